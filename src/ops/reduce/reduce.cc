// Reductions over axes: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd, ReduceL1,
// ReduceL2, ReduceSumSquare, ReduceLogSum, ReduceLogSumExp. Axes come from the attribute (older
// opsets) or the second input (ReduceSum >= 13, the others >= 18); one kernel serves both.
// Reducing an empty set gives the identity of the fold (0 for sums, 1 for products, -inf/+inf or
// the type's extremes for max/min, NaN for the mean, -inf for the log reductions).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "ops/reduce/grad_common.h"
#include "ops/reduce/reduce_plan.h"
#include "ops/registry.h"
#if ONNXTRAIN_CUDA
#include "backends/cuda/kernels.h"
#endif

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

#if ONNXTRAIN_CUDA
// ReduceSum and ReduceMean on CUDA tensors: the reduced dims, once size-1 dims are dropped, must
// be adjacent (an [outer, reduced, inner] view: bias gradients, row sums); other layouts and
// dtypes run on the host.
template <RK K>
void reduce_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Shape& shape = x.shape();
  const bool keep = ctx.node().attr_int("keepdims", 1) != 0;
  auto mask = reduce_mask(ctx, x.rank());
  if (!mask) {  // noop_with_empty_axes and no axes: the input unchanged
    Tensor& y = ctx.output(0, x.dtype(), shape);
    if (y.data() != x.data()) cuda::unary(cuda::Unary::kCopy, x.dtype(), x.data(), shape, y.data(), shape, ctx.stream());
    return;
  }
  int64_t outer = 1, reduced = 1, inner = 1;
  int phase = 0;  // 0: before the reduced dims, 1: in them, 2: after
  bool adjacent = true;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if ((*mask)[d]) {
      if (phase == 2) adjacent = false;
      phase = 1;
      reduced *= shape[d];
    } else {
      if (phase == 1) phase = 2;
      (phase == 0 ? outer : inner) *= shape[d];
    }
  }
  if (!adjacent || !is_floating(x.dtype()) || x.dtype() == DType::kFloat64 || x.numel() == 0)
    return run_on_host(ctx, adjacent ? "dtype " + dtype_name(x.dtype()) : "reduced dims apart");
  Tensor& y = ctx.output(0, x.dtype(), reduced_shape(shape, *mask, keep));
  const float scale = K == RK::kMean ? 1.0f / float(reduced) : 1.0f;
  cuda::reduce_sum(x.dtype(), x.data(), y.data(), outer, reduced, inner, scale, ctx.stream());
}
#endif

// ---- Gradient rules ----
// Every rule sees y and dy in the forward's layout; keep() puts a keepdims=0 value back into the
// keepdims=1 layout (Unsqueeze over the same axes) so it broadcasts against x. Reductions the rules
// emit reuse the forward's axes (attribute or input) and noop_with_empty_axes, with keepdims=1.
// A node that statically reduces nothing (noop_with_empty_axes=1, empty axes) copies its input, so
// its gradient is dy for every kind.
struct ReduceGrad {
  GradientBuilder& g;
  bool keepdims;
  bool axes_input;                 // axes come from input 1 (else the attribute)
  std::vector<int64_t> attr_axes;
  std::optional<std::vector<int64_t>> axes;  // statically known axes
  bool noop;                       // noop_with_empty_axes

