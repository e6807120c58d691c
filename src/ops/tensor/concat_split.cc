// Concat and Split: rows of [outer, axis * inner] are copied with one memcpy per input/output
// (Concat on CUDA tensors: one strided copy per input, copy.cu).
#include <algorithm>

#include "ops/gradient_builder.h"
#include "ops/tensor/tensor_ops.h"

namespace onnxtrain {
namespace tensor_ops {

namespace {
// The shape of inputs concatenated along `axis` (in range), checking dtypes and the other dims.
Shape concat_shape(const Node& node, const std::vector<const Tensor*>& inputs, int64_t axis) {
  const Tensor& first = *inputs[0];
  const int64_t rank = first.rank();
  OT_CHECK(rank >= 1, node.context(), "concatenates tensors of rank >= 1, got a scalar");
  Shape out_shape = first.shape();
  out_shape[size_t(axis)] = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = *inputs[i];
    OT_CHECK(t.dtype() == first.dtype(), node.context(), "input ", i, " has dtype ", dtype_name(t.dtype()),
             ", expected ", dtype_name(first.dtype()));
    OT_CHECK(t.rank() == rank, node.context(), "input ", i, " has shape ", shape_str(t.shape()),
             ", expected rank ", rank);
    for (int64_t d = 0; d < rank; ++d)
      OT_CHECK(d == axis || t.dim(int(d)) == first.dim(int(d)), node.context(), "input ", i, " has shape ",
               shape_str(t.shape()), ", which differs from ", shape_str(first.shape()), " off axis ", axis);
    out_shape[size_t(axis)] += t.dim(int(axis));
  }
  return out_shape;
}
}  // namespace

Tensor& concat_tensors(KernelContext& ctx, const std::vector<const Tensor*>& inputs, int64_t axis_attr,
                       size_t output) {
  const Node& node = ctx.node();
  OT_CHECK(!inputs.empty(), node.context(), "has nothing to concatenate");
  const Tensor& first = *inputs[0];
  const int64_t rank = first.rank();
  const int64_t axis = normalize_axis(node, axis_attr, rank);
  const Shape out_shape = concat_shape(node, inputs, axis);
  Tensor& out = ctx.output(output, first.dtype(), out_shape);
  if (out.numel() == 0) return out;
  const size_t es = dtype_size(first.dtype());
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < rank; ++d) {
    if (d < axis) outer *= out_shape[size_t(d)];
    else if (d > axis) inner *= out_shape[size_t(d)];
  }
  const int64_t row = out_shape[size_t(axis)] * inner;  // elements per output row
  char* dst = static_cast<char*>(out.data());
  std::vector<std::pair<const char*, int64_t>> parts;  // (data, elements per row)
  for (const Tensor* t : inputs) parts.push_back({static_cast<const char*>(t->data()), t->dim(int(axis)) * inner});
  int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(row, 1));
  parallel_for(outer, grain, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      char* d = dst + size_t(o * row) * es;
      for (const auto& [src, n] : parts) {
        copy_bytes(d, src + size_t(o * n) * es, size_t(n) * es);
        d += size_t(n) * es;
      }
    }
  });
  return out;
}

void split_tensor(const Tensor& x, int64_t axis, const std::vector<Tensor*>& outs) {
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < x.rank(); ++d) {
    if (d < axis) outer *= x.dim(int(d));
    else if (d > axis) inner *= x.dim(int(d));
  }
  const size_t es = dtype_size(x.dtype());
  const int64_t row = x.dim(int(axis)) * inner;
  std::vector<std::pair<char*, int64_t>> parts;
  for (Tensor* out : outs) parts.push_back({static_cast<char*>(out->data()), out->dim(int(axis)) * inner});
  if (x.numel() == 0) return;
  const char* src = static_cast<const char*>(x.data());
  int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(row, 1));
  parallel_for(outer, grain, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      const char* s = src + size_t(o * row) * es;
      for (const auto& [dst, n] : parts) {
        copy_bytes(dst + size_t(o * n) * es, s, size_t(n) * es);
        s += size_t(n) * es;
      }
    }
  });
}

}  // namespace tensor_ops

