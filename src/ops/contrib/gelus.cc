// The GELU variants of ONNX Runtime's contrib ops (com.microsoft):
//   FastGelu(X, bias?)  y = 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))), v = X + bias (bias: last dim)
//   BiasGelu(A, B)      y = gelu(A + B), the exact erf form (B: last dim)
//   QuickGelu(X)        y = X sigmoid(alpha X), alpha default 1.702
// Gradients: FastGelu and QuickGelu through fused elementwise grads here; BiasGelu through
// onnxtrain.GeluGrad (src/ops/fused/gelu.cc); bias gradients by sum_to. float FastGelu and its
// gradient run core/fast_math.h's vectorised tanh-GELU; the rest computes in double.
#include <algorithm>
#include <cmath>

#include "core/fast_math.h"
#include "ops/contrib/contrib.h"
#include "ops/gradient_builder.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kCoef = 0.044715;

// v = x (+ bias broadcast along the last dim), through fn(v) into y. fn takes and returns the
// compute type: double, or the input's own where `Fast` (float FastGelu).
template <bool Fast = false, typename F>
void biased_unary(KernelContext& ctx, const char* bias_name, F fn) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  dispatch_f32_f64(node, x.dtype(), [&]<typename T>() {
    const T* bias = nullptr;
    int64_t nb = 1;
    if (ctx.has_input(1)) {
      const Tensor& b = ctx.input(1);
      nb = b.numel();
      OT_CHECK(b.dtype() == x.dtype() && x.rank() >= 1 && b.rank() >= 1 && b.dim(-1) == x.dim(-1) && nb == x.dim(-1),
               node.context(), "expected ", bias_name, " of shape [", x.rank() ? x.dim(-1) : 0, "] (the last dim), got ",
               shape_str(b.shape()));
      bias = b.data<T>();
    }
    Tensor& y = ctx.output(0, x.dtype(), x.shape());
    const T* px = x.data<T>();
    T* py = y.data<T>();
    using C = std::conditional_t<Fast, T, double>;
    // The pointers copied in: read through references, GCC cannot prove they stay put and the
    // loop stays scalar.
    parallel_for(x.numel(), kElementwiseGrain, [px, py, bias, nb, fn](int64_t b, int64_t e) {
      if (!bias) {
        for (int64_t i = b; i < e; ++i) py[i] = T(fn(C(px[i])));
        return;
      }
      for (int64_t i = b; i < e;) {  // a run within one row, so the inner loop vectorises
        const int64_t j = i % nb, n = std::min(e - i, nb - j);
        for (int64_t k = 0; k < n; ++k) py[i + k] = T(fn(C(px[i + k]) + C(bias[j + k])));
        i += n;
      }
    });
  });
}

// Elementwise grad kernels: dX = dY * f'(X), f' over double (or the input's type where `Fast`).
template <bool Fast = false, typename F>
void elementwise_grad(KernelContext& ctx, F dfn) {
  const Node& node = ctx.node();
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  OT_CHECK(dy.shape() == x.shape() && dy.dtype() == x.dtype(), node.context(), "expected dY and X of one shape, got ",
           shape_str(dy.shape()), " and ", shape_str(x.shape()));
  dispatch_f32_f64(node, x.dtype(), [&]<typename T>() {
    Tensor& dx = ctx.output(0, x.dtype(), x.shape());
    const T *pg = dy.data<T>(), *px = x.data<T>();
    T* pd = dx.data<T>();
    parallel_for(x.numel(), kElementwiseGrain, [pg, px, pd, dfn](int64_t b, int64_t e) {  // copied: see above
      using C = std::conditional_t<Fast, T, double>;
      for (int64_t i = b; i < e; ++i) pd[i] = T(C(pg[i]) * dfn(C(px[i])));
    });
  });
}

double fast_gelu(double v) { return 0.5 * v * (1.0 + std::tanh(kSqrt2OverPi * (v + kCoef * v * v * v))); }
// d/dv: 0.5 (1 + t) + 0.5 v (1 - t^2) sqrt(2/pi) (1 + 3 c v^2), t = tanh(sqrt(2/pi) (v + c v^3))
double fast_gelu_grad(double v) {
  double t = std::tanh(kSqrt2OverPi * (v + kCoef * v * v * v));
  return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 3.0 * kCoef * v * v);
}

