// Dropout. Inference (every opset before 12, and training_mode false from 12): y = x and an
// all-true mask. Training (opset 12+, training_mode true, ratio > 0): mask = u >= ratio with u
// uniform in [0, 1), y = x * mask / (1 - ratio).
// Without a `seed` attribute (what exporters write) u_i = uniform_at(stream_key(executor seed, node
// name, run index), i) (core/random.h): counter-based, so elements are drawn in parallel, and a
// training run restored from a checkpoint (seed and step) redraws the masks of an uninterrupted
// one. With `seed`, an MT19937 stream seeded with it and advanced across runs, each u built from
// two 32-bit draws as a 53-bit double: numpy's legacy uniform, which ONNX's reference tests use.
#include <cstring>
#include <random>

#include "ops/gradient_builder.h"
#include "core/random.h"
#include "ops/common.h"
#include "ops/reduce/grad_common.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

void shape_dropout(ShapeContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(0), ctx.input_shape(0));
  if (ctx.num_outputs() > 1)
    ctx.set_output(1, ctx.opset() >= 10 ? DType::kBool : ctx.input_dtype(0), ctx.input_shape(0));
}

class DropoutKernel final : public Kernel {
 public:
  explicit DropoutKernel(const Node& node)
      : seeded_(node.has_attr("seed")), stream_(hash_name(node.name.empty() ? node.outputs[0] : node.name)) {
    if (seeded_) gen_.seed(uint32_t(node.attr_int("seed", 0)));
  }

  void compute(KernelContext& ctx) override {
    const Node& node = ctx.node();
    const Tensor& x = ctx.input(0);
    float ratio = node.attr_float("ratio", 0.5f);
    bool training = false;
    if (ctx.opset() >= 12) {
      ratio = 0.5f;
      if (ctx.has_input(1)) {
        const Tensor& r = ctx.input(1);
        OT_CHECK(r.numel() == 1 && is_floating(r.dtype()), node.context(),
                 "ratio must be a floating-point scalar, got ", dtype_name(r.dtype()), " of shape ", shape_str(r.shape()));
        ratio = float(r.item_as_double(0));
      }
      if (ctx.has_input(2)) {
        const Tensor& t = ctx.input(2);
        OT_CHECK(t.numel() == 1 && t.dtype() == DType::kBool, node.context(),
                 "training_mode must be a bool scalar, got ", dtype_name(t.dtype()), " of shape ", shape_str(t.shape()));
        training = t.data<bool>()[0];
      }
    }
    OT_CHECK(ratio >= 0.0f && ratio <= 1.0f, node.context(), "ratio must be in [0, 1], got ", ratio);
    Tensor& y = ctx.output(0, x.dtype(), x.shape());
    const bool want_mask = ctx.output_requested(1);
    const DType mask_dt = ctx.opset() >= 10 ? DType::kBool : x.dtype();
    Tensor* mask = want_mask ? &ctx.output(1, mask_dt, x.shape()) : nullptr;
    const int64_t n = x.numel();

    if (!training || ratio == 0.0f) {
      if (y.data() != x.data() && n) std::memcpy(y.data(), x.data(), x.nbytes());
      if (mask) {
        if (mask_dt == DType::kBool) {
          bool* m = mask->data<bool>();
          std::fill(m, m + n, true);
        } else {
          dispatch_float(mask_dt, [&]<typename T>() {
            T* m = mask->data<T>();
            std::fill(m, m + n, T(1.0f));
          });
        }
      }
      return;
    }
    dispatch_float(x.dtype(), [&]<typename T>() {
      using C = compute_t<T>;
      const C scale = ratio < 1.0f ? C(1) / (C(1) - C(ratio)) : C(0);
      const double r = double(ratio);
      const T* px = x.data<T>();
      T* py = y.data<T>();
      bool* pm = mask ? mask->data<bool>() : nullptr;
      auto apply = [&](int64_t i, double u) {
        bool keep = u >= r;
        py[i] = keep ? T(C(px[i]) * scale) : T(C(0));
        if (pm) pm[i] = keep;
      };
      if (seeded_) {
        for (int64_t i = 0; i < n; ++i) {  // sequential: the stream order defines the mask
          uint32_t a = gen_() >> 5, b = gen_() >> 6;
          apply(i, (double(a) * 67108864.0 + double(b)) / 9007199254740992.0);
        }
        return;
      }
      const uint64_t key = stream_key(ctx.random_seed(), stream_, ctx.run_index());
      parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) apply(i, uniform_at(key, uint64_t(i)));
      });
    });
  }

 private:
  bool seeded_;
  uint64_t stream_;  // this node's stream id: its name's hash
  std::mt19937 gen_;
};

