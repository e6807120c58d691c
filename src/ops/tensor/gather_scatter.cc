// Indexing ops: Gather, GatherElements, GatherND, ScatterElements (and the older Scatter),
// ScatterND. Negative indices are normalised; an out-of-range index is an error naming the index,
// never an out-of-bounds access. Copies dispatch on element size; reductions on the dtype.
//
// Their backward ops live here too (onnxtrain domain): GatherGrad, GatherElementsGrad and
// GatherNDGrad add dY into zeros at the gathered positions (repeated indices accumulate), and
// ScatterElementsGrad splits dY between data and updates for reduction "none". Gather and
// GatherGrad have CUDA kernels too (backends/cuda/gather.cu).
#include <algorithm>

#include "ops/gradient_builder.h"
#include "ops/tensor/tensor_ops.h"

namespace onnxtrain {
namespace {
using namespace tensor_ops;

// ---- Gather ----

Shape gather_shape(const Shape& data, const Shape& idx, int64_t axis) {
  Shape out(data.begin(), data.begin() + axis);
  out.insert(out.end(), idx.begin(), idx.end());
  out.insert(out.end(), data.begin() + axis + 1, data.end());
  return out;
}

// A shape of rank >= 1 viewed as [outer, dim, inner] around the node's axis.
struct GatherAxis {
  int64_t axis = 0, outer = 1, dim = 0, inner = 1;
};
GatherAxis gather_axis(const Node& node, const Shape& shape, const char* what) {
  OT_CHECK(!shape.empty(), node.context(), what, " should have rank >= 1, got a scalar");
  GatherAxis g;
  g.axis = normalize_axis(node, node.attr_int("axis", 0), int64_t(shape.size()));
  g.dim = shape[size_t(g.axis)];
  for (int64_t d = 0; d < int64_t(shape.size()); ++d) {
    if (d < g.axis) g.outer *= shape[size_t(d)];
    else if (d > g.axis) g.inner *= shape[size_t(d)];
  }
  return g;
}

void gather_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& data = ctx.input(0);
  const Tensor& idx = ctx.input(1);
  check_index_dtype(ctx, idx, "indices");
  const GatherAxis g = gather_axis(node, data.shape(), "data");
  const int64_t axis = g.axis, outer = g.outer, dim = g.dim, inner = g.inner, n = idx.numel();
  Tensor& out = ctx.output(0, data.dtype(), gather_shape(data.shape(), idx.shape(), axis));
  if (out.numel() == 0) return;
  dispatch_index(idx.dtype(), [&]<typename I>() {
    const I* ip = idx.data<I>();
    for (int64_t j = 0; j < n; ++j) checked_index(node, int64_t(ip[j]), dim, "gather");
    dispatch_by_size(data.dtype(), [&]<typename T>() {
      const T* src = static_cast<const T*>(data.data());
      T* dst = static_cast<T*>(out.data());
      int64_t grain = std::max<int64_t>(1, kElementwiseGrain / inner);
      parallel_for(outer * n, grain, [&](int64_t b, int64_t e) {
        for (int64_t item = b; item < e; ++item) {
          int64_t o = item / n, k = int64_t(ip[item % n]);
          if (k < 0) k += dim;
          const T* s = src + (o * dim + k) * inner;
          if (inner == 1) dst[item] = *s;
          else std::copy_n(s, inner, dst + item * inner);
        }
      });
    });
  });
}

void gather_rule(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  const auto &d = ctx.input_shape(0), &i = ctx.input_shape(1);
  if (!d || !i) return ctx.set_output(0, dt);
  OT_CHECK(!d->empty(), ctx.node().context(), "data should have rank >= 1, got a scalar");  // as the kernel says
  int64_t axis = normalize_axis(ctx.node(), ctx.node().attr_int("axis", 0), int64_t(d->size()));
  ctx.set_output(0, dt, gather_shape(*d, *i, axis));
}

// ---- GatherElements ----

// The axis of a GatherElements / ScatterElements node (and their gradients) after checking its
// indices against the tensor they index (`what` names it in errors): the same rank (>= 1), and no
// dim larger than the tensor's outside the axis.
int64_t elements_axis(const Node& node, const Tensor& idx, const Shape& indexed, const char* what) {
  const int64_t r = int64_t(indexed.size());
  OT_CHECK(idx.rank() == r && r >= 1, node.context(), "indices ", shape_str(idx.shape()), " should have the rank of ",
           what, " ", shape_str(indexed));
  const int64_t axis = normalize_axis(node, node.attr_int("axis", 0), r);
  for (int64_t d = 0; d < r; ++d)
    OT_CHECK(d == axis || idx.dim(int(d)) <= indexed[size_t(d)], node.context(), "indices ", shape_str(idx.shape()),
             " exceed ", what, " ", shape_str(indexed), " in dim ", d);
  return axis;
}

void gather_elements_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& data = ctx.input(0);
  const Tensor& idx = ctx.input(1);
  check_index_dtype(ctx, idx, "indices");
  int64_t r = data.rank();
  int64_t axis = elements_axis(node, idx, data.shape(), "data");
  Tensor& out = ctx.output(0, data.dtype(), idx.shape());
  if (out.numel() == 0) return;
  std::vector<int64_t> ds = strides_of(data.shape());
  int64_t dim = data.dim(int(axis)), last = idx.dim(-1), rows = idx.numel() / last;
  dispatch_index(idx.dtype(), [&]<typename I>() {
    const I* ip = idx.data<I>();
    for (int64_t j = 0; j < idx.numel(); ++j) checked_index(node, int64_t(ip[j]), dim, "gather_elements");
    dispatch_by_size(data.dtype(), [&]<typename T>() {
      const T* src = static_cast<const T*>(data.data());
      T* dst = static_cast<T*>(out.data());
      int64_t grain = std::max<int64_t>(1, kElementwiseGrain / last);
      parallel_for(rows, grain, [&](int64_t b, int64_t e) {
        for (int64_t row = b; row < e; ++row) {
          int64_t base = 0, rem = row;
          for (int64_t d = r - 2; d >= 0; --d) {
            int64_t i = rem % idx.dim(int(d));
            rem /= idx.dim(int(d));
            if (d != axis) base += i * ds[size_t(d)];
          }
          const I* irow = ip + row * last;
          T* orow = dst + row * last;
          int64_t sa = ds[size_t(axis)], sl = ds[size_t(r - 1)];
          for (int64_t j = 0; j < last; ++j) {
            int64_t k = int64_t(irow[j]);
            if (k < 0) k += dim;
            orow[j] = src[base + k * sa + (axis == r - 1 ? 0 : j * sl)];
          }
        }
      });
    });
  });
}

