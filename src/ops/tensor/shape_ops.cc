// Shape queries and zero-copy views: Shape, Size, Reshape, Flatten, Squeeze, Unsqueeze, Identity.
// The view ops hand back the input's storage with a new shape (ctx.set_output), never a copy. The
// same kernels serve CUDA tensors (a view of device storage is a device tensor; the executor plans
// aliases on either device alike); only their shape and axes inputs stay on the host.
#include <algorithm>

#include "ops/gradient_builder.h"
#include "ops/tensor/tensor_ops.h"

namespace onnxtrain {
namespace {
using namespace tensor_ops;

// ---- Shape / Size ----

std::pair<int64_t, int64_t> shape_range(const Node& node, int64_t rank) {
  int64_t start = node.attr_int("start", 0), end = node.attr_int("end", rank);
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<int64_t>(start, 0, rank);
  end = std::clamp<int64_t>(end, 0, rank);
  return {start, std::max(start, end)};
}

void shape_kernel(KernelContext& ctx) {
  const Shape& s = ctx.input(0).shape();
  auto [b, e] = shape_range(ctx.node(), int64_t(s.size()));
  Tensor& out = ctx.output(0, DType::kInt64, {e - b});
  int64_t* p = out.data<int64_t>();
  for (int64_t i = b; i < e; ++i) p[i - b] = s[size_t(i)];
}

void shape_rule(ShapeContext& ctx) {
  const auto& s = ctx.input_shape(0);
  if (!s) return ctx.set_output(0, DType::kInt64, Shape{-1});
  auto [b, e] = shape_range(ctx.node(), int64_t(s->size()));
  ctx.set_output(0, DType::kInt64, Shape{e - b});
}

void size_kernel(KernelContext& ctx) {
  Tensor& out = ctx.output(0, DType::kInt64, {});
  out.data<int64_t>()[0] = ctx.input(0).numel();
}

// On a device executor the result of Shape and Size is made on the host: they read metadata
// only, so the input's data is not copied down for them, and the ops that take shapes read them
// there (OpSchema::host_inputs) with no copy either. No device code: every build registers it.
void shape_on_host(KernelContext& ctx) {
  const Shape& s = ctx.input(0).shape();
  auto [b, e] = shape_range(ctx.node(), int64_t(s.size()));
  Tensor out = Tensor::empty(DType::kInt64, {e - b});
  for (int64_t i = b; i < e; ++i) out.data<int64_t>()[i - b] = s[size_t(i)];
  ctx.set_output(0, std::move(out));
}

void size_on_host(KernelContext& ctx) { ctx.set_output(0, Tensor::scalar<int64_t>(ctx.input(0).numel())); }

// ---- Reshape ----

// The target shape with 0 (copy, unless allowzero) and -1 (infer) resolved. Input dims may be -1
// (unknown) in shape rules; the result then has -1 where it cannot be decided.
Shape resolve_reshape(const Node& node, const Shape& in, const std::vector<int64_t>& target, bool allowzero) {
  Shape out(target.size());
  int64_t infer = -1, known = 1;
  bool unknown = false, zero = false, overflow = false;
  for (size_t d = 0; d < target.size(); ++d) {
    int64_t t = target[d];
    if (t == 0 && !allowzero) {
      OT_CHECK(d < in.size(), node.context(), "shape entry ", d, " is 0 (copy the input dim) but the input ",
               shape_str(in), " has rank ", in.size());
      out[d] = in[d];
    } else if (t == -1) {
      OT_CHECK(infer < 0, node.context(), "at most one shape entry may be -1, got ", shape_str(target));
      infer = int64_t(d);
      continue;
    } else {
      OT_CHECK(t >= 0, node.context(), "shape entries must be >= -1, got ", shape_str(target));
      out[d] = t;
    }
    if (out[d] < 0) unknown = true;
    else if (out[d] == 0) zero = true;
    else overflow = overflow || __builtin_mul_overflow(known, out[d], &known);
  }
  // A product past 64 bits is no shape a tensor can have, unless a 0 makes it empty.
  OT_CHECK(zero || !overflow, node.context(), "the target shape ", shape_str(target),
           " has more elements than an int64 can count");
  if (zero) known = 0;
  bool in_unknown = std::any_of(in.begin(), in.end(), [](int64_t v) { return v < 0; });
  int64_t total = in_unknown ? -1 : numel(in);
  if (infer >= 0) {
    if (unknown || total < 0) {
      out[size_t(infer)] = -1;
    } else {
      OT_CHECK(known != 0 && total % known == 0, node.context(), "cannot reshape ", shape_str(in), " to ",
               shape_str(target));
      out[size_t(infer)] = total / known;
    }
  } else if (!unknown && total >= 0) {
    OT_CHECK(known == total, node.context(), "cannot reshape ", shape_str(in), " (", total, " elements) to ",
             shape_str(target));
  }
  return out;
}

void reshape_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  auto target = attr_or_input_ints(ctx, "shape", 1);
  OT_CHECK(target.has_value(), ctx.node().context(), "the target shape is missing");
  bool allowzero = ctx.node().attr_int("allowzero", 0) != 0;
  ctx.set_output(0, x.reshaped(resolve_reshape(ctx.node(), x.shape(), *target, allowzero)));
}

void reshape_rule(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  auto target = static_ints(ctx, "shape", 1);
  if (!target.known || !target.value) {
    // The rank is still known from the shape input's length.
    const auto& ss = ctx.input_shape(1);
    if (ss && ss->size() == 1 && (*ss)[0] >= 0) return ctx.set_output(0, dt, Shape(size_t((*ss)[0]), -1));
    return ctx.set_output(0, dt);
  }
  bool allowzero = ctx.node().attr_int("allowzero", 0) != 0;
  const auto& in = ctx.input_shape(0);
  if (!in) {
    Shape out(target.value->size(), -1);
    for (size_t d = 0; d < out.size(); ++d) {
      int64_t t = (*target.value)[d];
      if (t > 0 || (t == 0 && allowzero)) out[d] = t;
    }
    return ctx.set_output(0, dt, out);
  }
  ctx.set_output(0, dt, resolve_reshape(ctx.node(), *in, *target.value, allowzero));
}

// ---- Flatten ----

Shape flatten_shape(const Node& node, const Shape& in) {
  int64_t rank = int64_t(in.size());
  int64_t axis = node.attr_int("axis", 1);
  if (axis < 0) axis += rank;
  OT_CHECK(axis >= 0 && axis <= rank, node.context(), "axis ", node.attr_int("axis", 1),
           " is out of range for rank ", rank);
  int64_t a = 1, b = 1;
  bool ua = false, ub = false;
  for (int64_t d = 0; d < rank; ++d) {
    int64_t v = in[size_t(d)];
    if (d < axis) { if (v < 0) ua = true; else a *= v; }
    else { if (v < 0) ub = true; else b *= v; }
  }
  return {ua ? -1 : a, ub ? -1 : b};
}

void flatten_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  ctx.set_output(0, x.reshaped(flatten_shape(ctx.node(), x.shape())));
}