// onnxtrain.DropoutGrad(dY, mask, ratio?, training_mode?): the forward's mask output and its ratio
// and training_mode inputs. dX = mask ? dY / (1 - ratio) : 0 in training (0 everywhere for ratio 1);
// dX = dY in inference or for ratio 0, as in the forward.
// kOrt: ONNX Runtime's DropoutGrad, which exists only in training graphs, masks when training_mode
// is absent (ours passes dY through, as ONNX's Dropout defaults to inference).
template <bool kOrt = false>
void dropout_grad_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& dy = ctx.input(0);
  const Tensor& mask = ctx.input(1);
  OT_CHECK(mask.shape() == dy.shape() && mask.dtype() == DType::kBool, node.context(),
           "mask must be a bool tensor of dY's shape ", shape_str(dy.shape()), ", got ", dtype_name(mask.dtype()), " ",
           shape_str(mask.shape()));
  double ratio = ctx.has_input(2) ? ctx.input(2).item_as_double(0) : 0.5;
  bool training = ctx.has_input(3) ? ctx.input(3).item_as_int(0) != 0 : kOrt;
  Tensor& dx = ctx.output(0, dy.dtype(), dy.shape());
  const int64_t n = dy.numel();
  if (!training || ratio == 0.0) {
    if (dx.data() != dy.data() && n) std::memcpy(dx.data(), dy.data(), dy.nbytes());
    return;
  }
  dispatch_float(dy.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    const C scale = ratio < 1.0 ? C(1) / (C(1) - C(float(ratio))) : C(0);
    const T* pdy = dy.data<T>();
    const bool* pm = mask.data<bool>();
    T* pdx = dx.data<T>();
    parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) pdx[i] = pm[i] ? T(C(pdy[i]) * scale) : T(C(0));
    });
  });
}

// The mask output of a forward Dropout node, added to the node when the model did not ask for it
// (the kernel draws mask and output together, so the backward sees exactly the forward's mask).
std::string dropout_mask(GradientBuilder& g) {
  if (g.node().has_output(1)) return g.y(1);
  Graph& graph = g.graph();
  for (Node& n : graph.nodes) {
    if (n.op_type != "Dropout" || !n.domain.empty() || !n.has_output(0) || n.outputs[0] != g.y(0)) continue;
    std::string name = graph.unique_name(g.y(0) + "/dropout_mask");
    n.outputs.resize(2);
    n.outputs[1] = name;
    return name;
  }
  OT_THROW(kRuntime, g.context(), "cannot find the forward Dropout node to add its mask output");
}

// y = x * mask * s, s = 1 / (1 - ratio) in training (1 otherwise).  dx = dy * mask * s
// Before opset 12 Dropout only runs in inference (dx = dy); from 12 training mode comes from the
// training_mode input: statically false (or ratio statically 0) gives dx = dy, otherwise the rule
// reuses the mask output (adding it to the forward node when absent) in onnxtrain.DropoutGrad.
void dropout_gradient(GradientBuilder& g) {
  if (g.opset() < 12 || !g.has_input(2)) return g.set(0, g.dy(0));
  if (auto t = static_value(g, g.x(2)); t && t->numel() == 1 && t->item_as_int(0) == 0) return g.set(0, g.dy(0));
  if (g.has_input(1))
    if (auto r = static_value(g, g.x(1)); r && r->numel() == 1 && r->item_as_double(0) == 0.0) return g.set(0, g.dy(0));
  std::string mask = dropout_mask(g);
  g.set(0, g.emit("DropoutGrad", {g.dy(0), mask, g.has_input(1) ? g.x(1) : "", g.x(2)}, {}, kOnnxTrainDomain));
}

// Inference: training_mode omitted (an identity), no mask output.
void dropout_inference_form(Node& node, int64_t) {
  if (node.inputs.size() > 2) node.inputs.resize(2);
  if (node.outputs.size() > 1) node.outputs.resize(1);
}

}  // namespace

ONNXTRAIN_OP(Dropout, kOnnxDomain, 1).inputs(1, 3).outputs(1, 2).shape(shape_dropout).inplace(0, 0)
    .cpu_kernel<DropoutKernel>().gradient(dropout_gradient).inference_form(dropout_inference_form);
// dX = DropoutGrad(dY, mask, ratio?, training_mode?); linear in dY, second derivatives are not needed.
ONNXTRAIN_OP(DropoutGrad, kOnnxTrainDomain, 1).inputs(2, 4).outputs(1)
    .shape([](ShapeContext& ctx) { ctx.set_output(0, ctx.input_dtype(0), ctx.input_shape(1)); })
    .inplace(0, 0).cpu(dropout_grad_kernel<>).gradient_not_implemented("second derivatives are not needed");
// ONNX Runtime's training artifacts: DropoutGrad(dY, mask, ratio?, training_mode?), training by default.
ONNXTRAIN_OP(DropoutGrad, kMsDomain, 1).inputs(2, 4).outputs(1)
    .shape([](ShapeContext& ctx) { ctx.set_output(0, ctx.input_dtype(0), ctx.input_shape(1)); })
    .inplace(0, 0).cpu(dropout_grad_kernel<true>).gradient_not_implemented("second derivatives are not needed");

}  // namespace onnxtrain
