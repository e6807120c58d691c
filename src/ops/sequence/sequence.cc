// Sequence ops (opset 11+): SequenceEmpty, SequenceConstruct, SequenceInsert, SequenceAt,
// SequenceErase, SequenceLength, SplitToSequence, ConcatFromSequence, and SequenceMap (17).
// A sequence is a runtime Value (onnxtrain/value.h) that only an executor holds: these kernels
// read it with ctx.input_sequence and write it with ctx.set_output_value. Elements entering a
// sequence are copied, since a tensor's buffer may be a planned arena slot that is reused once
// the tensor's last reader has run; elements leaving one are shared (sequences never change in
// place: every edit makes a new sequence).
#include "ops/gradient_builder.h"
#include "ops/subgraph.h"
#include "ops/tensor/tensor_ops.h"

namespace onnxtrain {
namespace {
using namespace tensor_ops;

// A position input (int32/int64 scalar) in [-n, n) for reads, [-n, n] for inserts.
int64_t position(const KernelContext& ctx, size_t i, int64_t n, bool insert) {
  const Tensor& p = ctx.input(i);
  check_index_dtype(ctx, p, "position");
  int64_t pos = scalar_int_input(ctx, i, "position");
  const int64_t hi = insert ? n : n - 1;
  OT_CHECK(pos >= -n && pos <= hi, ctx.node().context(), "position ", pos, " is out of range for a sequence of ",
           n, " tensors (expected [", -n, ", ", hi, "])");
  return pos < 0 ? pos + n : pos;
}

void check_element(const KernelContext& ctx, const std::vector<Tensor>& seq, const Tensor& t, const char* what) {
  if (!seq.empty())
    OT_CHECK(t.dtype() == seq[0].dtype(), ctx.node().context(), what, " has dtype ", dtype_name(t.dtype()),
             ", the sequence holds ", dtype_name(seq[0].dtype()));
}

ValueInfo sequence_info(DType dtype, std::optional<Shape> shape = std::nullopt) {
  ValueInfo info;
  info.kind = ValueKind::kSequence;
  info.dtype = dtype;
  info.shape = std::move(shape);
  return info;
}

// ---- SequenceEmpty ----

void sequence_empty_kernel(KernelContext& ctx) { ctx.set_output_value(0, Value::of_sequence({})); }

void sequence_empty_rule(ShapeContext& ctx) {
  ctx.set_output_info(0, sequence_info(DType(ctx.node().attr_int("dtype", int64_t(DType::kFloat32)))));
}

// ---- SequenceConstruct ----

void sequence_construct_kernel(KernelContext& ctx) {
  std::vector<Tensor> items;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const Tensor& t = ctx.input(i);
    check_element(ctx, items, t, ("input " + std::to_string(i)).c_str());
    items.push_back(t.clone());
  }
  ctx.set_output_value(0, Value::of_sequence(std::move(items)));
}

// The element shape when every input agrees on it.
void sequence_construct_rule(ShapeContext& ctx) {
  std::optional<Shape> shape = ctx.input_shape(0);
  for (size_t i = 1; i < ctx.num_inputs() && shape; ++i)
    if (ctx.input_shape(i) != shape) shape.reset();
  ctx.set_output_info(0, sequence_info(ctx.input_dtype(0), shape));
}

// ---- SequenceInsert ----

void sequence_insert_kernel(KernelContext& ctx) {
  std::vector<Tensor> items = ctx.input_sequence(0);
  const Tensor& t = ctx.input(1);
  check_element(ctx, items, t, "the inserted tensor");
  int64_t n = int64_t(items.size());
  int64_t pos = ctx.has_input(2) ? position(ctx, 2, n, true) : n;
  items.insert(items.begin() + pos, t.clone());
  ctx.set_output_value(0, Value::of_sequence(std::move(items)));
}

void sequence_insert_rule(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0) != DType::kUndefined ? ctx.input_dtype(0) : ctx.input_dtype(1);
  std::optional<Shape> shape = ctx.input_shape(0) == ctx.input_shape(1) ? ctx.input_shape(0) : std::nullopt;
  ctx.set_output_info(0, sequence_info(dt, shape));
}

