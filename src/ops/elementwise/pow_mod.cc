// Pow (base and exponent may differ in dtype; the output has the base's) and Mod (C fmod or
// Python's sign-of-divisor remainder).
#include <cmath>

#include "ops/elementwise/elementwise.h"

namespace onnxtrain {

namespace grad = elementwise::grad;
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
    unary_map(y.data<U>(), t.data<E>(), y.numel(), [](U v) { return cast_value<E>(v); });
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
          return saturate_to_int<T>(std::pow(double(b), p));
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

// z = x^y.  dx = sum_to(dz * y * x^(y-1), x), dy = sum_to(dz * z * log(x), y)  (0 where x == 0)
ONNXTRAIN_OP(Pow, kOnnxDomain, 7).inputs(2).outputs(1).shape(shape_broadcast_inputs).inplace(0, 0).inplace(0, 1)
    .cpu(pow_kernel).gradient([](GradientBuilder& g) {
      const std::string& x = g.x(0);
      if (g.needs(0)) {
        // The exponent may be an integer: bring it to the base's dtype first.
        std::string e = g.x(1);
        DType xt = g.dtype(x), et = g.dtype(e);
        if (xt == DType::kUndefined || et == DType::kUndefined) e = g.emit("CastLike", {e, x});
        else if (xt != et) e = g.emit("Cast", {e}, {{"to", Attribute::of(int64_t(xt))}});
        std::string d = g.mul(g.mul(g.dy(0), e), g.emit("Pow", {x, g.sub(e, grad::c(g, 1.0, x))}));
        g.set(0, g.sum_to(d, x));
      }
      if (g.needs(1)) {
        std::string zero = grad::c(g, 0.0, x);
        std::string d = g.mul(g.mul(g.dy(0), g.y(0)), g.emit("Log", {x}));
        g.set(1, g.sum_to(g.emit("Where", {g.emit("Equal", {x, zero}), zero, d}), g.x(1)));
      }
    });
// z = a mod b.  da = sum_to(dz, a), db = -sum_to(dz * (fmod ? trunc(a / b) : floor(a / b)), b)
ONNXTRAIN_OP(Mod, kOnnxDomain, 10).inputs(2).outputs(1).shape(shape_broadcast_inputs).inplace(0, 0).inplace(0, 1)
    .cpu(mod_kernel).gradient([](GradientBuilder& g) {
      if (g.needs(0)) g.set(0, g.sum_to(g.dy(0), g.x(0)));
      if (g.needs(1)) {
        // a = k b + z with k = trunc(a / b) (fmod) or floor(a / b): k = (a - z) / b, rounded to the
        // integer it is up to rounding error.
        const std::string& a = g.x(0);
        std::string k = g.emit("Floor", {g.add(g.div(g.sub(a, g.y(0)), g.x(1)), grad::c(g, 0.5, a))});
        g.set(1, g.neg(g.sum_to(g.mul(g.dy(0), k), g.x(1))));
      }
    });

}  // namespace onnxtrain
