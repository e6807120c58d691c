// The IR: a Graph of Nodes connected by value names, as in ONNX. Every pass, autodiff and the
// planner transform this one structure, and every Graph can be written back to ONNX.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "onnxtrain/tensor.h"

namespace onnxtrain {

class Graph;

// One ONNX attribute. Subgraphs are kept so models round-trip, even where no kernel runs them.
struct Attribute {
  // kTypeProto: an ONNX TypeProto (Optional's `type`), kept serialized in `s`.
  enum class Kind { kFloat, kInt, kString, kTensor, kGraph, kFloats, kInts, kStrings, kTensors, kTypeProto };
  Kind kind = Kind::kInt;
  float f = 0;
  int64_t i = 0;
  std::string s;
  Tensor t;
  std::shared_ptr<Graph> g;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::vector<Tensor> tensors;

  static Attribute of(float v) { Attribute a; a.kind = Kind::kFloat; a.f = v; return a; }
  static Attribute of(int64_t v) { Attribute a; a.kind = Kind::kInt; a.i = v; return a; }
  static Attribute of(std::string v) { Attribute a; a.kind = Kind::kString; a.s = std::move(v); return a; }
  static Attribute of(Tensor v) { Attribute a; a.kind = Kind::kTensor; a.t = std::move(v); return a; }
  static Attribute of(std::vector<float> v) { Attribute a; a.kind = Kind::kFloats; a.floats = std::move(v); return a; }
  static Attribute of(std::vector<int64_t> v) { Attribute a; a.kind = Kind::kInts; a.ints = std::move(v); return a; }
  static Attribute of(std::vector<std::string> v) { Attribute a; a.kind = Kind::kStrings; a.strings = std::move(v); return a; }
};
const char* attribute_kind_name(Attribute::Kind kind);

inline const std::string kOnnxDomain = "";              // "ai.onnx"
inline const std::string kOnnxTrainDomain = "onnxtrain";  // our own ops (fused backward, ...)
inline const std::string kTrainingDomain = "ai.onnx.preview.training";
inline const std::string kMsDomain = "com.microsoft";           // ONNX Runtime's contrib and training ops

struct Node {
  std::string name;
  std::string op_type;
  std::string domain;                 // "" for ai.onnx
  std::vector<std::string> inputs;    // "" marks an omitted optional input
  std::vector<std::string> outputs;   // "" marks an omitted optional output
  std::map<std::string, Attribute> attributes;

  bool has_input(size_t i) const { return i < inputs.size() && !inputs[i].empty(); }
  bool has_output(size_t i) const { return i < outputs.size() && !outputs[i].empty(); }
  bool has_attr(const std::string& key) const { return attributes.count(key) > 0; }

  // Typed attribute reads; a missing attribute gives the default, a wrong kind throws.
  int64_t attr_int(const std::string& key, int64_t dflt) const;
  float attr_float(const std::string& key, float dflt) const;
  std::string attr_string(const std::string& key, const std::string& dflt) const;
  std::vector<int64_t> attr_ints(const std::string& key, std::vector<int64_t> dflt = {}) const;
  std::vector<float> attr_floats(const std::string& key, std::vector<float> dflt = {}) const;
  const Tensor* attr_tensor(const std::string& key) const;
  const Attribute* attr(const std::string& key) const;

  // "[OpType] node 'name': " — the prefix of every error about this node.
  std::string context() const;
  // Whether the node reads only the shape of input i, never its elements (ai.onnx Shape, Size).
  bool reads_only_shape(size_t i) const {
    return i == 0 && domain.empty() && (op_type == "Shape" || op_type == "Size");
  }
};

// The ONNX type constructor of a value: a tensor, a sequence of tensors, or an optional of either.
enum class ValueKind : uint8_t { kTensor, kSequence, kOptionalTensor, kOptionalSequence };

// Static knowledge of a value: element type and shape. Unknown dims are -1 (with an optional
// symbolic name in dim_params); an unknown rank is an empty optional. For sequences and optionals
// dtype and shape describe the elements (a sequence's shape is known only when all elements agree).
struct ValueInfo {
  DType dtype = DType::kUndefined;
  std::optional<Shape> shape;
  std::vector<std::string> dim_params;  // parallel to *shape where present; "" when unnamed
  ValueKind kind = ValueKind::kTensor;
  bool has_static_shape() const;
  bool is_tensor() const { return kind == ValueKind::kTensor; }
};

struct NamedValue {
  std::string name;
  ValueInfo info;
};

class Graph {
 public:
  std::string name = "graph";
  std::vector<Node> nodes;                        // kept in topological order by passes
  std::vector<NamedValue> inputs;                 // runtime feeds (initializers excluded)
  std::vector<NamedValue> outputs;
  std::map<std::string, Tensor> initializers;
  std::unordered_map<std::string, ValueInfo> value_info;  // intermediate annotations

  bool is_initializer(const std::string& value) const { return initializers.count(value) > 0; }
  bool is_input(const std::string& value) const;
  bool is_output(const std::string& value) const;
  // Index of the node producing each value; graph inputs and initializers are absent.
  std::unordered_map<std::string, size_t> producers() const;
  // For each value, how many node inputs and graph outputs read it.
  std::unordered_map<std::string, int> use_counts() const;
  // Sorts nodes topologically (stable for already-ordered graphs); throws on cycles or on inputs
  // that nothing defines.
  void topological_sort();
  // A fresh name that no value, node or initializer uses yet: base, base_1, base_2, ...
  std::string unique_name(const std::string& base);

 private:
  std::unordered_map<std::string, int> name_counters_;
};

struct Model {
  Graph graph;
  std::map<std::string, int64_t> opsets;  // domain -> version ("" is ai.onnx)
  int64_t ir_version = 8;
  std::string producer_name = "onnxtrain";
  std::string producer_version;
  std::string description;       // where the model came from, for error messages
  std::map<std::string, std::string> metadata;

  int64_t opset(const std::string& domain = "") const;
};

// A readable dump: one line per node with its inputs, outputs and attributes.
std::string to_string(const Graph& graph);

// The forward of a training graph: nodes that `forward_outputs` depend on. Everything else is the
// backward. These are the graph outputs that are not "<input>_grad" gradients.
std::vector<std::string> default_forward_outputs(const Graph& graph);

// True when a node or value `name` matches a pattern: a glob when it holds * or ?, else a substring.
bool name_matches(const std::string& name, const std::string& pattern);

}  // namespace onnxtrain
