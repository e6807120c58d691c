// onnxtrain.SumTo(X, shape): sums X down to `shape`, the inverse of numpy broadcasting. Every
// gradient rule reduces broadcast dimensions through it (GradientBuilder::sum_to).
// com.microsoft.BroadcastGradientArgs(A_shape, B_shape) -> (A_axes, B_axes): ONNX Runtime's form of
// the same reduction, the axes of broadcast(A, B) that a ReduceSum takes each operand's gradient
// down by (ORT-compatible artifacts write SumTo so, src/training/ort_export.cc).
#include "ops/gradient_builder.h"
#include "ops/common.h"
#include "ops/registry.h"
#if ONNXTRAIN_CUDA
#include "backends/cuda/kernels.h"
#endif

namespace onnxtrain {
namespace {

// The target shape (input 1), checked against x's, and the target padded with leading 1s to x's
// rank: every x element adds into out[its index with the dims of 1 set to 0].
std::pair<Shape, Shape> sum_to_target(const KernelContext& ctx, const Tensor& x) {
  Shape target = int_list_input(ctx, 1);
  const Node& node = ctx.node();
  OT_CHECK(target.size() <= size_t(x.rank()), node.context(), "cannot sum ", shape_str(x.shape()), " to ",
           shape_str(target), ": target has higher rank");
  size_t lead = size_t(x.rank()) - target.size();
  for (size_t d = 0; d < target.size(); ++d)
    OT_CHECK(target[d] == x.shape()[lead + d] || target[d] == 1, node.context(), "cannot sum ",
             shape_str(x.shape()), " to ", shape_str(target));
  Shape full(size_t(x.rank()), 1);
  for (size_t d = 0; d < target.size(); ++d) full[lead + d] = target[d];
  return {target, full};
}

void sum_to_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const auto shapes = sum_to_target(ctx, x);
  const Shape &target = shapes.first, &full = shapes.second;
  if (x.shape() == target) {
    ctx.set_output(0, x);
    return;
  }
  Tensor& out = ctx.output(0, x.dtype(), target);
  // Fast path: only leading dims are reduced, so X is [rows, n_out] and out sums its rows
  // (bias gradients). Rows are added in order, vectorised along the row.
  size_t first_kept = 0;
  while (first_kept < full.size() && full[first_kept] == 1) ++first_kept;
  bool leading_only = true;
  for (size_t d = first_kept; d < full.size(); ++d) leading_only = leading_only && full[d] == x.shape()[d];
  if (leading_only) {
    int64_t n_out = out.numel(), rows = n_out ? x.numel() / n_out : 0;
    dispatch_float(x.dtype(), [&]<typename T>() {
      using C = compute_t<T>;
      const T* px = x.data<T>();
      T* po = out.data<T>();
      parallel_for(n_out, 1024, [&](int64_t b, int64_t e) {
        std::vector<C> acc(size_t(e - b), C(0));
        for (int64_t r = 0; r < rows; ++r) {
          const T* row = px + r * n_out;
          for (int64_t j = b; j < e; ++j) acc[size_t(j - b)] += C(row[j]);
        }
        for (int64_t j = b; j < e; ++j) po[j] = T(acc[size_t(j - b)]);
      });
    });
    return;
  }
  dispatch_float(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    const T* px = x.data<T>();
    T* po = out.data<T>();
    int64_t n_out = out.numel();
    // Accumulate per output element in the compute type; parallel over output elements.
    std::vector<int64_t> in_strides = strides_of(x.shape());
    // Dimensions that are reduced (target 1, x > 1).
    std::vector<int> reduced, kept;
    for (int d = 0; d < x.rank(); ++d) (full[size_t(d)] == 1 && x.shape()[size_t(d)] != 1 ? reduced : kept).push_back(d);
    int64_t n_red = 1;
    for (int d : reduced) n_red *= x.shape()[size_t(d)];
    parallel_for(n_out, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(n_red, 1)), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        // offset of this output's first contributor in x
        int64_t rem = o, base = 0;
        for (int d = x.rank() - 1; d >= 0; --d) {
          int64_t extent = full[size_t(d)];
          int64_t i = rem % extent;
          rem /= extent;
          base += i * in_strides[size_t(d)];
        }
        C acc = C(0);
        for (int64_t r = 0; r < n_red; ++r) {
          int64_t rr = r, off = base;
          for (size_t k = reduced.size(); k-- > 0;) {
            int d = reduced[k];
            off += (rr % x.shape()[size_t(d)]) * in_strides[size_t(d)];
            rr /= x.shape()[size_t(d)];
          }
          acc += C(px[off]);
        }
        po[o] = T(acc);
      }
    });
  });
}

