// Elementwise unary math: out = f(x), computed in float for the half types. Float-only ops go
// through float_unary; Abs, Neg, Sign and Relu also take integers.
#include <cmath>

#include "core/fast_math.h"
#include "ops/elementwise/elementwise.h"

namespace onnxtrain {

namespace grad = elementwise::grad;
namespace {

using elementwise::float_unary;

template <typename Fn>
void float_unary_kernel(KernelContext& ctx) {
  float_unary(ctx, [](auto x) { return Fn::apply(x); });
}

#define OT_UNARY_FN(NAME, EXPR) \
  struct NAME { template <typename C> static C apply(C x) { return EXPR; } };
// float (and the half types, computed in float): the vectorised functions of core/fast_math.h,
// with the error bounds it states; double: the C library's.
#define OT_UNARY_FAST_FN(NAME, FAST, EXPR)                                              \
  struct NAME {                                                                          \
    template <typename C>                                                                \
    ONNXTRAIN_FAST_MATH_INLINE static C apply(C x) {                                     \
      if constexpr (std::is_same_v<C, float>) return FAST(x);                            \
      else return EXPR;                                                                  \
    }                                                                                    \
  };

OT_UNARY_FAST_FN(ExpFn, exp_fast, std::exp(x))
OT_UNARY_FAST_FN(LogFn, log_fast, std::log(x))
OT_UNARY_FN(SqrtFn, std::sqrt(x))
OT_UNARY_FAST_FN(TanhFn, tanh_fast, std::tanh(x))
// double: the two-sided form, no overflow
OT_UNARY_FAST_FN(SigmoidFn, sigmoid_fast,
                 x >= C(0) ? C(1) / (C(1) + std::exp(-x)) : std::exp(x) / (C(1) + std::exp(x)))
OT_UNARY_FAST_FN(ErfFn, erf_fast, std::erf(x))
// log(1 + exp(x)) without overflow: max(x, 0) + log1p(exp(-|x|)).
OT_UNARY_FAST_FN(SoftplusFn, softplus_fast, (x > C(0) ? x : C(0)) + std::log1p(std::exp(-std::fabs(x))))
#undef OT_UNARY_FAST_FN
OT_UNARY_FN(SinFn, std::sin(x))
OT_UNARY_FN(CosFn, std::cos(x))
OT_UNARY_FN(TanFn, std::tan(x))
OT_UNARY_FN(AsinFn, std::asin(x))
OT_UNARY_FN(AcosFn, std::acos(x))
OT_UNARY_FN(AtanFn, std::atan(x))
OT_UNARY_FN(SinhFn, std::sinh(x))
OT_UNARY_FN(CoshFn, std::cosh(x))
OT_UNARY_FN(AsinhFn, std::asinh(x))
OT_UNARY_FN(AcoshFn, std::acosh(x))
OT_UNARY_FN(AtanhFn, std::atanh(x))
OT_UNARY_FN(CeilFn, std::ceil(x))
OT_UNARY_FN(FloorFn, std::floor(x))
// nearbyint rounds half to even under the default rounding mode, which nothing here changes.
OT_UNARY_FN(RoundFn, std::nearbyint(x))
OT_UNARY_FN(ReciprocalFn, C(1) / x)
OT_UNARY_FN(SoftsignFn, x / (C(1) + std::fabs(x)))
#undef OT_UNARY_FN

// Unary ops that also take integers: dispatched over `Dispatch`'s dtypes, computed in compute_t.
template <typename T>
T abs_value(T v) {
  if constexpr (std::is_unsigned_v<T>) return v;
  else if constexpr (std::is_integral_v<T>) return v < 0 ? elementwise::wrapping_neg(v) : v;  // |min| wraps to min
  else return T(std::fabs(compute_t<T>(v)));
}

template <typename T>
T neg_value(T v) {
  if constexpr (std::is_integral_v<T>) return elementwise::wrapping_neg(v);
  else return T(-compute_t<T>(v));
}

template <typename T>
T sign_value(T v) {
  using C = compute_t<T>;
  C c = C(v);
  if constexpr (std::is_unsigned_v<T>) return T(c > 0 ? 1 : 0);
  else return T(c > C(0) ? C(1) : c < C(0) ? C(-1) : c);  // 0 and NaN pass through
}

template <typename T>
T relu_value(T v) {
  using C = compute_t<T>;
  return C(v) > C(0) ? v : T(C(0));
}

void abs_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  dispatch_numeric(x.dtype(), [&]<typename T>() {
    unary_map(x.data<T>(), y.data<T>(), x.numel(), [](T v) { return abs_value<T>(v); });
  });
}

void neg_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  dispatch_signed(x.dtype(), [&]<typename T>() {
    unary_map(x.data<T>(), y.data<T>(), x.numel(), [](T v) { return neg_value<T>(v); });
  });
}

