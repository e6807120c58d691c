// Reductions over axes: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceL1,
// ReduceL2, ReduceSumSquare, ReduceLogSum, ReduceLogSumExp. Axes come from the attribute (older
// opsets) or the second input (ReduceSum >= 13, the others >= 18); one kernel serves both.
// Reducing an empty set gives the identity of the fold (0 for sums, 1 for products, -inf/+inf or
// the type's extremes for max/min, NaN for the mean, -inf for the log reductions).
#include <cmath>
#include <cstring>
#include <type_traits>

#include "ops/reduce/reduce_plan.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

enum class RK { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kSumSquare, kLogSum, kLogSumExp };

// The accumulator: compute_t for floats; a wide integer for integer sums and products; double for
// integer inputs of the log and square-root reductions.
template <RK K, typename T>
using acc_t = std::conditional_t<
    is_float_like_v<T>, compute_t<T>,
    std::conditional_t<K == RK::kMax || K == RK::kMin, T,
                       std::conditional_t<K == RK::kL2 || K == RK::kLogSum || K == RK::kLogSumExp, double,
                                          std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>>>>;

template <RK K, typename T, typename A>
struct ReducePolicy {
  T* y;
  int64_t count;
  const A* shift = nullptr;  // per-output max for LogSumExp

  A init() const {
    if constexpr (K == RK::kProd) return A(1);
    else if constexpr (K == RK::kMax)
      return std::numeric_limits<A>::has_infinity ? -std::numeric_limits<A>::infinity() : std::numeric_limits<A>::lowest();
    else if constexpr (K == RK::kMin)
      return std::numeric_limits<A>::has_infinity ? std::numeric_limits<A>::infinity() : std::numeric_limits<A>::max();
    else return A(0);
  }
  A map(A v, int64_t o) const {
    if constexpr (K == RK::kL1) {
      if constexpr (std::is_unsigned_v<A>) return v;
      else return v < A(0) ? A(-v) : v;
    } else if constexpr (K == RK::kL2 || K == RK::kSumSquare) {
      return A(v * v);
    } else if constexpr (K == RK::kLogSumExp) {
      return std::exp(v - shift[o]);
    } else {
      (void)o;
      return v;
    }
  }
  A combine(A a, A b) const {
    if constexpr (K == RK::kMax) return b > a ? b : a;
    else if constexpr (K == RK::kMin) return b < a ? b : a;
    else if constexpr (K == RK::kProd) return A(a * b);
    else return A(a + b);
  }
  void store(int64_t o, A acc) {
    if constexpr (K == RK::kMean) {
      if constexpr (std::is_integral_v<A>) y[o] = cast_value<T>(count ? A(acc / A(count)) : A(0));
      else y[o] = cast_value<T>(acc / A(count));
    } else if constexpr (K == RK::kL2) {
      y[o] = cast_value<T>(std::sqrt(acc));
    } else if constexpr (K == RK::kLogSum) {
      y[o] = cast_value<T>(std::log(acc));
    } else if constexpr (K == RK::kLogSumExp) {
      y[o] = cast_value<T>(std::log(acc) + shift[o]);
    } else {
      y[o] = cast_value<T>(acc);
    }
  }
};

// Collects per-output maxima (the shift of LogSumExp) in the accumulator type.
template <typename A>
struct MaxInto {
  A* m;
  A init() const { return -std::numeric_limits<A>::infinity(); }
  A map(A v, int64_t) const { return v; }
  A combine(A a, A b) const { return b > a ? b : a; }
  void store(int64_t o, A acc) { m[o] = std::isfinite(acc) ? acc : A(0); }
};

