// GradientBuilder: what a gradient rule sees and writes with.
//
// A rule reads the forward node's inputs x(i), outputs y(i) and upstream gradients dy(i) (all are
// value names in the training graph), and emits backward nodes with the same graph-builder calls
// a forward graph uses. It sets the gradient of each input that needs one:
//
//   // C = A * B.  dA = sum_to(dC * B, A), dB = sum_to(dC * A, B)
//   [](GradientBuilder& g) {
//     if (g.needs(0)) g.set(0, g.sum_to(g.mul(g.dy(0), g.x(1)), g.x(0)));
//     if (g.needs(1)) g.set(1, g.sum_to(g.mul(g.dy(0), g.x(0)), g.x(1)));
//   }
//
// Forward results are reused by name (never recomputed); broadcasting is undone by sum_to alone.
#pragma once

#include <initializer_list>
#include <map>
#include <string>
#include <unordered_set>
#include <vector>

#include "ir/graph.h"

namespace onnxtrain {

class GradientBuilder {
 public:
  using Attrs = std::map<std::string, Attribute>;

  GradientBuilder(Graph& graph, const Node& node, std::vector<std::string> output_grads,
                  std::vector<bool> input_needs, std::unordered_set<std::string>& names,
                  std::vector<Node>& backward);

  const Node& node() const { return node_; }
  std::string x(size_t i) const;                       // forward input i
  std::string y(size_t i) const;                       // forward output i
  std::string dy(size_t i) const;                      // gradient flowing into output i, "" if none
  bool has_dy(size_t i) const { return !dy(i).empty(); }
  bool has_input(size_t i) const { return node_.has_input(i); }
  size_t num_inputs() const { return node_.inputs.size(); }
  bool needs(size_t i) const { return i < needs_.size() && needs_[i]; }
  void set(size_t i, const std::string& gradient);     // the gradient of input i
  const std::map<size_t, std::string>& results() const { return results_; }

  // Static knowledge from shape inference (dtype kUndefined / nullopt when unknown).
  DType dtype(const std::string& value) const;
  std::optional<Shape> static_shape(const std::string& value) const;

  // Emitting nodes: each returns the name of the (first) output.
  std::string emit(const std::string& op_type, std::vector<std::string> inputs, Attrs attrs = {},
                   const std::string& domain = kOnnxDomain);
  std::vector<std::string> emit_n(const std::string& op_type, std::vector<std::string> inputs, size_t n_outputs,
                                  Attrs attrs = {}, const std::string& domain = kOnnxDomain);
  // A constant initializer, returned by name.
  std::string constant(const Tensor& value);
  std::string ints(const std::vector<int64_t>& values);           // a 1-D int64 constant
  std::string scalar_like(double value, const std::string& like);  // a 0-d constant of like's dtype

  // Common ops.
  std::string add(const std::string& a, const std::string& b) { return emit("Add", {a, b}); }
  std::string sub(const std::string& a, const std::string& b) { return emit("Sub", {a, b}); }
  std::string mul(const std::string& a, const std::string& b) { return emit("Mul", {a, b}); }
  std::string div(const std::string& a, const std::string& b) { return emit("Div", {a, b}); }
  std::string neg(const std::string& a) { return emit("Neg", {a}); }
  std::string shape(const std::string& a) { return emit("Shape", {a}); }
  std::string reshape_like(const std::string& a, const std::string& like) { return emit("Reshape", {a, shape(like)}); }
  std::string transpose(const std::string& a, const std::vector<int64_t>& perm);
  std::string reduce_sum(const std::string& a, const std::vector<int64_t>& axes, bool keepdims);
  // Sums `grad` down to the shape of `like`, undoing numpy broadcasting (no-op when equal).
  std::string sum_to(const std::string& grad, const std::string& like);
  std::string zeros_like(const std::string& like);

 private:
  std::string fresh(const std::string& hint);

  Graph& graph_;
  const Node& node_;
  std::vector<std::string> output_grads_;
  std::vector<bool> needs_;
  std::unordered_set<std::string>& names_;
  std::vector<Node>& backward_;
  std::map<size_t, std::string> results_;
  int counter_ = 0;
};

}  // namespace onnxtrain
