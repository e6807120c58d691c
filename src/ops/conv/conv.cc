// Conv (1-d/2-d/3-d; group, strides, dilations, pads, auto_pad, bias). fp32 through the backend's convolution primitive (backends/cpu/conv.h) with
// the primitive cached per shape, bf16 too where the CPU has bf16 kernels (fp32 accumulation);
// other half types through fp32 (widened operands, one rounding of the result); float64 through
// the direct reference loop.
#include <algorithm>
#include <cmath>
#include <optional>

#include "ops/gradient_builder.h"
#include "backends/cpu/conv.h"
#include "backends/cpu/gemm.h"  // matmul_native: whether the CPU has bf16 kernels
#include "backends/cpu/shape_cache.h"
#include "ops/common.h"
#include "ops/conv/conv_reference.h"
#include "ops/conv/conv_util.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

// Whether oneDNN convolves this dtype natively here.
bool onednn_dtype(DType dt) {
  return dt == DType::kFloat32 || (dt == DType::kBFloat16 && cpu::matmul_native(DType::kBFloat16));
}

bool is_half(DType dt) { return dt == DType::kBFloat16 || dt == DType::kFloat16; }

void conv_shape(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  const auto& x = ctx.input_shape(0);
  const auto& w = ctx.input_shape(1);
  if (!x || !w || x->size() < 3 || w->size() != x->size()) {
    ctx.set_output(0, dt);
    return;
  }
  std::vector<int64_t> in(x->begin() + 2, x->end()), kernel(w->begin() + 2, w->end());
  WindowGeometry g = window_geometry(ctx.node(), in, kernel, false);
  Shape out{(*x)[0], (*w)[0]};
  out.insert(out.end(), g.out.begin(), g.out.end());
  ctx.set_output(0, dt, out);
}

// FusedConv's `activation` (with `activation_params`) as a oneDNN post-op; none for Conv.
struct Activation {
  cpu::ConvActivation kind = cpu::ConvActivation::kNone;
  float alpha = 0, beta = 0;

  explicit Activation(const Node& node) {
    std::string name = node.attr_string("activation", "");
    std::vector<float> params = node.has_attr("activation_params") ? node.attr_floats("activation_params")
                                                                    : std::vector<float>{};
    auto want_params = [&](size_t n) {
      OT_CHECK(params.size() == n, node.context(), "activation '", name, "' takes ", n,
               " activation_params, got ", params.size());
    };
    if (name.empty()) return;
    if (name == "Relu") kind = cpu::ConvActivation::kRelu, want_params(0);
    else if (name == "Sigmoid") kind = cpu::ConvActivation::kSigmoid, want_params(0);
    else if (name == "Tanh") kind = cpu::ConvActivation::kTanh, want_params(0);
    else if (name == "LeakyRelu") kind = cpu::ConvActivation::kLeakyRelu, want_params(1), alpha = params[0];
    else if (name == "Clip") kind = cpu::ConvActivation::kClip, want_params(2), alpha = params[0], beta = params[1];
    else if (name == "HardSwish") kind = cpu::ConvActivation::kHardSwish, want_params(0);
    else OT_THROW(kInvalidModel, node.context(), "activation '", name,
                  "' is not one of Relu, LeakyRelu, Sigmoid, Tanh, Clip, HardSwish");
  }

  // The reference path: the same functions applied after the convolution.
  template <typename T>
  void apply(T* y, int64_t n) const {
    using C = compute_t<T>;
    if (kind == cpu::ConvActivation::kNone) return;
    for (int64_t i = 0; i < n; ++i) {
      C v = C(y[i]);
      switch (kind) {
        case cpu::ConvActivation::kRelu: v = v > C(0) ? v : C(0); break;
        case cpu::ConvActivation::kLeakyRelu: v = v > C(0) ? v : C(alpha) * v; break;
        case cpu::ConvActivation::kSigmoid: v = C(1) / (C(1) + std::exp(-v)); break;
        case cpu::ConvActivation::kTanh: v = std::tanh(v); break;
        case cpu::ConvActivation::kClip: v = std::min(std::max(v, C(alpha)), C(beta)); break;
        case cpu::ConvActivation::kHardSwish: v = v * std::min(std::max(v + C(3), C(0)), C(6)) / C(6); break;
        case cpu::ConvActivation::kNone: break;
      }
      y[i] = T(v);
    }
  }
};