// ---- GatherND ----

struct NDPlan {
  int64_t batch = 1, tuples = 1, m = 0, slice = 1, data_batch_stride = 1;
  Shape out_shape;
};

NDPlan nd_plan(const Node& node, const Shape& data, const Shape& idx, int64_t b) {
  int64_t r = int64_t(data.size()), q = int64_t(idx.size());
  OT_CHECK(q >= 1 && r >= 1, node.context(), "data and indices should have rank >= 1");
  OT_CHECK(b >= 0 && b < std::min(r, q), node.context(), "batch_dims ", b, " should be < min(rank(data), rank(indices))");
  NDPlan p;
  p.m = idx.back();
  OT_CHECK(p.m >= 1 && p.m <= r - b, node.context(), "indices last dim ", p.m, " should be in [1, ", r - b, "]");
  for (int64_t d = 0; d < b; ++d) {
    OT_CHECK(data[size_t(d)] == idx[size_t(d)] || data[size_t(d)] < 0 || idx[size_t(d)] < 0, node.context(),
             "batch dims of data ", shape_str(data), " and indices ", shape_str(idx), " differ");
    p.batch *= data[size_t(d)];
  }
  for (int64_t d = b; d < q - 1; ++d) p.tuples *= idx[size_t(d)];
  for (int64_t d = b + p.m; d < r; ++d) p.slice *= data[size_t(d)];
  for (int64_t d = b; d < r; ++d) p.data_batch_stride *= data[size_t(d)];
  p.out_shape.assign(idx.begin(), idx.end() - 1);
  p.out_shape.insert(p.out_shape.end(), data.begin() + b + p.m, data.end());
  return p;
}

// The element offset (within one batch) of index tuple t, validated.
template <typename I>
int64_t nd_offset(const Node& node, const I* tuple, int64_t m, const Shape& data, int64_t b,
                  const std::vector<int64_t>& ds) {
  int64_t off = 0;
  for (int64_t j = 0; j < m; ++j)
    off += checked_index(node, int64_t(tuple[j]), data[size_t(b + j)], "gather_nd") * ds[size_t(b + j)];
  return off;
}

void gather_nd_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& data = ctx.input(0);
  const Tensor& idx = ctx.input(1);
  check_index_dtype(ctx, idx, "indices");
  int64_t b = node.attr_int("batch_dims", 0);
  NDPlan p = nd_plan(node, data.shape(), idx.shape(), b);
  Tensor& out = ctx.output(0, data.dtype(), p.out_shape);
  if (out.numel() == 0) return;
  std::vector<int64_t> ds = strides_of(data.shape());
  dispatch_index(idx.dtype(), [&]<typename I>() {
    const I* ip = idx.data<I>();
    for (int64_t t = 0; t < p.batch * p.tuples; ++t) nd_offset(node, ip + t * p.m, p.m, data.shape(), b, ds);
    dispatch_by_size(data.dtype(), [&]<typename T>() {
      const T* src = static_cast<const T*>(data.data());
      T* dst = static_cast<T*>(out.data());
      int64_t grain = std::max<int64_t>(1, kElementwiseGrain / p.slice);
      parallel_for(p.batch * p.tuples, grain, [&](int64_t s, int64_t e) {
        for (int64_t t = s; t < e; ++t) {
          int64_t off = (t / p.tuples) * p.data_batch_stride + nd_offset(node, ip + t * p.m, p.m, data.shape(), b, ds);
          std::copy_n(src + off, p.slice, dst + t * p.slice);
        }
      });
    });
  });
}