// ---- SequenceAt ----

void sequence_at_kernel(KernelContext& ctx) {
  const std::vector<Tensor>& items = ctx.input_sequence(0);
  ctx.set_output(0, items[size_t(position(ctx, 1, int64_t(items.size()), false))]);
}

void sequence_at_rule(ShapeContext& ctx) { ctx.set_output(0, ctx.input_dtype(0), ctx.input_shape(0)); }

// ---- SequenceErase ----

void sequence_erase_kernel(KernelContext& ctx) {
  std::vector<Tensor> items = ctx.input_sequence(0);
  int64_t n = int64_t(items.size());
  OT_CHECK(n > 0, ctx.node().context(), "cannot erase from an empty sequence");
  int64_t pos = ctx.has_input(1) ? position(ctx, 1, n, false) : n - 1;
  items.erase(items.begin() + pos);
  ctx.set_output_value(0, Value::of_sequence(std::move(items)));
}

void same_sequence_rule(ShapeContext& ctx) {
  ctx.set_output_info(0, sequence_info(ctx.input_dtype(0), ctx.input_shape(0)));
}

// ---- SequenceLength ----

void sequence_length_kernel(KernelContext& ctx) {
  ctx.output(0, DType::kInt64, {}).data<int64_t>()[0] = int64_t(ctx.input_sequence(0).size());
}

void sequence_length_rule(ShapeContext& ctx) { ctx.set_output(0, DType::kInt64, Shape{}); }

// ---- SplitToSequence ----

void split_to_sequence_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  OT_CHECK(x.rank() >= 1, node.context(), "input should have rank >= 1, got a scalar");
  const int64_t axis = normalize_axis(node, node.attr_int("axis", 0), x.rank());
  const int64_t dim = x.dim(int(axis));
  std::vector<int64_t> sizes;
  bool squeeze = false;
  if (!ctx.has_input(1)) {  // pieces of 1, squeezed unless keepdims
    sizes.assign(size_t(dim), 1);
    squeeze = node.attr_int("keepdims", 1) == 0;
  } else {
    const Tensor& split = ctx.input(1);
    check_index_dtype(ctx, split, "split");
    if (split.rank() == 0) {  // equal pieces of that length, the last one shorter
      int64_t piece = split.item_as_int(0);
      OT_CHECK(piece > 0, node.context(), "split should be > 0, got ", piece);
      for (int64_t at = 0; at < dim; at += piece) sizes.push_back(std::min(piece, dim - at));
    } else {
      OT_CHECK(split.rank() == 1, node.context(), "split should be a scalar or 1-D, got shape ",
               shape_str(split.shape()));
      int64_t sum = 0;
      for (int64_t i = 0; i < split.numel(); ++i) {
        sizes.push_back(split.item_as_int(i));
        OT_CHECK(sizes.back() >= 0, node.context(), "split sizes should be >= 0, got ", sizes.back());
        sum += sizes.back();
      }
      OT_CHECK(sum == dim, node.context(), "split sizes sum to ", sum, ", expected the axis length ", dim);
    }
  }
  std::vector<Tensor> items;
  std::vector<Tensor*> outs;
  items.reserve(sizes.size());
  for (int64_t len : sizes) {
    Shape s = x.shape();
    s[size_t(axis)] = len;
    items.push_back(Tensor::empty(x.dtype(), s));
    outs.push_back(&items.back());
  }
  split_tensor(x, axis, outs);
  if (squeeze) {
    Shape s = x.shape();
    s.erase(s.begin() + axis);
    for (auto& t : items) t = t.reshaped(s);
  }
  ctx.set_output_value(0, Value::of_sequence(std::move(items)));
}

void split_to_sequence_rule(ShapeContext& ctx) { ctx.set_output_info(0, sequence_info(ctx.input_dtype(0))); }