class ConvKernel final : public Kernel {
 public:
  explicit ConvKernel(const Node& node)
      : group_(node.attr_int("group", 1)), activation_(node),
        x_channels_last_(node.attr_int("input_channels_last", 0) != 0),
        y_channels_last_(node.attr_int("output_channels_last", 0) != 0) {}

  void compute(KernelContext& ctx) override {
    const Node& node = ctx.node();
    const Tensor& x = ctx.input(0);
    const Tensor& w = ctx.input(1);
    const Tensor* b = ctx.has_input(2) ? &ctx.input(2) : nullptr;
    const Tensor* z = ctx.has_input(3) ? &ctx.input(3) : nullptr;
    OT_CHECK(x.rank() >= 3 && w.rank() == x.rank(), node.context(), "X must be [N, C, spatial...] and W [M, C/group, k...] of the same rank, got ",
             shape_str(x.shape()), " and ", shape_str(w.shape()));
    OT_CHECK(w.dtype() == x.dtype() && (!b || b->dtype() == x.dtype()), node.context(), "X, W and B must share a dtype");
    int64_t n = x.dim(0), c = x.dim(1), m = w.dim(0);
    OT_CHECK(group_ >= 1 && c == w.dim(1) * group_ && m % group_ == 0, node.context(), "channels do not match: X has ", c,
             ", W is ", shape_str(w.shape()), " with group ", group_);
    OT_CHECK(!b || (b->rank() == 1 && b->dim(0) == m), node.context(), "B must be [", m, "], got ", shape_str(b->shape()));
    if (!last_ || last_->x != x.shape() || last_->w != w.shape()) {
      std::vector<int64_t> in(x.shape().begin() + 2, x.shape().end()), kernel(w.shape().begin() + 2, w.shape().end());
      last_ = LastCall{x.shape(), w.shape(), window_geometry(node, in, kernel, false)};
    }
    const WindowGeometry& g = last_->g;
    Shape out{n, m};
    out.insert(out.end(), g.out.begin(), g.out.end());
    OT_CHECK(!z || (z->shape() == out && z->dtype() == x.dtype()), node.context(), "Z must be ", dtype_name(x.dtype()),
             shape_str(out), " (Y's shape), got ", dtype_name(z ? z->dtype() : x.dtype()),
             shape_str(z ? z->shape() : out));
    Tensor& y = ctx.output(0, x.dtype(), out);
    if (y.numel() == 0) return;
    OT_CHECK(!z || x.dtype() == DType::kFloat32, node.context(), "a summand Z needs fp32, got ", dtype_name(x.dtype()));
    if (onednn_dtype(x.dtype()) && c > 0) return run_onednn(node, x, w, b, y, g, ctx.input_is_constant(1), z);
    if (is_half(x.dtype()) && c > 0) {  // no native kernel: through fp32
      note_half_through_fp32("convolution", x.dtype());
      Tensor x32 = widen_to_fp32(x), w32 = widen_to_fp32(w), b32 = b ? widen_to_fp32(*b) : Tensor();
      Tensor y32 = Tensor::empty(DType::kFloat32, y.shape());
      run_onednn(node, x32, w32, b ? &b32 : nullptr, y32, g, false);
      narrow_from_fp32(y32, y);
      return;
    }
    OT_CHECK(!x_channels_last_ && !y_channels_last_, node.context(),
             "input_channels_last / output_channels_last need fp32 X with channels, got ", dtype_name(x.dtype()),
             shape_str(x.shape()));
    const std::vector<int64_t> in(x.shape().begin() + 2, x.shape().end());
    dispatch_float(x.dtype(), [&]<typename T>() {
      conv_reference<T>(x.data<T>(), w.data<T>(), b ? b->data<T>() : nullptr, y.data<T>(), n, c, m, group_, in, g);
      activation_.apply(y.data<T>(), y.numel());
    });
  }

