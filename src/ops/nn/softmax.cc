// Softmax, LogSoftmax and Hardmax. Before opset 13 the input is coerced to 2D at `axis` (default
// 1) and the op runs over the flattened trailing dims; from 13 it runs along the single `axis`
// (default -1). Both are an (outer, n, inner) view, inner == 1 for the legacy form.
#include "ops/nn/softmax_rows.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

struct AxisView {
  int64_t outer = 1, n = 1, inner = 1;
};

AxisView axis_view(const KernelContext& ctx, const Shape& shape, bool legacy) {
  const Node& node = ctx.node();
  int64_t rank = int64_t(shape.size());
  AxisView v;
  if (legacy) {
    int64_t axis = node.attr_int("axis", 1);
    // The 2D coercion accepts axis == rank (everything in the outer dim).
    if (axis < 0) axis += rank;
    OT_CHECK(axis >= 0 && axis <= rank, node.context(), "axis ", node.attr_int("axis", 1),
             " is out of range for rank ", rank);
    for (int64_t d = 0; d < rank; ++d) (d < axis ? v.outer : v.n) *= shape[size_t(d)];
    return v;
  }
  OT_CHECK(rank > 0, node.context(), "expected an input of rank >= 1, got a scalar");
  int64_t axis = normalize_axis(node, node.attr_int("axis", -1), rank);
  for (int64_t d = 0; d < rank; ++d) {
    if (d < axis) v.outer *= shape[size_t(d)];
    else if (d == axis) v.n = shape[size_t(d)];
    else v.inner *= shape[size_t(d)];
  }
  return v;
}

template <bool kLog, bool kLegacy>
void softmax_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  AxisView v = axis_view(ctx, x.shape(), kLegacy);
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  dispatch_float(x.dtype(), [&]<typename T>() {
    softmax_along<kLog>(x.data<T>(), y.data<T>(), v.outer, v.n, v.inner);
  });
}

template <bool kLegacy>
void hardmax_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  AxisView v = axis_view(ctx, x.shape(), kLegacy);
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  if (x.numel() == 0) return;
  dispatch_float(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    const T* px = x.data<T>();
    T* py = y.data<T>();
    int64_t n = v.n, inner = v.inner;
    int64_t grain = std::max<int64_t>(1, kElementwiseGrain / (n * inner));
    parallel_for(v.outer, grain, [&](int64_t b, int64_t e) {
      std::vector<int64_t> best(static_cast<size_t>(inner));
      std::vector<C> bv(static_cast<size_t>(inner));
      for (int64_t o = b; o < e; ++o) {
        const T* xo = px + o * n * inner;
        T* yo = py + o * n * inner;
        for (int64_t j = 0; j < inner; ++j) { bv[size_t(j)] = C(xo[j]); best[size_t(j)] = 0; }
        for (int64_t i = 1; i < n; ++i)
          for (int64_t j = 0; j < inner; ++j) {
            C c = C(xo[i * inner + j]);
            if (c > bv[size_t(j)]) { bv[size_t(j)] = c; best[size_t(j)] = i; }
          }
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < inner; ++j) yo[i * inner + j] = T(best[size_t(j)] == i ? C(1) : C(0));
      }
    });
  });
}

}  // namespace

// y = softmax(x).  dx = y * (dy - sum(dy * y, axis))
ONNXTRAIN_OP(Softmax, kOnnxDomain, 1).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .cpu(softmax_kernel<false, true>);
// y = softmax(x).  dx = y * (dy - sum(dy * y, axis))
ONNXTRAIN_OP(Softmax, kOnnxDomain, 13).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .cpu(softmax_kernel<false, false>);
// y = x - logsumexp(x).  dx = dy - exp(y) * sum(dy, axis)
ONNXTRAIN_OP(LogSoftmax, kOnnxDomain, 1).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .cpu(softmax_kernel<true, true>);
// y = x - logsumexp(x).  dx = dy - exp(y) * sum(dy, axis)
ONNXTRAIN_OP(LogSoftmax, kOnnxDomain, 13).inputs(1).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .cpu(softmax_kernel<true, false>);
ONNXTRAIN_OP(Hardmax, kOnnxDomain, 1).inputs(1).outputs(1).shape(shape_same_as_input).not_differentiable()
    .cpu(hardmax_kernel<true>);
ONNXTRAIN_OP(Hardmax, kOnnxDomain, 13).inputs(1).outputs(1).shape(shape_same_as_input).not_differentiable()
    .cpu(hardmax_kernel<false>);

}  // namespace onnxtrain