// ---- ConcatFromSequence ----

void concat_from_sequence_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const std::vector<Tensor>& items = ctx.input_sequence(0);
  OT_CHECK(!items.empty(), node.context(), "cannot concatenate an empty sequence");
  OT_CHECK(node.attr("axis"), node.context(), "attribute 'axis' is required");
  int64_t axis = node.attr_int("axis", 0);
  if (node.attr_int("new_axis", 0) == 0) {
    std::vector<const Tensor*> parts;
    for (const auto& t : items) parts.push_back(&t);
    concat_tensors(ctx, parts, axis, 0);
    return;
  }
  // Stacking: every element gains a dim of 1 at axis (in [-rank-1, rank]).
  const int64_t rank = items[0].rank() + 1;
  axis = normalize_axis(node, axis, rank);
  std::vector<Tensor> stacked;
  std::vector<const Tensor*> parts;
  for (const auto& t : items) {
    Shape s = t.shape();
    OT_CHECK(t.rank() + 1 == rank, node.context(), "elements should all have rank ", rank - 1, ", got shape ",
             shape_str(s));
    s.insert(s.begin() + axis, 1);
    stacked.push_back(t.reshaped(s));
  }
  for (const auto& t : stacked) parts.push_back(&t);
  concat_tensors(ctx, parts, axis, 0);
}

void concat_from_sequence_rule(ShapeContext& ctx) { ctx.set_output(0, ctx.input_dtype(0)); }

// ---- SequenceMap ----

// Runs the body once per position: sequence inputs give their element, tensor inputs are given
// whole; each body output is collected into one output sequence.
void sequence_map_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const size_t n = ctx.input_sequence(0).size();
  for (size_t i = 1; i < ctx.num_inputs(); ++i)
    if (ctx.input_kind(i) == Value::Kind::kSequence)
      OT_CHECK(ctx.input_sequence(i).size() == n, node.context(), "input ", i, " is a sequence of ",
               ctx.input_sequence(i).size(), " tensors, input 0 of ", n);
  std::vector<std::vector<Tensor>> outs(ctx.num_outputs());
  SubgraphHost& host = subgraph_host(ctx);
  for (size_t k = 0; k < n; ++k) {
    std::vector<Value> in;
    for (size_t i = 0; i < ctx.num_inputs(); ++i)
      in.push_back(ctx.input_kind(i) == Value::Kind::kSequence ? Value(ctx.input_sequence(i)[k]) : ctx.input_value(i));
    std::vector<Value> out = host.run_subgraph("body", in);
    OT_CHECK(out.size() == outs.size(), node.context(), "body gives ", out.size(), " outputs, the node has ",
             outs.size());
    for (size_t j = 0; j < out.size(); ++j) {
      OT_CHECK(out[j].is_tensor(), node.context(), "body output ", j, " is ", value_kind_name(out[j].kind),
               ", expected a tensor");
      outs[j].push_back(std::move(out[j].tensor));
    }
  }
  for (size_t j = 0; j < outs.size(); ++j) ctx.set_output_value(j, Value::of_sequence(std::move(outs[j])));
}

void sequence_map_rule(ShapeContext& ctx) {
  const Attribute* body = ctx.node().attr("body");
  for (size_t j = 0; j < ctx.num_outputs(); ++j) {
    DType dt = body && body->g && j < body->g->outputs.size() ? body->g->outputs[j].info.dtype : DType::kUndefined;
    ctx.set_output_info(j, sequence_info(dt));
  }
}

// ---- Backward ops (onnxtrain domain) ----

// SequenceAtGrad(s, p, dy): a sequence shaped like s, zeros except dy at position p.
void sequence_at_grad_kernel(KernelContext& ctx) {
  const std::vector<Tensor>& like = ctx.input_sequence(0);
  const size_t at = size_t(position(ctx, 1, int64_t(like.size()), false));
  const Tensor& dy = ctx.input(2);
  std::vector<Tensor> items;
  for (size_t i = 0; i < like.size(); ++i) items.push_back(i == at ? dy.clone() : Tensor::zeros(dy.dtype(), like[i].shape()));
  ctx.set_output_value(0, Value::of_sequence(std::move(items)));
}

