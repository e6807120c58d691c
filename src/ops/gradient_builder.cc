#include "ops/gradient_builder.h"

namespace onnxtrain {

GradientBuilder::GradientBuilder(Graph& graph, const Node& node, int64_t opset, int64_t onnx_opset,
                                 std::vector<std::string> output_grads, std::vector<bool> input_needs,
                                 std::unordered_set<std::string>& names, std::vector<Node>& backward)
    : GraphBuilder(graph, onnx_opset, node.name + "/grad", &names, &backward), node_(node), opset_(opset),
      output_grads_(std::move(output_grads)), needs_(std::move(input_needs)) {}

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

}  // namespace onnxtrain
