#include "passes/compute_optimizer.h"

#include <algorithm>
#include <map>
#include <optional>
#include <unordered_set>

#include "passes/passes.h"
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

std::optional<std::vector<int64_t>> constant_ints(const Graph& g, const std::string& v) {
  const Tensor* t = constant_tensor(g, v);
  if (!t || (t->dtype() != DType::kInt64 && t->dtype() != DType::kInt32) || t->shape().size() > 1) return std::nullopt;
  return t->to_int_vector();
}

// A node that keeps some rows of its input `x` (rank r): Gather(x, index, axis), or Slice(x,
// starts, ends, axes, steps) with constant operands. `axes` are positive, in x's rank.
struct Selection {
  bool gather = false;
  std::vector<int64_t> axes;
  std::string index;  // Gather: its indices
  size_t index_rank = 1;  // Gather: 0 drops the axis, 2 or more add axes
  std::vector<int64_t> starts, ends, steps;  // Slice: parallel to axes
};

std::optional<Selection> read_selection(const Model& model, const Node& n, const Shape& xs) {
  const Graph& g = model.graph;
  const int64_t r = int64_t(xs.size());
  Selection s;
  if (n.op_type == "Gather" && n.inputs.size() == 2) {
    const std::optional<Shape> is = known_shape(g, n.inputs[1]);
    if (!is) return std::nullopt;
    for (int64_t d : *is) if (d < 0) return std::nullopt;
    int64_t axis = n.attr_int("axis", 0);
    if (axis < 0) axis += r;
    if (axis < 0 || axis >= r || xs[size_t(axis)] < 0 || numel(*is) >= xs[size_t(axis)]) return std::nullopt;
    s.gather = true;
    s.axes = {axis};
    s.index = n.inputs[1];
    s.index_rank = is->size();
    return s;
  }
  if (n.op_type != "Slice" || model.opset("") < 10 || n.inputs.size() < 3) return std::nullopt;  // older: attributes
  auto starts = constant_ints(g, n.inputs[1]), ends = constant_ints(g, n.inputs[2]);
  if (!starts || !ends || starts->size() != ends->size()) return std::nullopt;
  std::vector<int64_t> axes(starts->size()), steps(starts->size(), 1);
  for (size_t k = 0; k < axes.size(); ++k) axes[k] = int64_t(k);
  if (n.has_input(3)) {
    auto a = constant_ints(g, n.inputs[3]);
    if (!a || a->size() != axes.size()) return std::nullopt;
    axes = *a;
  }
  if (n.has_input(4)) {
    auto st = constant_ints(g, n.inputs[4]);
    if (!st || st->size() != axes.size()) return std::nullopt;
    steps = *st;
  }
  const std::optional<Shape> out = known_shape(g, n.outputs[0]);
  if (!out || out->size() != xs.size()) return std::nullopt;
  bool fewer = false;
  for (size_t k = 0; k < axes.size(); ++k) {
    if (axes[k] < 0) axes[k] += r;
    if (axes[k] < 0 || axes[k] >= r || xs[size_t(axes[k])] < 0 || (*out)[size_t(axes[k])] < 0) return std::nullopt;
    fewer = fewer || (*out)[size_t(axes[k])] < xs[size_t(axes[k])];
  }
  if (!fewer) return std::nullopt;  // keeps every row
  s.axes = axes;
  s.starts = *starts;
  s.ends = *ends;
  s.steps = steps;
  return s;
}