void gather_nd_rule(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  const auto &d = ctx.input_shape(0), &i = ctx.input_shape(1);
  if (!d || !i || i->empty() || i->back() < 0) return ctx.set_output(0, dt);
  ctx.set_output(0, dt, nd_plan(ctx.node(), *d, *i, ctx.node().attr_int("batch_dims", 0)).out_shape);
}

// ---- ScatterElements / ScatterND ----

enum class Reduction { kNone, kAdd, kMul, kMax, kMin };

Reduction reduction_of(const Node& node) {
  std::string r = node.attr_string("reduction", "none");
  if (r == "none") return Reduction::kNone;
  if (r == "add") return Reduction::kAdd;
  if (r == "mul") return Reduction::kMul;
  if (r == "max") return Reduction::kMax;
  if (r == "min") return Reduction::kMin;
  OT_THROW(kInvalidArgument, node.context(), "reduction should be none, add, mul, max or min, got '", r, "'");
}

// Calls f(apply) where apply(T* dst, const T* src, n) writes or reduces n elements, T being the
// storage type (by size for plain writes, the real dtype for reductions).
template <typename F>
void with_reducer(const Node& node, DType dt, Reduction red, F&& f) {
  if (red == Reduction::kNone) {
    dispatch_by_size(dt, [&]<typename T>() {
      f.template operator()<T>([](T* d, const T* s, int64_t n) { std::copy_n(s, n, d); });
    });
    return;
  }
  if (dt == DType::kBool) OT_THROW(kNotImplemented, node.context(), "reductions over bool are not supported");
  dispatch_numeric(dt, [&]<typename T>() {
    using C = compute_t<T>;
    f.template operator()<T>([red](T* d, const T* s, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        C a = C(d[i]), b = C(s[i]);
        C v = red == Reduction::kAdd ? C(a + b) : red == Reduction::kMul ? C(a * b)
            : red == Reduction::kMax ? std::max(a, b) : std::min(a, b);
        d[i] = T(v);
      }
    });
  });
}

void scatter_elements_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& data = ctx.input(0);
  const Tensor& idx = ctx.input(1);
  const Tensor& upd = ctx.input(2);
  check_index_dtype(ctx, idx, "indices");
  OT_CHECK(upd.dtype() == data.dtype(), node.context(), "updates dtype ", dtype_name(upd.dtype()),
           " differs from data ", dtype_name(data.dtype()));
  OT_CHECK(upd.shape() == idx.shape(), node.context(), "updates ", shape_str(upd.shape()),
           " should have the shape of indices ", shape_str(idx.shape()));
  int64_t r = data.rank();
  int64_t axis = elements_axis(node, idx, data.shape(), "data");
  Tensor& out = ctx.output(0, data.dtype(), data.shape());
  if (out.data() != data.data()) copy_bytes(out.data(), data.data(), data.nbytes());
  if (idx.numel() == 0) return;
  std::vector<int64_t> ds = strides_of(data.shape());
  int64_t dim = data.dim(int(axis));
  Reduction red = reduction_of(node);
  dispatch_index(idx.dtype(), [&]<typename I>() {
    const I* ip = idx.data<I>();
    for (int64_t j = 0; j < idx.numel(); ++j) checked_index(node, int64_t(ip[j]), dim, "scatter");
    with_reducer(node, data.dtype(), red, [&]<typename T>(auto apply) {
      const T* up = static_cast<const T*>(upd.data());
      T* dst = static_cast<T*>(out.data());
      int64_t n = idx.numel();
      std::vector<int64_t> pos(static_cast<size_t>(r), 0);
      for (int64_t j = 0; j < n; ++j) {
        int64_t off = 0;
        for (int64_t d = 0; d < r; ++d) {
          int64_t i = d == axis ? checked_index(node, int64_t(ip[j]), dim, "scatter") : pos[size_t(d)];
          off += i * ds[size_t(d)];
        }
        apply(dst + off, up + j, 1);
        for (int64_t d = r - 1; d >= 0; --d) {
          if (++pos[size_t(d)] < idx.dim(int(d))) break;
          pos[size_t(d)] = 0;
        }
      }
    });
  });
}

