// Small helpers for tests: graphs built by hand, without protobuf, and error messages.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"
#include "onnxtrain/status.h"

namespace onnxtrain::test {

inline Node make_node(std::string op, std::vector<std::string> inputs, std::vector<std::string> outputs,
                      std::string name = "") {
  Node n;
  n.op_type = std::move(op);
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  n.name = name.empty() ? n.op_type + "_" + n.outputs.at(0) : std::move(name);
  return n;
}

inline NamedValue value(std::string name, DType dtype, std::optional<Shape> shape) {
  return NamedValue{std::move(name), ValueInfo{dtype, std::move(shape), {}}};
}

inline Model make_model(Graph graph, int64_t opset = 17) {
  Model m;
  m.graph = std::move(graph);
  m.opsets[""] = opset;
  m.description = "'test'";
  return m;
}

// The message of the onnxtrain::Error that f throws, or "<no error>".
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace onnxtrain::test