void sign_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  dispatch_numeric(x.dtype(), [&]<typename T>() {
    unary_map(x.data<T>(), y.data<T>(), x.numel(), [](T v) { return sign_value<T>(v); });
  });
}

void shape_like_input1(ShapeContext& ctx) { ctx.set_output(0, ctx.input_dtype(1), ctx.input_shape(1)); }

// The gradients written from the forward's output Y, each in one pass:
//   ReluGrad(dY, Y) = dY where Y > 0, else 0 (instead of Greater + Where);
//   com.microsoft.SigmoidGrad(dY, Y) = dY Y (1 - Y), TanhGrad(dY, Y) = dY (1 - Y^2) (ONNX Runtime's
//   backward of Sigmoid and Tanh in its training artifacts).
enum class FromOutput { kRelu, kSigmoid, kTanh };

template <FromOutput kOp>
void grad_from_output_kernel(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const Tensor& y = ctx.input(1);
  OT_CHECK(dy.shape() == y.shape() && dy.dtype() == y.dtype(), ctx.node().context(), "dY and Y must match, got ",
           dtype_name(dy.dtype()), shape_str(dy.shape()), " and ", dtype_name(y.dtype()), shape_str(y.shape()));
  Tensor& dx = ctx.output(0, y.dtype(), y.shape());
  dispatch_float(y.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    const T* pdy = dy.data<T>();
    const T* py = y.data<T>();
    T* pdx = dx.data<T>();
    parallel_for(y.numel(), kElementwiseGrain, [pdy, py, pdx](int64_t b, int64_t e) {
      // Both loads unconditional and the pointers copied in: Relu's loop becomes a vector select
      // (a branch on the sign of Y mispredicts half the time).
      for (int64_t i = b; i < e; ++i) {
        const T g = pdy[i];
        const C v = C(py[i]);
        if constexpr (kOp == FromOutput::kRelu) pdx[i] = v > C(0) ? g : T(C(0));
        else if constexpr (kOp == FromOutput::kSigmoid) pdx[i] = T(C(g) * v * (C(1) - v));
        else pdx[i] = T(C(g) * (C(1) - v * v));
      }
    });
  });
}

void relu_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  dispatch_signed(x.dtype(), [&]<typename T>() {
    unary_map(x.data<T>(), y.data<T>(), x.numel(), [](T v) { return relu_value<T>(v); });
  });
}

}  // namespace

#define OT_FLOAT_UNARY(OP, SINCE, FN) \
  ONNXTRAIN_OP(OP, kOnnxDomain, SINCE).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0) \
      .work(memory_bound_work).cpu(float_unary_kernel<FN>)
// The ops with a kernel of the CUDA family too.
#define OT_FLOAT_UNARY_CUDA(OP, SINCE, FN) OT_FLOAT_UNARY(OP, SINCE, FN).cuda(OT_CUDA(elementwise::unary_cuda<cuda::Unary::k##OP>))

// y = exp(x).  dx = dy * y
OT_FLOAT_UNARY_CUDA(Exp, 6, ExpFn).gradient([](GradientBuilder& g) {
  grad::set_unary(g, g.y(0));
});
// y = log(x).  dx = dy / x
OT_FLOAT_UNARY_CUDA(Log, 6, LogFn).gradient([](GradientBuilder& g) {
  g.set(0, g.div(g.dy(0), g.x(0)));
});
// y = sqrt(x).  dx = dy / (2 y)
OT_FLOAT_UNARY_CUDA(Sqrt, 6, SqrtFn).gradient([](GradientBuilder& g) {
  g.set(0, g.div(g.mul(g.dy(0), grad::c(g, 0.5, g.x(0))), g.y(0)));
});
// y = tanh(x).  dx = dy * (1 - y^2)
OT_FLOAT_UNARY_CUDA(Tanh, 6, TanhFn).gradient([](GradientBuilder& g) {
  grad::set_unary(g, g.sub(grad::c(g, 1.0, g.x(0)), grad::square(g, g.y(0))));
});
// y = 1 / (1 + exp(-x)).  dx = dy * y * (1 - y)
OT_FLOAT_UNARY_CUDA(Sigmoid, 6, SigmoidFn).gradient([](GradientBuilder& g) {
  grad::set_unary(g, g.mul(g.y(0), g.sub(grad::c(g, 1.0, g.x(0)), g.y(0))));
});
// y = max(x, 0).  dx = dy * (y > 0)
ONNXTRAIN_OP(Relu, kOnnxDomain, 6).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0).work(memory_bound_work)
    .cpu(relu_kernel).cuda(OT_CUDA(elementwise::unary_cuda<cuda::Unary::kRelu>)).gradient([](GradientBuilder& g) {
      g.set(0, g.emit("ReluGrad", {g.dy(0), g.y(0)}, {}, kOnnxTrainDomain));
    });