void scatter_nd_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& data = ctx.input(0);
  const Tensor& idx = ctx.input(1);
  const Tensor& upd = ctx.input(2);
  check_index_dtype(ctx, idx, "indices");
  OT_CHECK(upd.dtype() == data.dtype(), node.context(), "updates dtype ", dtype_name(upd.dtype()),
           " differs from data ", dtype_name(data.dtype()));
  NDPlan p = nd_plan(node, data.shape(), idx.shape(), 0);
  OT_CHECK(upd.shape() == p.out_shape, node.context(), "updates ", shape_str(upd.shape()), " should have shape ",
           shape_str(p.out_shape), " for data ", shape_str(data.shape()), " and indices ", shape_str(idx.shape()));
  Tensor& out = ctx.output(0, data.dtype(), data.shape());
  if (out.data() != data.data()) copy_bytes(out.data(), data.data(), data.nbytes());
  if (upd.numel() == 0) return;
  std::vector<int64_t> ds = strides_of(data.shape());
  Reduction red = reduction_of(node);
  dispatch_index(idx.dtype(), [&]<typename I>() {
    const I* ip = idx.data<I>();
    for (int64_t t = 0; t < p.tuples; ++t) nd_offset(node, ip + t * p.m, p.m, data.shape(), 0, ds);
    with_reducer(node, data.dtype(), red, [&]<typename T>(auto apply) {
      const T* up = static_cast<const T*>(upd.data());
      T* dst = static_cast<T*>(out.data());
      for (int64_t t = 0; t < p.tuples; ++t)
        apply(dst + nd_offset(node, ip + t * p.m, p.m, data.shape(), 0, ds), up + t * p.slice, p.slice);
    });
  });
}

// ---- Backward ops ----

// The zero-filled dX of the shape held by input `i` (the forward data's shape).
Tensor& zero_output(KernelContext& ctx, size_t i, DType dt) {
  Shape shape = int_list_input(ctx, i);
  for (int64_t d : shape)
    OT_CHECK(d >= 0, ctx.node().context(), "shape entries must be >= 0, got ", shape_str(shape));
  Tensor& out = ctx.output(0, dt, shape);
  if (out.nbytes()) std::memset(out.data(), 0, out.nbytes());
  return out;
}

// GatherGrad's dX shape viewed around the axis, checked against dY.
GatherAxis gather_grad_axis(const KernelContext& ctx, const Tensor& dy, const Tensor& idx, const Shape& dx) {
  const GatherAxis g = gather_axis(ctx.node(), dx, "shape");
  const Shape want = gather_shape(dx, idx.shape(), g.axis);
  OT_CHECK(dy.shape() == want, ctx.node().context(), "dY has shape ", shape_str(dy.shape()), ", expected ",
           shape_str(want));
  return g;
}

// dst[slice_at(g, j) + i] += src[(g * per_group + j) * slice + i] for every group g, j < per_group
// and i < slice: the scatter-add of the Gather family's gradients. Work is split over (g, i); the
// groups' destinations never overlap, and within a group each i walks every j in order (repeated
// indices add up deterministically).
template <typename T, typename SliceAt>
void scatter_add_slices(T* dst, const T* src, int64_t groups, int64_t per_group, int64_t slice, SliceAt slice_at) {
  using C = compute_t<T>;
  parallel_for(groups * slice, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(1, per_group)),
               [&](int64_t b, int64_t e) {
                 for (int64_t pos = b; pos < e;) {
                   int64_t g = pos / slice, i0 = pos % slice, i1 = std::min(slice, i0 + (e - pos));
                   for (int64_t j = 0; j < per_group; ++j) {
                     T* to = dst + slice_at(g, j);
                     const T* from = src + (g * per_group + j) * slice;
                     for (int64_t i = i0; i < i1; ++i) to[i] = T(C(to[i]) + C(from[i]));
                   }
                   pos += i1 - i0;
                 }
               });
}

// onnxtrain.GatherGrad(dY, shape, indices; axis): dX = zeros(shape); dX[.., idx[j], ..] += dY[.., j, ..].
// kDy, kShape, kIdx: where the inputs are (onnxtrain's order dY, shape, indices; ONNX Runtime's
// com.microsoft.GatherGrad has shape, indices, dY).
template <size_t kDy = 0, size_t kShape = 1, size_t kIdx = 2>
void gather_grad_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& dy = ctx.input(kDy);
  const Tensor& idx = ctx.input(kIdx);
  check_index_dtype(ctx, idx, "indices");
  Tensor& dx = zero_output(ctx, kShape, dy.dtype());
  const GatherAxis g = gather_grad_axis(ctx, dy, idx, dx.shape());
  const int64_t outer = g.outer, dim = g.dim, inner = g.inner, n = idx.numel();
  if (dy.numel() == 0) return;
  dispatch_index(idx.dtype(), [&]<typename I>() {
    const I* ip = idx.data<I>();
    std::vector<int64_t> k(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) k[size_t(j)] = checked_index(node, int64_t(ip[j]), dim, "gather");
    dispatch_float(dy.dtype(), [&]<typename T>() {
      scatter_add_slices(dx.data<T>(), dy.data<T>(), outer, n, inner,
                         [&](int64_t o, int64_t j) { return (o * dim + k[size_t(j)]) * inner; });
    });
  });
}