// ConcatFromSequenceGrad(dy, s): dy cut along `axis` into the extents of s's elements (each
// extent 1 and the axis dropped when new_axis).
void concat_from_sequence_grad_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& dy = ctx.input(0);
  const std::vector<Tensor>& like = ctx.input_sequence(1);
  const bool new_axis = node.attr_int("new_axis", 0) != 0;
  const int64_t axis = normalize_axis(node, node.attr_int("axis", 0), dy.rank());
  std::vector<Tensor> items;
  std::vector<Tensor*> outs;
  items.reserve(like.size());
  int64_t sum = 0;
  for (const auto& t : like) {
    Shape s = dy.shape();
    s[size_t(axis)] = new_axis ? 1 : t.dim(int(axis));
    sum += s[size_t(axis)];
    items.push_back(Tensor::empty(dy.dtype(), s));
    outs.push_back(&items.back());
  }
  OT_CHECK(sum == dy.dim(int(axis)), node.context(), "the elements span ", sum, " along axis ", axis,
           ", the gradient ", dy.dim(int(axis)));
  split_tensor(dy, axis, outs);
  for (size_t i = 0; i < items.size(); ++i) items[i] = items[i].reshaped(like[i].shape());
  ctx.set_output_value(0, Value::of_sequence(std::move(items)));
}

// SequenceInsertGrad(ds', s[, p]) -> (ds, dx): the gradient of s' = SequenceInsert(s, x, p).
// Position p indexes s (in [-n, n], absent = n), so it is resolved against s's length, not ds''s.
void sequence_insert_grad_kernel(KernelContext& ctx) {
  const std::vector<Tensor>& d_out = ctx.input_sequence(0);
  const int64_t n = int64_t(ctx.input_sequence(1).size());
  OT_CHECK(int64_t(d_out.size()) == n + 1, ctx.node().context(), "the gradient holds ", d_out.size(),
           " tensors, expected one more than the ", n, " of the input sequence");
  const size_t at = size_t(ctx.has_input(2) ? position(ctx, 2, n, true) : n);
  std::vector<Tensor> rest;
  for (size_t i = 0; i < d_out.size(); ++i)
    if (i != at) rest.push_back(d_out[i]);
  ctx.set_output_value(0, Value::of_sequence(std::move(rest)));
  ctx.set_output(1, d_out[at]);
}

// SequenceEraseGrad(ds', s[, p]) -> ds: the gradient of s' = SequenceErase(s, p): ds' with zeros
// shaped like the erased element put back at p (in [-n, n), absent = n - 1).
void sequence_erase_grad_kernel(KernelContext& ctx) {
  const std::vector<Tensor>& d_out = ctx.input_sequence(0);
  const std::vector<Tensor>& like = ctx.input_sequence(1);
  const int64_t n = int64_t(like.size());
  OT_CHECK(n > 0 && int64_t(d_out.size()) == n - 1, ctx.node().context(), "the gradient holds ", d_out.size(),
           " tensors, expected one fewer than the ", n, " of the input sequence");
  const int64_t at = ctx.has_input(2) ? position(ctx, 2, n, false) : n - 1;
  const DType dtype = d_out.empty() ? like[size_t(at)].dtype() : d_out[0].dtype();
  std::vector<Tensor> items = d_out;
  items.insert(items.begin() + at, Tensor::zeros(dtype, like[size_t(at)].shape()));
  ctx.set_output_value(0, Value::of_sequence(std::move(items)));
}

