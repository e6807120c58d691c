// Elementwise unary math over floating types: out = f(x), computed in float for the half types.
#include <cmath>

#include "ops/common.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

template <typename Fn>
void float_unary_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  dispatch_float(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    unary_map(x.data<T>(), y.data<T>(), x.numel(), [](T v) { return T(Fn::apply(C(v))); });
  });
}

#define OT_UNARY_FN(NAME, EXPR) \
  struct NAME { template <typename C> static C apply(C x) { return EXPR; } };

OT_UNARY_FN(ExpFn, std::exp(x))
OT_UNARY_FN(LogFn, std::log(x))
OT_UNARY_FN(SqrtFn, std::sqrt(x))
OT_UNARY_FN(TanhFn, std::tanh(x))
OT_UNARY_FN(SigmoidFn, x >= C(0) ? C(1) / (C(1) + std::exp(-x)) : std::exp(x) / (C(1) + std::exp(x)))
OT_UNARY_FN(ReluFn, x > C(0) ? x : C(0))
#undef OT_UNARY_FN

}  // namespace

// y = exp(x).  dx = dy * y
ONNXTRAIN_OP(Exp, kOnnxDomain, 6).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .cpu(float_unary_kernel<ExpFn>);
// y = log(x).  dx = dy / x
ONNXTRAIN_OP(Log, kOnnxDomain, 6).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .cpu(float_unary_kernel<LogFn>);
// y = sqrt(x).  dx = dy / (2 y)
ONNXTRAIN_OP(Sqrt, kOnnxDomain, 6).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .cpu(float_unary_kernel<SqrtFn>);
// y = tanh(x).  dx = dy * (1 - y^2)
ONNXTRAIN_OP(Tanh, kOnnxDomain, 6).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .cpu(float_unary_kernel<TanhFn>);
// y = 1 / (1 + exp(-x)).  dx = dy * y * (1 - y)
ONNXTRAIN_OP(Sigmoid, kOnnxDomain, 6).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .cpu(float_unary_kernel<SigmoidFn>);
// y = max(x, 0).  dx = dy * (y > 0)
ONNXTRAIN_OP(Relu, kOnnxDomain, 6).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .cpu(float_unary_kernel<ReluFn>);

}  // namespace onnxtrain