 private:
  void run_onednn(const Node& node, const Tensor& x, const Tensor& w, const Tensor* b, Tensor& y,
                  const WindowGeometry& g, bool w_constant, const Tensor* z = nullptr) {
    if (last_->conv && last_->conv_dtype == x.dtype() && last_->bias == (b != nullptr) && last_->sum == (z != nullptr))
      return last_->conv->run(x.data(), w.data(), b ? b->data() : nullptr, y.data(), w_constant, z ? z->data() : nullptr);
    cpu::ConvSpec s = conv_spec(x, w.dim(0), group_, b != nullptr, g);
    s.activation = activation_.kind;
    s.act_alpha = activation_.alpha;
    s.act_beta = activation_.beta;
    s.x_channels_last = x_channels_last_;
    s.y_channels_last = y_channels_last_;
    s.sum = z != nullptr;
    int64_t macs = y.numel() * (w.numel() / std::max<int64_t>(w.dim(0), 1));  // per output: C/G * kernel taps
    s.serial = !s.transposed && macs < serial_work();
    auto key = s.key();
    cpu::ConvPrimitive* conv = cache_.find(key);
    if (!conv) conv = &cache_.insert(key, cpu::ConvPrimitive(s, node.context()));
    last_->conv = conv, last_->conv_dtype = x.dtype(), last_->bias = b != nullptr, last_->sum = z != nullptr;
    conv->run(x.data(), w.data(), b ? b->data() : nullptr, y.data(), w_constant, z ? z->data() : nullptr);
  }

  // The last call's geometry and primitive: a kernel sees one shape over most of its life, and
  // deriving them again (attribute lookups by name, the primitive cache's key) was a few
  // microseconds of a batch-1 convolution's 20. `conv` (an entry of cache_, which keeps the entry
  // it last handed out) is for X and W of these shapes with conv_dtype, bias and sum as recorded.
  struct LastCall {
    Shape x, w;
    WindowGeometry g;
    cpu::ConvPrimitive* conv = nullptr;
    DType conv_dtype = DType::kUndefined;
    bool bias = false, sum = false;
  };

  int64_t group_;
  Activation activation_;
  bool x_channels_last_, y_channels_last_;
  cpu::ShapeCache<cpu::ConvPrimitive> cache_;
  std::optional<LastCall> last_;
};

// onnxtrain.ConvGrad(dY, X, W) -> dX, dW [, dB] with the forward Conv's attributes; compute_dx /
// compute_dw = 0 skip dX / (dW, dB), whose outputs are then zeros (the rules never read them).
void conv_grad_shape(ShapeContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(1), ctx.input_shape(1));
  ctx.set_output(1, ctx.input_dtype(2), ctx.input_shape(2));
  if (ctx.num_outputs() > 2) {
    const auto& w = ctx.input_shape(2);
    ctx.set_output(2, ctx.input_dtype(2), w && !w->empty() ? std::optional<Shape>(Shape{(*w)[0]}) : std::nullopt);
  }
}

class ConvGradKernel final : public Kernel {
 public:
  explicit ConvGradKernel(const Node& node)
      : group_(node.attr_int("group", 1)), need_dx_(node.attr_int("compute_dx", 1) != 0),
        need_dw_(node.attr_int("compute_dw", 1) != 0) {}