// float: x sigmoid(2u), the same function (core/fast_math.h); double: the formulas above.
template <typename C>
ONNXTRAIN_FAST_MATH_INLINE C fast_gelu_of(C v) {
  if constexpr (std::is_same_v<C, float>) return gelu_tanh_fast(v);
  else return fast_gelu(v);
}
template <typename C>
ONNXTRAIN_FAST_MATH_INLINE C fast_gelu_grad_of(C v) {
  if constexpr (std::is_same_v<C, float>) return gelu_tanh_grad_fast(v);
  else return fast_gelu_grad(v);
}
void fast_gelu_kernel(KernelContext& ctx) {
  biased_unary<true>(ctx, "bias", [](auto v) { return fast_gelu_of(v); });
}
void fast_gelu_grad_kernel(KernelContext& ctx) {
  elementwise_grad<true>(ctx, [](auto v) { return fast_gelu_grad_of(v); });
}

void bias_gelu_kernel(KernelContext& ctx) {
  biased_unary(ctx, "B", [](double v) { return 0.5 * v * (1.0 + std::erf(v * 0.70710678118654752440)); });
}

void quick_gelu_kernel(KernelContext& ctx) {
  double a = ctx.node().attr_float("alpha", 1.702f);
  biased_unary(ctx, "bias", [a](double v) { return v / (1.0 + std::exp(-a * v)); });
}
// d/dx x s(ax) = s + a x s (1 - s)
void quick_gelu_grad_kernel(KernelContext& ctx) {
  double a = ctx.node().attr_float("alpha", 1.702f);
  elementwise_grad(ctx, [a](double v) {
    double s = 1.0 / (1.0 + std::exp(-a * v));
    return s + a * v * s * (1.0 - s);
  });
}

// v = x + bias: the value the activation saw (the bias broadcast along the last dim).
std::string biased(GradientBuilder& g) { return g.has_input(1) ? g.add(g.x(0), g.x(1)) : g.x(0); }

// y = fast_gelu(x + bias).  dx = dy f'(v), dbias = sum_to(dx, bias)
void fast_gelu_gradient(GradientBuilder& g) {
  std::string dv = g.emit("FastGeluGrad", {g.dy(0), biased(g)}, {}, kOnnxTrainDomain);
  if (g.needs(0)) g.set(0, dv);
  if (g.has_input(1) && g.needs(1)) g.set(1, g.sum_to(dv, g.x(1)));
}

// y = gelu(a + b).  da = GeluGrad(dy, a + b), db = sum_to(da, b)
void bias_gelu_gradient(GradientBuilder& g) {
  std::string dv = g.emit("GeluGrad", {g.dy(0), biased(g)}, {}, kOnnxTrainDomain);
  if (g.needs(0)) g.set(0, g.sum_to(dv, g.x(0)));
  if (g.needs(1)) g.set(1, g.sum_to(dv, g.x(1)));
}

// y = x sigmoid(alpha x).  dx = dy (s + alpha x s (1 - s))
void quick_gelu_gradient(GradientBuilder& g) {
  GraphBuilder::Attrs attrs{{"alpha", Attribute::of(g.node().attr_float("alpha", 1.702f))}};
  g.set(0, g.emit("QuickGeluGrad", {g.dy(0), g.x(0)}, attrs, kOnnxTrainDomain));
}

void grad_shape(ShapeContext& ctx) { ctx.set_output(0, ctx.input_dtype(1), ctx.input_shape(1)); }

}  // namespace

ONNXTRAIN_OP(FastGelu, kMsDomain, 1).inputs(1, 2).outputs(1).shape(shape_same_as_input).cpu(fast_gelu_kernel)
    .gradient(fast_gelu_gradient);
ONNXTRAIN_OP(BiasGelu, kMsDomain, 1).inputs(2).outputs(1).shape(shape_same_as_input).cpu(bias_gelu_kernel)
    .gradient(bias_gelu_gradient);
ONNXTRAIN_OP(QuickGelu, kMsDomain, 1).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .cpu(quick_gelu_kernel).gradient(quick_gelu_gradient);
// dX = FastGeluGrad(dY, V) / QuickGeluGrad(dY, X); second derivatives are not needed.
ONNXTRAIN_OP(FastGeluGrad, kOnnxTrainDomain, 1).inputs(2).outputs(1).shape(grad_shape).cpu(fast_gelu_grad_kernel)
    .gradient_not_implemented("second derivatives are not needed for training");
// ONNX Runtime's training artifacts: FastGeluGrad(dY, X), the same op.
ONNXTRAIN_OP(FastGeluGrad, kMsDomain, 1).inputs(2).outputs(1).shape(grad_shape).cpu(fast_gelu_grad_kernel)
    .gradient_not_implemented("second derivatives are not needed for training");
ONNXTRAIN_OP(QuickGeluGrad, kOnnxTrainDomain, 1).inputs(2).outputs(1).shape(grad_shape).cpu(quick_gelu_grad_kernel)
    .gradient_not_implemented("second derivatives are not needed for training");

}  // namespace onnxtrain
