// GradientBuilder: what a gradient rule sees and writes with.
//
// A rule reads the forward node's inputs x(i), outputs y(i) and upstream gradients dy(i) (value
// names in the training graph), emits backward nodes with the GraphBuilder calls a forward graph
// uses, and sets the gradient of each input that needs one:
//
//   // C = A * B.  dA = sum_to(dC * B, A), dB = sum_to(dC * A, B)
//   .gradient([](GradientBuilder& g) {
//     if (g.needs(0)) g.set(0, g.sum_to(g.mul(g.dy(0), g.x(1)), g.x(0)));
//     if (g.needs(1)) g.set(1, g.sum_to(g.mul(g.dy(0), g.x(0)), g.x(1)));
//   })
//
// Forward results are reused by name (never recomputed); broadcasting is undone by sum_to alone.
// A rule that cannot handle an attribute combination throws kNotImplemented naming it.
#pragma once

#include "ops/graph_builder.h"

namespace onnxtrain {

class GradientBuilder : public GraphBuilder {
 public:
  // `opset`: the version of the node's own domain; `onnx_opset`: the model's ai.onnx version, in
  // whose form emitted ops are written.
  GradientBuilder(Graph& graph, const Node& node, int64_t opset, int64_t onnx_opset,
                  std::vector<std::string> output_grads, std::vector<bool> input_needs,
                  std::unordered_set<std::string>& names, std::vector<Node>& backward);

  const Node& node() const { return node_; }
  int64_t opset() const { return opset_; }  // the node's domain version (GraphBuilder::onnx_opset: ai.onnx)
  std::string x(size_t i) const;                       // forward input i
  std::string y(size_t i) const;                       // forward output i
  std::string dy(size_t i) const;                      // gradient flowing into output i, "" if none
  bool has_dy(size_t i) const { return !dy(i).empty(); }
  bool has_input(size_t i) const { return node_.has_input(i); }
  size_t num_inputs() const { return node_.inputs.size(); }
  bool needs(size_t i) const { return i < needs_.size() && needs_[i]; }
  void set(size_t i, const std::string& gradient);     // the gradient of input i
  const std::map<size_t, std::string>& results() const { return results_; }
  // "[Op] node 'name': " for errors raised by rules.
  std::string context() const { return node_.context(); }

 private:
  const Node& node_;
  int64_t opset_;
  std::vector<std::string> output_grads_;
  std::vector<bool> needs_;
  std::map<size_t, std::string> results_;
};

}  // namespace onnxtrain
