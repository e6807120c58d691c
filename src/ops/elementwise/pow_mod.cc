// Pow (base and exponent may differ in dtype; the output has the base's) and Mod (C fmod or
// Python's sign-of-divisor remainder).
#include <cmath>

#include "ops/elementwise/elementwise.h"

namespace onnxtrain {
namespace {

using elementwise::wrapping_mul;

// base^e for integers by squaring, wrapping on overflow. A negative exponent truncates 1/base^|e|
// toward zero: 1 and -1 keep their value (by parity), every other base gives 0.
template <typename T, typename E>
T int_pow(T base, E e) {
  if constexpr (std::is_signed_v<E>) {
    if (e < 0) {
      if (base == T(1)) return T(1);
      if constexpr (std::is_signed_v<T>)
        if (base == T(-1)) return (e % 2 == 0) ? T(1) : T(-1);
      return T(0);
    }
  }
  T result = T(1);
  while (e != 0) {
    if (e & 1) result = wrapping_mul(result, base);
    e = E(e >> 1);
    if (e != 0) base = wrapping_mul(base, base);
  }
  return result;
}

// The exponent converted to E (int64 or double) in a temporary, when its dtype differs from the base's.
template <typename E>
Tensor exponent_as(const Tensor& y) {
  Tensor t = Tensor::empty(dtype_v<E>, y.shape());
  dispatch_numeric(y.dtype(), [&]<typename U>() {
    unary_map(y.data<U>(), t.data<E>(), y.numel(), [](U v) { return elementwise::convert<E>(v); });
  });
  return t;
}

void pow_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& y = ctx.input(1);
  Tensor& out = ctx.output(0, x.dtype(), broadcast_shapes(ctx.node(), x.shape(), y.shape()));
  dispatch_numeric(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    if constexpr (std::is_integral_v<T>) {
      if (is_integer(y.dtype())) {
        if (y.dtype() == x.dtype()) {
          binary_broadcast<T, T, T>(x, y, out, [](T b, T e) { return int_pow(b, e); });
        } else {
          Tensor e = exponent_as<int64_t>(y);
          binary_broadcast<T, int64_t, T>(x, e, out, [](T b, int64_t n) { return int_pow(b, n); });
        }
      } else {
        Tensor e = exponent_as<double>(y);
        binary_broadcast<T, double, T>(x, e, out, [](T b, double p) {
          return elementwise::saturate_to_int<T>(std::pow(double(b), p));
        });
      }
    } else if (y.dtype() == x.dtype()) {
      // The common square: one multiply. A one-element exponent leaves the element count alone.
      if (y.numel() == 1 && C(y.data<T>()[0]) == C(2)) {
        unary_map(x.data<T>(), out.data<T>(), x.numel(), [](T b) { return T(C(b) * C(b)); });
        return;
      }
      binary_broadcast<T, T, T>(x, y, out, [](T b, T p) { return T(std::pow(C(b), C(p))); });
    } else {  // float base, other exponent dtype: as numpy, in double
      Tensor e = exponent_as<double>(y);
      binary_broadcast<T, double, T>(x, e, out, [](T b, double p) { return T(C(std::pow(double(C(b)), p))); });
    }
  });
}

void mod_kernel(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  OT_CHECK(a.dtype() == b.dtype(), ctx.node().context(), "inputs must share a dtype, got ",
           dtype_name(a.dtype()), " and ", dtype_name(b.dtype()));
  bool fmod = ctx.node().attr_int("fmod", 0) != 0;
  Tensor& out = ctx.output(0, a.dtype(), broadcast_shapes(ctx.node(), a.shape(), b.shape()));
  dispatch_numeric(a.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    if constexpr (std::is_floating_point_v<C>) {
      // fmod=1: C fmod (sign of the dividend). fmod=0 (ONNX asks for 1 with floats): numpy's mod,
      // sign of the divisor.
      if (fmod) {
        binary_broadcast<T, T, T>(a, b, out, [](T x, T y) { return T(std::fmod(C(x), C(y))); });
      } else {
        binary_broadcast<T, T, T>(a, b, out, [](T x, T y) {
          C r = std::fmod(C(x), C(y));
          if (r != C(0) && ((r < C(0)) != (C(y) < C(0)))) r += C(y);
          return T(r);
        });
      }
    } else if constexpr (std::is_unsigned_v<T>) {
      binary_broadcast<T, T, T>(a, b, out, [](T x, T y) { return y == 0 ? T(0) : T(x % y); });
    } else {
      // x % 0 gives 0 (as numpy) and x % -1 is 0 (avoids min % -1 overflow).
      if (fmod) {
        binary_broadcast<T, T, T>(a, b, out, [](T x, T y) { return y == 0 || y == T(-1) ? T(0) : T(x % y); });
      } else {
        binary_broadcast<T, T, T>(a, b, out, [](T x, T y) {
          if (y == 0 || y == T(-1)) return T(0);
          T r = T(x % y);
          if (r != 0 && ((r < 0) != (y < 0))) r = T(r + y);
          return r;
        });
      }
    }
  });
}

}  // namespace

// z = x^y.  dx = sum_to(dz * y * x^(y-1), x), dy = sum_to(dz * z * log(x), y)
ONNXTRAIN_OP(Pow, kOnnxDomain, 7).inputs(2).outputs(1).shape(shape_broadcast_inputs).inplace(0, 0).inplace(0, 1)
    .cpu(pow_kernel);
// z = a mod b.  da = sum_to(dz, a), db = -sum_to(dz * (fmod ? trunc(a / b) : floor(a / b)), b)
ONNXTRAIN_OP(Mod, kOnnxDomain, 10).inputs(2).outputs(1).shape(shape_broadcast_inputs).inplace(0, 0).inplace(0, 1)
    .cpu(mod_kernel);

}  // namespace onnxtrain
