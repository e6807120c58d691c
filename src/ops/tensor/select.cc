// Data-dependent selection: TopK, NonZero, Unique, Compress. Output sizes of NonZero, Unique and
// Compress depend on values, so their shape rules leave those dims unknown.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/gradient_builder.h"
#include "ops/tensor/tensor_ops.h"

namespace onnxtrain {
namespace {
using namespace tensor_ops;

template <typename C>
inline bool is_nan(C v) {
  if constexpr (std::is_floating_point_v<C>) return std::isnan(v);
  else return false;
}

// ---- TopK ----

int64_t topk_k(const KernelContext& ctx) {
  if (ctx.opset() < 10 || !ctx.has_input(1)) return ctx.node().attr_int("k", -1);
  return scalar_int_input(ctx, 1, "K");
}

void topk_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  OT_CHECK(x.rank() >= 1, node.context(), "input should have rank >= 1, got a scalar");
  int64_t axis = normalize_axis(node, node.attr_int("axis", -1), x.rank());
  int64_t dim = x.dim(int(axis)), k = topk_k(ctx);
  OT_CHECK(k >= 0 && k <= dim, node.context(), "K = ", k, " should be in [0, ", dim, "] for input ",
           shape_str(x.shape()), " along axis ", axis);
  bool largest = node.attr_int("largest", 1) != 0;
  Shape out_shape = x.shape();
  out_shape[size_t(axis)] = k;
  Tensor& values = ctx.output(0, x.dtype(), out_shape);
  Tensor& indices = ctx.output(1, DType::kInt64, out_shape);
  if (values.numel() == 0) return;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < x.rank(); ++d) {
    if (d < axis) outer *= x.dim(int(d));
    else if (d > axis) inner *= x.dim(int(d));
  }
  dispatch_numeric(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    const T* src = x.data<T>();
    T* vo = values.data<T>();
    int64_t* io = indices.data<int64_t>();
    int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(dim, 1));
    parallel_for(outer * inner, grain, [&](int64_t b, int64_t e) {
      std::vector<int64_t> order(static_cast<size_t>(dim));
      std::vector<C> vals(static_cast<size_t>(dim));
      for (int64_t s = b; s < e; ++s) {
        int64_t o = s / inner, i = s % inner;
        const T* base = src + o * dim * inner + i;
        for (int64_t j = 0; j < dim; ++j) vals[size_t(j)] = C(base[j * inner]);
        std::iota(order.begin(), order.end(), int64_t(0));
        // NaN ranks above every number; equal values keep the lower index first.
        auto before = [&](int64_t a, int64_t c) {
          C va = vals[size_t(a)], vc = vals[size_t(c)];
          bool na = is_nan(va), nc = is_nan(vc);
          if (na || nc) {
            if (na && nc) return a < c;
            return largest ? na : nc;
          }
          if (va != vc) return largest ? va > vc : va < vc;
          return a < c;
        };
        if (k < dim) std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
        else std::sort(order.begin(), order.end(), before);
        for (int64_t j = 0; j < k; ++j) {
          int64_t pos = o * k * inner + j * inner + i;
          vo[pos] = base[order[size_t(j)] * inner];
          io[pos] = order[size_t(j)];
        }
      }
    });
  });
}

void topk_rule(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  const auto& in = ctx.input_shape(0);
  if (!in) {
    ctx.set_output(0, dt);
    ctx.set_output(1, DType::kInt64);
    return;
  }
  int64_t axis = normalize_axis(ctx.node(), ctx.node().attr_int("axis", -1), int64_t(in->size()));
  int64_t k = -1;
  if (ctx.opset() < 10) k = ctx.node().attr_int("k", -1);
  else if (const Tensor* kt = ctx.input_value(1); kt && kt->numel() == 1) k = kt->item_as_int(0);
  Shape out = *in;
  out[size_t(axis)] = k;
  ctx.set_output(0, dt, out);
  ctx.set_output(1, DType::kInt64, out);
}

// ---- NonZero ----

