// Gelu and its fused gradient, both forms: approximate="none", 0.5 x (1 + erf(x / sqrt 2)), and
// approximate="tanh", 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (GPT-2's gelu_new,
// PyTorch's gelu_pytorch_tanh). The fusion pass (src/passes/fusions.cc) rewrites the patterns
// exporters emit for either (five to nine passes over memory) into one Gelu node. float and the
// half types go through core/fast_math.h (vectorised); double through the C library.
#include <cmath>

#include "ops/gradient_builder.h"
#include "core/fast_math.h"
#include "ops/common.h"
#include "ops/half_round.h"
#include "ops/registry.h"
#if ONNXTRAIN_CUDA
#include "backends/cuda/kernels.h"
#endif

namespace onnxtrain {
namespace {

inline double erf_exact(double x) { return std::erf(x); }

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

template <typename T>
ONNXTRAIN_FAST_MATH_INLINE T gelu(T x) {  // inlined into the kernels' vector loops (fast_math.h)
  using C = compute_t<T>;
  C v = C(x);
  C e = std::is_same_v<C, double> ? C(erf_exact(double(v) * kInvSqrt2)) : C(erf_abs_fast(float(v) * float(kInvSqrt2)));
  return round_to<T>(C(0.5) * v * (C(1) + e));
}

// d gelu / dx = Phi(x) + x phi(x), Phi(x) = 0.5 (1 + erf(x / sqrt 2)), phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
template <typename T>
ONNXTRAIN_FAST_MATH_INLINE T gelu_grad(T dy, T x) {
  using C = compute_t<T>;
  C v = C(x);
  C e = std::is_same_v<C, double> ? C(erf_exact(double(v) * kInvSqrt2)) : C(erf_abs_fast(float(v) * float(kInvSqrt2)));
  C cdf = C(0.5) * (C(1) + e);
  C pdf;
  if constexpr (std::is_same_v<C, float>) pdf = C(kInvSqrt2Pi) * exp_fast(C(-0.5) * v * v);
  else pdf = C(kInvSqrt2Pi) * std::exp(C(-0.5) * v * v);
  return round_to<T>(C(dy) * (cdf + v * pdf));
}

constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kGeluCoef = 0.044715;

// 0.5 x (1 + tanh u), u = sqrt(2/pi) (x + 0.044715 x^3); float: x sigmoid(2u) (fast_math.h).
template <typename T>
ONNXTRAIN_FAST_MATH_INLINE T gelu_tanh(T x) {
  using C = compute_t<T>;
  if constexpr (std::is_same_v<C, float>) {
    return round_to<T>(gelu_tanh_fast(float(x)));
  } else {
    C v = C(x);
    return T(C(0.5) * v * (C(1) + std::tanh(C(kSqrt2OverPi) * (v + C(kGeluCoef) * v * v * v))));
  }
}

// d/dx: 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), t = tanh u
template <typename T>
ONNXTRAIN_FAST_MATH_INLINE T gelu_tanh_grad(T dy, T x) {
  using C = compute_t<T>;
  if constexpr (std::is_same_v<C, float>) {
    return round_to<T>(C(dy) * gelu_tanh_grad_fast(float(x)));
  } else {
    C v = C(x);
    C t = std::tanh(C(kSqrt2OverPi) * (v + C(kGeluCoef) * v * v * v));
    C d = C(0.5) * (C(1) + t) + C(0.5) * v * (C(1) - t * t) * C(kSqrt2OverPi) * (C(1) + C(3 * kGeluCoef) * v * v);
    return T(C(dy) * d);
  }
}

// approximate: "none" (erf) or "tanh"; anything else fails by name.
bool tanh_form(const KernelContext& ctx) {
  std::string approximate = ctx.node().attr_string("approximate", "none");
  OT_CHECK(approximate == "none" || approximate == "tanh", ctx.node().context(), "approximate='", approximate,
           "' is not supported (none or tanh)");
  return approximate == "tanh";
}

void gelu_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const bool tanh = tanh_form(ctx);
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  dispatch_float(x.dtype(), [&]<typename T>() {
    // A lambda, not gelu<T> itself: a function pointer is not inlined into the parallel loop.
    if (tanh) unary_map(x.data<T>(), y.data<T>(), x.numel(), [](T v) { return gelu_tanh<T>(v); });
    else unary_map(x.data<T>(), y.data<T>(), x.numel(), [](T v) { return gelu<T>(v); });
  });
}

// GeluGrad's dY and X, which must match.
void check_gelu_grad_inputs(const KernelContext& ctx, const Tensor& dy, const Tensor& x) {
  OT_CHECK(dy.shape() == x.shape() && dy.dtype() == x.dtype(), ctx.node().context(),
           "dY and X must match, got ", shape_str(dy.shape()), " and ", shape_str(x.shape()));
}

void gelu_grad_kernel(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  check_gelu_grad_inputs(ctx, dy, x);
  const bool tanh = tanh_form(ctx);
  Tensor& dx = ctx.output(0, x.dtype(), x.shape());
  dispatch_float(x.dtype(), [&]<typename T>() {
    const T* pdy = dy.data<T>();
    const T* px = x.data<T>();
    T* pdx = dx.data<T>();
    // The pointers copied in, so GCC knows they stay put and vectorises the loops.
    parallel_for(x.numel(), kElementwiseGrain, [pdy, px, pdx, tanh](int64_t b, int64_t e) {
      if (tanh) for (int64_t i = b; i < e; ++i) pdx[i] = gelu_tanh_grad<T>(pdy[i], px[i]);
      else for (int64_t i = b; i < e; ++i) pdx[i] = gelu_grad<T>(pdy[i], px[i]);
    });
  });
}

#if ONNXTRAIN_CUDA
// On CUDA tensors: the elementwise family's kGelu / kGeluTanh and their gradients (erff, expf and
// tanhf in float); float64 runs on the host.
bool gelu_on_device(DType dt) { return dt == DType::kFloat32 || dt == DType::kFloat16 || dt == DType::kBFloat16; }

void gelu_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const bool tanh = tanh_form(ctx);
  if (!gelu_on_device(x.dtype())) return run_on_host(ctx, "dtype " + dtype_name(x.dtype()));
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  cuda::unary(tanh ? cuda::Unary::kGeluTanh : cuda::Unary::kGelu, x.dtype(), x.data(), x.shape(), y.data(), y.shape(),
              ctx.stream());
}