  explicit ReduceGrad(GradientBuilder& gb) : g(gb) {
    const Node& n = g.node();
    keepdims = n.attr_int("keepdims", 1) != 0;
    noop = n.attr_int("noop_with_empty_axes", 0) != 0;
    axes_input = n.has_input(1);
    attr_axes = n.attr_ints("axes");
    if (!axes_input) axes = attr_axes;
    else if (auto v = static_value(g, g.x(1))) axes = v->to_int_vector();
  }
  bool identity() const { return noop && axes && axes->empty(); }
  // Whether the node might copy its input (noop with axes that are only known at run time).
  bool maybe_identity() const { return noop && !axes; }
  void require_reduction(const char* what) const {
    if (maybe_identity())
      OT_THROW(kNotImplemented, g.context(), "the gradient of ", what,
               " with noop_with_empty_axes=1 needs axes known when the gradient graph is built");
  }
  // v (laid out like y) in the keepdims=1 layout.
  std::string keep(const std::string& v) {
    if (keepdims || (axes && axes->empty())) return v;  // empty axes: a scalar (or x itself) broadcasts
    return axes_input ? g.emit("Unsqueeze", {v, g.x(1)}) : g.unsqueeze(v, attr_axes);
  }
  // op(v) over the forward's axes, keepdims=1.
  std::string reduce(const std::string& op, const std::string& v) {
    GraphBuilder::Attrs attrs{{"keepdims", Attribute::of(int64_t(1))}};
    if (noop) attrs["noop_with_empty_axes"] = Attribute::of(int64_t(1));
    if (axes_input) return g.emit(op, {v, g.x(1)}, attrs);
    if (!attr_axes.empty()) attrs["axes"] = Attribute::of(attr_axes);
    return g.emit(op, {v}, attrs);
  }
  std::string expand(const std::string& v) { return g.emit("Expand", {v, g.shape(g.x(0))}); }
  std::string scalar(double v) { return g.scalar_like(v, g.x(0)); }
  // y / x element counts: 1 / count of the reduction.
  std::string inv_count() {
    auto xs = g.static_shape(g.x(0)), ys = g.static_shape(g.y(0));
    auto known = [](const std::optional<Shape>& s) {
      return s && std::all_of(s->begin(), s->end(), [](int64_t d) { return d >= 0; });
    };
    if (known(xs) && known(ys) && numel(*xs) > 0) return scalar(double(numel(*ys)) / double(numel(*xs)));
    std::string nx = cast_like(g, g.emit("Size", {g.x(0)}), g.x(0));
    std::string ny = cast_like(g, g.emit("Size", {g.y(0)}), g.x(0));
    return g.div(ny, nx);
  }
};

// y = sum(x, axes).  dx = expand(dy, shape(x))
void reduce_sum_gradient(GradientBuilder& g) {
  ReduceGrad r(g);
  if (r.identity()) return g.set(0, g.dy(0));
  g.set(0, r.expand(r.keep(g.dy(0))));
}

// y = mean(x, axes).  dx = expand(dy / count, shape(x))
void reduce_mean_gradient(GradientBuilder& g) {
  ReduceGrad r(g);
  if (r.identity()) return g.set(0, g.dy(0));
  g.set(0, r.expand(r.keep(g.mul(g.dy(0), r.inv_count()))));
}

// y = sum(x^2, axes).  dx = 2 x dy
void reduce_sum_square_gradient(GradientBuilder& g) {
  ReduceGrad r(g);
  if (r.identity()) return g.set(0, g.dy(0));
  r.require_reduction("ReduceSumSquare");
  g.set(0, g.mul(g.x(0), r.keep(g.mul(g.dy(0), r.scalar(2.0)))));
}

// y = sum(|x|, axes).  dx = sign(x) dy  (0 at x = 0)
void reduce_l1_gradient(GradientBuilder& g) {
  ReduceGrad r(g);
  if (r.identity()) return g.set(0, g.dy(0));
  r.require_reduction("ReduceL1");
  g.set(0, g.mul(g.emit("Sign", {g.x(0)}), r.keep(g.dy(0))));
}

// y = sqrt(sum(x^2, axes)).  dx = x dy / y  (0 where y = 0)
void reduce_l2_gradient(GradientBuilder& g) {
  ReduceGrad r(g);
  if (r.identity()) return g.set(0, g.dy(0));
  r.require_reduction("ReduceL2");
  std::string zero = r.scalar(0.0);
  std::string q = g.emit("Where", {g.emit("Equal", {g.y(0), zero}), zero, g.div(g.dy(0), g.y(0))});
  g.set(0, g.mul(g.x(0), r.keep(q)));
}

// y = log(sum(x, axes)).  dx = expand(dy exp(-y), shape(x))  (= dy / sum(x))
void reduce_log_sum_gradient(GradientBuilder& g) {
  ReduceGrad r(g);
  if (r.identity()) return g.set(0, g.dy(0));
  r.require_reduction("ReduceLogSum");
  g.set(0, r.expand(r.keep(g.mul(g.dy(0), g.emit("Exp", {g.neg(g.y(0))})))));
}

// y = log(sum(exp(x), axes)).  dx = dy exp(x - y)  (softmax over the reduced axes)
void reduce_log_sum_exp_gradient(GradientBuilder& g) {
  ReduceGrad r(g);
  if (r.identity()) return g.set(0, g.dy(0));
  g.set(0, g.mul(r.keep(g.dy(0)), g.emit("Exp", {g.sub(g.x(0), r.keep(g.y(0)))})));
}

