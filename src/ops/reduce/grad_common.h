// Small helpers for the gradient rules of the reduce, nn and loss families.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ops/gradient_builder.h"

namespace onnxtrain {

// The value of `name` when it is known while the gradient graph is built: an initializer or the
// output of a Constant node (attribute `value`, `value_int(s)` or `value_float(s)`); else null.
inline std::optional<Tensor> static_value(GradientBuilder& g, const std::string& name) {
  if (name.empty()) return std::nullopt;
  const Graph& graph = g.graph();
  if (auto it = graph.initializers.find(name); it != graph.initializers.end()) return it->second;
  for (const Node& n : graph.nodes) {
    if (n.op_type != "Constant" || !n.domain.empty() || !n.has_output(0) || n.outputs[0] != name) continue;
    if (const Tensor* t = n.attr_tensor("value")) return *t;
    if (n.has_attr("value_int")) return Tensor::scalar<int64_t>(n.attr_int("value_int", 0));
    if (n.has_attr("value_float")) return Tensor::scalar<float>(n.attr_float("value_float", 0.0f));
    if (n.has_attr("value_ints")) {
      std::vector<int64_t> v = n.attr_ints("value_ints");
      return Tensor::from_vector(v, {int64_t(v.size())});
    }
    return std::nullopt;
  }
  return std::nullopt;
}

// `value` cast to the dtype of `like`: Cast when that dtype is known (every opset), else CastLike
// (opset 15 and later).
inline std::string cast_like(GradientBuilder& g, const std::string& value, const std::string& like) {
  DType dt = g.dtype(like);
  if (dt == DType::kUndefined) return g.emit("CastLike", {value, like});
  return g.emit("Cast", {value}, {{"to", Attribute::of(int64_t(dt))}});
}

}  // namespace onnxtrain