// onnxtrain.GatherElementsGrad(dY, shape, indices; axis): dX = zeros(shape); dX[p with p[axis] =
// idx[q]] += dY[q]. Split over the non-axis positions of indices, which never collide.
void gather_elements_grad_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& dy = ctx.input(0);
  const Tensor& idx = ctx.input(2);
  check_index_dtype(ctx, idx, "indices");
  Tensor& dx = zero_output(ctx, 1, dy.dtype());
  int64_t r = dx.rank();
  OT_CHECK(dy.shape() == idx.shape(), node.context(), "dY ", shape_str(dy.shape()), " and indices ",
           shape_str(idx.shape()), " should match");
  int64_t axis = elements_axis(node, idx, dx.shape(), "the forward data");
  if (idx.numel() == 0) return;
  std::vector<int64_t> ds = strides_of(dx.shape());
  int64_t outer = 1, inner = 1, len = idx.dim(int(axis)), dim = dx.dim(int(axis));
  for (int64_t d = 0; d < r; ++d) {
    if (d < axis) outer *= idx.dim(int(d));
    else if (d > axis) inner *= idx.dim(int(d));
  }
  // Offsets in dX of the inner positions of indices.
  std::vector<int64_t> inner_off(static_cast<size_t>(inner), 0);
  for (int64_t i = 0; i < inner; ++i) {
    int64_t rem = i;
    for (int64_t d = r - 1; d > axis; --d) {
      inner_off[size_t(i)] += (rem % idx.dim(int(d))) * ds[size_t(d)];
      rem /= idx.dim(int(d));
    }
  }
  dispatch_index(idx.dtype(), [&]<typename I>() {
    const I* ip = idx.data<I>();
    for (int64_t j = 0; j < idx.numel(); ++j) checked_index(node, int64_t(ip[j]), dim, "gather_elements");
    dispatch_float(dy.dtype(), [&]<typename T>() {
      using C = compute_t<T>;
      const T* src = dy.data<T>();
      T* dst = dx.data<T>();
      parallel_for(outer * inner, std::max<int64_t>(1, kElementwiseGrain / len), [&](int64_t b, int64_t e) {
        for (int64_t pos = b; pos < e; ++pos) {
          int64_t o = pos / inner, i = pos % inner, base = inner_off[size_t(i)], rem = o;
          for (int64_t d = axis - 1; d >= 0; --d) {
            base += (rem % idx.dim(int(d))) * ds[size_t(d)];
            rem /= idx.dim(int(d));
          }
          for (int64_t j = 0; j < len; ++j) {
            int64_t q = (o * len + j) * inner + i, k = int64_t(ip[q]);
            if (k < 0) k += dim;
            T& to = dst[base + k * ds[size_t(axis)]];
            to = T(C(to) + C(src[q]));
          }
        }
      });
    });
  });
}

// onnxtrain.GatherNDGrad(dY, shape, indices; batch_dims): dX = zeros(shape); each index tuple's
// slice of dY is added at its position. ONNX Runtime's takes (shape, indices, dY).
template <size_t kDy = 0, size_t kShape = 1, size_t kIdx = 2>
void gather_nd_grad_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& dy = ctx.input(kDy);
  const Tensor& idx = ctx.input(kIdx);
  check_index_dtype(ctx, idx, "indices");
  Tensor& dx = zero_output(ctx, kShape, dy.dtype());
  int64_t b = node.attr_int("batch_dims", 0);
  NDPlan p = nd_plan(node, dx.shape(), idx.shape(), b);
  OT_CHECK(dy.shape() == p.out_shape, node.context(), "dY has shape ", shape_str(dy.shape()), ", expected ",
           shape_str(p.out_shape));
  if (dy.numel() == 0) return;
  std::vector<int64_t> ds = strides_of(dx.shape());
  dispatch_index(idx.dtype(), [&]<typename I>() {
    const I* ip = idx.data<I>();
    std::vector<int64_t> offs(static_cast<size_t>(p.batch * p.tuples));
    for (int64_t t = 0; t < p.batch * p.tuples; ++t)
      offs[size_t(t)] = (t / p.tuples) * p.data_batch_stride + nd_offset(node, ip + t * p.m, p.m, dx.shape(), b, ds);
    dispatch_float(dy.dtype(), [&]<typename T>() {
      scatter_add_slices(dx.data<T>(), dy.data<T>(), p.batch, p.tuples, p.slice,
                         [&](int64_t bt, int64_t t) { return offs[size_t(bt * p.tuples + t)]; });
    });
  });
}