template <RK K>
void reduce_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Shape& shape = x.shape();
  bool keep = ctx.node().attr_int("keepdims", 1) != 0;
  auto mask = reduce_mask(ctx, x.rank());
  if (!mask) {  // noop_with_empty_axes and no axes: the input unchanged
    Tensor& y = ctx.output(0, x.dtype(), shape);
    if (y.data() != x.data() && x.nbytes()) std::memcpy(y.data(), x.data(), x.nbytes());
    return;
  }
  Tensor& y = ctx.output(0, x.dtype(), reduced_shape(shape, *mask, keep));
  int64_t count = 1;
  for (size_t d = 0; d < shape.size(); ++d) if ((*mask)[d]) count *= shape[d];
  dispatch_numeric(x.dtype(), [&]<typename T>() {
    using A = acc_t<K, T>;
    ReducePolicy<K, T, A> pol{y.data<T>(), count};
    if constexpr (K == RK::kLogSumExp) {
      std::vector<A> m(size_t(y.numel()));
      MaxInto<A> mx{m.data()};
      run_reduction<T, A>(x.data<T>(), shape, *mask, mx);
      pol.shift = m.data();
      run_reduction<T, A>(x.data<T>(), shape, *mask, pol);
    } else {
      run_reduction<T, A>(x.data<T>(), shape, *mask, pol);
    }
  });
}

}  // namespace

// y = sum(x, axes).  dx = expand(dy, x)
ONNXTRAIN_OP(ReduceSum, kOnnxDomain, 1).inputs(1, 2).outputs(1).shape(shape_reduce)
    .cpu(reduce_kernel<RK::kSum>);
// y = mean(x, axes).  dx = expand(dy, x) / count
ONNXTRAIN_OP(ReduceMean, kOnnxDomain, 1).inputs(1, 2).outputs(1).shape(shape_reduce)
    .cpu(reduce_kernel<RK::kMean>);
// y = max(x, axes).  dx = expand(dy) * (x == expand(y)) / ties
ONNXTRAIN_OP(ReduceMax, kOnnxDomain, 1).inputs(1, 2).outputs(1).shape(shape_reduce)
    .cpu(reduce_kernel<RK::kMax>);
// y = min(x, axes).  dx = expand(dy) * (x == expand(y)) / ties
ONNXTRAIN_OP(ReduceMin, kOnnxDomain, 1).inputs(1, 2).outputs(1).shape(shape_reduce)
    .cpu(reduce_kernel<RK::kMin>);
// y = prod(x, axes).  dx = expand(dy * y) / x  (exact form for zeros: product of the others)
ONNXTRAIN_OP(ReduceProd, kOnnxDomain, 1).inputs(1, 2).outputs(1).shape(shape_reduce)
    .cpu(reduce_kernel<RK::kProd>);
// y = sum(|x|, axes).  dx = expand(dy) * sign(x)
ONNXTRAIN_OP(ReduceL1, kOnnxDomain, 1).inputs(1, 2).outputs(1).shape(shape_reduce)
    .cpu(reduce_kernel<RK::kL1>);
// y = sqrt(sum(x^2, axes)).  dx = expand(dy / y) * x
ONNXTRAIN_OP(ReduceL2, kOnnxDomain, 1).inputs(1, 2).outputs(1).shape(shape_reduce)
    .cpu(reduce_kernel<RK::kL2>);
// y = sum(x^2, axes).  dx = 2 x expand(dy)
ONNXTRAIN_OP(ReduceSumSquare, kOnnxDomain, 1).inputs(1, 2).outputs(1).shape(shape_reduce)
    .cpu(reduce_kernel<RK::kSumSquare>);
// y = log(sum(x, axes)).  dx = expand(dy / exp(y))
ONNXTRAIN_OP(ReduceLogSum, kOnnxDomain, 1).inputs(1, 2).outputs(1).shape(shape_reduce)
    .cpu(reduce_kernel<RK::kLogSum>);
// y = log(sum(exp(x), axes)).  dx = expand(dy) * exp(x - expand(y))
ONNXTRAIN_OP(ReduceLogSumExp, kOnnxDomain, 1).inputs(1, 2).outputs(1).shape(shape_reduce)
    .cpu(reduce_kernel<RK::kLogSumExp>);

}  // namespace onnxtrain
