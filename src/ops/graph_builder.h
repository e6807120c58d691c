// GraphBuilder: emits nodes and constants into a graph under fresh names. Forward blocks (losses,
// optimizer graphs) and gradient rules (GradientBuilder derives from it) are written with it.
// It emits ops in the form the model's ai.onnx opset defines (ReduceSum's axes are an input from
// opset 13, an attribute before), so what it builds stays a valid model of that opset.
//
//   GraphBuilder b(model, "loss");
//   std::string d = b.sub(prediction, target);
//   std::string loss = b.emit("ReduceMean", {b.mul(d, d)}, {{"keepdims", Attribute::of(int64_t(0))}});
//   b.commit();   // appends the emitted nodes to the graph
#pragma once

#include <map>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "ir/graph.h"

namespace onnxtrain {

class GraphBuilder {
 public:
  using Attrs = std::map<std::string, Attribute>;

  // Nodes go to `sink` when given (the caller appends them later), else to a private list that
  // commit() appends to the graph. `names` holds every name in use; pass one shared set when
  // several builders work on one graph, or leave it null to collect the graph's names.
  GraphBuilder(Model& model, std::string prefix, std::unordered_set<std::string>* names = nullptr,
               std::vector<Node>* sink = nullptr);
  // `onnx_opset`: the graph's ai.onnx version (Model::opset()); 0, no import, means the newest.
  GraphBuilder(Graph& graph, int64_t onnx_opset, std::string prefix, std::unordered_set<std::string>* names = nullptr,
               std::vector<Node>* sink = nullptr);
  virtual ~GraphBuilder() = default;

  Graph& graph() { return graph_; }
  int64_t onnx_opset() const { return onnx_opset_; }
  void commit();  // appends pending nodes to the graph (only without a sink)

  std::string emit(const std::string& op_type, std::vector<std::string> inputs, Attrs attrs = {},
                   const std::string& domain = kOnnxDomain);
  std::vector<std::string> emit_n(const std::string& op_type, std::vector<std::string> inputs, size_t n_outputs,
                                  Attrs attrs = {}, const std::string& domain = kOnnxDomain);
  // Names the (single) output of the next node explicitly, e.g. a graph output "loss".
  std::string emit_named(const std::string& output, const std::string& op_type, std::vector<std::string> inputs,
                         Attrs attrs = {}, const std::string& domain = kOnnxDomain);

  std::string constant(const Tensor& value);                        // a new initializer
  std::string ints(const std::vector<int64_t>& values);             // 1-D int64 constant
  std::string scalar_like(double value, const std::string& like);   // 0-d constant of like's dtype

  // Static knowledge (from shape inference or initializers); kUndefined / nullopt when unknown.
  DType dtype(const std::string& value) const;
  std::optional<Shape> static_shape(const std::string& value) const;

  std::string add(const std::string& a, const std::string& b) { return emit("Add", {a, b}); }
  std::string sub(const std::string& a, const std::string& b) { return emit("Sub", {a, b}); }
  std::string mul(const std::string& a, const std::string& b) { return emit("Mul", {a, b}); }
  std::string div(const std::string& a, const std::string& b) { return emit("Div", {a, b}); }
  std::string neg(const std::string& a) { return emit("Neg", {a}); }
  std::string shape(const std::string& a) { return emit("Shape", {a}); }
  std::string reshape(const std::string& a, const std::string& shape_value) { return emit("Reshape", {a, shape_value}); }
  std::string reshape_like(const std::string& a, const std::string& like) { return reshape(a, shape(like)); }
  std::string transpose(const std::string& a, const std::vector<int64_t>& perm);
  std::string reduce_sum(const std::string& a, const std::vector<int64_t>& axes, bool keepdims);
  std::string reduce_mean(const std::string& a, const std::vector<int64_t>& axes, bool keepdims);
  std::string squeeze(const std::string& a, const std::vector<int64_t>& axes);
  std::string unsqueeze(const std::string& a, const std::vector<int64_t>& axes);
  std::string expand_like(const std::string& a, const std::string& like) { return emit("Expand", {a, shape(like)}); }
  std::string zeros_like(const std::string& like);
  std::string ones_like(const std::string& like);
  // Sums `value` down to the shape of `like`, undoing numpy broadcasting (no-op when equal).
  std::string sum_to(const std::string& value, const std::string& like);

 protected:
  std::string fresh(const std::string& hint);
  // op_type(a) with `axes` as an input or an attribute, whichever the opset defines.
  std::string emit_with_axes(const std::string& op_type, const std::string& a, const std::vector<int64_t>& axes,
                             Attrs attrs);
  void infer(const Node& node);  // records the emitted node's output dtypes/shapes in value_info
  std::vector<std::string> append(const std::string& op_type, std::vector<std::string> inputs,
                                  std::vector<std::string> outputs, Attrs attrs, const std::string& domain);

  Graph& graph_;
  int64_t onnx_opset_;
  std::string prefix_;
  std::unordered_set<std::string> own_names_;
  std::unordered_set<std::string>& names_;
  std::vector<Node> pending_;
  std::vector<Node>& sink_;
};

// Every value, node and initializer name a graph uses.
std::unordered_set<std::string> collect_names(const Graph& graph);

}  // namespace onnxtrain
