// What a shape rule sees: the node, the static dtypes/shapes of its inputs (dims of -1 are
// unknown) and the values of inputs that are known constants. It sets each output's dtype and
// shape; a shape it cannot know is left unset (nullopt) rather than guessed.
#pragma once

#include <optional>
#include <vector>

#include "ir/graph.h"

namespace onnxtrain {

class ShapeContext {
 public:
  ShapeContext(const Node& node, int64_t opset, std::vector<const ValueInfo*> inputs,
               std::vector<const Tensor*> input_values)
      : node_(node), opset_(opset), inputs_(std::move(inputs)), values_(std::move(input_values)),
        outputs_(node.outputs.size()) {}

  const Node& node() const { return node_; }
  int64_t opset() const { return opset_; }
  size_t num_inputs() const { return inputs_.size(); }
  bool has_input(size_t i) const { return i < inputs_.size() && inputs_[i] != nullptr; }
  DType input_dtype(size_t i) const { return has_input(i) ? inputs_[i]->dtype : DType::kUndefined; }
  // Tensor, sequence or optional (ir/graph.h); a value nothing is known about is a tensor.
  ValueKind input_kind(size_t i) const { return has_input(i) ? inputs_[i]->kind : ValueKind::kTensor; }
  const ValueInfo* input_info(size_t i) const { return has_input(i) ? inputs_[i] : nullptr; }
  // The shape when the rank is known (dims may be -1).
  const std::optional<Shape>& input_shape(size_t i) const;
  // The value when the input is a known constant (initializer, Constant, folded).
  const Tensor* input_value(size_t i) const { return i < values_.size() ? values_[i] : nullptr; }

  size_t num_outputs() const { return outputs_.size(); }
  void set_output(size_t i, DType dtype, std::optional<Shape> shape = std::nullopt);
  // Sets everything known about output i, its kind included (sequence and optional outputs).
  void set_output_info(size_t i, ValueInfo info);
  const std::vector<ValueInfo>& outputs() const { return outputs_; }

 private:
  const Node& node_;
  int64_t opset_;
  std::vector<const ValueInfo*> inputs_;
  std::vector<const Tensor*> values_;
  std::vector<ValueInfo> outputs_;
};

}  // namespace onnxtrain
