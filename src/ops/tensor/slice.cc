// Slice and its fused backward onnxtrain.SliceGrad. Slice: starts/ends/axes as attributes (opset 1) or inputs (opset 10+), with steps, negative steps
// and clamping as the spec defines. The copy is one strided_copy (memcpy runs when the innermost
// step is 1); on CUDA tensors the same view goes to copy.cu's strided copy.
#include <algorithm>

#include "ops/gradient_builder.h"
#include "ops/tensor/tensor_ops.h"

namespace onnxtrain {
namespace {
using namespace tensor_ops;

struct SliceAxis {
  int64_t start = 0, step = 1, count = 0;
};

// Per input dim: the first index, step and element count. `in` dims may be -1 in shape rules; a
// sliced unknown dim gives count -1.
std::vector<SliceAxis> plan_slice(const Node& node, const Shape& in, const std::vector<int64_t>& starts,
                                  const std::vector<int64_t>& ends, std::optional<std::vector<int64_t>> axes,
                                  const std::optional<std::vector<int64_t>>& steps) {
  int64_t rank = int64_t(in.size());
  OT_CHECK(starts.size() == ends.size(), node.context(), "starts has ", starts.size(), " entries but ends has ",
           ends.size());
  if (!axes || axes->empty()) {
    axes = std::vector<int64_t>(starts.size());
    for (size_t i = 0; i < starts.size(); ++i) (*axes)[i] = int64_t(i);
  }
  OT_CHECK(axes->size() == starts.size(), node.context(), "axes has ", axes->size(), " entries for ", starts.size(),
           " starts");
  OT_CHECK(!steps || steps->empty() || steps->size() == starts.size(), node.context(), "steps has ", steps->size(),
           " entries for ", starts.size(), " starts");
  std::vector<SliceAxis> plan(static_cast<size_t>(rank));
  std::vector<char> seen(static_cast<size_t>(rank), 0);
  for (int64_t d = 0; d < rank; ++d) plan[size_t(d)] = {0, 1, in[size_t(d)]};
  for (size_t i = 0; i < starts.size(); ++i) {
    int64_t a = normalize_axis(node, (*axes)[i], rank);
    OT_CHECK(!seen[size_t(a)], node.context(), "axis ", a, " appears twice in axes");
    seen[size_t(a)] = 1;
    int64_t step = steps && !steps->empty() ? (*steps)[i] : 1;
    OT_CHECK(step != 0, node.context(), "steps must not be 0");
    int64_t dim = in[size_t(a)];
    if (dim < 0) {
      plan[size_t(a)] = {0, step, -1};
      continue;
    }
    int64_t s = starts[i], e = ends[i];
    if (s < 0) s += dim;
    if (e < 0) e += dim;
    int64_t count;
    if (step > 0) {
      s = std::clamp<int64_t>(s, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
      count = e > s ? (e - s + step - 1) / step : 0;
    } else {
      s = std::clamp<int64_t>(s, 0, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
      count = s > e ? (s - e + (-step) - 1) / (-step) : 0;
    }
    plan[size_t(a)] = {s, step, count};
  }
  return plan;
}

// The sliced positions of a tensor of shape `full`: their counts per dim, and the element strides
// and offset at which they lie in it.
struct SliceView {
  Shape counts;
  std::vector<int64_t> strides;
  int64_t base = 0;
};
SliceView slice_view(const std::vector<SliceAxis>& plan, const Shape& full) {
  std::vector<int64_t> is = strides_of(full);
  SliceView v;
  for (size_t d = 0; d < plan.size(); ++d) {
    v.counts.push_back(plan[d].count);
    v.strides.push_back(is[d] * plan[d].step);
    v.base += is[d] * plan[d].start;
  }
  return v;
}

// Slice's view of its input x: starts, ends, axes and steps from attributes or inputs 1-4.
SliceView slice_of_input(const KernelContext& ctx, const Shape& x) {
  const Node& node = ctx.node();
  auto starts = attr_or_input_ints(ctx, "starts", 1);
  auto ends = attr_or_input_ints(ctx, "ends", 2);
  OT_CHECK(starts && ends, node.context(), "starts and ends are required");
  return slice_view(plan_slice(node, x, *starts, *ends, attr_or_input_ints(ctx, "axes", 3),
                               attr_or_input_ints(ctx, nullptr, 4)), x);
}

void slice_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const SliceView v = slice_of_input(ctx, x.shape());
  Tensor& out = ctx.output(0, x.dtype(), v.counts);
  if (out.numel() == 0) return;
  strided_copy(x, out, v.counts, v.strides, v.base);
}

void slice_rule(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  const auto& in = ctx.input_shape(0);
  auto starts = static_ints(ctx, "starts", 1), ends = static_ints(ctx, "ends", 2);
  auto axes = static_ints(ctx, "axes", 3), steps = static_ints(ctx, nullptr, 4);
  if (!in) return ctx.set_output(0, dt);
  if (!starts.known || !ends.known || !axes.known || !steps.known || !starts.value || !ends.value)
    return ctx.set_output(0, dt, Shape(in->size(), -1));
  auto plan = plan_slice(ctx.node(), *in, *starts.value, *ends.value, axes.value, steps.value);
  Shape out(plan.size());
  for (size_t d = 0; d < plan.size(); ++d) out[d] = plan[d].count;
  ctx.set_output(0, dt, out);
}

// ---- onnxtrain.SliceGrad(dY, shape, starts, ends, axes?, steps?) ----
// dX of shape `shape` is zero except at the positions Slice reads, where it holds dY. Slice
// positions are distinct, so the scatter is a plain strided write, parallel over rows.

template <typename T>
void strided_scatter(const T* in, T* out, const Shape& shape, const std::vector<int64_t>& st, int64_t base) {
  int64_t total = numel(shape);
  if (total == 0) return;
  if (shape.empty()) {
    out[base] = in[0];
    return;
  }
  const size_t r = shape.size() - 1;
  const int64_t inner = shape[r], s = st[r], rows = total / inner;
  parallel_for(rows, std::max<int64_t>(1, kElementwiseGrain / inner), [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row) {
      int64_t off = base, rem = row;
      for (size_t d = r; d-- > 0;) {
        off += (rem % shape[d]) * st[d];
        rem /= shape[d];
      }
      const T* src = in + row * inner;
      if (s == 1) std::memcpy(out + off, src, size_t(inner) * sizeof(T));
      else for (int64_t i = 0; i < inner; ++i) out[off + i * s] = src[i];
    }
  });
}

// SliceGrad's output shape (input 1) and the view of it that dY fills (inputs 2-5), checked against dY.
std::pair<Shape, SliceView> slice_grad_view(const KernelContext& ctx, const Tensor& dy) {
  const Node& node = ctx.node();
  Shape shape = int_list_input(ctx, 1);
  for (int64_t d : shape) OT_CHECK(d >= 0, node.context(), "shape entries must be >= 0, got ", shape_str(shape));
  SliceView v = slice_view(plan_slice(node, shape, int_list_input(ctx, 2), int_list_input(ctx, 3),
                                      attr_or_input_ints(ctx, nullptr, 4), attr_or_input_ints(ctx, nullptr, 5)),
                           shape);
  OT_CHECK(dy.shape() == v.counts, node.context(), "dY has shape ", shape_str(dy.shape()), ", but slicing ",
           shape_str(shape), " gives ", shape_str(v.counts));
  return {shape, v};
}

void slice_grad_kernel(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  const auto view = slice_grad_view(ctx, dy);
  const SliceView& v = view.second;
  Tensor& dx = ctx.output(0, dy.dtype(), view.first);
  if (dx.numel() == 0) return;
  std::memset(dx.data(), 0, dx.nbytes());  // all-zero bytes are zero for every dtype
  dispatch_by_size(dy.dtype(), [&]<typename T>() {
    strided_scatter<T>(static_cast<const T*>(dy.data()), static_cast<T*>(dx.data()), v.counts, v.strides, v.base);
  });
}

#if ONNXTRAIN_CUDA
// Slice: one strided copy from x at the view's strides. SliceGrad: zeros, then dY written at them.
void slice_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (!copy_rank_fits(size_t(x.rank()))) return run_on_host(ctx, rank_too_high());
  SliceView v = slice_of_input(ctx, x.shape());
  Tensor& out = ctx.output(0, x.dtype(), v.counts);
  strided_copy_cuda(ctx, x, out, {v.counts, std::move(v.strides), {}, v.base, 0});
}

void slice_grad_cuda(KernelContext& ctx) {
  const Tensor& dy = ctx.input(0);
  if (!copy_rank_fits(size_t(dy.rank()))) return run_on_host(ctx, rank_too_high());
  auto [shape, v] = slice_grad_view(ctx, dy);
  Tensor& dx = ctx.output(0, dy.dtype(), shape);
  cuda::memset_zero(dx.data(), dx.nbytes(), ctx.stream());  // all-zero bytes are zero for every dtype
  strided_copy_cuda(ctx, dy, dx, {v.counts, strides_of(v.counts), std::move(v.strides), 0, v.base});
}
#endif

void slice_gradient(GradientBuilder& g) {
  std::string starts = ints_attr_or_input(g, "starts", 1), ends = ints_attr_or_input(g, "ends", 2);
  std::string axes = ints_attr_or_input(g, "axes", 3), steps = ints_attr_or_input(g, nullptr, 4);
  std::vector<std::string> in{g.dy(0), g.shape(g.x(0)), starts, ends, axes, steps};
  while (in.back().empty()) in.pop_back();
  g.set(0, g.emit("SliceGrad", in, {}, kOnnxTrainDomain));
}

}  // namespace