// SequenceSum(s_0..s_n): the element-wise sum of sequences of the same length and shapes (the
// gradient of a sequence read by several nodes).
void sequence_sum_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  std::vector<Tensor> items;
  for (const auto& t : ctx.input_sequence(0)) items.push_back(t.clone());
  for (size_t i = 1; i < ctx.num_inputs(); ++i) {
    const std::vector<Tensor>& more = ctx.input_sequence(i);
    OT_CHECK(more.size() == items.size(), node.context(), "input ", i, " holds ", more.size(), " tensors, input 0 ",
             items.size());
    for (size_t k = 0; k < items.size(); ++k) {
      OT_CHECK(more[k].shape() == items[k].shape() && more[k].dtype() == items[k].dtype(), node.context(), "input ", i,
               " element ", k, " is ", shape_str(more[k].shape()), ", input 0's is ", shape_str(items[k].shape()));
      dispatch_float(items[k].dtype(), [&]<typename T>() {
        T* acc = items[k].data<T>();
        const T* x = more[k].data<T>();
        for (int64_t e = 0; e < items[k].numel(); ++e) acc[e] = T(compute_t<T>(acc[e]) + compute_t<T>(x[e]));
      });
    }
  }
  ctx.set_output_value(0, Value::of_sequence(std::move(items)));
}

}  // namespace

// ---- Gradients (every op here is linear in its tensor contents) ----
namespace {

// s = SequenceConstruct(x_0..x_n).  dx_i = SequenceAt(ds, i)
void sequence_construct_gradient(GradientBuilder& g) {
  for (size_t i = 0; i < g.num_inputs(); ++i)
    if (g.needs(i)) g.set(i, g.emit("SequenceAt", {g.dy(0), g.constant(Tensor::scalar<int64_t>(int64_t(i)))}));
}

// y = SequenceAt(s, p).  ds = the sequence shaped like s, zeros except dy at p
void sequence_at_gradient(GradientBuilder& g) {
  if (g.needs(0)) g.set(0, g.emit("SequenceAtGrad", {g.x(0), g.x(1), g.dy(0)}, {}, kOnnxTrainDomain));
}

// s = SplitToSequence(x).  dx = ConcatFromSequence(ds) along the split axis (stacked where the
// pieces were squeezed)
void split_to_sequence_gradient(GradientBuilder& g) {
  const Node& n = g.node();
  const bool squeezed = n.inputs.size() < 2 || n.inputs[1].empty() ? n.attr_int("keepdims", 1) == 0 : false;
  g.set(0, g.emit("ConcatFromSequence", {g.dy(0)},
                  {{"axis", Attribute::of(n.attr_int("axis", 0))}, {"new_axis", Attribute::of(int64_t(squeezed))}}));
}

// y = ConcatFromSequence(s).  ds = dy cut into the elements' extents along the axis (unstacked
// when new_axis)
void concat_from_sequence_gradient(GradientBuilder& g) {
  const Node& n = g.node();
  g.set(0, g.emit("ConcatFromSequenceGrad", {g.dy(0), g.x(0)},
                  {{"axis", Attribute::of(n.attr_int("axis", 0))}, {"new_axis", Attribute::of(n.attr_int("new_axis", 0))}},
                  kOnnxTrainDomain));
}

// s' = SequenceInsert(s, x, p).  ds = ds' without position p; dx = ds'[p]
void sequence_insert_gradient(GradientBuilder& g) {
  std::vector<std::string> in = {g.dy(0), g.x(0)};
  if (g.node().inputs.size() > 2 && !g.node().inputs[2].empty()) in.push_back(g.x(2));
  std::vector<std::string> d = g.emit_n("SequenceInsertGrad", in, 2, {}, kOnnxTrainDomain);
  if (g.needs(0)) g.set(0, d[0]);
  if (g.needs(1)) g.set(1, d[1]);
}

// s' = SequenceErase(s, p).  ds = ds' with zeros (shaped like s[p]) put back at p
void sequence_erase_gradient(GradientBuilder& g) {
  std::vector<std::string> in = {g.dy(0), g.x(0)};
  if (g.node().inputs.size() > 1 && !g.node().inputs[1].empty()) in.push_back(g.x(1));
  if (g.needs(0)) g.set(0, g.emit("SequenceEraseGrad", in, {}, kOnnxTrainDomain));
}

}  // namespace

