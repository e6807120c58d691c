// Expand and Tile: both are one strided_copy with stride-0 dims (Expand on CUDA tensors: copy.cu's) (Tile views its output as
// [r0, d0, r1, d1, ...] over input strides [0, s0, 0, s1, ...]).
#include "ops/gradient_builder.h"
#include "ops/tensor/tensor_ops.h"

namespace onnxtrain {
namespace {
using namespace tensor_ops;

// Expand's output shape and x's element strides over it (0 where x repeats).
std::pair<Shape, std::vector<int64_t>> expand_view(const KernelContext& ctx, const Tensor& x) {
  Shape target = int_list_input(ctx, 1);
  OT_CHECK(ctx.input(1).rank() == 1, ctx.node().context(), "shape should be 1-D, got shape ",
           shape_str(ctx.input(1).shape()));
  Shape out_shape = broadcast_shapes(ctx.node(), x.shape(), target);
  std::vector<int64_t> xs = strides_of(x.shape()), st(out_shape.size(), 0);
  size_t off = out_shape.size() - x.shape().size();
  for (size_t d = 0; d < x.shape().size(); ++d) st[off + d] = x.shape()[d] == 1 ? 0 : xs[d];
  return {out_shape, st};
}

void expand_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const auto [out_shape, st] = expand_view(ctx, x);
  Tensor& out = ctx.output(0, x.dtype(), out_shape);
  if (out.numel() == 0) return;
  strided_copy(x, out, out_shape, st, 0);
}

#if ONNXTRAIN_CUDA
void expand_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  auto [out_shape, st] = expand_view(ctx, x);
  if (!copy_rank_fits(out_shape.size())) return run_on_host(ctx, rank_too_high());
  Tensor& out = ctx.output(0, x.dtype(), out_shape);
  strided_copy_cuda(ctx, x, out, {out_shape, std::move(st), {}, 0, 0});
}
#endif

void expand_rule(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  if (const Tensor* s = ctx.input_value(1)) {
    Shape target = s->to_int_vector();
    const auto& in = ctx.input_shape(0);
    if (!in) return ctx.set_output(0, dt);
    // A target dim of 1 takes the input's dim, whatever it is; broadcast_static does exactly that.
    return ctx.set_output(0, dt, broadcast_static(in, target));
  }
  ctx.set_output(0, dt);
}

void tile_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  std::vector<int64_t> reps = int_list_input(ctx, 1);
  OT_CHECK(int64_t(reps.size()) == x.rank(), ctx.node().context(), "repeats has ", reps.size(),
           " entries for an input of rank ", x.rank());
  Shape out_shape(reps.size()), view, st;
  std::vector<int64_t> xs = strides_of(x.shape());
  for (size_t d = 0; d < reps.size(); ++d) {
    OT_CHECK(reps[d] >= 0, ctx.node().context(), "repeats must be >= 0, got ", shape_str(reps));
    out_shape[d] = reps[d] * x.shape()[d];
    view.push_back(reps[d]);
    st.push_back(0);
    view.push_back(x.shape()[d]);
    st.push_back(xs[d]);
  }
  Tensor& out = ctx.output(0, x.dtype(), out_shape);
  if (out.numel() == 0) return;
  strided_copy(x, out, view, st, 0);
}

void tile_rule(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  const auto& in = ctx.input_shape(0);
  if (!in) return ctx.set_output(0, dt);
  const Tensor* r = ctx.input_value(1);
  if (!r) return ctx.set_output(0, dt, Shape(in->size(), -1));
  std::vector<int64_t> reps = r->to_int_vector();
  OT_CHECK(reps.size() == in->size(), ctx.node().context(), "repeats has ", reps.size(), " entries for rank ",
           in->size());
  Shape out(in->size());
  for (size_t d = 0; d < out.size(); ++d) out[d] = (*in)[d] < 0 ? -1 : (*in)[d] * reps[d];
  ctx.set_output(0, dt, out);
}

void tile_gradient(GradientBuilder& g) {
  std::optional<int64_t> rank;
  if (auto s = g.static_shape(g.x(0))) rank = int64_t(s->size());
  else if (auto r = g.static_shape(g.x(1)); r && r->size() == 1 && (*r)[0] >= 0) rank = (*r)[0];
  if (!rank)
    OT_THROW(kNotImplemented, g.context(), "the gradient of Tile needs the input's rank, which is not known statically");
  if (*rank == 0) return g.set(0, g.dy(0));
  // [r0, d0, r1, d1, ...]: repeats and dims interleaved, as the kernel views its output.
  std::string pairs = g.emit("Concat", {g.unsqueeze(g.x(1), {1}), g.unsqueeze(g.shape(g.x(0)), {1})},
                             {{"axis", Attribute::of(int64_t(1))}});
  std::string view = g.emit("Reshape", {g.dy(0), g.emit("Reshape", {pairs, g.ints({-1})})},
                            {{"allowzero", Attribute::of(int64_t(1))}});
  std::vector<int64_t> axes;
  for (int64_t d = 0; d < *rank; ++d) axes.push_back(2 * d);
  g.set(0, g.reduce_sum(view, axes, false));
}

}  // namespace

// y = expand(x, shape).  dx = sum_to(dy, x)
ONNXTRAIN_OP(Expand, kOnnxDomain, 8).inputs(2).outputs(1).shape(expand_rule).cpu(expand_kernel)
    .cuda(OT_CUDA(expand_cuda)).host_inputs(std::vector<int>{1}).gradient([](GradientBuilder& g) { g.set(0, g.sum_to(g.dy(0), g.x(0))); });
// y = tile(x, r).  dx = reduce_sum(reshape(dy, [r0, d0, r1, d1, ...]), axes = [0, 2, 4, ...])
ONNXTRAIN_OP(Tile, kOnnxDomain, 6).inputs(2).outputs(1).shape(tile_rule).cpu(tile_kernel).gradient(tile_gradient);

}  // namespace onnxtrain