namespace {
using namespace tensor_ops;

// ---- Concat ----

void concat_kernel(KernelContext& ctx) {
  std::vector<const Tensor*> parts;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) parts.push_back(&ctx.input(i));
  concat_tensors(ctx, parts, ctx.node().attr_int("axis", 1), 0);
}

#if ONNXTRAIN_CUDA
// Each input is a [outer, its rows] block copied into the output's [outer, row] at its offset: one
// strided copy per input.
void concat_cuda(KernelContext& ctx) {
  const Node& node = ctx.node();
  std::vector<const Tensor*> parts;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) parts.push_back(&ctx.input(i));
  OT_CHECK(!parts.empty(), node.context(), "has nothing to concatenate");
  const int64_t axis = normalize_axis(node, node.attr_int("axis", 1), parts[0]->rank());
  const Shape out_shape = concat_shape(node, parts, axis);
  Tensor& out = ctx.output(0, parts[0]->dtype(), out_shape);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < int64_t(out_shape.size()); ++d) {
    if (d < axis) outer *= out_shape[size_t(d)];
    else if (d > axis) inner *= out_shape[size_t(d)];
  }
  const int64_t row = out_shape[size_t(axis)] * inner;
  int64_t offset = 0;
  for (const Tensor* t : parts) {
    const int64_t n = t->dim(int(axis)) * inner;
    strided_copy_cuda(ctx, *t, out, {{outer, n}, {n, 1}, {row, 1}, 0, offset});
    offset += n;
  }
}
#endif

void concat_rule(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  const auto& s0 = ctx.input_shape(0);
  if (!s0) return ctx.set_output(0, dt);
  OT_CHECK(!s0->empty(), ctx.node().context(), "concatenates tensors of rank >= 1, got a scalar");
  int64_t axis = normalize_axis(ctx.node(), ctx.node().attr_int("axis", 1), int64_t(s0->size()));
  Shape out = *s0;
  for (size_t i = 1; i < ctx.node().inputs.size(); ++i) {
    const auto& s = ctx.input_shape(i);
    if (!s || s->size() != out.size()) return ctx.set_output(0, dt, Shape(out.size(), -1));
    for (size_t d = 0; d < out.size(); ++d) {
      if (int64_t(d) == axis) out[d] = (out[d] < 0 || (*s)[d] < 0) ? -1 : out[d] + (*s)[d];
      else if (out[d] < 0) out[d] = (*s)[d];
    }
  }
  ctx.set_output(0, dt, out);
}

// com.microsoft.ConcatTraining (ONNX Runtime's training graphs): Concat, and optionally each
// input's length along the axis (int64 [n]), which ORT's backward splits by.
void concat_training_kernel(KernelContext& ctx) {
  concat_kernel(ctx);
  if (!ctx.output_requested(1)) return;
  const int64_t axis = normalize_axis(ctx.node(), ctx.node().attr_int("axis", 1), ctx.input(0).rank());
  Tensor& lengths = ctx.output(1, DType::kInt64, Shape{int64_t(ctx.num_inputs())});
  for (size_t i = 0; i < ctx.num_inputs(); ++i) lengths.data<int64_t>()[i] = ctx.input(i).dim(int(axis));
}

void concat_training_rule(ShapeContext& ctx) {
  concat_rule(ctx);
  if (ctx.num_outputs() > 1) ctx.set_output(1, DType::kInt64, Shape{int64_t(ctx.node().inputs.size())});
}

// ---- Split ----

// The split sizes: given (attribute before opset 13, input 1 from 13, and in opset 1 either), or
// equal parts.
std::vector<int64_t> split_sizes(const Node& node, int64_t dim, size_t outputs,
                                 const std::optional<std::vector<int64_t>>& given) {
  if (given && !given->empty()) {
    OT_CHECK(given->size() == outputs, node.context(), "split has ", given->size(), " entries for ", outputs,
             " outputs");
    int64_t sum = 0;
    for (int64_t s : *given) {
      OT_CHECK(s >= 0, node.context(), "split sizes must be >= 0, got ", shape_str(*given));
      sum += s;
    }
    OT_CHECK(dim < 0 || sum == dim, node.context(), "split sizes ", shape_str(*given), " sum to ", sum,
             ", expected the axis length ", dim);
    return *given;
  }
  OT_CHECK(dim < 0 || dim % int64_t(outputs) == 0, node.context(), "axis length ", dim,
           " cannot be split into ", outputs, " equal parts");
  return std::vector<int64_t>(outputs, dim < 0 ? -1 : dim / int64_t(outputs));
}

