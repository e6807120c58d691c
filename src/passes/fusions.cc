// Pattern fusions: rewrite multi-node patterns that exporters emit into one fused op.
#include <cmath>
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "passes/passes.h"

namespace onnxtrain {

namespace {

// Who reads each value; a fused-away intermediate must have exactly one reader.
struct Uses {
  std::unordered_map<std::string, std::vector<size_t>> readers;
  std::unordered_set<std::string> graph_outputs;
  explicit Uses(const Graph& g) {
    for (size_t i = 0; i < g.nodes.size(); ++i)
      for (const auto& in : g.nodes[i].inputs) if (!in.empty()) readers[in].push_back(i);
    for (const auto& o : g.outputs) graph_outputs.insert(o.name);
  }
  // The only node reading `value`, or -1.
  int sole_reader(const std::string& value) const {
    auto it = readers.find(value);
    if (it == readers.end() || it->second.size() != 1 || graph_outputs.count(value)) return -1;
    return int(it->second[0]);
  }
};

bool is_scalar_constant(const Graph& g, const std::string& value, double expected, double tol = 1e-4) {
  auto it = g.initializers.find(value);
  if (it == g.initializers.end() || it->second.numel() != 1 || !is_floating(it->second.dtype())) return false;
  return std::fabs(it->second.item_as_double() - expected) <= tol * std::fabs(expected);
}

bool is_op(const Node& n, const char* op) { return n.op_type == op && n.domain.empty(); }

// The operand of a binary node other than `value`, or "" when `value` is not an operand.
std::string other_operand(const Node& n, const std::string& value) {
  if (n.inputs.size() != 2) return "";
  if (n.inputs[0] == value) return n.inputs[1];
  if (n.inputs[1] == value) return n.inputs[0];
  return "";
}

}  // namespace

int fuse_gelu(Graph& g) {
  Uses uses(g);
  std::vector<char> removed(g.nodes.size(), 0);
  int fused = 0;
  for (size_t e = 0; e < g.nodes.size(); ++e) {
    const Node& erf = g.nodes[e];
    if (!is_op(erf, "Erf") || removed[e]) continue;
    // scaled = x / sqrt(2)  or  x * (1 / sqrt(2))
    auto producers = g.producers();
    auto pit = producers.find(erf.inputs[0]);
    if (pit == producers.end()) continue;
    const Node& scale = g.nodes[pit->second];
    std::string x;
    if (is_op(scale, "Div") && is_scalar_constant(g, scale.inputs[1], std::sqrt(2.0))) x = scale.inputs[0];
    else if (is_op(scale, "Mul") && is_scalar_constant(g, scale.inputs[1], 1 / std::sqrt(2.0))) x = scale.inputs[0];
    else if (is_op(scale, "Mul") && is_scalar_constant(g, scale.inputs[0], 1 / std::sqrt(2.0))) x = scale.inputs[1];
    if (x.empty() || uses.sole_reader(scale.outputs[0]) != int(e)) continue;
    // plus1 = erf + 1
    int a = uses.sole_reader(erf.outputs[0]);
    if (a < 0 || !is_op(g.nodes[size_t(a)], "Add") ||
        !is_scalar_constant(g, other_operand(g.nodes[size_t(a)], erf.outputs[0]), 1.0))
      continue;
    const std::string& plus1 = g.nodes[size_t(a)].outputs[0];
    // Either (x * plus1) * 0.5, or (x * 0.5) * plus1.
    int m1 = uses.sole_reader(plus1);
    if (m1 < 0 || !is_op(g.nodes[size_t(m1)], "Mul")) continue;
    std::string partner = other_operand(g.nodes[size_t(m1)], plus1);
    std::vector<size_t> chain = {pit->second, e, size_t(a), size_t(m1)};
    std::string out;
    if (partner == x) {
      int m2 = uses.sole_reader(g.nodes[size_t(m1)].outputs[0]);
      if (m2 < 0 || !is_op(g.nodes[size_t(m2)], "Mul") ||
          !is_scalar_constant(g, other_operand(g.nodes[size_t(m2)], g.nodes[size_t(m1)].outputs[0]), 0.5))
        continue;
      chain.push_back(size_t(m2));
      out = g.nodes[size_t(m2)].outputs[0];
    } else {
      auto hp = producers.find(partner);
      if (hp == producers.end()) continue;
      const Node& half = g.nodes[hp->second];
      if (!is_op(half, "Mul") || other_operand(half, x).empty() || !is_scalar_constant(g, other_operand(half, x), 0.5) ||
          uses.sole_reader(partner) != m1)
        continue;
      chain.push_back(hp->second);
      out = g.nodes[size_t(m1)].outputs[0];
    }
    bool free = true;
    for (size_t k : chain) free = free && !removed[k];
    if (!free) continue;
    for (size_t k : chain) removed[k] = 1;
    Node gelu;
    gelu.op_type = "Gelu";
    gelu.domain = kOnnxTrainDomain;
    gelu.name = erf.name + "/gelu";
    gelu.inputs = {x};
    gelu.outputs = {out};
    // Put the fused node where the last node of the chain was, keeping topological order.
    size_t last = *std::max_element(chain.begin(), chain.end());
    g.nodes[last] = gelu;
    removed[last] = 0;
    ++fused;
  }
  if (!fused) return 0;
  std::vector<Node> kept;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (!removed[i]) kept.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(kept);
  return fused;
}

}  // namespace onnxtrain
