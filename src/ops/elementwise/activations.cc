// Activations with attributes (Elu, LeakyRelu, Selu, Celu, HardSigmoid, HardSwish, ThresholdedRelu,
// Shrink), Clip with attribute (opset < 11) or input (opset >= 11) bounds, and PRelu.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/elementwise/elementwise.h"

namespace onnxtrain {

namespace grad = elementwise::grad;
namespace {

using elementwise::float_unary;

void elu_kernel(KernelContext& ctx) {
  float alpha = ctx.node().attr_float("alpha", 1.0f);
  float_unary(ctx, [alpha](auto x) {
    using C = decltype(x);
    return x >= C(0) ? x : C(alpha) * std::expm1(x);
  });
}

void leaky_relu_kernel(KernelContext& ctx) {
  float alpha = ctx.node().attr_float("alpha", 0.01f);
  float_unary(ctx, [alpha](auto x) {
    using C = decltype(x);
    return x >= C(0) ? x : C(alpha) * x;
  });
}

void selu_kernel(KernelContext& ctx) {
  float alpha = ctx.node().attr_float("alpha", 1.67326319217681884765625f);
  float gamma = ctx.node().attr_float("gamma", 1.05070102214813232421875f);
  float_unary(ctx, [alpha, gamma](auto x) {
    using C = decltype(x);
    return x > C(0) ? C(gamma) * x : C(gamma) * C(alpha) * std::expm1(x);
  });
}

void celu_kernel(KernelContext& ctx) {
  float alpha = ctx.node().attr_float("alpha", 1.0f);
  OT_CHECK(alpha != 0.0f, ctx.node().context(), "alpha must be nonzero, got 0");
  float_unary(ctx, [alpha](auto x) {
    using C = decltype(x);
    return x > C(0) ? x : C(alpha) * std::expm1(x / C(alpha));
  });
}

void hard_sigmoid_kernel(KernelContext& ctx) {
  float alpha = ctx.node().attr_float("alpha", 0.2f);
  float beta = ctx.node().attr_float("beta", 0.5f);
  float_unary(ctx, [alpha, beta](auto x) {
    using C = decltype(x);
    return std::min(C(1), std::max(C(0), C(alpha) * x + C(beta)));
  });
}

void hard_swish_kernel(KernelContext& ctx) {
  float_unary(ctx, [](auto x) {
    using C = decltype(x);
    return x * std::min(C(1), std::max(C(0), x / C(6) + C(0.5)));
  });
}

void thresholded_relu_kernel(KernelContext& ctx) {
  float alpha = ctx.node().attr_float("alpha", 1.0f);
  float_unary(ctx, [alpha](auto x) {
    using C = decltype(x);
    return x > C(alpha) ? x : C(0);
  });
}

// Shrink takes every numeric dtype; integers compute in double and convert back.
void shrink_kernel(KernelContext& ctx) {
  double lambd = ctx.node().attr_float("lambd", 0.5f);
  double bias = ctx.node().attr_float("bias", 0.0f);
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  dispatch_numeric(x.dtype(), [&]<typename T>() {
    using C = std::conditional_t<std::is_integral_v<T>, double, compute_t<T>>;
    C lo = C(-lambd), hi = C(lambd), b = C(bias);
    unary_map(x.data<T>(), y.data<T>(), x.numel(), [=](T v) {
      C c = C(v);
      C r = c < lo ? c + b : c > hi ? c - b : C(0);
      return cast_value<T>(r);
    });
  });
}

// Bounds come from the min/max attributes before opset 11 and from optional inputs 1 and 2 after.
void clip_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  dispatch_numeric(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    C lo = std::numeric_limits<C>::lowest(), hi = std::numeric_limits<C>::max();
    if constexpr (std::is_floating_point_v<C>) {
      if (node.has_attr("min")) lo = C(node.attr_float("min", 0.0f));
      if (node.has_attr("max")) hi = C(node.attr_float("max", 0.0f));
    }
    if (ctx.has_input(1)) lo = C(elementwise::scalar_of<T>(ctx, 1, "min"));
    if (ctx.has_input(2)) hi = C(elementwise::scalar_of<T>(ctx, 2, "max"));
    // min(max(x, lo), hi): NaN passes through, and lo > hi gives hi everywhere as ONNX says.
    unary_map(x.data<T>(), y.data<T>(), x.numel(), [=](T v) { return T(std::min(std::max(C(v), lo), hi)); });
  });
}