void nonzero_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Shape shape = x.rank() == 0 ? Shape{1} : x.shape();  // numpy treats a scalar as 1-D
  int64_t r = int64_t(shape.size()), n = x.numel();
  dispatch_all(x.dtype(), [&]<typename T>() {
    const T* p = x.data<T>();
    int64_t nnz = 0;
    for (int64_t i = 0; i < n; ++i) nnz += cast_value<bool>(p[i]) ? 1 : 0;
    Tensor& out = ctx.output(0, DType::kInt64, {r, nnz});
    int64_t* o = out.data<int64_t>();
    std::vector<int64_t> idx(static_cast<size_t>(r), 0);
    int64_t col = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (cast_value<bool>(p[i])) {
        for (int64_t d = 0; d < r; ++d) o[d * nnz + col] = idx[size_t(d)];
        ++col;
      }
      for (int64_t d = r - 1; d >= 0; --d) {
        if (++idx[size_t(d)] < shape[size_t(d)]) break;
        idx[size_t(d)] = 0;
      }
    }
  });
}

void nonzero_rule(ShapeContext& ctx) {
  const auto& in = ctx.input_shape(0);
  ctx.set_output(0, DType::kInt64, in ? std::optional<Shape>(Shape{std::max<int64_t>(int64_t(in->size()), 1), -1})
                                      : std::nullopt);
}

// ---- Unique ----

void unique_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  bool sorted = node.attr_int("sorted", 1) != 0;
  bool has_axis = node.has_attr("axis");
  int64_t outer = 1, dim = x.numel(), inner = 1, axis = 0;
  if (has_axis) {
    axis = normalize_axis(node, node.attr_int("axis", 0), x.rank());
    dim = x.dim(int(axis));
    for (int64_t d = 0; d < x.rank(); ++d) {
      if (d < axis) outer *= x.dim(int(d));
      else if (d > axis) inner *= x.dim(int(d));
    }
  }
  // Items are the slices along axis (single elements without one); item k's elements are
  // x[o, k, i] in row-major (o, i) order.
  std::vector<int64_t> order(static_cast<size_t>(dim)), first, counts, inverse(static_cast<size_t>(dim));
  std::iota(order.begin(), order.end(), int64_t(0));
  std::vector<int64_t> unique_of_sorted;  // group id per position in `order`
  dispatch_all(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    const T* p = x.data<T>();
    auto elem = [&](int64_t k, int64_t o, int64_t i) { return C(p[(o * dim + k) * inner + i]); };
    auto cmp = [&](int64_t a, int64_t b) {  // -1, 0, 1; NaN sorts last and equals NaN
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < inner; ++i) {
          C va = elem(a, o, i), vb = elem(b, o, i);
          bool na = is_nan(va), nb = is_nan(vb);
          if (na || nb) {
            if (na && nb) continue;
            return na ? 1 : -1;
          }
          if (va < vb) return -1;
          if (vb < va) return 1;
        }
      return 0;
    };
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return cmp(a, b) < 0; });
    for (size_t s = 0; s < order.size(); ++s) {
      if (s == 0 || cmp(order[s - 1], order[s]) != 0) {
        first.push_back(order[s]);  // the stable sort puts the first occurrence first
        counts.push_back(0);
      }
      ++counts.back();
      inverse[size_t(order[s])] = int64_t(first.size() - 1);
    }
  });
  size_t u = first.size();
  // Output position of each group: sorted order, or order of first occurrence.
  std::vector<int64_t> pos(u);
  std::iota(pos.begin(), pos.end(), int64_t(0));
  if (!sorted) {
    std::vector<int64_t> g(u);
    std::iota(g.begin(), g.end(), int64_t(0));
    std::sort(g.begin(), g.end(), [&](int64_t a, int64_t b) { return first[size_t(a)] < first[size_t(b)]; });
    for (size_t j = 0; j < u; ++j) pos[size_t(g[j])] = int64_t(j);
  }
  Shape yshape = has_axis ? x.shape() : Shape{int64_t(u)};
  if (has_axis) yshape[size_t(axis)] = int64_t(u);
  Tensor& y = ctx.output(0, x.dtype(), yshape);
  size_t es = dtype_size(x.dtype());
  const char* src = static_cast<const char*>(x.data());
  char* dst = static_cast<char*>(y.data());
  for (size_t g = 0; g < u; ++g)
    for (int64_t o = 0; o < outer; ++o)
      copy_bytes(dst + size_t((o * int64_t(u) + pos[g]) * inner) * es, src + size_t((o * dim + first[g]) * inner) * es,
                 size_t(inner) * es);
  if (ctx.output_requested(1)) {
    int64_t* q = ctx.output(1, DType::kInt64, {int64_t(u)}).data<int64_t>();
    for (size_t g = 0; g < u; ++g) q[pos[g]] = first[g];
  }
  if (ctx.output_requested(2)) {
    int64_t* q = ctx.output(2, DType::kInt64, {dim}).data<int64_t>();
    for (int64_t k = 0; k < dim; ++k) q[k] = pos[size_t(inverse[size_t(k)])];
  }
  if (ctx.output_requested(3)) {
    int64_t* q = ctx.output(3, DType::kInt64, {int64_t(u)}).data<int64_t>();
    for (size_t g = 0; g < u; ++g) q[pos[g]] = counts[g];
  }
}

