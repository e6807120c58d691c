// Static shape inference by our own per-op shape rules. Walks the graph in order, asks each op's
// rule for its outputs' dtypes and shapes, and records them in graph.value_info. Small values
// computed only from constants (the Shape -> Gather -> Concat chains exporters emit) are
// evaluated with the CPU kernels on the way, so that shapes fed to Reshape/Expand resolve.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "ir/graph.h"

namespace onnxtrain {

struct ShapeInferenceStats {
  int nodes = 0;
  int without_rule = 0;      // ops that have no shape rule
  int outputs_unknown = 0;   // outputs left without a dtype
};

ShapeInferenceStats infer_shapes(Graph& graph, const std::map<std::string, int64_t>& opsets);

// The shape shape inference (or the model) recorded for a value: an initializer's, a graph
// input's or an annotation; nullopt when the rank is unknown.
std::optional<Shape> known_shape(const Graph& graph, const std::string& value);
// Its dtype from the same records; kUndefined when none has it.
DType known_dtype(const Graph& graph, const std::string& value);

// True for ops whose outputs are not a function of their inputs alone (random), or that write
// their inputs (parameter updates):
// passes must not fold or merge them.
bool is_nondeterministic(const Node& node);

}  // namespace onnxtrain