// onnxtrain.ScatterElementsGrad(dY, indices; axis) -> (dData, dUpdates) for reduction "none":
// dData = dY with every written position zeroed; dUpdates[j] = dY at j's position when update j is
// the one that stays (the last write there, as the kernel applies them in order), else 0.
void scatter_elements_grad_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& dy = ctx.input(0);
  const Tensor& idx = ctx.input(1);
  check_index_dtype(ctx, idx, "indices");
  int64_t r = dy.rank();
  int64_t axis = elements_axis(node, idx, dy.shape(), "dY");
  Tensor& dd = ctx.output(0, dy.dtype(), dy.shape());
  Tensor& du = ctx.output(1, dy.dtype(), idx.shape());
  copy_bytes(dd.data(), dy.data(), dy.nbytes());
  if (idx.numel() == 0) return;
  std::vector<int64_t> ds = strides_of(dy.shape());
  int64_t dim = dy.dim(int(axis)), n = idx.numel();
  std::vector<int64_t> off(static_cast<size_t>(n));
  dispatch_index(idx.dtype(), [&]<typename I>() {
    const I* ip = idx.data<I>();
    std::vector<int64_t> pos(static_cast<size_t>(r), 0);
    for (int64_t j = 0; j < n; ++j) {
      int64_t o = 0;
      for (int64_t d = 0; d < r; ++d)
        o += (d == axis ? checked_index(node, int64_t(ip[j]), dim, "scatter") : pos[size_t(d)]) * ds[size_t(d)];
      off[size_t(j)] = o;
      for (int64_t d = r - 1; d >= 0; --d) {
        if (++pos[size_t(d)] < idx.dim(int(d))) break;
        pos[size_t(d)] = 0;
      }
    }
  });
  dispatch_by_size(dy.dtype(), [&]<typename T>() {
    const T* g = static_cast<const T*>(dy.data());
    T* pd = static_cast<T*>(dd.data());
    T* pu = static_cast<T*>(du.data());
    std::vector<char> taken(static_cast<size_t>(dy.numel()), 0);
    for (int64_t j = n; j-- > 0;) {  // the last write to a position wins
      int64_t o = off[size_t(j)];
      if (taken[size_t(o)]) {
        std::memset(static_cast<void*>(pu + j), 0, sizeof(T));
      } else {
        pu[j] = g[o];
        taken[size_t(o)] = 1;
        std::memset(static_cast<void*>(pd + o), 0, sizeof(T));
      }
    }
  });
}

// Gradient rules.

Reduction checked_gradient_reduction(GradientBuilder& g) {
  Reduction red = reduction_of(g.node());
  if (red != Reduction::kNone && red != Reduction::kAdd)
    OT_THROW(kNotImplemented, g.context(), "no gradient rule for reduction '", g.node().attr_string("reduction", ""),
             "': mul needs zero-safe products of the other updates, max/min need tie handling (only none and add)");
  return red;
}

void scatter_elements_gradient(GradientBuilder& g) {
  GraphBuilder::Attrs axis{{"axis", Attribute::of(g.node().attr_int("axis", 0))}};
  if (checked_gradient_reduction(g) == Reduction::kAdd) {
    g.set(0, g.dy(0));
    if (g.needs(2)) g.set(2, g.emit("GatherElements", {g.dy(0), g.x(1)}, axis));
    return;
  }
  auto d = g.emit_n("ScatterElementsGrad", {g.dy(0), g.x(1)}, 2, axis, kOnnxTrainDomain);
  g.set(0, d[0]);
  g.set(2, d[1]);
}

void scatter_nd_gradient(GradientBuilder& g) {
  Reduction red = checked_gradient_reduction(g);
  if (g.needs(0))
    g.set(0, red == Reduction::kAdd ? g.dy(0) : g.emit("ScatterND", {g.dy(0), g.x(1), g.zeros_like(g.x(2))}));
  if (g.needs(2)) g.set(2, g.emit("GatherND", {g.dy(0), g.x(1)}));
}

#if ONNXTRAIN_CUDA
// Gather and GatherGrad on CUDA tensors (gather.cu). Their indices are host inputs: checked and
// normalised here as the CPU kernels do, then uploaded with the launch; GatherGrad sorts them on
// the host too, so that it sums without atomics, the same bits every run.
std::vector<int64_t> checked_indices(const KernelContext& ctx, const Tensor& idx, int64_t dim) {
  std::vector<int64_t> k(size_t(idx.numel()));
  dispatch_index(idx.dtype(), [&]<typename I>() {
    const I* ip = idx.data<I>();
    for (size_t j = 0; j < k.size(); ++j) k[j] = checked_index(ctx.node(), int64_t(ip[j]), dim, "gather");
  });
  return k;
}