#if ONNXTRAIN_CUDA
// On CUDA tensors: reduce.cu's sum over [outer, reduced, inner] where the summed dims (size-1
// dims aside) are adjacent (bias gradients: the leading dims; a broadcast middle dim); other
// layouts and dtypes run on the host.
void sum_to_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const auto [target, full] = sum_to_target(ctx, x);
  if (x.shape() == target) return ctx.set_output(0, x);
  int64_t outer = 1, reduced = 1, inner = 1;
  int phase = 0;  // 0: before the summed dims, 1: in them, 2: after
  bool adjacent = true;
  for (size_t d = 0; d < full.size(); ++d) {
    const int64_t n = x.shape()[d];
    if (n == 1) continue;
    if (full[d] == 1) {
      if (phase == 2) adjacent = false;
      phase = 1;
      reduced *= n;
    } else {
      if (phase == 1) phase = 2;
      (phase == 0 ? outer : inner) *= n;
    }
  }
  const DType dt = x.dtype();
  if (!adjacent || !(dt == DType::kFloat32 || dt == DType::kFloat16 || dt == DType::kBFloat16))
    return run_on_host(ctx, adjacent ? "dtype " + dtype_name(dt) : "summed dims apart");
  Tensor& out = ctx.output(0, dt, target);
  cuda::reduce_sum(dt, x.data(), out.data(), outer, reduced, inner, 1.0f, ctx.stream());
}
#endif

void sum_to_shape(ShapeContext& ctx) {
  std::optional<Shape> shape;
  if (const Tensor* t = ctx.input_value(1)) shape = t->to_int_vector();
  ctx.set_output(0, ctx.input_dtype(0), shape);
}

// Per operand, the axes (of the broadcast shape, ascending) where it was broadcast: dims it lacks
// and its 1s against a larger dim. Shapes that do not broadcast are an error.
void broadcast_gradient_args_kernel(KernelContext& ctx) {
  const std::vector<int64_t> a = int_list_input(ctx, 0), b = int_list_input(ctx, 1);
  const size_t rank = std::max(a.size(), b.size());
  std::vector<int64_t> a_axes, b_axes;
  for (size_t k = 0; k < rank; ++k) {
    const int64_t da = k + a.size() >= rank ? a[k + a.size() - rank] : -1;  // -1: the operand lacks the dim
    const int64_t db = k + b.size() >= rank ? b[k + b.size() - rank] : -1;
    OT_CHECK(da == db || da == 1 || db == 1 || da < 0 || db < 0, ctx.node().context(), "shapes ",
             shape_str(Shape(a)), " and ", shape_str(Shape(b)), " do not broadcast (axis ", k, ")");
    if (da != db && (da < 0 || (da == 1 && db != 1))) a_axes.push_back(int64_t(k));
    if (da != db && (db < 0 || (db == 1 && da != 1))) b_axes.push_back(int64_t(k));
  }
  if (ctx.output_requested(0)) ctx.set_output(0, Tensor::from_vector<int64_t>(a_axes, {int64_t(a_axes.size())}));
  if (ctx.output_requested(1)) ctx.set_output(1, Tensor::from_vector<int64_t>(b_axes, {int64_t(b_axes.size())}));
}

}  // namespace

ONNXTRAIN_OP(BroadcastGradientArgs, kMsDomain, 1).inputs(2).outputs(1, 2).not_differentiable()
    .shape([](ShapeContext& ctx) {
      ctx.set_output(0, DType::kInt64);
      ctx.set_output(1, DType::kInt64);
    }).cpu(broadcast_gradient_args_kernel);

// Y = sum_to(X, shape).  dX = expand(dY, shape(X))
ONNXTRAIN_OP(SumTo, kOnnxTrainDomain, 1).inputs(2).outputs(1).shape(sum_to_shape).cpu(sum_to_kernel)
    .cuda(OT_CUDA(sum_to_cuda)).host_inputs(std::vector<int>{1})
    .gradient([](GradientBuilder& g) { g.set(0, g.emit("Expand", {g.dy(0), g.shape(g.x(0))})); });

}  // namespace onnxtrain