// onnxtrain.ReluGrad(dY, Y) = dY * (Y > 0), written over dY. com.microsoft.ReluGrad is ONNX
// Runtime's name for the same op (its training artifacts): same inputs, no attributes.
ONNXTRAIN_OP(ReluGrad, kOnnxTrainDomain, 1).inputs(2).outputs(1).shape(shape_like_input1).inplace(0, 0)
    .work(memory_bound_work).cpu(grad_from_output_kernel<FromOutput::kRelu>)
    .cuda(OT_CUDA(elementwise::binary_cuda<cuda::Binary::kReluGrad>))
    .gradient_not_implemented("second derivatives of Relu are not needed for training");
ONNXTRAIN_OP(ReluGrad, kMsDomain, 1).inputs(2).outputs(1).shape(shape_like_input1).inplace(0, 0)
    .work(memory_bound_work).cpu(grad_from_output_kernel<FromOutput::kRelu>)
    .cuda(OT_CUDA(elementwise::binary_cuda<cuda::Binary::kReluGrad>))
    .gradient_not_implemented("second derivatives of Relu are not needed for training");
ONNXTRAIN_OP(SigmoidGrad, kMsDomain, 1).inputs(2).outputs(1).shape(shape_like_input1).inplace(0, 0)
    .work(memory_bound_work).cpu(grad_from_output_kernel<FromOutput::kSigmoid>)
    .gradient_not_implemented("second derivatives through ONNX Runtime's SigmoidGrad are not needed");
ONNXTRAIN_OP(TanhGrad, kMsDomain, 1).inputs(2).outputs(1).shape(shape_like_input1).inplace(0, 0)
    .work(memory_bound_work).cpu(grad_from_output_kernel<FromOutput::kTanh>)
    .gradient_not_implemented("second derivatives through ONNX Runtime's TanhGrad are not needed");