void gather_cuda(KernelContext& ctx) {
  const Tensor& data = ctx.input(0);
  const Tensor& idx = ctx.input(1);
  check_index_dtype(ctx, idx, "indices");
  const auto [axis, outer, dim, inner] = gather_axis(ctx.node(), data.shape(), "data");
  Tensor& out = ctx.output(0, data.dtype(), gather_shape(data.shape(), idx.shape(), axis));
  if (out.numel() == 0) return;
  const std::vector<int64_t> k = checked_indices(ctx, idx, dim);
  cuda::gather(dtype_size(data.dtype()), data.data(), k.data(), out.data(), idx.numel(), outer, dim, inner, ctx.stream());
}

template <size_t kDy = 0, size_t kShape = 1, size_t kIdx = 2>
void gather_grad_cuda(KernelContext& ctx) {
  const Tensor& dy = ctx.input(kDy);
  const Tensor& idx = ctx.input(kIdx);
  check_index_dtype(ctx, idx, "indices");
  const DType dt = dy.dtype();
  if (!(dt == DType::kFloat32 || dt == DType::kFloat16 || dt == DType::kBFloat16))
    return run_on_host(ctx, "dtype " + dtype_name(dt));
  const Shape shape = int_list_input(ctx, kShape);
  for (int64_t d : shape)
    OT_CHECK(d >= 0, ctx.node().context(), "shape entries must be >= 0, got ", shape_str(shape));
  const auto [axis, outer, dim, inner] = gather_grad_axis(ctx, dy, idx, shape);
  Tensor& dx = ctx.output(0, dt, shape);
  const std::vector<int64_t> k = dy.numel() ? checked_indices(ctx, idx, dim) : std::vector<int64_t>{};
  cuda::gather_grad(dt, dy.data(), k.data(), dx.data(), int64_t(k.size()), outer, dim, inner, ctx.stream());
}
#endif

GraphBuilder::Attrs copy_attr(const Node& node, const char* name) {
  GraphBuilder::Attrs a;
  if (const Attribute* v = node.attr(name)) a[name] = *v;
  return a;
}

}  // namespace

// y = gather(x, idx, axis).  dx = gather_grad(dy, shape(x), idx, axis): dy added into zeros at idx
ONNXTRAIN_OP(Gather, kOnnxDomain, 1).inputs(2).outputs(1).shape(gather_rule).cpu(gather_kernel)
    .cuda(OT_CUDA(gather_cuda)).host_inputs(std::vector<int>{1})
    .gradient([](GradientBuilder& g) {
      g.set(0, g.emit("GatherGrad", {g.dy(0), g.shape(g.x(0)), g.x(1)}, copy_attr(g.node(), "axis"), kOnnxTrainDomain));
    });
// y = gather_elements(x, idx, axis).  dx = gather_elements_grad(dy, shape(x), idx, axis): dy added into zeros at idx
ONNXTRAIN_OP(GatherElements, kOnnxDomain, 11).inputs(2).outputs(1)
    .shape([](ShapeContext& ctx) { ctx.set_output(0, ctx.input_dtype(0), ctx.input_shape(1)); })
    .cpu(gather_elements_kernel).gradient([](GradientBuilder& g) {
      g.set(0, g.emit("GatherElementsGrad", {g.dy(0), g.shape(g.x(0)), g.x(1)}, copy_attr(g.node(), "axis"),
                      kOnnxTrainDomain));
    });
// y = gather_nd(x, idx, b).  dx = gather_nd_grad(dy, shape(x), idx, b): each tuple's dy slice added into zeros
ONNXTRAIN_OP(GatherND, kOnnxDomain, 11).inputs(2).outputs(1).shape(gather_nd_rule).cpu(gather_nd_kernel)
    .gradient([](GradientBuilder& g) {
      g.set(0, g.emit("GatherNDGrad", {g.dy(0), g.shape(g.x(0)), g.x(1)}, copy_attr(g.node(), "batch_dims"),
                      kOnnxTrainDomain));
    });
// y = scatter(x, idx, u).  dx = dy zeroed where written, du = dy at the written positions (last write wins)
ONNXTRAIN_OP(Scatter, kOnnxDomain, 9).inputs(3).outputs(1).shape(shape_same_as_input).cpu(scatter_elements_kernel)
    .gradient(scatter_elements_gradient);