  void compute(KernelContext& ctx) override {
    const Node& node = ctx.node();
    const Tensor& dy = ctx.input(0);
    const Tensor& x = ctx.input(1);
    const Tensor& w = ctx.input(2);
    OT_CHECK(x.rank() >= 3 && w.rank() == x.rank() && dy.rank() == x.rank(), node.context(),
             "dY, X and W must have the same rank >= 3, got ", shape_str(dy.shape()), ", ", shape_str(x.shape()),
             " and ", shape_str(w.shape()));
    OT_CHECK(w.dtype() == x.dtype() && dy.dtype() == x.dtype(), node.context(), "dY, X and W must share a dtype");
    int64_t n = x.dim(0), c = x.dim(1), m = w.dim(0);
    OT_CHECK(group_ >= 1 && c == w.dim(1) * group_ && m % group_ == 0, node.context(), "channels do not match: X has ",
             c, ", W is ", shape_str(w.shape()), " with group ", group_);
    std::vector<int64_t> in(x.shape().begin() + 2, x.shape().end()), kernel(w.shape().begin() + 2, w.shape().end());
    WindowGeometry g = window_geometry(node, in, kernel, false);
    Shape out{n, m};
    out.insert(out.end(), g.out.begin(), g.out.end());
    OT_CHECK(dy.shape() == out, node.context(), "dY must be ", shape_str(out), ", got ", shape_str(dy.shape()));
    bool bias = ctx.num_outputs() > 2;
    Tensor& dx = ctx.output(0, x.dtype(), x.shape());
    Tensor& dw = ctx.output(1, w.dtype(), w.shape());
    Tensor* db = bias ? &ctx.output(2, w.dtype(), {m}) : nullptr;
    bool need_dx = need_dx_ && ctx.output_requested(0) && dx.numel() > 0;
    bool need_dw = need_dw_ && (ctx.output_requested(1) || (bias && ctx.output_requested(2)));
    // Outputs not computed (or empty products) are zeros.
    auto zero = [](Tensor& t) {
      dispatch_float(t.dtype(), [&]<typename T>() { std::fill(t.data<T>(), t.data<T>() + t.numel(), T(0)); });
    };
    if (!need_dx) zero(dx);
    if (!need_dw || dy.numel() == 0 || x.numel() == 0) {
      zero(dw);
      if (db) zero(*db);
      if (dy.numel() == 0 || x.numel() == 0) {
        zero(dx);
        return;
      }
      need_dw = false;
    }
    if (!need_dx && !need_dw) return;
    if (onednn_dtype(x.dtype()))
      return run_onednn(node, dy, x, w, need_dx ? &dx : nullptr, need_dw ? &dw : nullptr, need_dw ? db : nullptr,
                        bias, g);
    if (is_half(x.dtype())) {  // no native kernel: through fp32
      note_half_through_fp32("convolution", x.dtype());
      Tensor dy32 = widen_to_fp32(dy), x32 = widen_to_fp32(x), w32 = widen_to_fp32(w);
      Tensor dx32 = Tensor::empty(DType::kFloat32, dx.shape()), dw32 = Tensor::empty(DType::kFloat32, dw.shape());
      Tensor db32 = db ? Tensor::empty(DType::kFloat32, db->shape()) : Tensor();
      run_onednn(node, dy32, x32, w32, need_dx ? &dx32 : nullptr, need_dw ? &dw32 : nullptr,
                 need_dw && db ? &db32 : nullptr, bias, g);
      if (need_dx) narrow_from_fp32(dx32, dx);
      if (need_dw) narrow_from_fp32(dw32, dw);
      if (need_dw && db) narrow_from_fp32(db32, *db);
      return;
    }
    dispatch_float(x.dtype(), [&]<typename T>() {
      conv_backward_reference<T>(dy.data<T>(), x.data<T>(), w.data<T>(), need_dx ? dx.data<T>() : nullptr,
                                 need_dw ? dw.data<T>() : nullptr, need_dw && db ? db->data<T>() : nullptr, n, c, m,
                                 group_, in, g);
    });
  }

 private:
  // dx / dw / db null: not wanted (db also when the forward has no bias).
  void run_onednn(const Node& node, const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, Tensor* dw,
                  Tensor* db, bool bias, const WindowGeometry& g) {
    cpu::ConvSpec s = conv_spec(x, w.dim(0), group_, bias, g);
    auto key = s.key();
    key.push_back(dx != nullptr);
    key.push_back(dw != nullptr);
    cpu::ConvBackwardPrimitive* conv = cache_.find(key);
    if (!conv) conv = &cache_.insert(key, cpu::ConvBackwardPrimitive(s, dx != nullptr, dw != nullptr, node.context()));
    conv->run(dy.data(), x.data(), w.data(), dx ? dx->data() : nullptr, dw ? dw->data() : nullptr,
              db ? db->data() : nullptr);
  }