void clip_grad_kernel(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const Tensor& y = ctx.input(2);
  OT_CHECK(dy.shape() == x.shape() && y.shape() == x.shape() && dy.dtype() == x.dtype() && y.dtype() == x.dtype(),
           ctx.node().context(), "dY, X and Y must match, got ", dtype_name(dy.dtype()), shape_str(dy.shape()), ", ",
           dtype_name(x.dtype()), shape_str(x.shape()), " and ", dtype_name(y.dtype()), shape_str(y.shape()));
  Tensor& dx = ctx.output(0, x.dtype(), x.shape());
  dispatch_float(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    const T* pdy = dy.data<T>();
    const T* px = x.data<T>();
    const T* py = y.data<T>();
    T* pdx = dx.data<T>();
    parallel_for(x.numel(), kElementwiseGrain, [pdy, px, py, pdx](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {  // unconditional loads: a vector select
        T g = pdy[i];
        pdx[i] = C(px[i]) == C(py[i]) ? g : T(C(0));
      }
    });
  });
}

// The slope broadcasts to X's shape (unidirectionally); the output has X's shape.
void prelu_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& slope = ctx.input(1);
  OT_CHECK(x.dtype() == slope.dtype(), ctx.node().context(), "slope must have X's dtype ",
           dtype_name(x.dtype()), ", got ", dtype_name(slope.dtype()));
  Shape out_shape = broadcast_shapes(ctx.node(), x.shape(), slope.shape());
  OT_CHECK(out_shape == x.shape(), ctx.node().context(), "slope of shape ", shape_str(slope.shape()),
           " must broadcast to X's shape ", shape_str(x.shape()));
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  dispatch_numeric(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    binary_broadcast<T, T, T>(x, slope, y, [](T v, T s) {
      if constexpr (std::is_unsigned_v<T>) { (void)s; return v; }
      else return C(v) < C(0) ? T(elementwise::wrapping_mul(C(s), C(v))) : v;
    });
  });
}

}  // namespace

#define OT_ACTIVATION(OP, SINCE, KERNEL) \
  ONNXTRAIN_OP(OP, kOnnxDomain, SINCE).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0).cpu(KERNEL) \
      .work(memory_bound_work)

// y = x >= 0 ? x : alpha (exp(x) - 1).  dx = dy * (x >= 0 ? 1 : y + alpha)
OT_ACTIVATION(Elu, 1, elu_kernel).gradient([](GradientBuilder& g) {
  float alpha = g.node().attr_float("alpha", 1.0f);
  std::string neg_part = g.mul(g.dy(0), g.add(g.y(0), grad::c(g, alpha, g.x(0))));
  g.set(0, g.emit("Where", {grad::less(g, g.x(0), grad::c(g, 0.0, g.x(0))), neg_part, g.dy(0)}));
});
// y = x >= 0 ? x : alpha x.  dx = dy * (x >= 0 ? 1 : alpha)
OT_ACTIVATION(LeakyRelu, 1, leaky_relu_kernel).gradient([](GradientBuilder& g) {
  float alpha = g.node().attr_float("alpha", 0.01f);
  std::string neg_part = g.mul(g.dy(0), grad::c(g, alpha, g.x(0)));
  g.set(0, g.emit("Where", {grad::less(g, g.x(0), grad::c(g, 0.0, g.x(0))), neg_part, g.dy(0)}));
});
// y = gamma (x > 0 ? x : alpha (exp(x) - 1)).  dx = dy * (x > 0 ? gamma : y + gamma alpha)
OT_ACTIVATION(Selu, 1, selu_kernel).gradient([](GradientBuilder& g) {
  float alpha = g.node().attr_float("alpha", 1.67326319217681884765625f);
  float gamma = g.node().attr_float("gamma", 1.05070102214813232421875f);
  std::string pos = g.mul(g.dy(0), grad::c(g, gamma, g.x(0)));
  std::string neg_part = g.mul(g.dy(0), g.add(g.y(0), grad::c(g, double(gamma) * double(alpha), g.x(0))));
  g.set(0, g.emit("Where", {grad::greater(g, g.x(0), grad::c(g, 0.0, g.x(0))), pos, neg_part}));
});
// y = max(0, x) + min(0, alpha (exp(x / alpha) - 1)).  dx = dy * (x > 0 ? 1 : exp(x / alpha))
OT_ACTIVATION(Celu, 12, celu_kernel).gradient([](GradientBuilder& g) {
  float alpha = g.node().attr_float("alpha", 1.0f);
  std::string neg_part = g.mul(g.dy(0), g.emit("Exp", {g.div(g.x(0), grad::c(g, alpha, g.x(0)))}));
  g.set(0, g.emit("Where", {grad::greater(g, g.x(0), grad::c(g, 0.0, g.x(0))), g.dy(0), neg_part}));
});
// y = clamp(alpha x + beta, 0, 1).  dx = dy * (0 < alpha x + beta < 1 ? alpha : 0)
OT_ACTIVATION(HardSigmoid, 1, hard_sigmoid_kernel).gradient([](GradientBuilder& g) {
  // 0 < y < 1 exactly where alpha x + beta is inside the clamp.
  float alpha = g.node().attr_float("alpha", 0.2f);
  std::string inside = g.emit("And", {grad::greater(g, g.y(0), grad::c(g, 0.0, g.x(0))),
                                      grad::less(g, g.y(0), grad::c(g, 1.0, g.x(0)))});
  g.set(0, grad::where_or_zero(g, inside, g.mul(g.dy(0), grad::c(g, alpha, g.x(0))), g.x(0)));
});
// y = x clamp(x / 6 + 1/2, 0, 1).  dx = dy * (x < -3 ? 0 : x > 3 ? 1 : x / 3 + 1/2)
OT_ACTIVATION(HardSwish, 14, hard_swish_kernel).gradient([](GradientBuilder& g) {
  std::string mid = g.mul(g.dy(0), g.add(g.div(g.x(0), grad::c(g, 3.0, g.x(0))), grad::c(g, 0.5, g.x(0))));
  std::string upper = g.emit("Where", {grad::greater(g, g.x(0), grad::c(g, 3.0, g.x(0))), g.dy(0), mid});
  g.set(0, g.emit("Where", {grad::less(g, g.x(0), grad::c(g, -3.0, g.x(0))), grad::c(g, 0.0, g.x(0)), upper}));
});
// y = x > alpha ? x : 0.  dx = dy * (x > alpha)
OT_ACTIVATION(ThresholdedRelu, 10, thresholded_relu_kernel).gradient([](GradientBuilder& g) {
  float alpha = g.node().attr_float("alpha", 1.0f);
  g.set(0, grad::where_or_zero(g, grad::greater(g, g.x(0), grad::c(g, alpha, g.x(0))), g.dy(0), g.x(0)));
});
// y = x < -l ? x + b : x > l ? x - b : 0.  dx = dy * (|x| > l)
OT_ACTIVATION(Shrink, 9, shrink_kernel).gradient([](GradientBuilder& g) {
  float lambd = g.node().attr_float("lambd", 0.5f);
  std::string outside = grad::greater(g, g.emit("Abs", {g.x(0)}), grad::c(g, lambd, g.x(0)));
  g.set(0, grad::where_or_zero(g, outside, g.dy(0), g.x(0)));
});
#undef OT_ACTIVATION

