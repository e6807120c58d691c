// Comparisons (bool outputs, numpy broadcasting), boolean logic, IsNaN / IsInf and BitShift.
// None of these carry a gradient: their outputs are bools or integers.
#include <cmath>

#include "ops/elementwise/elementwise.h"

namespace onnxtrain {
namespace {

void check_same_dtype(const KernelContext& ctx, const Tensor& a, const Tensor& b) {
  OT_CHECK(a.dtype() == b.dtype(), ctx.node().context(), "inputs must share a dtype, got ",
           dtype_name(a.dtype()), " and ", dtype_name(b.dtype()));
}

struct EqualFn { template <typename C> static bool apply(C x, C y) { return x == y; } };
struct GreaterFn { template <typename C> static bool apply(C x, C y) { return x > y; } };
struct GreaterOrEqualFn { template <typename C> static bool apply(C x, C y) { return x >= y; } };
struct LessFn { template <typename C> static bool apply(C x, C y) { return x < y; } };
struct LessOrEqualFn { template <typename C> static bool apply(C x, C y) { return x <= y; } };

template <typename Fn, bool kWithBool>
void compare_kernel(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  check_same_dtype(ctx, a, b);
  Tensor& out = ctx.output(0, DType::kBool, broadcast_shapes(ctx.node(), a.shape(), b.shape()));
  auto body = [&]<typename T>() {
    using C = compute_t<T>;
    binary_broadcast<T, T, bool>(a, b, out, [](T x, T y) { return Fn::apply(C(x), C(y)); });
  };
  if constexpr (kWithBool) dispatch_all(a.dtype(), body);
  else dispatch_numeric(a.dtype(), body);
}

struct AndFn { static bool apply(bool x, bool y) { return x && y; } };
struct OrFn { static bool apply(bool x, bool y) { return x || y; } };
struct XorFn { static bool apply(bool x, bool y) { return x != y; } };

template <typename Fn>
void logic_kernel(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  OT_CHECK(a.dtype() == DType::kBool && b.dtype() == DType::kBool, ctx.node().context(),
           "inputs must be bool, got ", dtype_name(a.dtype()), " and ", dtype_name(b.dtype()));
  Tensor& out = ctx.output(0, DType::kBool, broadcast_shapes(ctx.node(), a.shape(), b.shape()));
  binary_broadcast<bool, bool, bool>(a, b, out, [](bool x, bool y) { return Fn::apply(x, y); });
}

void not_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  OT_CHECK(x.dtype() == DType::kBool, ctx.node().context(), "input must be bool, got ", dtype_name(x.dtype()));
  Tensor& y = ctx.output(0, DType::kBool, x.shape());
  unary_map(x.data<bool>(), y.data<bool>(), x.numel(), [](bool v) { return !v; });
}

void isnan_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0, DType::kBool, x.shape());
  dispatch_float(x.dtype(), [&]<typename T>() {
    unary_map(x.data<T>(), y.data<bool>(), x.numel(), [](T v) { return std::isnan(compute_t<T>(v)); });
  });
}

void isinf_kernel(KernelContext& ctx) {
  bool pos = ctx.node().attr_int("detect_positive", 1) != 0;
  bool neg = ctx.node().attr_int("detect_negative", 1) != 0;
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0, DType::kBool, x.shape());
  dispatch_float(x.dtype(), [&]<typename T>() {
    unary_map(x.data<T>(), y.data<bool>(), x.numel(), [=](T v) {
      compute_t<T> c = v;
      return std::isinf(c) && (c > 0 ? pos : neg);
    });
  });
}

// Unsigned shifts; a shift by the bit width or more gives 0 (plain C++ would be undefined).
void bitshift_kernel(KernelContext& ctx) {
  std::string direction = ctx.node().attr_string("direction", "");
  OT_CHECK(direction == "LEFT" || direction == "RIGHT", ctx.node().context(),
           "direction must be \"LEFT\" or \"RIGHT\", got \"", direction, "\"");
  bool left = direction == "LEFT";
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  check_same_dtype(ctx, a, b);
  OT_CHECK(a.dtype() == DType::kUint8 || a.dtype() == DType::kUint16 || a.dtype() == DType::kUint32 ||
               a.dtype() == DType::kUint64,
           ctx.node().context(), "inputs must be unsigned integers, got ", dtype_name(a.dtype()));
  Tensor& out = ctx.output(0, a.dtype(), broadcast_shapes(ctx.node(), a.shape(), b.shape()));
  dispatch_integer(a.dtype(), [&]<typename T>() {
    if constexpr (std::is_unsigned_v<T>) {
      constexpr T kBits = T(sizeof(T) * 8);
      if (left)
        binary_broadcast<T, T, T>(a, b, out, [](T x, T s) { return s >= kBits ? T(0) : T(x << s); });
      else
        binary_broadcast<T, T, T>(a, b, out, [](T x, T s) { return s >= kBits ? T(0) : T(x >> s); });
    }
  });
}

}  // namespace

#define OT_COMPARE(OP, SINCE, FN, WITH_BOOL)                                                          \
  ONNXTRAIN_OP(OP, kOnnxDomain, SINCE).inputs(2).outputs(1).shape(shape_broadcast_to_bool).not_differentiable() \
      .cpu(compare_kernel<FN, WITH_BOOL>)
OT_COMPARE(Equal, 7, EqualFn, true);
OT_COMPARE(Greater, 7, GreaterFn, false);
OT_COMPARE(GreaterOrEqual, 12, GreaterOrEqualFn, false);
OT_COMPARE(Less, 7, LessFn, false);
OT_COMPARE(LessOrEqual, 12, LessOrEqualFn, false);
#undef OT_COMPARE

#define OT_LOGIC(OP, FN)                                                                              \
  ONNXTRAIN_OP(OP, kOnnxDomain, 7).inputs(2).outputs(1).shape(shape_broadcast_to_bool).not_differentiable() \
      .inplace(0, 0).inplace(0, 1).cpu(logic_kernel<FN>)
OT_LOGIC(And, AndFn);
OT_LOGIC(Or, OrFn);
OT_LOGIC(Xor, XorFn);
#undef OT_LOGIC

ONNXTRAIN_OP(Not, kOnnxDomain, 1).inputs(1).outputs(1).shape(shape_same_as_input).not_differentiable()
    .inplace(0, 0).cpu(not_kernel);
ONNXTRAIN_OP(IsNaN, kOnnxDomain, 9).inputs(1).outputs(1)
    .shape([](ShapeContext& ctx) { ctx.set_output(0, DType::kBool, ctx.input_shape(0)); })
    .not_differentiable().cpu(isnan_kernel);
ONNXTRAIN_OP(IsInf, kOnnxDomain, 10).inputs(1).outputs(1)
    .shape([](ShapeContext& ctx) { ctx.set_output(0, DType::kBool, ctx.input_shape(0)); })
    .not_differentiable().cpu(isinf_kernel);
ONNXTRAIN_OP(BitShift, kOnnxDomain, 11).inputs(2).outputs(1).shape(shape_broadcast_inputs).not_differentiable()
    .inplace(0, 0).inplace(0, 1).cpu(bitshift_kernel);

}  // namespace onnxtrain