// Rewrites Sel(P(x...)) into P(Sel(x)...) for the selection node at `si`; false when P does not
// treat the selected axes row by row.
bool move_one(Model& model, size_t si, const std::unordered_map<std::string, size_t>& producers,
              const std::unordered_map<std::string, int>& uses, const std::set<std::string>& keep) {
  Graph& g = model.graph;
  const Node sel_node = g.nodes[si];
  const std::string& x = sel_node.inputs[0];
  auto pit = producers.find(x);
  if (pit == producers.end() || uses.at(x) != 1 || g.is_output(x) || keep.count(x)) return false;
  const Node p = g.nodes[pit->second];
  const std::optional<Shape> xs = known_shape(g, x);
  if (!xs || xs->empty()) return false;
  const std::optional<Selection> sel = read_selection(model, sel_node, *xs);
  if (!sel) return false;
  const int64_t r = int64_t(xs->size());

  std::vector<Node> added;  // placed before the moved node
  std::vector<Node> after;  // placed after it
  std::map<std::string, Tensor> constants;  // added on success
  auto constant = [&](Tensor t, const std::string& what) {
    std::string name = g.unique_name(sel_node.name + "/" + what);
    constants[name] = std::move(t);
    return name;
  };
  auto add = [&](const std::string& op, std::vector<std::string> inputs, const std::string& v) {
    std::string out = g.unique_name(v + "/selected");
    added.push_back(Node{g.unique_name(sel_node.name + "/upstream"), op, "", std::move(inputs), {out}, {}});
    return &added.back();
  };
  auto ints = [&](const std::vector<int64_t>& values, const std::string& what) {
    return constant(Tensor::from_vector<int64_t>(values, {int64_t(values.size())}), what);
  };
  auto gather = [&](const std::string& v, const std::string& index, int64_t axis) {
    Node* n = add("Gather", {v, index}, v);
    n->attributes["axis"] = Attribute::of(axis);
    return n->outputs[0];
  };
  auto slice = [&](const std::string& v, const std::vector<int64_t>& axes, const std::vector<int64_t>& starts,
                   const std::vector<int64_t>& ends, const std::vector<int64_t>& steps) {
    return add("Slice", {v, ints(starts, "starts"), ints(ends, "ends"), ints(axes, "axes"), ints(steps, "steps")}, v)
        ->outputs[0];
  };
  // The same selection on value `v` along its axes `axes` (parallel to the selection's own).
  auto select_along = [&](const std::string& v, const std::vector<int64_t>& axes) {
    return sel->gather ? gather(v, sel->index, axes[0]) : slice(v, axes, sel->starts, sel->ends, sel->steps);
  };
  // The rows of operand `v` (its shape aligned to x's from the right) that the selection keeps;
  // nullopt when an axis it spans is neither x's size nor 1.
  auto select = [&](const std::string& v) -> std::optional<std::string> {
    std::optional<Shape> s = known_shape(g, v);
    if (!s) return std::nullopt;
    const int64_t offset = r - int64_t(s->size());
    if (sel->gather) {
      const int64_t ax = sel->axes[0] - offset;
      if (ax < 0) return v;  // spans only later axes: broadcasts as before
      const int64_t d = (*s)[size_t(ax)];
      std::string index = sel->index;
      if (d == 1) {
        if (sel->index_rank == 1) return v;  // broadcasts against the gathered rows
        if (sel->index_rank > 1) return std::nullopt;  // would need an axis per index dim
        index = constant(Tensor::scalar<int64_t>(0), "zero");  // drops the axis as the gather does
      } else if (d != (*xs)[size_t(sel->axes[0])]) {
        return std::nullopt;
      }
      return gather(v, index, ax);
    }
    std::vector<int64_t> axes, starts, ends, steps;
    for (size_t k = 0; k < sel->axes.size(); ++k) {
      const int64_t ax = sel->axes[k] - offset;
      if (ax < 0 || (*s)[size_t(ax)] == 1) continue;  // broadcasts against the kept rows
      if ((*s)[size_t(ax)] != (*xs)[size_t(sel->axes[k])]) return std::nullopt;
      axes.push_back(ax);
      starts.push_back(sel->starts[k]);
      ends.push_back(sel->ends[k]);
      steps.push_back(sel->steps[k]);
    }
    if (axes.empty()) return v;
    return slice(v, axes, starts, ends, steps);
  };
  auto all_axes_below = [&](int64_t limit) {
    for (int64_t a : sel->axes) if (a >= limit) return false;
    return true;
  };

  Node moved = p;
  moved.name = g.unique_name(p.name + "/selected");
  if (is_row_wise_unary(p) || is_elementwise_binary(p)) {
    for (auto& in : moved.inputs) {
      std::optional<std::string> picked = select(in);
      if (!picked) return false;
      in = *picked;
    }
  } else if (p.domain.empty() && (p.op_type == "LayerNormalization" || p.op_type == "Softmax") &&
             single_output(p, uses)) {
    if (p.op_type == "Softmax" && model.opset("") < 13) return false;  // older Softmax flattens from axis
    int64_t norm = p.attr_int("axis", -1);
    if (norm < 0) norm += r;
    std::optional<std::string> picked = select(p.inputs[0]);
    if (!all_axes_below(norm) || !picked) return false;  // the selection must keep whole normalised rows
    moved.inputs[0] = *picked;
    moved.attributes["axis"] = Attribute::of(norm - r);  // counted from the end: the rank may drop
  } else if (p.domain.empty() && p.op_type == "MatMul") {
    std::optional<Shape> b = known_shape(g, p.inputs[1]), a = known_shape(g, p.inputs[0]);
    if (!a || !b || b->size() < 2 || int64_t(a->size()) != r) return false;
    if (b->size() == 2) {  // A [..., M, K] @ W [K, N]: any rows of A; the weight's columns stay
      std::optional<std::string> picked = select(p.inputs[0]);
      if (!all_axes_below(r - 1) || !picked) return false;
      moved.inputs[0] = *picked;
    } else {
      // Batched, A [..., M, K] @ B [..., K, N] (attention's Q K^T and P V): rows of M only, so B,
      // which has no M axis, stays whole.
      for (int64_t axis : sel->axes) if (axis != r - 2) return false;
      if (sel->gather && sel->index_rank > 1) return false;
      if (sel->gather && sel->index_rank == 0) {
        // A rank-0 gather would make A's rows a batch of vectors: keep the axis through the
        // product with a one-element index, and drop it after.
        const Tensor* index = constant_tensor(g, sel->index);
        std::string index1;
        if (index && index->numel() == 1) {
          index1 = constant(Tensor::from_vector<int64_t>(index->to_int_vector(), {1}), "index");
        } else {
          index1 = add("Reshape", {sel->index, ints({1}, "one")}, sel->index)->outputs[0];
        }
        moved.inputs[0] = gather(p.inputs[0], index1, r - 2);
        moved.outputs = {g.unique_name(p.outputs[0] + "/selected")};
        Node squeeze{g.unique_name(sel_node.name + "/squeeze"), "Squeeze", "", {moved.outputs[0]},
                     {sel_node.outputs[0]}, {}};
        if (model.opset("") >= 13) {
          squeeze.inputs.push_back(ints({r - 2}, "axes"));
        } else {
          squeeze.attributes["axes"] = Attribute::of(std::vector<int64_t>{r - 2});
        }
        after.push_back(std::move(squeeze));
      } else {
        moved.inputs[0] = select_along(p.inputs[0], sel->axes);
      }
    }
  } else if (p.domain.empty() && p.op_type == "Transpose" && p.inputs.size() == 1) {
    // Output axis k is input axis perm[k]: the selection moves to those axes.
    std::vector<int64_t> perm = p.attr_ints("perm");
    if (perm.empty()) for (int64_t k = r - 1; k >= 0; --k) perm.push_back(k);
    if (int64_t(perm.size()) != r || (sel->gather && sel->index_rank > 1)) return false;
    std::vector<int64_t> axes;
    for (int64_t axis : sel->axes) axes.push_back(perm[size_t(axis)]);
    moved.inputs[0] = select_along(p.inputs[0], axes);
    if (sel->gather && sel->index_rank == 0) {  // the gathered axis is gone from both sides
      const int64_t gone = axes[0];
      std::vector<int64_t> kept;
      for (int64_t k = 0; k < r; ++k)
        if (k != sel->axes[0]) kept.push_back(perm[size_t(k)] - (perm[size_t(k)] > gone ? 1 : 0));
      perm = kept;
    }
    moved.attributes["perm"] = Attribute::of(perm);
  } else if (p.domain.empty() && p.op_type == "Reshape") {
    // A reshape that keeps every axis up to the last selected one (attention's head split and
    // merge) selects the same rows of its input; its target becomes the selection's shape.
    const std::optional<Shape> in = known_shape(g, p.inputs[0]), out = known_shape(g, sel_node.outputs[0]);
    if (!in || !out) return false;
    for (int64_t d : *out) if (d < 0) return false;
    int64_t last = 0;
    for (int64_t axis : sel->axes) last = std::max(last, axis);
    if (int64_t(in->size()) <= last) return false;
    for (int64_t k = 0; k <= last; ++k)
      if ((*in)[size_t(k)] < 0 || (*in)[size_t(k)] != (*xs)[size_t(k)]) return false;
    moved.inputs = {select_along(p.inputs[0], sel->axes), ints(*out, "shape")};
    moved.attributes.erase("allowzero");
  } else {
    return false;
  }
  for (auto& [name, t] : constants) g.initializers[name] = std::move(t);
  if (after.empty()) moved.outputs = {sel_node.outputs[0]};
  moved.outputs.resize(1);
  for (size_t k = 1; k < p.outputs.size(); ++k) moved.outputs.push_back("");
  // The new nodes take the selection's place (its operands may be computed after P); P goes.
  std::vector<Node> nodes;
  nodes.reserve(g.nodes.size() + added.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (i == pit->second) continue;
    if (i == si) {
      for (auto& n : added) nodes.push_back(std::move(n));
      nodes.push_back(std::move(moved));
      for (auto& n : after) nodes.push_back(std::move(n));
      continue;
    }
    nodes.push_back(std::move(g.nodes[i]));
  }
  g.nodes = std::move(nodes);
  for (const auto& o : p.outputs) g.value_info.erase(o);
  g.value_info.erase(sel_node.outputs[0]);
  return true;
}