// y = clamp(x, lo, hi) = min(max(x, lo), hi).  dx = dy * (lo <= x <= hi), i.e. where y == x
// (onnxtrain.ClipGrad, one pass); dhi = sum(dy where y != x and y == hi),
// dlo = sum(dy where y != x and y != hi) (bounds as inputs)
ONNXTRAIN_OP(Clip, kOnnxDomain, 1).inputs(1, 3).outputs(1).shape(shape_same_as_input).inplace(0, 0).work(memory_bound_work)
    .cpu(clip_kernel).gradient([](GradientBuilder& g) {
      if (g.needs(0)) g.set(0, g.emit("ClipGrad", {g.dy(0), g.x(0), g.y(0)}, {}, kOnnxTrainDomain));
      if (!g.needs(1) && !g.needs(2)) return;
      std::string passed = g.emit("Equal", {g.x(0), g.y(0)});
      std::string clipped = g.emit("Not", {passed});
      std::string at_hi = g.has_input(2) ? g.emit("And", {clipped, g.emit("Equal", {g.y(0), g.x(2)})}) : "";
      if (g.needs(2)) g.set(2, g.sum_to(grad::where_or_zero(g, at_hi, g.dy(0), g.x(0)), g.x(2)));
      if (g.needs(1)) {
        std::string at_lo = at_hi.empty() ? clipped : g.emit("And", {clipped, g.emit("Not", {at_hi})});
        g.set(1, g.sum_to(grad::where_or_zero(g, at_lo, g.dy(0), g.x(0)), g.x(1)));
      }
    });
// onnxtrain.ClipGrad(dY, X, Y) = dY where Y == X (X passed the clamp), else 0; written over dY.
ONNXTRAIN_OP(ClipGrad, kOnnxTrainDomain, 1).inputs(3).outputs(1).shape([](ShapeContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(1), ctx.input_shape(1));
}).inplace(0, 0).work(memory_bound_work).cpu(clip_grad_kernel).gradient_not_implemented("second derivatives of Clip are not needed for training");

// y = x < 0 ? slope x : x.  dx = dy * (x < 0 ? slope : 1), dslope = sum_to(dy * min(x, 0), slope)
ONNXTRAIN_OP(PRelu, kOnnxDomain, 1).inputs(2).outputs(1).shape(shape_same_as_input).inplace(0, 0).work(memory_bound_work)
    .cpu(prelu_kernel).gradient([](GradientBuilder& g) {
      std::string negative = grad::less(g, g.x(0), grad::c(g, 0.0, g.x(0)));
      if (g.needs(0)) g.set(0, g.emit("Where", {negative, g.mul(g.dy(0), g.x(1)), g.dy(0)}));
      if (g.needs(1))
        g.set(1, g.sum_to(grad::where_or_zero(g, negative, g.mul(g.dy(0), g.x(0)), g.x(0)), g.x(1)));
    });

}  // namespace onnxtrain
