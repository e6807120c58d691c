#include "ops/graph_builder.h"

#include <algorithm>
#include <string_view>

#include "ops/registry.h"

namespace onnxtrain {

std::unordered_set<std::string> collect_names(const Graph& g) {
  std::unordered_set<std::string> names;
  for (const auto& in : g.inputs) names.insert(in.name);
  for (const auto& out : g.outputs) names.insert(out.name);
  for (const auto& [n, t] : g.initializers) names.insert(n);
  for (const auto& node : g.nodes) {
    names.insert(node.name);
    for (const auto& o : node.outputs) names.insert(o);
  }
  return names;
}

GraphBuilder::GraphBuilder(Model& model, std::string prefix, std::unordered_set<std::string>* names,
                           std::vector<Node>* sink)
    : GraphBuilder(model.graph, model.opset(kOnnxDomain), std::move(prefix), names, sink) {}

GraphBuilder::GraphBuilder(Graph& graph, int64_t onnx_opset, std::string prefix, std::unordered_set<std::string>* names,
                           std::vector<Node>* sink)
    : graph_(graph), onnx_opset_(onnx_opset > 0 ? onnx_opset : INT32_MAX), prefix_(std::move(prefix)), own_names_(names ? std::unordered_set<std::string>{} : collect_names(graph)),
      names_(names ? *names : own_names_), sink_(sink ? *sink : pending_) {}

void GraphBuilder::commit() {
  for (auto& n : pending_) graph_.nodes.push_back(std::move(n));
  pending_.clear();
}

std::string GraphBuilder::fresh(const std::string& hint) {
  std::string base = prefix_ + "/" + hint;
  std::string name = base;
  for (int i = 1; names_.count(name); ++i) name = base + "_" + std::to_string(i);
  names_.insert(name);
  return name;
}

std::vector<std::string> GraphBuilder::emit_n(const std::string& op_type, std::vector<std::string> inputs,
                                              size_t n_outputs, Attrs attrs, const std::string& domain) {
  std::vector<std::string> outputs;
  for (size_t i = 0; i < n_outputs; ++i) outputs.push_back(fresh(op_type + "_" + std::to_string(i)));
  return append(op_type, std::move(inputs), std::move(outputs), std::move(attrs), domain);
}

std::vector<std::string> GraphBuilder::append(const std::string& op_type, std::vector<std::string> inputs,
                                              std::vector<std::string> outputs, Attrs attrs, const std::string& domain) {
  Node n;
  n.op_type = op_type;
  n.domain = domain;
  n.name = fresh(op_type);
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  n.attributes = std::move(attrs);
  infer(n);
  sink_.push_back(n);
  return n.outputs;
}

void GraphBuilder::infer(const Node& n) {
  // The op's own shape rule gives emitted values a dtype (and a shape when it can), so later
  // builder calls (scalar_like, sum_to) see static facts instead of emitting run-time fallbacks.
  // Our own domain's ops are all version 1; ai.onnx ops follow the model's opset.
  const int64_t opset = n.domain == kOnnxDomain ? onnx_opset_ : INT32_MAX;
  const OpSchema* schema = OpRegistry::global().find(n.domain, n.op_type, opset);
  if (!schema || !schema->shape) return;
  std::vector<ValueInfo> infos(n.inputs.size());
  std::vector<const ValueInfo*> ptrs;
  std::vector<const Tensor*> values;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const std::string& in = n.inputs[i];
    auto it = graph_.initializers.find(in);
    values.push_back(it == graph_.initializers.end() ? nullptr : &it->second);
    if (in.empty()) { ptrs.push_back(nullptr); continue; }
    infos[i] = ValueInfo{dtype(in), static_shape(in), {}};
    ptrs.push_back(&infos[i]);
  }
  ShapeContext ctx(n, opset, ptrs, values);
  try {
    schema->shape(ctx);
  } catch (const Error&) {
    return;  // undecidable statically: the values stay unknown
  }
  for (size_t i = 0; i < n.outputs.size() && i < ctx.outputs().size(); ++i)
    if (!n.outputs[i].empty() && ctx.outputs()[i].dtype != DType::kUndefined) graph_.value_info[n.outputs[i]] = ctx.outputs()[i];
}

std::string GraphBuilder::emit(const std::string& op_type, std::vector<std::string> inputs, Attrs attrs,
                               const std::string& domain) {
  return emit_n(op_type, std::move(inputs), 1, std::move(attrs), domain)[0];
}

std::string GraphBuilder::emit_named(const std::string& output, const std::string& op_type,
                                     std::vector<std::string> inputs, Attrs attrs, const std::string& domain) {
  OT_CHECK(!names_.count(output) || graph_.is_output(output), "name '", output, "' is already used in the graph");
  names_.insert(output);
  return append(op_type, std::move(inputs), {output}, std::move(attrs), domain)[0];
}

