#include "passes/shape_inference.h"

#include "ops/kernel.h"
#include "ops/registry.h"

namespace onnxtrain {

namespace {
constexpr int64_t kFoldLimit = 1 << 16;  // elements: shape-sized values, not weights

int64_t opset_of(const std::map<std::string, int64_t>& opsets, const std::string& domain) {
  auto it = opsets.find(domain);
  return it == opsets.end() ? 1 : it->second;
}
}  // namespace

bool is_nondeterministic(const Node& node) {
  // Parameter updates write their inputs in place: never fold or merge them.
  if (node.domain == kTrainingDomain) return true;
  if (node.domain == kOnnxTrainDomain)
    for (const char* op : {"AdamW", "Adam", "SGD", "Lamb", "Adagrad"})
      if (node.op_type == op) return true;
  static const char* kRandom[] = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                                  "Multinomial", "Bernoulli", "Dropout"};
  for (const char* op : kRandom)
    if (node.op_type == op) return true;
  return false;
}

std::optional<Shape> known_shape(const Graph& g, const std::string& v) {
  if (auto it = g.initializers.find(v); it != g.initializers.end()) return it->second.shape();
  if (auto it = g.value_info.find(v); it != g.value_info.end()) return it->second.shape;
  for (const auto& in : g.inputs)
    if (in.name == v) return in.info.shape;
  return std::nullopt;
}

DType known_dtype(const Graph& g, const std::string& v) {
  if (auto it = g.initializers.find(v); it != g.initializers.end()) return it->second.dtype();
  if (auto it = g.value_info.find(v); it != g.value_info.end()) return it->second.dtype;
  for (const auto& in : g.inputs)
    if (in.name == v) return in.info.dtype;
  return DType::kUndefined;
}

ShapeInferenceStats infer_shapes(Graph& graph, const std::map<std::string, int64_t>& opsets) {
  ShapeInferenceStats stats;
  std::map<std::string, ValueInfo> known;
  std::map<std::string, Tensor> values;
  for (const auto& in : graph.inputs) known[in.name] = in.info;
  for (const auto& [name, t] : graph.initializers) {
    known[name] = ValueInfo{t.dtype(), t.shape(), {}};
    if (t.numel() <= kFoldLimit) values[name] = t;
  }
  for (const auto& node : graph.nodes) {
    ++stats.nodes;
    int64_t opset = opset_of(opsets, node.domain);
    const OpSchema* schema = OpRegistry::global().find(node.domain, node.op_type, opset);
    std::vector<const ValueInfo*> infos;
    std::vector<const Tensor*> consts;
    bool all_const = true;
    for (const auto& in : node.inputs) {
      if (in.empty()) { infos.push_back(nullptr); consts.push_back(nullptr); continue; }
      auto it = known.find(in);
      infos.push_back(it == known.end() ? nullptr : &it->second);
      auto vt = values.find(in);
      consts.push_back(vt == values.end() ? nullptr : &vt->second);
      if (vt == values.end()) all_const = false;
    }
    std::vector<ValueInfo> outs(node.outputs.size());
    if (schema && schema->shape) {
      ShapeContext ctx(node, opset, infos, consts);
      try {
        schema->shape(ctx);
        outs = ctx.outputs();
      } catch (const Error&) {
        // A rule that cannot decide leaves the outputs unknown; the kernel reports real errors.
      }
    } else {
      ++stats.without_rule;
    }
    // Evaluate small constant subexpressions; their exact values beat any rule.
    if (schema && schema->cpu && all_const && !is_nondeterministic(node)) {
      try {
        std::vector<Tensor> ins;
        for (const Tensor* t : consts) ins.push_back(t ? *t : Tensor());
        auto results = run_node_once(node, opset, ins);
        for (size_t i = 0; i < results.size() && i < outs.size(); ++i) {
          if (!results[i].defined()) continue;
          outs[i] = ValueInfo{results[i].dtype(), results[i].shape(), {}};
          if (results[i].numel() <= kFoldLimit) values[node.outputs[i]] = results[i];
        }
      } catch (const Error&) {
      }
    }
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      if (node.outputs[i].empty()) continue;
      if (outs[i].dtype == DType::kUndefined) ++stats.outputs_unknown;
      known[node.outputs[i]] = outs[i];
      if (outs[i].dtype != DType::kUndefined) graph.value_info[node.outputs[i]] = outs[i];
    }
  }
  for (auto& out : graph.outputs) {
    auto it = known.find(out.name);
    if (it == known.end() || it->second.dtype == DType::kUndefined) continue;
    if (out.info.dtype == DType::kUndefined) out.info.dtype = it->second.dtype;
    if (!out.info.shape) out.info.shape = it->second.shape;
  }
  return stats;
}

}  // namespace onnxtrain