// y = scatter_elements(x, idx, u).  none: dx = dy zeroed where written, du = dy there (last write wins);
// add: dx = dy, du = gather_elements(dy, idx)
ONNXTRAIN_OP(ScatterElements, kOnnxDomain, 11).inputs(3).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .cpu(scatter_elements_kernel).gradient(scatter_elements_gradient);
// y = scatter_nd(x, idx, u).  none: dx = scatter_nd(dy, idx, 0), du = gather_nd(dy, idx); add: dx = dy, du = gather_nd(dy, idx)
ONNXTRAIN_OP(ScatterND, kOnnxDomain, 11).inputs(3).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .cpu(scatter_nd_kernel).gradient(scatter_nd_gradient);

// Backward ops. Each is linear in dY, so its own gradient is the forward op it is the adjoint of.
// dX = gather_grad(dY, shape, idx, axis).  d(dY) = gather(d(dX), idx, axis)
ONNXTRAIN_OP(GatherGrad, kOnnxTrainDomain, 1).inputs(3).outputs(1).shape(shape_from_input1).cpu(gather_grad_kernel<>)
    .cuda(OT_CUDA(gather_grad_cuda<>)).host_inputs(std::vector<int>{1, 2})
    .gradient([](GradientBuilder& g) { g.set(0, g.emit("Gather", {g.dy(0), g.x(2)}, copy_attr(g.node(), "axis"))); });
// ONNX Runtime's training artifacts: GatherGrad(shape, indices, dY; axis), the same op.
ONNXTRAIN_OP(GatherGrad, kMsDomain, 1).inputs(3).outputs(1).shape([](ShapeContext& ctx) {
  DType dt = ctx.input_dtype(2);
  if (const Tensor* s = ctx.input_value(0)) return ctx.set_output(0, dt, s->to_int_vector());
  ctx.set_output(0, dt);
}).cpu(gather_grad_kernel<2, 0, 1>).cuda(OT_CUDA((gather_grad_cuda<2, 0, 1>))).host_inputs(std::vector<int>{0, 1})
    .gradient_not_implemented("second derivatives through ONNX Runtime's GatherGrad are not needed");
// dX = gather_elements_grad(dY, shape, idx, axis).  d(dY) = gather_elements(d(dX), idx, axis)
ONNXTRAIN_OP(GatherElementsGrad, kOnnxTrainDomain, 1).inputs(3).outputs(1).shape(shape_from_input1)
    .cpu(gather_elements_grad_kernel).gradient([](GradientBuilder& g) {
      g.set(0, g.emit("GatherElements", {g.dy(0), g.x(2)}, copy_attr(g.node(), "axis")));
    });
// dX = gather_nd_grad(dY, shape, idx, b).  d(dY) = gather_nd(d(dX), idx, b)
ONNXTRAIN_OP(GatherNDGrad, kOnnxTrainDomain, 1).inputs(3).outputs(1).shape(shape_from_input1)
    .cpu(gather_nd_grad_kernel<>).gradient([](GradientBuilder& g) {
      g.set(0, g.emit("GatherND", {g.dy(0), g.x(2)}, copy_attr(g.node(), "batch_dims")));
    });
// ONNX Runtime's training artifacts: GatherElementsGrad(dY, shape, indices; axis), the same op, and
// GatherNDGrad(shape, indices, dY; batch_dims).
ONNXTRAIN_OP(GatherElementsGrad, kMsDomain, 1).inputs(3).outputs(1).shape(shape_from_input1)
    .cpu(gather_elements_grad_kernel)
    .gradient_not_implemented("second derivatives through ONNX Runtime's GatherElementsGrad are not needed");
ONNXTRAIN_OP(GatherNDGrad, kMsDomain, 1).inputs(3).outputs(1).shape([](ShapeContext& ctx) {
  DType dt = ctx.input_dtype(2);
  if (const Tensor* s = ctx.input_value(0)) return ctx.set_output(0, dt, s->to_int_vector());
  ctx.set_output(0, dt);
}).cpu(gather_nd_grad_kernel<2, 0, 1>).gradient_not_implemented("second derivatives through ONNX Runtime's GatherNDGrad are not needed");
// (dD, dU) = scatter_elements_grad(dY, idx, axis).  d(dY) = scatter_elements(d(dD), idx, d(dU)), zeros for a missing one
ONNXTRAIN_OP(ScatterElementsGrad, kOnnxTrainDomain, 1).inputs(2).outputs(2)
    .shape([](ShapeContext& ctx) {
      ctx.set_output(0, ctx.input_dtype(0), ctx.input_shape(0));
      ctx.set_output(1, ctx.input_dtype(0), ctx.input_shape(1));
    })
    .cpu(scatter_elements_grad_kernel).gradient([](GradientBuilder& g) {
      std::string dd = g.has_dy(0) ? g.dy(0) : g.zeros_like(g.y(0));
      std::string du = g.has_dy(1) ? g.dy(1) : g.zeros_like(g.y(1));
      g.set(0, g.emit("ScatterElements", {dd, g.x(1), du}, copy_attr(g.node(), "axis")));
    });

}  // namespace onnxtrain