std::string GraphBuilder::constant(const Tensor& value) {
  std::string name = fresh("const");
  graph_.initializers[name] = value;
  return name;
}

std::string GraphBuilder::ints(const std::vector<int64_t>& values) {
  return constant(Tensor::from_vector(values, {int64_t(values.size())}));
}

std::string GraphBuilder::scalar_like(double value, const std::string& like) {
  DType dt = dtype(like);
  if (dt == DType::kUndefined) return emit("CastLike", {constant(Tensor::scalar<double>(value)), like});
  Tensor t = Tensor::empty(dt, {});
  switch (dt) {
    case DType::kFloat32: *t.data<float>() = float(value); break;
    case DType::kFloat64: *t.data<double>() = value; break;
    case DType::kFloat16: *t.data<float16>() = float16(float(value)); break;
    case DType::kBFloat16: *t.data<bfloat16>() = bfloat16(float(value)); break;
    default: OT_THROW(kInvalidArgument, "a floating-point constant like '", like, "' (", dtype_name(dt), ")");
  }
  return constant(t);
}

DType GraphBuilder::dtype(const std::string& value) const {
  if (auto it = graph_.initializers.find(value); it != graph_.initializers.end()) return it->second.dtype();
  if (auto it = graph_.value_info.find(value); it != graph_.value_info.end()) return it->second.dtype;
  for (const auto& in : graph_.inputs) if (in.name == value) return in.info.dtype;
  return DType::kUndefined;
}

std::optional<Shape> GraphBuilder::static_shape(const std::string& value) const {
  if (auto it = graph_.initializers.find(value); it != graph_.initializers.end()) return it->second.shape();
  if (auto it = graph_.value_info.find(value); it != graph_.value_info.end()) return it->second.shape;
  for (const auto& in : graph_.inputs) if (in.name == value) return in.info.shape;
  return std::nullopt;
}

std::string GraphBuilder::transpose(const std::string& a, const std::vector<int64_t>& perm) {
  return emit("Transpose", {a}, {{"perm", Attribute::of(perm)}});
}

namespace {
// Ops whose axes moved from an attribute to an input: ReduceSum, Squeeze and Unsqueeze in opset 13,
// the other reductions in 18. Empty axes: every axis (the reductions) or every unit axis (Squeeze).
constexpr int64_t axes_input_since(const std::string_view op) {
  return op == "ReduceSum" || op == "Squeeze" || op == "Unsqueeze" ? 13 : 18;
}
}  // namespace

std::string GraphBuilder::emit_with_axes(const std::string& op_type, const std::string& a,
                                         const std::vector<int64_t>& axes, Attrs attrs) {
  if (onnx_opset_ >= axes_input_since(op_type)) {
    std::vector<std::string> inputs{a};
    if (!axes.empty()) inputs.push_back(ints(axes));
    return emit(op_type, std::move(inputs), std::move(attrs));
  }
  if (!axes.empty()) attrs["axes"] = Attribute::of(axes);
  return emit(op_type, {a}, std::move(attrs));
}

std::string GraphBuilder::reduce_sum(const std::string& a, const std::vector<int64_t>& axes, bool keepdims) {
  return emit_with_axes("ReduceSum", a, axes, {{"keepdims", Attribute::of(int64_t(keepdims))}});
}

std::string GraphBuilder::reduce_mean(const std::string& a, const std::vector<int64_t>& axes, bool keepdims) {
  return emit_with_axes("ReduceMean", a, axes, {{"keepdims", Attribute::of(int64_t(keepdims))}});
}

std::string GraphBuilder::squeeze(const std::string& a, const std::vector<int64_t>& axes) {
  return emit_with_axes("Squeeze", a, axes, {});
}

std::string GraphBuilder::unsqueeze(const std::string& a, const std::vector<int64_t>& axes) {
  OT_CHECK(!axes.empty(), "GraphBuilder::unsqueeze: axes must not be empty");
  return emit_with_axes("Unsqueeze", a, axes, {});
}

std::string GraphBuilder::zeros_like(const std::string& like) { return expand_like(scalar_like(0.0, like), like); }
std::string GraphBuilder::ones_like(const std::string& like) { return expand_like(scalar_like(1.0, like), like); }

std::string GraphBuilder::sum_to(const std::string& value, const std::string& like) {
  auto vs = static_shape(value), ls = static_shape(like);
  if (vs && ls && *vs == *ls && std::all_of(vs->begin(), vs->end(), [](int64_t d) { return d >= 0; }))
    return value;  // statically equal: nothing to reduce
  return emit("SumTo", {value, shape(like)}, {}, kOnnxTrainDomain);
}

}  // namespace onnxtrain