void flatten_rule(ShapeContext& ctx) {
  const auto& in = ctx.input_shape(0);
  ctx.set_output(0, ctx.input_dtype(0), in ? std::optional<Shape>(flatten_shape(ctx.node(), *in)) : Shape{-1, -1});
}

// ---- Squeeze / Unsqueeze ----

Shape squeeze_shape(const Node& node, const Shape& in, const std::optional<std::vector<int64_t>>& axes) {
  int64_t rank = int64_t(in.size());
  std::vector<char> drop(in.size(), 0);
  if (axes) {
    for (int64_t a : normalize_axes(node, *axes, rank)) {
      OT_CHECK(in[size_t(a)] == 1 || in[size_t(a)] < 0, node.context(), "cannot squeeze axis ", a,
               " of size ", in[size_t(a)], " (input shape ", shape_str(in), ")");
      drop[size_t(a)] = 1;
    }
  } else {
    for (size_t d = 0; d < in.size(); ++d) {
      OT_CHECK(in[d] >= 0, node.context(), "cannot squeeze unknown dims without axes");
      drop[d] = in[d] == 1;
    }
  }
  Shape out;
  for (size_t d = 0; d < in.size(); ++d)
    if (!drop[d]) out.push_back(in[d]);
  return out;
}

void squeeze_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  ctx.set_output(0, x.reshaped(squeeze_shape(ctx.node(), x.shape(), attr_or_input_ints(ctx, "axes", 1))));
}