// y = sin(x).  dx = dy * cos(x)
OT_FLOAT_UNARY(Sin, 7, SinFn).gradient([](GradientBuilder& g) {
  grad::set_unary(g, g.emit("Cos", {g.x(0)}));
});
// y = cos(x).  dx = -dy * sin(x)
OT_FLOAT_UNARY(Cos, 7, CosFn).gradient([](GradientBuilder& g) {
  g.set(0, g.neg(g.mul(g.dy(0), g.emit("Sin", {g.x(0)}))));
});
// y = tan(x).  dx = dy * (1 + y^2)
OT_FLOAT_UNARY(Tan, 7, TanFn).gradient([](GradientBuilder& g) {
  grad::set_unary(g, g.add(grad::c(g, 1.0, g.x(0)), grad::square(g, g.y(0))));
});
// y = asin(x).  dx = dy / sqrt(1 - x^2)
OT_FLOAT_UNARY(Asin, 7, AsinFn).gradient([](GradientBuilder& g) {
  g.set(0, g.div(g.dy(0), g.emit("Sqrt", {g.sub(grad::c(g, 1.0, g.x(0)), grad::square(g, g.x(0)))})));
});
// y = acos(x).  dx = -dy / sqrt(1 - x^2)
OT_FLOAT_UNARY(Acos, 7, AcosFn).gradient([](GradientBuilder& g) {
  g.set(0, g.neg(g.div(g.dy(0), g.emit("Sqrt", {g.sub(grad::c(g, 1.0, g.x(0)), grad::square(g, g.x(0)))}))));
});
// y = atan(x).  dx = dy / (1 + x^2)
OT_FLOAT_UNARY(Atan, 7, AtanFn).gradient([](GradientBuilder& g) {
  g.set(0, g.div(g.dy(0), g.add(grad::c(g, 1.0, g.x(0)), grad::square(g, g.x(0)))));
});
// y = sinh(x).  dx = dy * cosh(x)
OT_FLOAT_UNARY(Sinh, 9, SinhFn).gradient([](GradientBuilder& g) {
  grad::set_unary(g, g.emit("Cosh", {g.x(0)}));
});
// y = cosh(x).  dx = dy * sinh(x)
OT_FLOAT_UNARY(Cosh, 9, CoshFn).gradient([](GradientBuilder& g) {
  grad::set_unary(g, g.emit("Sinh", {g.x(0)}));
});
// y = asinh(x).  dx = dy / sqrt(x^2 + 1)
OT_FLOAT_UNARY(Asinh, 9, AsinhFn).gradient([](GradientBuilder& g) {
  g.set(0, g.div(g.dy(0), g.emit("Sqrt", {g.add(grad::square(g, g.x(0)), grad::c(g, 1.0, g.x(0)))})));
});
// y = acosh(x).  dx = dy / sqrt(x^2 - 1)
OT_FLOAT_UNARY(Acosh, 9, AcoshFn).gradient([](GradientBuilder& g) {
  g.set(0, g.div(g.dy(0), g.emit("Sqrt", {g.sub(grad::square(g, g.x(0)), grad::c(g, 1.0, g.x(0)))})));
});
// y = atanh(x).  dx = dy / (1 - x^2)
OT_FLOAT_UNARY(Atanh, 9, AtanhFn).gradient([](GradientBuilder& g) {
  g.set(0, g.div(g.dy(0), g.sub(grad::c(g, 1.0, g.x(0)), grad::square(g, g.x(0)))));
});
// y = erf(x).  dx = dy * 2 / sqrt(pi) * exp(-x^2)
OT_FLOAT_UNARY_CUDA(Erf, 9, ErfFn).gradient([](GradientBuilder& g) {
  grad::set_unary(g, g.mul(grad::c(g, 1.1283791670955125739, g.x(0)), g.emit("Exp", {g.neg(grad::square(g, g.x(0)))})));
});
// y = 1 / x.  dx = -dy * y^2
OT_FLOAT_UNARY_CUDA(Reciprocal, 1, ReciprocalFn).gradient([](GradientBuilder& g) {
  g.set(0, g.neg(g.mul(g.dy(0), grad::square(g, g.y(0)))));
});
// y = log(1 + exp(x)).  dx = dy * sigmoid(x)
OT_FLOAT_UNARY(Softplus, 1, SoftplusFn).gradient([](GradientBuilder& g) {
  grad::set_unary(g, g.emit("Sigmoid", {g.x(0)}));
});
// y = x / (1 + |x|).  dx = dy / (1 + |x|)^2
OT_FLOAT_UNARY(Softsign, 1, SoftsignFn).gradient([](GradientBuilder& g) {
  g.set(0, g.div(g.dy(0), grad::square(g, g.add(grad::c(g, 1.0, g.x(0)), g.emit("Abs", {g.x(0)})))));
});

// Piecewise constant: zero gradient almost everywhere.
OT_FLOAT_UNARY(Ceil, 1, CeilFn).not_differentiable();
OT_FLOAT_UNARY(Floor, 1, FloorFn).not_differentiable();
OT_FLOAT_UNARY(Round, 11, RoundFn).not_differentiable();
#undef OT_FLOAT_UNARY_CUDA
#undef OT_FLOAT_UNARY

// y = |x|.  dx = dy * sign(x)
ONNXTRAIN_OP(Abs, kOnnxDomain, 1).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .cpu(abs_kernel).cuda(OT_CUDA(elementwise::unary_cuda<cuda::Unary::kAbs>)).gradient([](GradientBuilder& g) { grad::set_unary(g, g.emit("Sign", {g.x(0)})); });
// y = -x.  dx = -dy
ONNXTRAIN_OP(Neg, kOnnxDomain, 1).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .cpu(neg_kernel).cuda(OT_CUDA(elementwise::unary_cuda<cuda::Unary::kNeg>)).gradient([](GradientBuilder& g) { g.set(0, g.neg(g.dy(0))); });
ONNXTRAIN_OP(Sign, kOnnxDomain, 9).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .not_differentiable().cpu(sign_kernel);

}  // namespace onnxtrain