// y = max(x, axes) (or min).  dx = dy [x == y] / #ties: the gradient is split evenly among the
// elements that attain the extremum (as torch.amax/amin do)
void reduce_extremum_gradient(GradientBuilder& g) {
  ReduceGrad r(g);
  if (r.identity()) return g.set(0, g.dy(0));
  std::string mask = cast_like(g, g.emit("Equal", {g.x(0), r.keep(g.y(0))}), g.x(0));
  std::string ties = r.reduce("ReduceSum", mask);
  g.set(0, g.mul(mask, g.div(r.keep(g.dy(0)), ties)));
}

// y = prod(x, axes).  dx_i = dy prod_{j != i} x_j: y / x_i where x_i != 0; for a zero x_i, the
// product of the non-zero others when x_i is the only zero of its group, else 0
void reduce_prod_gradient(GradientBuilder& g) {
  ReduceGrad r(g);
  if (r.identity()) return g.set(0, g.dy(0));
  std::string zero = r.scalar(0.0), one = r.scalar(1.0);
  std::string is_zero = g.emit("Equal", {g.x(0), zero});
  std::string safe_x = g.emit("Where", {is_zero, one, g.x(0)});
  std::string prod_nonzero = r.reduce("ReduceProd", safe_x);
  std::string zeros = r.reduce("ReduceSum", cast_like(g, is_zero, g.x(0)));
  std::string at_zero = g.emit("Where", {g.emit("Equal", {zeros, one}), prod_nonzero, zero});
  std::string others = g.emit("Where", {is_zero, at_zero, g.div(r.keep(g.y(0)), safe_x)});
  g.set(0, g.mul(others, r.keep(g.dy(0))));
}

}  // namespace

ONNXTRAIN_OP(ReduceSum, kOnnxDomain, 1).inputs(1, 2).outputs(1).shape(shape_reduce)
    .cpu(reduce_kernel<RK::kSum>).cuda(OT_CUDA(reduce_cuda<RK::kSum>)).host_inputs(std::vector<int>{1}).gradient(reduce_sum_gradient);
ONNXTRAIN_OP(ReduceMean, kOnnxDomain, 1).inputs(1, 2).outputs(1).shape(shape_reduce)
    .cpu(reduce_kernel<RK::kMean>).cuda(OT_CUDA(reduce_cuda<RK::kMean>)).host_inputs(std::vector<int>{1}).gradient(reduce_mean_gradient);
ONNXTRAIN_OP(ReduceMax, kOnnxDomain, 1).inputs(1, 2).outputs(1).shape(shape_reduce)
    .cpu(reduce_kernel<RK::kMax>).gradient(reduce_extremum_gradient);
ONNXTRAIN_OP(ReduceMin, kOnnxDomain, 1).inputs(1, 2).outputs(1).shape(shape_reduce)
    .cpu(reduce_kernel<RK::kMin>).gradient(reduce_extremum_gradient);
ONNXTRAIN_OP(ReduceProd, kOnnxDomain, 1).inputs(1, 2).outputs(1).shape(shape_reduce)
    .cpu(reduce_kernel<RK::kProd>).gradient(reduce_prod_gradient);
ONNXTRAIN_OP(ReduceL1, kOnnxDomain, 1).inputs(1, 2).outputs(1).shape(shape_reduce)
    .cpu(reduce_kernel<RK::kL1>).gradient(reduce_l1_gradient);
ONNXTRAIN_OP(ReduceL2, kOnnxDomain, 1).inputs(1, 2).outputs(1).shape(shape_reduce)
    .cpu(reduce_kernel<RK::kL2>).gradient(reduce_l2_gradient);
ONNXTRAIN_OP(ReduceSumSquare, kOnnxDomain, 1).inputs(1, 2).outputs(1).shape(shape_reduce)
    .cpu(reduce_kernel<RK::kSumSquare>).gradient(reduce_sum_square_gradient);
ONNXTRAIN_OP(ReduceLogSum, kOnnxDomain, 1).inputs(1, 2).outputs(1).shape(shape_reduce)
    .cpu(reduce_kernel<RK::kLogSum>).gradient(reduce_log_sum_gradient);
ONNXTRAIN_OP(ReduceLogSumExp, kOnnxDomain, 1).inputs(1, 2).outputs(1).shape(shape_reduce)
    .cpu(reduce_kernel<RK::kLogSumExp>).gradient(reduce_log_sum_exp_gradient);

}  // namespace onnxtrain