void split_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  OT_CHECK(x.rank() >= 1, node.context(), "Split needs an input of rank >= 1, got a scalar");
  int64_t axis = normalize_axis(node, node.attr_int("axis", 0), x.rank());
  size_t nout = ctx.num_outputs();
  auto sizes = split_sizes(node, x.dim(int(axis)), nout, attr_or_input_ints(ctx, "split", 1));
  std::vector<Tensor*> outs;
  for (size_t i = 0; i < nout; ++i) {
    Shape s = x.shape();
    s[size_t(axis)] = sizes[i];
    outs.push_back(&ctx.output(i, x.dtype(), s));
  }
  split_tensor(x, axis, outs);
}

void split_rule(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  const auto& in = ctx.input_shape(0);
  size_t nout = ctx.num_outputs();
  auto given = static_ints(ctx, "split", 1);
  if (!in || !given.known) {
    for (size_t i = 0; i < nout; ++i) ctx.set_output(i, dt, in ? std::optional<Shape>(Shape(in->size(), -1)) : std::nullopt);
    return;
  }
  OT_CHECK(!in->empty(), ctx.node().context(), "Split needs an input of rank >= 1, got a scalar");
  int64_t axis = normalize_axis(ctx.node(), ctx.node().attr_int("axis", 0), int64_t(in->size()));
  auto sizes = split_sizes(ctx.node(), (*in)[size_t(axis)], nout, given.value);
  for (size_t i = 0; i < nout; ++i) {
    Shape s = *in;
    s[size_t(axis)] = sizes[i];
    ctx.set_output(i, dt, s);
  }
}

void concat_gradient(GradientBuilder& g) {
  int64_t axis = g.node().attr_int("axis", 1);
  size_t n = g.num_inputs();
  std::vector<std::string> lens;
  for (size_t i = 0; i < n; ++i) lens.push_back(dim_of(g, g.x(i), axis));
  std::string sizes = n == 1 ? lens[0] : g.emit("Concat", lens, {{"axis", Attribute::of(int64_t(0))}});
  auto parts = g.emit_n("Split", {g.dy(0), sizes}, n, {{"axis", Attribute::of(axis)}});
  for (size_t i = 0; i < n; ++i) g.set(i, parts[i]);
}

void split_gradient(GradientBuilder& g) {
  int64_t axis = g.node().attr_int("axis", 0);
  std::vector<std::string> parts;
  for (size_t i = 0; i < g.node().outputs.size(); ++i)
    parts.push_back(g.has_dy(i) ? g.dy(i) : g.zeros_like(g.y(i)));
  g.set(0, parts.size() == 1 ? parts[0] : g.emit("Concat", parts, {{"axis", Attribute::of(axis)}}));
}

}  // namespace

// y = concat(x_0..x_n, axis).  dx_i = split(dy, [dim(x_0, axis), ..., dim(x_n, axis)], axis)_i
ONNXTRAIN_OP(Concat, kOnnxDomain, 1).inputs(1, INT_MAX).outputs(1).shape(concat_rule).cpu(concat_kernel).work(memory_bound_work)
    .cuda(OT_CUDA(concat_cuda))
    .gradient(concat_gradient);
// y_i = split(x, axis)_i.  dx = concat(dy_0..dy_n, axis), zeros_like(y_i) for an output without dy_i
// y = concat(x_i, axis).  dx_i = the i-th piece of dy along axis
ONNXTRAIN_OP(ConcatTraining, kMsDomain, 1).inputs(1, INT_MAX).outputs(1, 2).shape(concat_training_rule)
    .cpu(concat_training_kernel).work(memory_bound_work).gradient(concat_gradient);
ONNXTRAIN_OP(Split, kOnnxDomain, 1).inputs(1, 2).outputs(1, INT_MAX).shape(split_rule).cpu(split_kernel)
    .gradient(split_gradient);

}  // namespace onnxtrain
