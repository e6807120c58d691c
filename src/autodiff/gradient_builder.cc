#include "autodiff/gradient_builder.h"

#include <algorithm>

namespace onnxtrain {

GradientBuilder::GradientBuilder(Graph& graph, const Node& node, std::vector<std::string> output_grads,
                                 std::vector<bool> input_needs, std::unordered_set<std::string>& names,
                                 std::vector<Node>& backward)
    : graph_(graph), node_(node), output_grads_(std::move(output_grads)), needs_(std::move(input_needs)),
      names_(names), backward_(backward) {}

std::string GradientBuilder::x(size_t i) const {
  if (!node_.has_input(i)) OT_THROW(kInvalidModel, node_.context(), "gradient rule reads missing input ", i);
  return node_.inputs[i];
}

std::string GradientBuilder::y(size_t i) const {
  if (!node_.has_output(i)) OT_THROW(kInvalidModel, node_.context(), "gradient rule reads missing output ", i);
  return node_.outputs[i];
}

std::string GradientBuilder::dy(size_t i) const { return i < output_grads_.size() ? output_grads_[i] : ""; }

void GradientBuilder::set(size_t i, const std::string& gradient) {
  if (!needs(i)) return;  // rules may compute more than asked; only needed ones are kept
  results_[i] = gradient;
}

DType GradientBuilder::dtype(const std::string& value) const {
  if (auto it = graph_.initializers.find(value); it != graph_.initializers.end()) return it->second.dtype();
  if (auto it = graph_.value_info.find(value); it != graph_.value_info.end()) return it->second.dtype;
  for (const auto& in : graph_.inputs) if (in.name == value) return in.info.dtype;
  return DType::kUndefined;
}

std::optional<Shape> GradientBuilder::static_shape(const std::string& value) const {
  if (auto it = graph_.initializers.find(value); it != graph_.initializers.end()) return it->second.shape();
  if (auto it = graph_.value_info.find(value); it != graph_.value_info.end()) return it->second.shape;
  for (const auto& in : graph_.inputs) if (in.name == value) return in.info.shape;
  return std::nullopt;
}

std::string GradientBuilder::fresh(const std::string& hint) {
  std::string base = node_.name + "/grad/" + hint;
  std::string name = base;
  while (names_.count(name)) name = base + "_" + std::to_string(++counter_);
  names_.insert(name);
  return name;
}

std::vector<std::string> GradientBuilder::emit_n(const std::string& op_type, std::vector<std::string> inputs,
                                                 size_t n_outputs, Attrs attrs, const std::string& domain) {
  Node n;
  n.op_type = op_type;
  n.domain = domain;
  n.name = fresh(op_type);
  n.inputs = std::move(inputs);
  n.attributes = std::move(attrs);
  for (size_t i = 0; i < n_outputs; ++i) n.outputs.push_back(fresh(op_type + "_out" + std::to_string(i)));
  backward_.push_back(n);
  return n.outputs;
}

std::string GradientBuilder::emit(const std::string& op_type, std::vector<std::string> inputs, Attrs attrs,
                                  const std::string& domain) {
  return emit_n(op_type, std::move(inputs), 1, std::move(attrs), domain)[0];
}

std::string GradientBuilder::constant(const Tensor& value) {
  std::string name = fresh("const");
  graph_.initializers[name] = value;
  return name;
}

std::string GradientBuilder::ints(const std::vector<int64_t>& values) {
  return constant(Tensor::from_vector(values, {int64_t(values.size())}));
}

std::string GradientBuilder::scalar_like(double value, const std::string& like) {
  DType dt = dtype(like);
  if (dt == DType::kUndefined) {  // resolved at run time
    return emit("CastLike", {constant(Tensor::scalar<double>(value)), like});
  }
  Tensor t = Tensor::empty(dt, {});
  switch (dt) {
    case DType::kFloat32: *t.data<float>() = float(value); break;
    case DType::kFloat64: *t.data<double>() = value; break;
    case DType::kFloat16: *t.data<float16>() = float16(float(value)); break;
    case DType::kBFloat16: *t.data<bfloat16>() = bfloat16(float(value)); break;
    default: OT_THROW(kInvalidArgument, node_.context(), "gradient of a non-floating value '", like, "'");
  }
  return constant(t);
}

std::string GradientBuilder::transpose(const std::string& a, const std::vector<int64_t>& perm) {
  return emit("Transpose", {a}, {{"perm", Attribute::of(perm)}});
}

std::string GradientBuilder::reduce_sum(const std::string& a, const std::vector<int64_t>& axes, bool keepdims) {
  return emit("ReduceSum", {a, ints(axes)}, {{"keepdims", Attribute::of(int64_t(keepdims))}});
}

std::string GradientBuilder::sum_to(const std::string& grad, const std::string& like) {
  auto gs = static_shape(grad), ls = static_shape(like);
  if (gs && ls && *gs == *ls && std::all_of(gs->begin(), gs->end(), [](int64_t d) { return d >= 0; }))
    return grad;  // statically equal: nothing to reduce
  return emit("SumTo", {grad, shape(like)}, {}, kOnnxTrainDomain);
}

std::string GradientBuilder::zeros_like(const std::string& like) {
  return mul(like, scalar_like(0.0, like));
}

}  // namespace onnxtrain