ONNXTRAIN_OP(SequenceEmpty, kOnnxDomain, 11).inputs(0).outputs(1).shape(sequence_empty_rule)
    .not_differentiable().cpu(sequence_empty_kernel);
ONNXTRAIN_OP(SequenceConstruct, kOnnxDomain, 11).inputs(1, INT_MAX).outputs(1).shape(sequence_construct_rule)
    .cpu(sequence_construct_kernel).gradient(sequence_construct_gradient);
ONNXTRAIN_OP(SequenceInsert, kOnnxDomain, 11).inputs(2, 3).outputs(1).shape(sequence_insert_rule)
    .cpu(sequence_insert_kernel).gradient(sequence_insert_gradient);
ONNXTRAIN_OP(SequenceAt, kOnnxDomain, 11).inputs(2).outputs(1).shape(sequence_at_rule).cpu(sequence_at_kernel)
    .gradient(sequence_at_gradient);
ONNXTRAIN_OP(SequenceErase, kOnnxDomain, 11).inputs(1, 2).outputs(1).shape(same_sequence_rule)
    .cpu(sequence_erase_kernel).gradient(sequence_erase_gradient);
ONNXTRAIN_OP(SequenceLength, kOnnxDomain, 11).inputs(1).outputs(1).shape(sequence_length_rule)
    .not_differentiable().cpu(sequence_length_kernel);
ONNXTRAIN_OP(SplitToSequence, kOnnxDomain, 11).inputs(1, 2).outputs(1).shape(split_to_sequence_rule)
    .cpu(split_to_sequence_kernel).gradient(split_to_sequence_gradient);
ONNXTRAIN_OP(ConcatFromSequence, kOnnxDomain, 11).inputs(1).outputs(1).shape(concat_from_sequence_rule)
    .cpu(concat_from_sequence_kernel).gradient(concat_from_sequence_gradient);
ONNXTRAIN_OP(SequenceMap, kOnnxDomain, 17).inputs(1, INT_MAX).outputs(1, INT_MAX).shape(sequence_map_rule)
    .cpu(sequence_map_kernel)
    .gradient_not_implemented("SequenceMap's body is not differentiated (write it as a Loop, whose gradient is "
                              "implemented)");


ONNXTRAIN_OP(SequenceAtGrad, kOnnxTrainDomain, 1).inputs(3).outputs(1).shape(same_sequence_rule)
    .cpu(sequence_at_grad_kernel).gradient_not_implemented("second derivatives are not needed for training");
ONNXTRAIN_OP(ConcatFromSequenceGrad, kOnnxTrainDomain, 1).inputs(2).outputs(1)
    .shape([](ShapeContext& ctx) { ctx.set_output_info(0, sequence_info(ctx.input_dtype(0))); })
    .cpu(concat_from_sequence_grad_kernel).gradient_not_implemented("second derivatives are not needed for training");
ONNXTRAIN_OP(SequenceInsertGrad, kOnnxTrainDomain, 1).inputs(2, 3).outputs(2)
    .shape([](ShapeContext& ctx) {
      ctx.set_output_info(0, sequence_info(ctx.input_dtype(0), ctx.input_shape(0)));
      ctx.set_output(1, ctx.input_dtype(0), ctx.input_shape(0));
    })
    .cpu(sequence_insert_grad_kernel).gradient_not_implemented("second derivatives are not needed for training");
ONNXTRAIN_OP(SequenceEraseGrad, kOnnxTrainDomain, 1).inputs(2, 3).outputs(1).shape(same_sequence_rule)
    .cpu(sequence_erase_grad_kernel).gradient_not_implemented("second derivatives are not needed for training");
ONNXTRAIN_OP(SequenceSum, kOnnxTrainDomain, 1).inputs(1, INT_MAX).outputs(1).shape(same_sequence_rule)
    .cpu(sequence_sum_kernel).gradient_not_implemented("second derivatives are not needed for training");

}  // namespace onnxtrain