// What a selection keeps, as text: equal keys select the same rows of the same value. "" for a
// node that is not a selection the pass moves.
std::string selection_key(const Model& model, const Node& n) {
  if (!n.domain.empty() || (n.op_type != "Gather" && n.op_type != "Slice") || n.inputs.empty()) return "";
  const std::optional<Shape> xs = known_shape(model.graph, n.inputs[0]);
  if (!xs || xs->empty()) return "";
  const std::optional<Selection> sel = read_selection(model, n, *xs);
  if (!sel) return "";
  auto join = [](const std::vector<int64_t>& v) {
    std::string s;
    for (int64_t x : v) s += std::to_string(x) + ",";
    return s + ";";
  };
  std::string key = n.op_type + "|" + n.inputs[0] + "|" + join(sel->axes);
  if (!sel->gather) return key + join(sel->starts) + join(sel->ends) + join(sel->steps);
  const Tensor* index = constant_tensor(model.graph, sel->index);  // the pass adds a constant per move
  if (!index) return key + sel->index;
  return key + std::to_string(index->shape().size()) + ":" + join(index->to_int_vector());
}

// A value read by several selections of the same rows (the pass moved one selection into both
// operands of an op whose operands share a producer, as GELU's x * Phi(x)) is selected once, so
// the value has one reader again and the selection can move further up.
int merge_same_selections(Model& model, const std::set<std::string>& keep) {
  Graph& g = model.graph;
  std::unordered_map<std::string, std::string> first;  // key -> output
  std::vector<Node> kept;
  int merged = 0;
  for (auto& n : g.nodes) {
    const std::string key = selection_key(model, n);
    if (!key.empty() && !g.is_output(n.outputs[0]) && !keep.count(n.outputs[0])) {
      auto [it, inserted] = first.emplace(key, n.outputs[0]);
      if (!inserted) {
        replace_uses(g, n.outputs[0], it->second);
        g.value_info.erase(n.outputs[0]);
        ++merged;
        continue;
      }
    }
    kept.push_back(std::move(n));
  }
  g.nodes = std::move(kept);
  return merged;
}

}  // namespace

int move_selections_upstream(Model& model, const std::set<std::string>& keep) {
  Graph& g = model.graph;
  int moved = 0;
  for (bool changed = true; changed && moved < 10000;) {
    changed = false;
    infer_shapes(g, model.opsets);
    merge_same_selections(model, keep);
    const auto producers = g.producers();
    const auto uses = g.use_counts();
    for (size_t i = 0; i < g.nodes.size() && !changed; ++i) {
      const Node& n = g.nodes[i];
      if (!n.domain.empty() || (n.op_type != "Gather" && n.op_type != "Slice") || n.inputs.empty()) continue;
      if (move_one(model, i, producers, uses, keep)) {
        changed = true;
        ++moved;
      }
    }
  }
  return moved;
}

}  // namespace onnxtrain
