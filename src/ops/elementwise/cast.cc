// Cast (to the dtype in attribute `to`) and CastLike (to input 1's dtype) between every numeric
// dtype and bool. Floats into integers saturate and NaN gives 0; integers into narrower integers
// wrap; strings are not supported.
#include <cstring>

#include "ops/elementwise/elementwise.h"

namespace onnxtrain {
namespace {

void check_castable(const Node& node, DType dt, const char* what) {
  if (dt == DType::kString)
    OT_THROW(kNotImplemented, node.context(), "string tensors are not supported (", what, ")");
  if (!dtype_supported(dt))
    OT_THROW(kNotImplemented, node.context(), "cast with ", what, " of ONNX dtype ", int(dt), " is not supported");
}

void cast_to(KernelContext& ctx, DType to) {
  const Tensor& x = ctx.input(0);
  check_castable(ctx.node(), x.dtype(), "the input");
  check_castable(ctx.node(), to, "the target");
  Tensor& y = ctx.output(0, to, x.shape());
  if (x.dtype() == to) {
    if (x.data() != y.data() && x.numel() > 0) std::memcpy(y.data(), x.data(), x.nbytes());
    return;
  }
  // fp32 <-> bf16, the casts mixed precision inserts: bit operations the compiler vectorises
  // (round to nearest even, NaN kept quiet), the same results as bfloat16(float).
  if (x.dtype() == DType::kFloat32 && to == DType::kBFloat16) {
    const uint32_t* src = static_cast<const uint32_t*>(x.data());
    uint16_t* dst = static_cast<uint16_t*>(y.data());
    unary_map(src, dst, x.numel(), [](uint32_t b) {
      const bool nan = (b & 0x7fffffffu) > 0x7f800000u;
      return uint16_t(nan ? (b >> 16) | 0x40u : (b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
    });
    return;
  }
  if (x.dtype() == DType::kBFloat16 && to == DType::kFloat32) {
    unary_map(static_cast<const uint16_t*>(x.data()), static_cast<uint32_t*>(y.data()), x.numel(),
              [](uint16_t b) { return uint32_t(b) << 16; });
    return;
  }
  dispatch_all(x.dtype(), [&]<typename From>() {
    dispatch_all(to, [&]<typename To>() {
      unary_map(x.data<From>(), y.data<To>(), x.numel(), [](From v) { return cast_value<To>(v); });
    });
  });
}

DType attr_to(const Node& node) {
  OT_CHECK(node.has_attr("to"), node.context(), "attribute 'to' is required");
  DType to = DType(int32_t(node.attr_int("to", 0)));
  check_castable(node, to, "the target");
  return to;
}

void cast_kernel(KernelContext& ctx) { cast_to(ctx, attr_to(ctx.node())); }
void cast_like_kernel(KernelContext& ctx) { cast_to(ctx, ctx.input(1).dtype()); }

}  // namespace

// y = cast(x, to).  dx = cast(dy, dtype(x)) for float-to-float casts; none through integers or bool
ONNXTRAIN_OP(Cast, kOnnxDomain, 6).inputs(1).outputs(1).inplace(0, 0).work(memory_bound_work)
    .shape([](ShapeContext& ctx) { ctx.set_output(0, attr_to(ctx.node()), ctx.input_shape(0)); })
    .cpu(cast_kernel).gradient([](GradientBuilder& g) {
      // Autodiff only asks for float inputs; a gradient reaches Y only when Y is float too.
      DType in = g.dtype(g.x(0));
      if (!is_floating(DType(int32_t(g.node().attr_int("to", 0))))) {
        g.set(0, g.zeros_like(g.x(0)));  // no gradient through integers or bool
      } else if (in == DType::kUndefined) {
        g.set(0, g.emit("CastLike", {g.dy(0), g.x(0)}));
      } else {
        g.set(0, g.emit("Cast", {g.dy(0)}, {{"to", Attribute::of(int64_t(in))}}));
      }
    });
// y = cast(x, dtype(t)).  dx = cast(dy, dtype(x)); t gets none
ONNXTRAIN_OP(CastLike, kOnnxDomain, 15).inputs(2).outputs(1).inplace(0, 0)
    .shape([](ShapeContext& ctx) { ctx.set_output(0, ctx.input_dtype(1), ctx.input_shape(0)); })
    .cpu(cast_like_kernel).gradient([](GradientBuilder& g) {
      DType target = g.dtype(g.x(1));
      if (g.needs(0)) {
        if (target != DType::kUndefined && !is_floating(target)) g.set(0, g.zeros_like(g.x(0)));
        else g.set(0, g.emit("CastLike", {g.dy(0), g.x(0)}));
      }
      if (g.needs(1)) g.set(1, g.zeros_like(g.x(1)));  // only its dtype is used
    });

}  // namespace onnxtrain
