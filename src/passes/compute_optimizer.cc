#include "passes/compute_optimizer.h"

#include <optional>
#include <unordered_set>

#include "passes/shape_inference.h"

namespace onnxtrain {

bool is_row_wise_unary(const Node& n) {
  static const std::unordered_set<std::string> kOps = {"Relu", "Tanh", "Sigmoid", "Erf", "Sqrt", "Neg", "Abs", "Exp",
                                                       "Log", "Cast", "Identity", "Reciprocal", "LeakyRelu"};
  if (n.domain == kOnnxTrainDomain) return n.op_type == "Gelu";
  return n.domain.empty() && kOps.count(n.op_type) && n.inputs.size() == 1;
}

bool is_elementwise_binary(const Node& n) {
  return n.domain.empty() && n.inputs.size() == 2 &&
         (n.op_type == "Add" || n.op_type == "Sub" || n.op_type == "Mul" || n.op_type == "Div" || n.op_type == "Pow");
}

namespace {

// Only output 0 of a node is read (LayerNormalization's statistics are unused in a forward graph).
bool single_output(const Node& n, const std::unordered_map<std::string, int>& uses) {
  for (size_t k = 1; k < n.outputs.size(); ++k)
    if (!n.outputs[k].empty() && uses.count(n.outputs[k]) && uses.at(n.outputs[k]) > 0) return false;
  return true;
}

// Rewrites Gather(P(x...), idx) into P(Gather(x, idx)...) for the node at `gi`; false when P does
// not treat the gathered axis row by row.
bool move_one(Model& model, size_t gi, const std::unordered_map<std::string, size_t>& producers,
              const std::unordered_map<std::string, int>& uses) {
  Graph& g = model.graph;
  const Node gather = g.nodes[gi];
  const std::string& x = gather.inputs[0];
  const std::string& idx = gather.inputs[1];
  auto pit = producers.find(x);
  if (pit == producers.end() || uses.at(x) != 1 || g.is_output(x)) return false;
  const Node p = g.nodes[pit->second];
  const std::optional<Shape> xs = known_shape(g, x), is = known_shape(g, idx);
  if (!xs || !is || xs->empty()) return false;
  const int64_t r = int64_t(xs->size());
  int64_t axis = gather.attr_int("axis", 0);
  if (axis < 0) axis += r;
  if (axis < 0 || axis >= r || (*xs)[size_t(axis)] < 0) return false;
  for (int64_t d : *is) if (d < 0) return false;
  if (numel(*is) >= (*xs)[size_t(axis)]) return false;  // gathers nothing away
  const bool scalar = is->empty();

  std::vector<Node> added;
  std::vector<std::string> zeros;  // int64 scalar 0 initializers, added on success
  auto gathered = [&](const std::string& v, int64_t ax, const std::string& index) {
    std::string out = g.unique_name(v + "/gathered");
    Node n{g.unique_name(gather.name + "/upstream"), "Gather", "", {v, index}, {out}, {}};
    n.attributes["axis"] = Attribute::of(ax);
    added.push_back(std::move(n));
    return out;
  };
  Node moved = p;
  moved.name = g.unique_name(p.name + "/gathered");
  if (is_row_wise_unary(p)) {
    moved.inputs[0] = gathered(p.inputs[0], axis, idx);
  } else if (is_elementwise_binary(p)) {
    for (auto& in : moved.inputs) {
      std::optional<Shape> s = known_shape(g, in);
      if (!s) return false;
      const int64_t ax = axis - (r - int64_t(s->size()));
      if (ax < 0) continue;  // the operand spans only later axes: it broadcasts as before
      const int64_t d = (*s)[size_t(ax)];
      if (d == 1) {
        if (!scalar) {
          if (is->size() != 1) return false;
          continue;  // broadcasts against the gathered rows
        }
        zeros.push_back(g.unique_name(gather.name + "/zero"));
        in = gathered(in, ax, zeros.back());  // drop the axis as the gather does
      } else if (d == (*xs)[size_t(axis)]) {
        in = gathered(in, ax, idx);
      } else {
        return false;
      }
    }
  } else if (p.domain.empty() && (p.op_type == "LayerNormalization" || p.op_type == "Softmax") &&
             single_output(p, uses)) {
    if (p.op_type == "Softmax" && model.opset("") < 13) return false;  // older Softmax flattens from axis
    int64_t norm = p.attr_int("axis", -1);
    if (norm < 0) norm += r;
    if (norm <= axis) return false;
    moved.inputs[0] = gathered(p.inputs[0], axis, idx);
    moved.attributes["axis"] = Attribute::of(norm - r);  // counted from the end: the rank may drop
  } else if (p.domain.empty() && p.op_type == "MatMul") {
    std::optional<Shape> b = known_shape(g, p.inputs[1]), a = known_shape(g, p.inputs[0]);
    if (!a || !b || b->size() != 2 || int64_t(a->size()) != r || axis > r - 2) return false;
    moved.inputs[0] = gathered(p.inputs[0], axis, idx);
  } else {
    return false;
  }
  for (const auto& z : zeros) g.initializers[z] = Tensor::scalar<int64_t>(0);
  moved.outputs = {gather.outputs[0]};
  for (size_t k = 1; k < p.outputs.size(); ++k) moved.outputs.push_back("");
  // The new nodes take the Gather's place (its index may be computed after P); P goes.
  std::vector<Node> nodes;
  nodes.reserve(g.nodes.size() + added.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (i == pit->second) continue;
    if (i == gi) {
      for (auto& n : added) nodes.push_back(std::move(n));
      nodes.push_back(std::move(moved));
      continue;
    }
    nodes.push_back(std::move(g.nodes[i]));
  }
  g.nodes = std::move(nodes);
  for (const auto& o : p.outputs) g.value_info.erase(o);
  g.value_info.erase(gather.outputs[0]);
  return true;
}

}  // namespace

int move_gathers_upstream(Model& model) {
  Graph& g = model.graph;
  int moved = 0;
  for (bool changed = true; changed && moved < 10000;) {
    changed = false;
    infer_shapes(g, model.opsets);
    const auto producers = g.producers();
    const auto uses = g.use_counts();
    for (size_t i = 0; i < g.nodes.size() && !changed; ++i) {
      const Node& n = g.nodes[i];
      if (!n.domain.empty() || n.op_type != "Gather" || n.inputs.size() != 2) continue;
      if (move_one(model, i, producers, uses)) {
        changed = true;
        ++moved;
      }
    }
  }
  return moved;
}

}  // namespace onnxtrain
