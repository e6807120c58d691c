// Conv (1-d/2-d/3-d; group, strides, dilations, pads, auto_pad, bias). fp32 through oneDNN with
// the primitive cached per shape; other float dtypes through the direct reference loop.
#include "backends/cpu/conv_dnnl.h"
#include "backends/cpu/shape_cache.h"
#include "ops/common.h"
#include "ops/conv/conv_reference.h"
#include "ops/conv/conv_util.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

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

class ConvKernel final : public Kernel {
 public:
  explicit ConvKernel(const Node& node) : group_(node.attr_int("group", 1)) {}

  void compute(KernelContext& ctx) override {
    const Node& node = ctx.node();
    const Tensor& x = ctx.input(0);
    const Tensor& w = ctx.input(1);
    const Tensor* b = ctx.has_input(2) ? &ctx.input(2) : nullptr;
    OT_CHECK(x.rank() >= 3 && w.rank() == x.rank(), node.context(), "X must be [N, C, spatial...] and W [M, C/group, k...] of the same rank, got ",
             shape_str(x.shape()), " and ", shape_str(w.shape()));
    OT_CHECK(w.dtype() == x.dtype() && (!b || b->dtype() == x.dtype()), node.context(), "X, W and B must share a dtype");
    int64_t n = x.dim(0), c = x.dim(1), m = w.dim(0);
    OT_CHECK(group_ >= 1 && c == w.dim(1) * group_ && m % group_ == 0, node.context(), "channels do not match: X has ", c,
             ", W is ", shape_str(w.shape()), " with group ", group_);
    OT_CHECK(!b || (b->rank() == 1 && b->dim(0) == m), node.context(), "B must be [", m, "], got ", shape_str(b->shape()));
    std::vector<int64_t> in(x.shape().begin() + 2, x.shape().end()), kernel(w.shape().begin() + 2, w.shape().end());
    WindowGeometry g = window_geometry(node, in, kernel, false);
    Shape out{n, m};
    out.insert(out.end(), g.out.begin(), g.out.end());
    Tensor& y = ctx.output(0, x.dtype(), out);
    if (y.numel() == 0) return;
    if (x.dtype() == DType::kFloat32 && c > 0) {
      cpu::ConvSpec s;
      s.x = x.shape();
      s.out_channels = m;
      s.group = group_;
      s.bias = b != nullptr;
      s.kernel = g.kernel;
      s.stride = g.stride;
      s.dilation = g.dilation;
      s.pad_l = g.pad_l;
      s.pad_r = g.pad_r;
      s.out = g.out;
      auto key = s.key();
      cpu::DnnlConv* conv = cache_.find(key);
      if (!conv) conv = &cache_.insert(key, cpu::DnnlConv(s, node.context()));
      conv->run(x.data<float>(), w.data<float>(), b ? b->data<float>() : nullptr, y.data<float>());
      return;
    }
    dispatch_float(x.dtype(), [&]<typename T>() {
      conv_reference<T>(x.data<T>(), w.data<T>(), b ? b->data<T>() : nullptr, y.data<T>(), n, c, m, group_, in, g);
    });
  }

 private:
  int64_t group_;
  cpu::ShapeCache<cpu::DnnlConv> cache_;
};

}  // namespace

// Y = conv(X, W) + B.  dX = conv_transpose(dY, W), dW = conv(X, dY) per group (correlation over
// the batch), dB = sum of dY over N and spatial dims
ONNXTRAIN_OP(Conv, kOnnxDomain, 1).inputs(2, 3).outputs(1).shape(conv_shape).cpu_kernel<ConvKernel>();

}  // namespace onnxtrain