  int64_t group_;
  bool need_dx_, need_dw_;
  cpu::ShapeCache<cpu::ConvBackwardPrimitive> cache_;
};

// Multiply-adds of a forward convolution: C/G * kernel taps per output element (the rule
// ConvKernel's serial primitives follow, so the executor and the kernel agree).
int64_t conv_work(const std::vector<const Shape*>& inputs, const std::vector<const Shape*>& outputs) {
  if (inputs.size() < 2 || !inputs[1] || inputs[1]->empty() || outputs.empty() || !outputs[0]) return kSerialWork;
  return numel(*outputs[0]) * (numel(*inputs[1]) / std::max<int64_t>((*inputs[1])[0], 1));
}

}  // namespace

// Y = conv(X, W) + B.  dX = conv's adjoint applied to dY (backward data), dW = sum over N of dY
// correlated with X per group (backward weights), dB = sum of dY over N and spatial dims
ONNXTRAIN_OP(Conv, kOnnxDomain, 1).inputs(2, 3).outputs(1).shape(conv_shape).cpu_kernel<ConvKernel>().work(conv_work)
    .gradient([](GradientBuilder& g) {
      bool bias = g.has_input(2);
      GraphBuilder::Attrs attrs = g.node().attributes;
      attrs["compute_dx"] = Attribute::of(int64_t(g.needs(0)));
      attrs["compute_dw"] = Attribute::of(int64_t(g.needs(1) || (bias && g.needs(2))));
      auto d = g.emit_n("ConvGrad", {g.dy(0), g.x(0), g.x(1)}, bias ? 3 : 2, attrs, kOnnxTrainDomain);
      for (size_t i = 0; i < d.size(); ++i)
        if (g.needs(i)) g.set(i, d[i]);
    });

// onnxtrain.FusedConv(X, W [, B]) with Conv's attributes plus `activation` (Relu, LeakyRelu,
// Sigmoid, Tanh, Clip, HardSwish) and its `activation_params`: Y = act(conv(X, W) + B) in one primitive.
// The inference pipeline makes it (src/passes/fusions.cc); training graphs keep Conv + activation.
// An optional fourth input Z (Y's shape, fp32) is added before the activation, Y = act(conv(X, W) + B + Z):
// a residual Add (and the Relu after it) folded in (src/passes/fusions.cc).
// `input_channels_last` / `output_channels_last` = 1 state that X / Y (and Z) hold their [N, C, spatial...]
// values in channels-last order (fp32 only): set on a FusedConv feeding another FusedConv, so the
// value between them stays in the layout the convolutions compute in and neither reorders it.
ONNXTRAIN_OP(FusedConv, kOnnxTrainDomain, 1).inputs(2, 4).outputs(1).shape(conv_shape).cpu_kernel<ConvKernel>()
    .work(conv_work).inplace(0, 3)
    .gradient_not_implemented("an inference-only fusion: autodiff differentiates Conv and the activation");

// dX, dW, dB = ConvGrad(dY, X, W): linear in dY, so differentiable in principle.
ONNXTRAIN_OP(ConvGrad, kOnnxTrainDomain, 1).inputs(3).outputs(2, 3).shape(conv_grad_shape)
    .cpu_kernel<ConvGradKernel>().gradient_not_implemented("second derivatives of Conv are not needed");
// ONNX Runtime's training artifacts: the same inputs, outputs and Conv attributes.
ONNXTRAIN_OP(ConvGrad, kMsDomain, 1).inputs(3).outputs(2, 3).shape(conv_grad_shape)
    .cpu_kernel<ConvGradKernel>().gradient_not_implemented("second derivatives of Conv are not needed");

}  // namespace onnxtrain
