// Broadcasting binary arithmetic: Add, Sub, Mul, Div.
#include "ops/common.h"
#include "ops/registry.h"

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
    binary_broadcast<T, T, T>(a, b, out, [](T x, T y) { return T(Fn::apply(C(x), C(y))); });
  });
}

struct AddFn { template <typename C> static C apply(C x, C y) { return x + y; } };
struct SubFn { template <typename C> static C apply(C x, C y) { return x - y; } };
struct MulFn { template <typename C> static C apply(C x, C y) { return x * y; } };
struct DivFn {
  template <typename C> static C apply(C x, C y) {
    if constexpr (std::is_integral_v<C>) return y == 0 ? C(0) : C(x / y);  // no trap on x/0
    else return x / y;
  }
};

}  // namespace

// C = A + B.  dA = sum_to(dC, A), dB = sum_to(dC, B)
ONNXTRAIN_OP(Add, kOnnxDomain, 7).inputs(2).outputs(1).shape(shape_broadcast_inputs).inplace(0, 0).inplace(0, 1)
    .cpu(arithmetic_kernel<AddFn>);
// C = A - B.  dA = sum_to(dC, A), dB = -sum_to(dC, B)
ONNXTRAIN_OP(Sub, kOnnxDomain, 7).inputs(2).outputs(1).shape(shape_broadcast_inputs).inplace(0, 0).inplace(0, 1)
    .cpu(arithmetic_kernel<SubFn>);
// C = A * B.  dA = sum_to(dC * B, A), dB = sum_to(dC * A, B)
ONNXTRAIN_OP(Mul, kOnnxDomain, 7).inputs(2).outputs(1).shape(shape_broadcast_inputs).inplace(0, 0).inplace(0, 1)
    .cpu(arithmetic_kernel<MulFn>);
// C = A / B.  dA = sum_to(dC / B, A), dB = -sum_to(dC * C / B, B)
ONNXTRAIN_OP(Div, kOnnxDomain, 7).inputs(2).outputs(1).shape(shape_broadcast_inputs).inplace(0, 0).inplace(0, 1)
    .cpu(arithmetic_kernel<DivFn>);

}  // namespace onnxtrain
