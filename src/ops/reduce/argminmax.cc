// ArgMax and ArgMin along one axis (keepdims, select_last_index). The input is viewed as
// (outer, n, inner): inner == 1 scans contiguous rows; otherwise the running best of a whole
// inner row is updated per step, vectorised over inner.
#include "ops/common.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

Shape arg_shape(const Shape& in, int64_t axis, bool keep) {
  Shape out;
  for (size_t d = 0; d < in.size(); ++d) {
    if (int64_t(d) != axis) out.push_back(in[d]);
    else if (keep) out.push_back(1);
  }
  return out;
}

void shape_arg(ShapeContext& ctx) {
  const auto& in = ctx.input_shape(0);
  if (!in) return ctx.set_output(0, DType::kInt64);
  int64_t axis = normalize_axis(ctx.node(), ctx.node().attr_int("axis", 0), int64_t(in->size()));
  ctx.set_output(0, DType::kInt64, arg_shape(*in, axis, ctx.node().attr_int("keepdims", 1) != 0));
}

// Better(a, b): whether candidate a replaces the current best b.
template <bool kMax, bool kLast, typename C>
inline bool better(C a, C b) {
  if constexpr (kMax) return kLast ? a >= b : a > b;
  else return kLast ? a <= b : a < b;
}

template <bool kMax, bool kLast, typename T>
void arg_rows(const T* x, int64_t* y, int64_t outer, int64_t n, int64_t inner) {
  using C = compute_t<T>;
  int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(n * inner, 1));
  parallel_for(outer, grain, [&](int64_t b, int64_t e) {
    std::vector<C> best(size_t(inner == 1 ? 0 : inner));
    for (int64_t o = b; o < e; ++o) {
      const T* xo = x + o * n * inner;
      int64_t* yo = y + o * inner;
      if (inner == 1) {
        C bv = C(xo[0]);
        int64_t bi = 0;
        for (int64_t i = 1; i < n; ++i) {
          C v = C(xo[i]);
          if (better<kMax, kLast>(v, bv)) { bv = v; bi = i; }
        }
        yo[0] = bi;
        continue;
      }
      for (int64_t j = 0; j < inner; ++j) { best[size_t(j)] = C(xo[j]); yo[j] = 0; }
      for (int64_t i = 1; i < n; ++i) {
        const T* row = xo + i * inner;
        for (int64_t j = 0; j < inner; ++j) {
          C v = C(row[j]);
          bool take = better<kMax, kLast>(v, best[size_t(j)]);
          best[size_t(j)] = take ? v : best[size_t(j)];
          yo[j] = take ? i : yo[j];
        }
      }
    }
  });
}

template <bool kMax>
void arg_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Node& node = ctx.node();
  int64_t axis = normalize_axis(node, node.attr_int("axis", 0), x.rank());
  bool keep = node.attr_int("keepdims", 1) != 0;
  bool last = node.attr_int("select_last_index", 0) != 0;
  OT_CHECK(x.rank() > 0, node.context(), "expected an input of rank >= 1, got a scalar");
  int64_t n = x.dim(int(axis));
  Tensor& y = ctx.output(0, DType::kInt64, arg_shape(x.shape(), axis, keep));
  if (y.numel() == 0) return;
  OT_CHECK(n > 0, node.context(), "expected a non-empty axis ", axis, ", got input shape ", shape_str(x.shape()));
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.dim(int(d));
  for (int64_t d = axis + 1; d < x.rank(); ++d) inner *= x.dim(int(d));
  dispatch_numeric(x.dtype(), [&]<typename T>() {
    if (last) arg_rows<kMax, true>(x.data<T>(), y.data<int64_t>(), outer, n, inner);
    else arg_rows<kMax, false>(x.data<T>(), y.data<int64_t>(), outer, n, inner);
  });
}

}  // namespace

ONNXTRAIN_OP(ArgMax, kOnnxDomain, 1).inputs(1).outputs(1).shape(shape_arg).not_differentiable()
    .cpu(arg_kernel<true>);
ONNXTRAIN_OP(ArgMin, kOnnxDomain, 1).inputs(1).outputs(1).shape(shape_arg).not_differentiable()
    .cpu(arg_kernel<false>);

}  // namespace onnxtrain