void unique_rule(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  const auto& in = ctx.input_shape(0);
  std::optional<Shape> y = Shape{-1};
  int64_t n = -1;
  if (ctx.node().has_attr("axis")) {
    if (in) {
      int64_t axis = normalize_axis(ctx.node(), ctx.node().attr_int("axis", 0), int64_t(in->size()));
      y = *in;
      (*y)[size_t(axis)] = -1;
      n = (*in)[size_t(axis)];
    } else {
      y = std::nullopt;
    }
  } else if (in && std::none_of(in->begin(), in->end(), [](int64_t d) { return d < 0; })) {
    n = numel(*in);
  }
  ctx.set_output(0, dt, y);
  ctx.set_output(1, DType::kInt64, Shape{-1});
  ctx.set_output(2, DType::kInt64, Shape{n});
  ctx.set_output(3, DType::kInt64, Shape{-1});
}

// ---- Compress ----

void compress_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  const Tensor& cond = ctx.input(1);
  OT_CHECK(cond.dtype() == DType::kBool && cond.rank() == 1, node.context(),
           "condition should be a 1-D bool tensor, got ", dtype_name(cond.dtype()), " ", shape_str(cond.shape()));
  bool has_axis = node.has_attr("axis");
  int64_t outer = 1, dim = x.numel(), inner = 1, axis = 0;
  if (has_axis) {
    axis = normalize_axis(node, node.attr_int("axis", 0), x.rank());
    dim = x.dim(int(axis));
    for (int64_t d = 0; d < x.rank(); ++d) {
      if (d < axis) outer *= x.dim(int(d));
      else if (d > axis) inner *= x.dim(int(d));
    }
  }
  const bool* c = cond.data<bool>();
  std::vector<int64_t> keep;
  for (int64_t k = 0; k < cond.numel(); ++k) {
    if (!c[k]) continue;
    OT_CHECK(k < dim, node.context(), "condition selects index ", k, " beyond the axis length ", dim);
    keep.push_back(k);
  }
  int64_t n = int64_t(keep.size());
  Shape shape = has_axis ? x.shape() : Shape{n};
  if (has_axis) shape[size_t(axis)] = n;
  Tensor& out = ctx.output(0, x.dtype(), shape);
  size_t es = dtype_size(x.dtype());
  const char* src = static_cast<const char*>(x.data());
  char* dst = static_cast<char*>(out.data());
  int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(n * inner, 1));
  parallel_for(outer, grain, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o)
      for (int64_t j = 0; j < n; ++j)
        copy_bytes(dst + size_t((o * n + j) * inner) * es, src + size_t((o * dim + keep[size_t(j)]) * inner) * es,
                   size_t(inner) * es);
  });
}

void compress_rule(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  const auto& in = ctx.input_shape(0);
  if (!ctx.node().has_attr("axis")) return ctx.set_output(0, dt, Shape{-1});
  if (!in) return ctx.set_output(0, dt);
  int64_t axis = normalize_axis(ctx.node(), ctx.node().attr_int("axis", 0), int64_t(in->size()));
  Shape out = *in;
  out[size_t(axis)] = -1;
  ctx.set_output(0, dt, out);
}

void topk_gradient(GradientBuilder& g) {
  if (!g.has_dy(0)) return g.set(0, g.zeros_like(g.x(0)));  // only the (integer) indices are used
  g.set(0, g.emit("GatherElementsGrad", {g.dy(0), g.shape(g.x(0)), g.y(1)},
                  {{"axis", Attribute::of(g.node().attr_int("axis", -1))}}, kOnnxTrainDomain));
}

