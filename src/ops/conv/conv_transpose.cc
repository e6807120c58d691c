// ConvTranspose (1-d/2-d/3-d; group, strides, dilations, pads, output_padding, output_shape,
// auto_pad, bias). fp32 through the backend's transposed convolution (backends/cpu/conv.h) when the pads are non-negative; otherwise,
// and for other float dtypes, the direct reference loop.
#include "ops/gradient_builder.h"
#include "backends/cpu/conv.h"
#include "backends/cpu/shape_cache.h"
#include "ops/common.h"
#include "ops/conv/conv_reference.h"
#include "ops/conv/conv_util.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

void conv_transpose_shape(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  const auto& x = ctx.input_shape(0);
  const auto& w = ctx.input_shape(1);
  if (!x || !w || x->size() < 3 || w->size() != x->size()) {
    ctx.set_output(0, dt);
    return;
  }
  std::vector<int64_t> in(x->begin() + 2, x->end()), kernel(w->begin() + 2, w->end());
  WindowGeometry g = transpose_geometry(ctx.node(), in, kernel);
  int64_t group = ctx.node().attr_int("group", 1);
  Shape out{(*x)[0], (*w)[1] < 0 ? -1 : (*w)[1] * group};
  out.insert(out.end(), g.out.begin(), g.out.end());
  ctx.set_output(0, dt, out);
}

class ConvTransposeKernel final : public Kernel {
 public:
  explicit ConvTransposeKernel(const Node& node) : group_(node.attr_int("group", 1)) {}

  void compute(KernelContext& ctx) override {
    const Node& node = ctx.node();
    const Tensor& x = ctx.input(0);
    const Tensor& w = ctx.input(1);
    const Tensor* b = ctx.has_input(2) ? &ctx.input(2) : nullptr;
    OT_CHECK(x.rank() >= 3 && w.rank() == x.rank(), node.context(),
             "X must be [N, C, spatial...] and W [C, M/group, k...] of the same rank, got ", shape_str(x.shape()),
             " and ", shape_str(w.shape()));
    OT_CHECK(w.dtype() == x.dtype() && (!b || b->dtype() == x.dtype()), node.context(), "X, W and B must share a dtype");
    int64_t n = x.dim(0), c = x.dim(1), m = w.dim(1) * group_;
    OT_CHECK(group_ >= 1 && c == w.dim(0) && c % group_ == 0, node.context(), "channels do not match: X has ", c,
             ", W is ", shape_str(w.shape()), " with group ", group_);
    OT_CHECK(!b || (b->rank() == 1 && b->dim(0) == m), node.context(), "B must be [", m, "], got ", shape_str(b->shape()));
    std::vector<int64_t> in(x.shape().begin() + 2, x.shape().end()), kernel(w.shape().begin() + 2, w.shape().end());
    WindowGeometry g = transpose_geometry(node, in, kernel);
    Shape out{n, m};
    out.insert(out.end(), g.out.begin(), g.out.end());
    Tensor& y = ctx.output(0, x.dtype(), out);
    if (y.numel() == 0) return;
    bool pads_ok = true;
    for (size_t i = 0; i < in.size(); ++i) pads_ok = pads_ok && g.pad_l[i] >= 0 && g.pad_r[i] >= 0;
    if (x.dtype() == DType::kFloat32 && pads_ok && x.numel() > 0) {
      cpu::ConvSpec s = conv_spec(x, m, group_, b != nullptr, g);
      s.transposed = true;
      auto key = s.key();
      cpu::ConvPrimitive* conv = cache_.find(key);
      if (!conv) conv = &cache_.insert(key, cpu::ConvPrimitive(s, node.context()));
      conv->run(x.data<float>(), w.data<float>(), b ? b->data<float>() : nullptr, y.data<float>());
      return;
    }
    dispatch_float(x.dtype(), [&]<typename T>() {
      conv_transpose_reference<T>(x.data<T>(), w.data<T>(), b ? b->data<T>() : nullptr, y.data<T>(), n, c, m, group_,
                                  in, g);
    });
  }

 private:
  int64_t group_;
  cpu::ShapeCache<cpu::ConvPrimitive> cache_;
};

// ConvTranspose is the adjoint of a Conv from Y's space to X's (same W, strides, dilations, group;
// pads (pl, pr) with output_padding added back to pr): its gradients are that Conv's forward and
// backward-weights.
void conv_transpose_gradient(GradientBuilder& g) {
  const Node& node = g.node();
  auto sx = g.static_shape(g.x(0)), sw = g.static_shape(g.x(1));
  if (!sx || sx->size() < 3)
    OT_THROW(kNotImplemented, g.context(), "the gradient needs X's rank from shape inference");
  size_t nd = sx->size() - 2;
  std::vector<int64_t> in(sx->begin() + 2, sx->end()), kernel(nd, -1);
  if (sw && sw->size() == sx->size()) kernel.assign(sw->begin() + 2, sw->end());
  WindowGeometry geo = transpose_geometry(node, in, kernel);
  std::vector<int64_t> op = node.attr_ints("output_padding", std::vector<int64_t>(nd, 0));
  if (op.size() != nd) op.assign(nd, 0);
  std::string auto_pad = node.attr_string("auto_pad", "NOTSET");
  bool derived = node.has_attr("output_shape") || auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
  std::vector<int64_t> pads(2 * nd);
  for (size_t i = 0; i < nd; ++i) {
    if (derived && (in[i] < 0 || kernel[i] < 0))
      OT_THROW(kNotImplemented, g.context(), "the gradient needs static spatial shapes with auto_pad/output_shape");
    pads[i] = geo.pad_l[i];
    pads[nd + i] = geo.pad_r[i] + op[i];
    if (pads[i] < 0 || pads[nd + i] < 0 || op[i] >= geo.stride[i])
      OT_THROW(kNotImplemented, g.context(), "no gradient for negative pads (output_shape larger than the input "
               "implies) or output_padding >= stride");
  }
  GraphBuilder::Attrs conv{{"strides", Attribute::of(geo.stride)}, {"dilations", Attribute::of(geo.dilation)},
                           {"group", Attribute::of(node.attr_int("group", 1))}, {"pads", Attribute::of(pads)}};
  if (g.needs(0)) g.set(0, g.emit("Conv", {g.dy(0), g.x(1)}, conv));
  if (g.needs(1)) {
    GraphBuilder::Attrs a = conv;
    a["compute_dx"] = Attribute::of(int64_t(0));
    g.set(1, g.emit_n("ConvGrad", {g.x(0), g.dy(0), g.x(1)}, 2, a, kOnnxTrainDomain)[1]);
  }
  if (g.has_input(2) && g.needs(2)) {
    std::vector<int64_t> axes{0};
    for (size_t i = 0; i < nd; ++i) axes.push_back(int64_t(i) + 2);
    g.set(2, g.reduce_sum(g.dy(0), axes, false));
  }
}

}  // namespace

// Y = conv_transpose(X, W) + B.  dX = conv(dY, W) (same strides/dilations/group, pads with
// output_padding restored), dW = ConvGrad's weight gradient with dY as input and X as output
// gradient, dB = sum of dY over N and spatial dims
ONNXTRAIN_OP(ConvTranspose, kOnnxDomain, 1).inputs(2, 3).outputs(1).shape(conv_transpose_shape)
    .cpu_kernel<ConvTransposeKernel>().gradient(conv_transpose_gradient);

}  // namespace onnxtrain
