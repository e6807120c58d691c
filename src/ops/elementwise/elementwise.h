// Helpers shared by the elementwise op files: unary drivers over float / numeric dtypes, wrapping
// integer arithmetic without undefined behaviour, and saturating float-to-integer conversion.
#pragma once

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ops/gradient_builder.h"
#include "ops/common.h"
#include "ops/registry.h"
#if ONNXTRAIN_CUDA
#include "backends/cuda/kernels.h"
#endif

namespace onnxtrain::elementwise {

// y = op(x) over the float dtypes; op is a generic callable taking and returning compute_t<T>
// (float for the half types). Output 0 has the input's dtype and shape.
template <typename Op>
void float_unary(KernelContext& ctx, Op op) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  dispatch_float(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    unary_map(x.data<T>(), y.data<T>(), x.numel(), [&](T v) { return T(op(C(v))); });
  });
}

// Integer arithmetic that wraps modulo 2^bits instead of overflowing (signed overflow is UB).
template <typename T>
using wrap_t = std::make_unsigned_t<std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>>;

template <typename T>
inline T wrapping_neg(T v) {
  if constexpr (std::is_integral_v<T>) return T(wrap_t<T>(0) - wrap_t<T>(v));
  else return -v;
}

template <typename T>
inline T wrapping_mul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    // At least unsigned int, so narrow types do not promote to (overflowing) signed int.
    using W = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, wrap_t<T>>;
    return T(wrap_t<T>(W(wrap_t<T>(a)) * W(wrap_t<T>(b))));
  } else {
    return a * b;
  }
}

// The first element of a one-element tensor of dtype T (Clip bounds, Pow fast paths).
template <typename T>
inline T scalar_of(const KernelContext& ctx, size_t i, const char* what) {
  const Tensor& t = ctx.input(i);
  OT_CHECK(t.dtype() == dtype_v<T>, ctx.node().context(), what, " must have the input's dtype ",
           dtype_name(dtype_v<T>), ", got ", dtype_name(t.dtype()));
  OT_CHECK(t.numel() == 1, ctx.node().context(), what, " must be a scalar, got shape ", shape_str(t.shape()));
  return t.data<T>()[0];
}

// Gradient-rule helpers. Constants take their dtype from a forward value (`like`), whose dtype
// shape inference knows, so no CastLike (opset 15) is needed for older models.
namespace grad {

inline std::string c(GradientBuilder& g, double v, const std::string& like) { return g.scalar_like(v, like); }
// cond ? a : 0
inline std::string where_or_zero(GradientBuilder& g, const std::string& cond, const std::string& a,
                                 const std::string& like) {
  return g.emit("Where", {cond, a, g.scalar_like(0.0, like)});
}
inline std::string less(GradientBuilder& g, const std::string& a, const std::string& b) { return g.emit("Less", {a, b}); }
inline std::string greater(GradientBuilder& g, const std::string& a, const std::string& b) {
  return g.emit("Greater", {a, b});
}
inline std::string square(GradientBuilder& g, const std::string& a) { return g.mul(a, a); }
// dx = dy * f for a unary op whose input 0 is x.
inline void set_unary(GradientBuilder& g, const std::string& factor) { g.set(0, g.mul(g.dy(0), factor)); }

}  // namespace grad

#if ONNXTRAIN_CUDA
// The CUDA kernels of the elementwise ops: backends/cuda/elementwise.cu's one broadcasting family.
// Dtypes it does not compute run on the host (run_on_host).
template <cuda::Binary kOp>
void binary_cuda(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  OT_CHECK(a.dtype() == b.dtype(), ctx.node().context(), "inputs must share a dtype, got ", dtype_name(a.dtype()),
           " and ", dtype_name(b.dtype()));
  if (!cuda::elementwise_supports(a.dtype())) return run_on_host(ctx, "dtype " + dtype_name(a.dtype()));
  Tensor& out = ctx.output(0, a.dtype(), broadcast_shapes(ctx.node(), a.shape(), b.shape()));
  cuda::binary(kOp, a.dtype(), a.data(), a.shape(), b.data(), b.shape(), out.data(), out.shape(), ctx.stream());
}
template <cuda::Unary kOp>
void unary_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const bool integer_ok = kOp == cuda::Unary::kNeg || kOp == cuda::Unary::kAbs || kOp == cuda::Unary::kRelu;
  if (!cuda::elementwise_supports(x.dtype()) || (is_integer(x.dtype()) && !integer_ok))
    return run_on_host(ctx, "dtype " + dtype_name(x.dtype()));
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  cuda::unary(kOp, x.dtype(), x.data(), x.shape(), y.data(), y.shape(), ctx.stream());
}
#endif

}  // namespace onnxtrain::elementwise