// For ops whose output is x's items at `indices` along the node's axis (x flattened without one):
// dx = gather_grad(dy, shape(x), indices, axis).
void set_scattered_gradient(GradientBuilder& g, const std::string& indices) {
  if (g.node().has_attr("axis")) {
    return g.set(0, g.emit("GatherGrad", {g.dy(0), g.shape(g.x(0)), indices},
                           {{"axis", Attribute::of(g.node().attr_int("axis", 0))}}, kOnnxTrainDomain));
  }
  std::string flat_shape = g.shape(g.reshape(g.x(0), g.ints({-1})));
  g.set(0, reshape_like(g, g.emit("GatherGrad", {g.dy(0), flat_shape, indices}, {}, kOnnxTrainDomain), g.x(0)));
}

// Unique's first-occurrence indices, passed through once its counts show no repeated value: the
// values output is then a permutation of x's items (its derivative a scatter), whereas a repeated
// value that moves apart changes the output's shape (no derivative exists there).
void unique_grad_indices_kernel(KernelContext& ctx) {
  const Tensor& indices = ctx.input(0);
  const Tensor& counts = ctx.input(1);
  OT_CHECK(counts.numel() == indices.numel(), ctx.node().context(), "indices (", indices.numel(),
           ") and counts (", counts.numel(), ") should describe the same unique values");
  int64_t repeated = 0, most = 1;
  for (int64_t g = 0; g < counts.numel(); ++g) {
    const int64_t c = counts.item_as_int(g);
    if (c > 1) ++repeated;
    most = std::max(most, c);
  }
  OT_CHECK(repeated == 0, ctx.node().context(), "Unique is differentiable only where its input has no repeated ",
           "values: ", repeated, " of ", counts.numel(), " values repeat (one of them ", most, " times)");
  ctx.set_output(0, indices);
}

// values = x[first]: with distinct items, dx = gather_grad(dvalues, shape(x), first, axis)
// (flattened x without an axis), after checking that no item repeats.
void unique_gradient(GradientBuilder& g) {
  auto outs = g.emit_n("Unique", {g.x(0)}, 4, g.node().attributes);  // values, first, inverse, counts
  set_scattered_gradient(g, g.emit("UniqueGradIndices", {outs[1], outs[3]}, {}, kOnnxTrainDomain));
}

void compress_gradient(GradientBuilder& g) {
  // The kept positions: nonzero(condition) as a 1-D index list.
  set_scattered_gradient(g, g.reshape(g.emit("NonZero", {g.x(1)}), g.ints({-1})));
}

}  // namespace

// (values, indices) = topk(x, k, axis).  dx = gather_elements_grad(dvalues, shape(x), indices, axis)
ONNXTRAIN_OP(TopK, kOnnxDomain, 1).inputs(1, 2).outputs(2).shape(topk_rule).cpu(topk_kernel).gradient(topk_gradient);
ONNXTRAIN_OP(NonZero, kOnnxDomain, 9).inputs(1).outputs(1).shape(nonzero_rule).not_differentiable()
    .cpu(nonzero_kernel);
// values = unique(x) = x[first] for distinct items.  dx = gather_grad(dvalues, shape(x), first, axis);
// an input with a repeated value has no derivative (moving the copies apart adds an output): the
// backward fails there, naming it (UniqueGradIndices)
ONNXTRAIN_OP(Unique, kOnnxDomain, 11).inputs(1).outputs(1, 4).shape(unique_rule).gradient(unique_gradient)
    .cpu(unique_kernel);
ONNXTRAIN_OP(UniqueGradIndices, kOnnxTrainDomain, 1).inputs(2).outputs(1).shape([](ShapeContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(0), ctx.input_shape(0));
}).not_differentiable().cpu(unique_grad_indices_kernel);
// y = compress(x, c, axis).  dx = gather_grad(dy, shape(x), nonzero(c), axis) (flattened x without an axis)
ONNXTRAIN_OP(Compress, kOnnxDomain, 9).inputs(2).outputs(1).shape(compress_rule).cpu(compress_kernel)
    .gradient(compress_gradient);

}  // namespace onnxtrain
