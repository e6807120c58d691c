// com.microsoft.Scale, which ONNX Runtime's gradient graphs emit (the backward of the average
// pools and reductions): Y = X * s, or X / s with scale_down = 1, s a one-element tensor.
#include "ops/common.h"
#include "ops/gradient_builder.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

void scale_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  const Tensor& s = ctx.input(1);
  OT_CHECK(s.numel() == 1, node.context(), "scale must hold one element, got shape ", shape_str(s.shape()));
  const double factor = s.item_as_double();
  const bool down = node.attr_int("scale_down", 0) != 0;
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  dispatch_float(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    const C f = C(factor);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    parallel_for(x.numel(), kElementwiseGrain, [&](int64_t b, int64_t e) {
      if (down) for (int64_t i = b; i < e; ++i) py[i] = T(C(px[i]) / f);
      else for (int64_t i = b; i < e; ++i) py[i] = T(C(px[i]) * f);
    });
  });
}

}  // namespace

// y = x * s (x / s when scale_down).  dx = dy * s (dy / s); s is a constant of the graph.
ONNXTRAIN_OP(Scale, kMsDomain, 1).inputs(2).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .work(memory_bound_work).cpu(scale_kernel).gradient([](GradientBuilder& g) {
      if (g.needs(1)) OT_THROW(kNotImplemented, g.context(), "no gradient rule for Scale's factor (a constant)");
      g.set(0, g.emit("Scale", {g.dy(0), g.x(1)}, {{"scale_down", Attribute::of(g.node().attr_int("scale_down", 0))}},
                      kMsDomain));
    });

}  // namespace onnxtrain