void squeeze_rule(ShapeContext& ctx) {
  auto axes = static_ints(ctx, "axes", 1);
  const auto& in = ctx.input_shape(0);
  if (!axes.known || !in) return ctx.set_output(0, ctx.input_dtype(0));
  ctx.set_output(0, ctx.input_dtype(0), squeeze_shape(ctx.node(), *in, axes.value));
}

Shape unsqueeze_shape(const Node& node, const Shape& in, const std::vector<int64_t>& axes) {
  int64_t rank = int64_t(in.size() + axes.size());
  std::vector<char> add(size_t(rank), 0);
  for (int64_t a : normalize_axes(node, axes, rank)) {
    OT_CHECK(!add[size_t(a)], node.context(), "axis ", a, " appears twice in axes");
    add[size_t(a)] = 1;
  }
  Shape out;
  size_t j = 0;
  for (int64_t d = 0; d < rank; ++d) out.push_back(add[size_t(d)] ? 1 : in[j++]);
  return out;
}

void unsqueeze_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  auto axes = attr_or_input_ints(ctx, "axes", 1);
  OT_CHECK(axes.has_value(), ctx.node().context(), "axes are required");
  ctx.set_output(0, x.reshaped(unsqueeze_shape(ctx.node(), x.shape(), *axes)));
}

void unsqueeze_rule(ShapeContext& ctx) {
  auto axes = static_ints(ctx, "axes", 1);
  const auto& in = ctx.input_shape(0);
  if (!axes.known || !axes.value || !in) return ctx.set_output(0, ctx.input_dtype(0));
  ctx.set_output(0, ctx.input_dtype(0), unsqueeze_shape(ctx.node(), *in, *axes.value));
}

// Identity passes sequences and optionals through too.
void identity_kernel(KernelContext& ctx) { ctx.set_output_value(0, ctx.input_value(0)); }

void identity_rule(ShapeContext& ctx) {
  if (const ValueInfo* info = ctx.input_info(0)) ctx.set_output_info(0, *info);
}

// The views only rename the elements: the gradient is dy viewed with x's shape.
void view_gradient(GradientBuilder& g) { g.set(0, reshape_like(g, g.dy(0), g.x(0))); }

}  // namespace

ONNXTRAIN_OP(Shape, kOnnxDomain, 1).inputs(1).outputs(1).shape(shape_rule).not_differentiable().cpu(shape_kernel)
    .cuda(shape_on_host);
ONNXTRAIN_OP(Size, kOnnxDomain, 1).inputs(1).outputs(1)
    .shape([](ShapeContext& ctx) { ctx.set_output(0, DType::kInt64, Shape{}); })
    .not_differentiable().cpu(size_kernel).cuda(size_on_host);
// y = reshape(x, s).  dx = reshape(dy, shape(x))
ONNXTRAIN_OP(Reshape, kOnnxDomain, 1).inputs(1, 2).outputs(1).shape(reshape_rule).cpu(reshape_kernel)
    .cuda(OT_CUDA(reshape_kernel)).host_inputs(std::vector<int>{1}).gradient(view_gradient);
// y = flatten(x, axis).  dx = reshape(dy, shape(x))
ONNXTRAIN_OP(Flatten, kOnnxDomain, 1).inputs(1).outputs(1).shape(flatten_rule).cpu(flatten_kernel)
    .cuda(OT_CUDA(flatten_kernel)).gradient(view_gradient);
// y = squeeze(x, axes).  dx = reshape(dy, shape(x))
ONNXTRAIN_OP(Squeeze, kOnnxDomain, 1).inputs(1, 2).outputs(1).shape(squeeze_rule).cpu(squeeze_kernel)
    .cuda(OT_CUDA(squeeze_kernel)).host_inputs(std::vector<int>{1}).gradient(view_gradient);
// y = unsqueeze(x, axes).  dx = reshape(dy, shape(x))
ONNXTRAIN_OP(Unsqueeze, kOnnxDomain, 1).inputs(1, 2).outputs(1).shape(unsqueeze_rule).cpu(unsqueeze_kernel)
    .cuda(OT_CUDA(unsqueeze_kernel)).host_inputs(std::vector<int>{1}).gradient(view_gradient);
// y = x.  dx = dy
ONNXTRAIN_OP(Identity, kOnnxDomain, 1).inputs(1).outputs(1).shape(identity_rule).cpu(identity_kernel)
    .cuda(OT_CUDA(identity_kernel)).gradient([](GradientBuilder& g) { g.set(0, g.dy(0)); });

}  // namespace onnxtrain
