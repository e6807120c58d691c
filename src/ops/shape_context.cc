#include "ops/shape_context.h"

namespace onnxtrain {

const std::optional<Shape>& ShapeContext::input_shape(size_t i) const {
  static const std::optional<Shape> unknown;
  return has_input(i) ? inputs_[i]->shape : unknown;
}

void ShapeContext::set_output(size_t i, DType dtype, std::optional<Shape> shape) {
  if (i >= outputs_.size()) return;  // an optional output the node does not produce
  outputs_[i].dtype = dtype;
  outputs_[i].shape = std::move(shape);
}

void ShapeContext::set_output_info(size_t i, ValueInfo info) {
  if (i < outputs_.size()) outputs_[i] = std::move(info);
}

}  // namespace onnxtrain