void gelu_grad_cuda(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  check_gelu_grad_inputs(ctx, dy, x);
  const bool tanh = tanh_form(ctx);
  if (!gelu_on_device(x.dtype())) return run_on_host(ctx, "dtype " + dtype_name(x.dtype()));
  Tensor& dx = ctx.output(0, x.dtype(), x.shape());
  cuda::binary(tanh ? cuda::Binary::kGeluTanhGrad : cuda::Binary::kGeluGrad, x.dtype(), dy.data(), dy.shape(), x.data(),
               x.shape(), dx.data(), dx.shape(), ctx.stream());
}
#endif

void gelu_gradient(GradientBuilder& g) {
  // y = gelu(x).  dx = dy * (Phi(x) + x phi(x))                                  (approximate none)
  //              dx = dy * (s + x s (1 - s) v'), s = sigmoid(v), v = 2u         (approximate tanh)
  std::string approximate = g.node().attr_string("approximate", "none");
  GraphBuilder::Attrs attrs;
  if (approximate != "none") attrs.emplace("approximate", Attribute::of(approximate));
  g.set(0, g.emit("GeluGrad", {g.dy(0), g.x(0)}, attrs, kOnnxTrainDomain));
}

}  // namespace

ONNXTRAIN_OP(Gelu, kOnnxTrainDomain, 1).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .cpu(gelu_kernel).cuda(OT_CUDA(gelu_cuda)).gradient(gelu_gradient);
// ai.onnx added Gelu in opset 20; models of that opset run the same kernel.
ONNXTRAIN_OP(Gelu, kOnnxDomain, 20).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .cpu(gelu_kernel).cuda(OT_CUDA(gelu_cuda)).gradient(gelu_gradient);
// dX = GeluGrad(dY, X) is itself differentiable in principle; second derivatives are not needed yet.
ONNXTRAIN_OP(GeluGrad, kOnnxTrainDomain, 1).inputs(2).outputs(1).shape([](ShapeContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(1), ctx.input_shape(1));
}).inplace(0, 0).cpu(gelu_grad_kernel).cuda(OT_CUDA(gelu_grad_cuda)).gradient_not_implemented("second derivatives of Gelu are not needed for training");
// ONNX Runtime's names (its contrib op and its training artifacts' backward): the erf form, no attributes.
ONNXTRAIN_OP(Gelu, kMsDomain, 1).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .cpu(gelu_kernel).cuda(OT_CUDA(gelu_cuda)).gradient(gelu_gradient);
ONNXTRAIN_OP(GeluGrad, kMsDomain, 1).inputs(2).outputs(1).shape([](ShapeContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(1), ctx.input_shape(1));
}).inplace(0, 0).cpu(gelu_grad_kernel).cuda(OT_CUDA(gelu_grad_cuda)).gradient_not_implemented("second derivatives of Gelu are not needed for training");

}  // namespace onnxtrain
