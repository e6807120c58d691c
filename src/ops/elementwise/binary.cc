// Broadcasting binary arithmetic: Add, Sub, Mul, Div.
#include "ops/elementwise/elementwise.h"
#include "ops/half_round.h"

namespace onnxtrain {
namespace {

template <typename Fn>
void arithmetic_kernel(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  OT_CHECK(a.dtype() == b.dtype(), ctx.node().context(), "inputs must share a dtype, got ",
           dtype_name(a.dtype()), " and ", dtype_name(b.dtype()));
  Tensor& out = ctx.output(0, a.dtype(), broadcast_shapes(ctx.node(), a.shape(), b.shape()));
  dispatch_numeric(a.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    binary_broadcast<T, T, T>(a, b, out, [](T x, T y) { return round_to<T>(Fn::apply(C(x), C(y))); });
  });
}

// Integers wrap on overflow, as numpy does (signed overflow would be undefined behaviour).
using elementwise::wrap_t;
struct AddFn {
  template <typename C> static C apply(C x, C y) {
    if constexpr (std::is_integral_v<C>) return C(wrap_t<C>(wrap_t<C>(x) + wrap_t<C>(y)));
    else return x + y;
  }
};
struct SubFn {
  template <typename C> static C apply(C x, C y) {
    if constexpr (std::is_integral_v<C>) return C(wrap_t<C>(wrap_t<C>(x) - wrap_t<C>(y)));
    else return x - y;
  }
};
struct MulFn { template <typename C> static C apply(C x, C y) { return elementwise::wrapping_mul(x, y); } };
struct DivFn {
  template <typename C> static C apply(C x, C y) {
    if constexpr (std::is_integral_v<C>) {
      if (y == 0) return C(0);  // no trap on x / 0
      if constexpr (std::is_signed_v<C>) if (y == C(-1)) return elementwise::wrapping_neg(x);  // nor on min / -1
      return C(x / y);
    } else {
      return x / y;
    }
  }
};

}  // namespace

// C = A + B.  dA = sum_to(dC, A), dB = sum_to(dC, B)
ONNXTRAIN_OP(Add, kOnnxDomain, 7).inputs(2).outputs(1).shape(shape_broadcast_inputs).inplace(0, 0).inplace(0, 1)
    .work(memory_bound_work)
    .cpu(arithmetic_kernel<AddFn>).cuda(OT_CUDA(elementwise::binary_cuda<cuda::Binary::kAdd>)).gradient([](GradientBuilder& g) {
      if (g.needs(0)) g.set(0, g.sum_to(g.dy(0), g.x(0)));
      if (g.needs(1)) g.set(1, g.sum_to(g.dy(0), g.x(1)));
    });
// C = A - B.  dA = sum_to(dC, A), dB = -sum_to(dC, B)
ONNXTRAIN_OP(Sub, kOnnxDomain, 7).inputs(2).outputs(1).shape(shape_broadcast_inputs).inplace(0, 0).inplace(0, 1)
    .work(memory_bound_work)
    .cpu(arithmetic_kernel<SubFn>).cuda(OT_CUDA(elementwise::binary_cuda<cuda::Binary::kSub>)).gradient([](GradientBuilder& g) {
      if (g.needs(0)) g.set(0, g.sum_to(g.dy(0), g.x(0)));
      if (g.needs(1)) g.set(1, g.neg(g.sum_to(g.dy(0), g.x(1))));
    });
// C = A * B.  dA = sum_to(dC * B, A), dB = sum_to(dC * A, B)
ONNXTRAIN_OP(Mul, kOnnxDomain, 7).inputs(2).outputs(1).shape(shape_broadcast_inputs).inplace(0, 0).inplace(0, 1)
    .work(memory_bound_work)
    .cpu(arithmetic_kernel<MulFn>).cuda(OT_CUDA(elementwise::binary_cuda<cuda::Binary::kMul>)).gradient([](GradientBuilder& g) {
      if (g.needs(0)) g.set(0, g.sum_to(g.mul(g.dy(0), g.x(1)), g.x(0)));
      if (g.needs(1)) g.set(1, g.sum_to(g.mul(g.dy(0), g.x(0)), g.x(1)));
    });
// C = A / B.  dA = sum_to(dC / B, A), dB = -sum_to(dC * C / B, B)
ONNXTRAIN_OP(Div, kOnnxDomain, 7).inputs(2).outputs(1).shape(shape_broadcast_inputs).inplace(0, 0).inplace(0, 1)
    .work(memory_bound_work)
    .cpu(arithmetic_kernel<DivFn>).cuda(OT_CUDA(elementwise::binary_cuda<cuda::Binary::kDiv>)).gradient([](GradientBuilder& g) {
      std::string da = g.div(g.dy(0), g.x(1));  // dC / B, reused by dB = -dC / B * C
      if (g.needs(0)) g.set(0, g.sum_to(da, g.x(0)));
      if (g.needs(1)) g.set(1, g.neg(g.sum_to(g.mul(da, g.y(0)), g.x(1))));
    });

}  // namespace onnxtrain