// y = x[starts:ends:steps].  dx = zeros_like(x) with dy written at the sliced positions (SliceGrad)
ONNXTRAIN_OP(Slice, kOnnxDomain, 1).inputs(1, 5).outputs(1).shape(slice_rule).cpu(slice_kernel).work(memory_bound_work)
    .cuda(OT_CUDA(slice_cuda)).host_inputs(std::vector<int>{1, 2, 3, 4}).gradient(slice_gradient);
// dX = slice_grad(dY, shape, starts, ends, axes, steps): the adjoint of Slice.  d(dY) = slice(d(dX), ...)
ONNXTRAIN_OP(SliceGrad, kOnnxTrainDomain, 1).inputs(4, 6).outputs(1).shape(shape_from_input1).cpu(slice_grad_kernel)
    .cuda(OT_CUDA(slice_grad_cuda)).host_inputs(std::vector<int>{1, 2, 3, 4, 5}).gradient([](GradientBuilder& g) {
      std::vector<std::string> in{g.dy(0), g.x(2), g.x(3)};
      if (g.has_input(4) || g.has_input(5)) in.push_back(g.has_input(4) ? g.x(4) : "");
      if (g.has_input(5)) in.push_back(g.x(5));
      g.set(0, g.emit("Slice", in));
    });
// ONNX Runtime's training artifacts: the same inputs (dY, shape, starts, ends, axes?, steps?).
ONNXTRAIN_OP(SliceGrad, kMsDomain, 1).inputs(4, 6).outputs(1).shape(shape_from_input1).cpu(slice_grad_kernel)
    .cuda(OT_CUDA(slice_grad_cuda)).host_inputs(std::vector<int>{1, 2, 3, 4, 5}).gradient_not_implemented("second derivatives through ONNX Runtime's SliceGrad are not needed");

}  // namespace onnxtrain
