#include "passes/sparsity.h"

#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include "ir/subgraph.h"
#include "passes/compute_optimizer.h"
#include "passes/shape_inference.h"

namespace onnxtrain {

namespace {

constexpr const char* kWhere = "[sparsity] ";

bool is_label_loss(const Node& n) {
  return (n.domain.empty() || n.domain == kOnnxTrainDomain) && n.has_attr("ignore_index") &&
         (n.op_type == "SoftmaxCrossEntropyLoss" || n.op_type == "NegativeLogLikelihoodLoss");
}

// Ops that move an integer tensor around without changing which entries it holds.
bool is_relabeling(const Node& n) {
  return n.domain.empty() && (n.op_type == "Reshape" || n.op_type == "Flatten" || n.op_type == "Squeeze" ||
                              n.op_type == "Unsqueeze" || n.op_type == "Identity" || n.op_type == "Cast");
}

// The graph input `v` is computed from by relabeling ops only; "" when there is none.
std::string source_input(const Graph& g, std::string v, const std::unordered_map<std::string, size_t>& producers) {
  for (int hops = 0; hops < 16; ++hops) {
    if (g.is_input(v) && !g.is_initializer(v)) return v;
    auto it = producers.find(v);
    if (it == producers.end() || !is_relabeling(g.nodes[it->second])) return "";
    v = g.nodes[it->second].inputs[0];
  }
  return "";
}

int64_t positive_axis(const Node& n, int64_t rank) {
  int64_t a = n.attr_int("axis", -1);
  return a < 0 ? a + rank : a;
}

// Only output 0 of `n` is read.
bool only_first_output_used(const Graph& g, const Node& n, const std::unordered_map<std::string, int>& uses) {
  for (size_t k = 1; k < n.outputs.size(); ++k)
    if (!n.outputs[k].empty() && ((uses.count(n.outputs[k]) && uses.at(n.outputs[k]) > 0) || g.is_output(n.outputs[k])))
      return false;
  return true;
}

// Appends nodes and constants to a graph under construction.
struct Emitter {
  Graph& g;
  std::vector<Node>& out;
  std::string base;

  std::string node(const std::string& op, std::vector<std::string> inputs, std::map<std::string, Attribute> attrs = {},
                   std::string output = "") {
    if (output.empty()) output = g.unique_name(base + "/" + op);
    out.push_back(Node{g.unique_name(base + "/" + op), op, "", std::move(inputs), {output}, std::move(attrs)});
    return output;
  }
  std::string constant(Tensor t, const std::string& what) {
    std::string name = g.unique_name(base + "/" + what);
    g.initializers[name] = std::move(t);
    return name;
  }
  std::string int64s(std::vector<int64_t> v, const std::string& what) {
    const int64_t n = int64_t(v.size());
    return constant(Tensor::from_vector<int64_t>(v, {n}), what);
  }
  // Positions of the entries of the 1-D `values` that differ from `skip`: [K] int64, the kept
  // ones in order. K is rounded up to a multiple of n / 16 (n: the length of `values`, static when
  // positive, else read from its shape at run time) with positions that hold `skip`: the executor
  // plans memory per distinct input shape (the backward's saved values), and a count that changes
  // with every batch would record a plan per batch; so at most 16 per n. The rows added compute
  // values that nothing reads (padding) or that the loss ignores (labels), and their gradients are zeros.
  std::string kept_positions(const std::string& values, int64_t skip, DType dtype, int64_t n) {
    Tensor s = dtype == DType::kInt32 ? Tensor::scalar<int32_t>(int32_t(skip)) : Tensor::scalar<int64_t>(skip);
    std::string eq = node("Equal", {values, constant(std::move(s), "skipped_value")});
    std::string mask = node("Not", {eq});
    std::string nz = node("NonZero", {mask});
    std::string kept = node("Reshape", {nz, int64s({-1}, "flat")});
    if (n > 0 && n <= 16) return kept;
    std::string skipped = node("Reshape", {node("NonZero", {eq}), int64s({-1}, "flat")});
    std::string order = node("Concat", {kept, skipped}, {{"axis", Attribute::of(int64_t(0))}});
    std::string count = node("Slice", {node("Shape", {nz}), int64s({1}, "one"), int64s({2}, "two")});
    std::string total, step, step_less_one;
    if (n > 0) {
      total = int64s({n}, "n");
      step = int64s({(n + 15) / 16}, "step");
      step_less_one = int64s({(n + 15) / 16 - 1}, "step_less_one");
    } else {  // symbolic length (batch, sequence): step = max(ceil(n / 16), 1)
      total = node("Shape", {values});
      step = node("Max", {node("Div", {node("Add", {total, int64s({15}, "fifteen")}), int64s({16}, "sixteen")}),
                          int64s({1}, "one")});
      step_less_one = node("Sub", {step, int64s({1}, "one")});
    }
    std::string up = node("Mul", {node("Div", {node("Add", {count, step_less_one}), step}), step});
    std::string rows = node("Min", {up, total});
    return node("Slice", {order, int64s({0}, "zero"), rows});
  }
};

// ---- label sparsity ------------------------------------------------------------------------

// For a node treating rows over its leading dims one by one, the input that carries the rows;
// -1 otherwise. `rank` is its output's rank.
int row_input(const Graph& g, const Node& p, int64_t rank, const std::unordered_map<std::string, int>& uses) {
  if (rank < 2) return -1;
  if (is_row_wise_unary(p)) return 0;
  if (is_elementwise_binary(p)) {
    int row = -1;
    for (int k = 0; k < 2; ++k) {
      std::optional<Shape> s = known_shape(g, p.inputs[size_t(k)]);
      if (!s) return -1;
      if (int64_t(s->size()) == rank) {
        if (row >= 0) return -1;  // two full operands: the other one would need gathering too
        row = k;
      } else if (s->size() > 1) {
        return -1;  // spans leading dims
      }
    }
    return row;
  }
  if (!p.domain.empty()) return -1;
  if (p.op_type == "LayerNormalization" || ((p.op_type == "Softmax" || p.op_type == "LogSoftmax"))) {
    if (!only_first_output_used(g, p, uses)) return -1;
    return positive_axis(p, rank) == rank - 1 ? 0 : -1;
  }
  if (p.op_type == "MatMul") {
    std::optional<Shape> b = known_shape(g, p.inputs[1]);
    return b && b->size() == 2 ? 0 : -1;
  }
  if (p.op_type == "Reshape") {  // merges or splits leading dims only: rows stay rows
    std::optional<Shape> in = known_shape(g, p.inputs[0]), o = known_shape(g, p.outputs[0]);
    if (!in || !o || in->size() < 2 || o->empty() || in->back() <= 0 || in->back() != o->back()) return -1;
    return 0;
  }
  return -1;
}

// A loss over [N, C, d...] scores computed as Transpose(x, [0, r-1, 1, ..., r-2]) from x of
// [N, d..., C] (a language model's logits in the layout the loss takes) reads instead
// Reshape(x, [-1, C]) against Reshape(labels, [-1]): the same terms, so the same 'mean' and 'sum',
// and the form keep_labels_of gathers rows in. Returns whether it rewrote the loss.
bool flatten_classes_second(Model& model, size_t li) {
  Graph& g = model.graph;
  const auto producers = g.producers();
  const auto uses = g.use_counts();
  const Node& loss = g.nodes[li];
  if (loss.attr_string("reduction", "mean") == "none") return false;
  std::optional<Shape> scores = known_shape(g, loss.inputs[0]);
  if (!scores || scores->size() < 3) return false;
  auto it = producers.find(loss.inputs[0]);
  if (it == producers.end() || uses.at(loss.inputs[0]) != 1 || g.is_output(loss.inputs[0])) return false;
  const Node& t = g.nodes[it->second];
  if (!t.domain.empty() || t.op_type != "Transpose") return false;
  const int64_t r = int64_t(scores->size());
  std::vector<int64_t> want{0, r - 1};
  for (int64_t d = 1; d + 1 < r; ++d) want.push_back(d);
  if (!t.has_attr("perm") || t.attr_ints("perm") != want) return false;
  std::optional<Shape> x = known_shape(g, t.inputs[0]);
  if (!x || x->size() != size_t(r) || x->back() <= 0) return false;
  const size_t transpose = it->second;
  std::vector<Node> added;
  Emitter e{g, added, loss.name + "/token_rows"};
  Node flat = loss;
  flat.inputs[0] = e.node("Reshape", {t.inputs[0], e.int64s({-1, x->back()}, "rows")});
  flat.inputs[1] = e.node("Reshape", {loss.inputs[1], e.int64s({-1}, "flat")});
  added.push_back(std::move(flat));
  std::vector<Node> nodes;
  nodes.reserve(g.nodes.size() + added.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (i == li)
      for (auto& n : added) nodes.push_back(std::move(n));
    else if (i != transpose)
      nodes.push_back(std::move(g.nodes[i]));
  }
  g.nodes = std::move(nodes);
  g.topological_sort();
  infer_shapes(g, model.opsets);
  return true;
}

// A loss whose rows label sparsity can gather: reduced ('none' keeps one loss per row), only its
// loss read (not log_prob), [N, C] scores against [N] integer labels. Its labels' length (symbolic:
// -1) and dtype.
struct LabelRows {
  int64_t count;
  DType dtype;
};
std::optional<LabelRows> gatherable_loss(const Graph& g, const Node& loss, const std::unordered_map<std::string, int>& uses) {
  if (!only_first_output_used(g, loss, uses) || loss.attr_string("reduction", "mean") == "none") return std::nullopt;
  std::optional<Shape> scores = known_shape(g, loss.inputs[0]), labels = known_shape(g, loss.inputs[1]);
  if (!scores || !labels || scores->size() != 2 || labels->size() != 1) return std::nullopt;
  const DType dtype = known_dtype(g, loss.inputs[1]);
  if (dtype != DType::kInt64 && dtype != DType::kInt32) return std::nullopt;
  return LabelRows{(*labels)[0], dtype};
}

// For a node treating the rows of its output one by one, the inputs that carry those rows (the
// others broadcast over them: weights, biases, scalars); nullopt otherwise. `rank` is its
// output's rank. Unlike row_input, two operands may both carry rows (a residual Add, GELU's
// x * Phi(x)) when their shapes are the output's.
std::optional<std::vector<int>> row_inputs(const Graph& g, const Node& p, int64_t rank,
                                           const std::unordered_map<std::string, int>& uses) {
  if (rank < 2) return std::nullopt;
  if (!is_elementwise_binary(p)) {
    const int k = row_input(g, p, rank, uses);
    if (k < 0) return std::nullopt;
    return std::vector<int>{k};
  }
  std::optional<Shape> out = known_shape(g, p.outputs[0]);
  if (!out) return std::nullopt;
  std::vector<int> rows;
  for (int k = 0; k < 2; ++k) {
    std::optional<Shape> s = known_shape(g, p.inputs[size_t(k)]);
    if (!s) return std::nullopt;
    if (*s == *out) rows.push_back(k);
    else if (s->size() > 1) return std::nullopt;  // spans leading dims: neither rows nor a broadcast
  }
  if (rows.empty()) return std::nullopt;
  return rows;
}

// Label sparsity gathered above a whole region of row-wise ops: the loss's scores and every value
// they are computed from by ops that keep rows apart, where each such value is read only inside the
// region. A head is a chain (vocabulary projection, final LayerNorm); in a decoder the region
// reaches past them into the last block: its MLP, its second LayerNorm, both residual Adds and the
// attention's output projection run on the kept rows; the values entering the region (the
// attention's context before its output projection, the residual stream before the block) are
// gathered, each once. Returns false, changing nothing, when there is nothing to gather.
bool keep_labels_of(Model& model, size_t li) {
  Graph& g = model.graph;
  const auto producers = g.producers();
  const auto uses = g.use_counts();
  const Node loss = g.nodes[li];
  const std::optional<LabelRows> labels = gatherable_loss(g, loss, uses);
  if (!labels) return false;

  // Candidates: every node reachable upwards from the scores through row operands of row-wise ops.
  std::map<size_t, std::vector<int>> region;  // node index -> its row operands
  std::vector<std::string> todo{loss.inputs[0]};
  while (!todo.empty()) {
    const std::string v = todo.back();
    todo.pop_back();
    auto it = producers.find(v);
    if (it == producers.end() || region.count(it->second)) continue;
    const Node& p = g.nodes[it->second];
    std::optional<Shape> s = known_shape(g, p.outputs[0]);
    if (!s) continue;
    std::optional<std::vector<int>> rows = row_inputs(g, p, int64_t(s->size()), uses);
    if (!rows) continue;
    region[it->second] = *rows;
    for (int k : *rows) todo.push_back(p.inputs[size_t(k)]);
  }
  // Keep only nodes whose outputs are read nowhere but in the region (or by the loss): drop the
  // others until none is left to drop.
  std::unordered_map<std::string, std::vector<size_t>> readers;  // inside a subgraph too (If, Loop)
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    for (const auto& in : g.nodes[i].inputs)
      if (!in.empty()) readers[in].push_back(i);
    for (const auto& in : outer_scope_reads(g.nodes[i])) readers[in].push_back(i);
  }
  for (bool dropped = true; dropped;) {
    dropped = false;
    for (auto it = region.begin(); it != region.end();) {
      bool inside = true;
      for (const auto& out : g.nodes[it->first].outputs) {
        if (out.empty()) continue;
        if (g.is_output(out)) inside = false;
        for (size_t r : readers[out]) inside = inside && (r == li || region.count(r));
      }
      if (inside) {
        ++it;
      } else {
        it = region.erase(it);
        dropped = true;
      }
    }
  }
  // The scores' producer must be in it.
  auto root = producers.find(loss.inputs[0]);
  if (root == producers.end() || !region.count(root->second)) return false;

  // Values entering the region, each with its shape (its rank known).
  std::map<std::string, Shape> entering;
  for (const auto& [i, rows] : region)
    for (int k : rows) {
      const std::string& v = g.nodes[i].inputs[size_t(k)];
      auto producer = producers.find(v);
      if (producer != producers.end() && region.count(producer->second)) continue;
      std::optional<Shape> vs = known_shape(g, v);  // its rank: the width may be symbolic (a Reshape's)
      if (!vs || vs->size() < 2) return false;
      entering[v] = *vs;
    }
  // Each gathered once, as [K, D] rows.
  std::vector<Node> added;
  Emitter e{g, added, loss.name + "/kept_labels"};
  const std::string kept = e.kept_positions(loss.inputs[1], loss.attr_int("ignore_index", 0), labels->dtype, labels->count);
  std::map<std::string, std::string> kept_rows;  // a value of the dense graph -> its kept rows
  for (const auto& [v, vs] : entering) {
    std::string flat = vs.size() > 2 ? e.node("Flatten", {v}, {{"axis", Attribute::of(int64_t(vs.size()) - 1)}}) : v;
    kept_rows[v] = e.node("Gather", {flat, kept}, {{"axis", Attribute::of(int64_t(0))}});
  }
  // The region's nodes on the kept rows, in the graph's (topological) order.
  for (const auto& [i, rows] : region) {
    const Node& p = g.nodes[i];
    if (p.domain.empty() && p.op_type == "Reshape") {  // rows of [K, D] already
      kept_rows[p.outputs[0]] = kept_rows.at(p.inputs[0]);
      continue;
    }
    Node moved = p;
    moved.name = g.unique_name(p.name + "/kept_rows");
    for (int k : rows) moved.inputs[size_t(k)] = kept_rows.at(p.inputs[size_t(k)]);
    if (moved.has_attr("axis")) moved.attributes["axis"] = Attribute::of(int64_t(-1));
    moved.outputs = {g.unique_name(p.outputs[0] + "/kept_rows")};
    for (size_t o = 1; o < p.outputs.size(); ++o) moved.outputs.push_back("");
    kept_rows[p.outputs[0]] = moved.outputs[0];
    added.push_back(std::move(moved));
  }
  Node new_loss = loss;
  new_loss.name = g.unique_name(loss.name + "/kept_rows");
  new_loss.inputs[0] = kept_rows.at(loss.inputs[0]);
  new_loss.inputs[1] = e.node("Gather", {loss.inputs[1], kept}, {{"axis", Attribute::of(int64_t(0))}});
  added.push_back(std::move(new_loss));

  std::vector<Node> nodes;
  nodes.reserve(g.nodes.size() + added.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (i == li)
      for (auto& n : added) nodes.push_back(std::move(n));
    if (i != li && !region.count(i)) nodes.push_back(std::move(g.nodes[i]));
  }
  g.nodes = std::move(nodes);
  g.topological_sort();
  return true;
}

// ---- padding sparsity ----------------------------------------------------------------------

struct Region {
  std::string ids;
  Shape ids_shape;  // static
  int64_t pad = 0;
};

// Shape [ids..., t...] with static t (at least one dim): the trailing dims; nullopt otherwise.
std::optional<Shape> token_dims(const Graph& g, const std::string& v, const Region& r) {
  std::optional<Shape> s = known_shape(g, v);
  const size_t q = r.ids_shape.size();
  if (!s || s->size() <= q) return std::nullopt;
  for (size_t i = 0; i < q; ++i)
    if ((*s)[i] != r.ids_shape[i]) return std::nullopt;
  Shape t(s->begin() + ptrdiff_t(q), s->end());
  for (int64_t d : t)
    if (d <= 0) return std::nullopt;
  return t;
}

// An operand of a token-wise op: the token rows themselves, or a value broadcast over the hidden
// dims only (bias, scale, scalar), or one spanning token dims in part ([1, S, H] positions).
enum class Operand { kTokens, kHidden, kPartial, kOther };

Operand classify(const Graph& g, const std::string& v, const Region& r, size_t out_t_rank) {
  if (token_dims(g, v, r)) return Operand::kTokens;
  std::optional<Shape> s = known_shape(g, v);
  if (!s) return Operand::kOther;
  if (s->size() <= out_t_rank) return Operand::kHidden;
  if (s->size() == r.ids_shape.size() + out_t_rank) {
    for (size_t i = 0; i < r.ids_shape.size(); ++i)
      if ((*s)[i] != 1 && (*s)[i] != r.ids_shape[i]) return Operand::kOther;
    return Operand::kPartial;
  }
  return Operand::kOther;
}

// True when `n` treats the tokens of its [ids..., t...] output one by one.
bool token_wise(const Graph& g, const Node& n, const Region& r, const std::unordered_map<std::string, int>& uses) {
  if (n.outputs.empty() || n.outputs[0].empty()) return false;
  std::optional<Shape> t = token_dims(g, n.outputs[0], r);
  if (!t) return false;
  const size_t q = r.ids_shape.size();
  auto operands_ok = [&](std::initializer_list<size_t> which) {
    bool tokens = false;
    for (size_t k : which) {
      if (k >= n.inputs.size() || n.inputs[k].empty()) continue;
      Operand o = classify(g, n.inputs[k], r, t->size());
      if (o == Operand::kOther) return false;
      tokens = tokens || o == Operand::kTokens;
    }
    return tokens;
  };
  if (is_row_wise_unary(n)) return operands_ok({0});
  if (is_elementwise_binary(n)) return operands_ok({0, 1});
  if (!n.domain.empty()) return false;
  const int64_t rank = int64_t(q + t->size());
  if (n.op_type == "LayerNormalization" || (n.op_type == "Softmax" && n.has_attr("axis")) || n.op_type == "LogSoftmax") {
    if (!only_first_output_used(g, n, uses) || positive_axis(n, rank) < int64_t(q)) return false;
    if (n.op_type != "LayerNormalization" && !n.has_attr("axis")) return false;
    return classify(g, n.inputs[0], r, t->size()) == Operand::kTokens;
  }
  if (n.op_type == "MatMul") {
    std::optional<Shape> b = known_shape(g, n.inputs[1]);
    return b && b->size() == 2 && classify(g, n.inputs[0], r, t->size()) == Operand::kTokens;
  }
  return false;
}

}  // namespace

SparsityInputs find_sparsity_inputs(const Model& model) {
  const Graph& g = model.graph;
  const auto producers = g.producers();
  SparsityInputs found;
  std::set<std::string> seen;
  for (const Node& n : g.nodes) {
    if (is_label_loss(n)) {
      std::string in = source_input(g, n.inputs[1], producers);
      if (!in.empty() && seen.insert("label:" + in).second) found.labels.push_back({in, n.attr_int("ignore_index", 0)});
    } else if (n.domain.empty() && n.op_type == "Gather" && n.attr_int("axis", 0) == 0 && n.inputs.size() == 2) {
      const bool table = g.is_initializer(n.inputs[0]) || g.is_input(n.inputs[0]);
      std::string in = source_input(g, n.inputs[1], producers);
      if (table && !in.empty() && seen.insert("embedding:" + n.inputs[0]).second)
        found.embeddings.push_back({in, n.inputs[0]});
    }
  }
  return found;
}

int compute_kept_labels_only(Model& model) {
  infer_shapes(model.graph, model.opsets);
  int done = 0;
  std::set<std::string> rewritten;  // the new losses' names
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < model.graph.nodes.size(); ++i) {
      const Node& n = model.graph.nodes[i];
      if (!is_label_loss(n) || rewritten.count(n.name)) continue;
      const std::string name = n.name;
      rewritten.insert(name);
      if (flatten_classes_second(model, i)) {  // the same node, now over [N*d..., C]
        rewritten.erase(name);
        changed = true;
        break;
      }
      if (keep_labels_of(model, i)) {
        ++done;
        for (const Node& m : model.graph.nodes)
          if (is_label_loss(m)) rewritten.insert(m.name);  // the new loss too (names are fresh)
        infer_shapes(model.graph, model.opsets);
        changed = true;
        break;
      }
    }
  }
  return done;
}

int strip_padding(Model& model, const std::map<std::string, int64_t>& padding_index_by_table) {
  if (padding_index_by_table.empty()) return 0;
  Graph& g = model.graph;
  infer_shapes(g, model.opsets);
  const auto uses = g.use_counts();

  // The region: the first lookup in a named table with static ids; lookups on the same ids join.
  std::optional<Region> region;
  std::vector<char> compact(g.nodes.size(), 0);
  std::set<std::string> tables_found;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (!n.domain.empty() || n.op_type != "Gather" || n.inputs.size() != 2 || n.attr_int("axis", 0) != 0) continue;
    auto pad = padding_index_by_table.find(n.inputs[0]);
    if (pad == padding_index_by_table.end()) continue;
    tables_found.insert(n.inputs[0]);
    std::optional<Shape> ids = known_shape(g, n.inputs[1]), table = known_shape(g, n.inputs[0]);
    const DType ids_dtype = known_dtype(g, n.inputs[1]);
    if (!ids || ids->empty() || !table || table->size() != 2 || (ids_dtype != DType::kInt64 && ids_dtype != DType::kInt32))
      continue;
    bool fixed = true;
    for (int64_t d : *ids) fixed = fixed && d > 0;
    if (!fixed) continue;
    if (!region) region = Region{n.inputs[1], *ids, pad->second};
    if (region->ids == n.inputs[1] && region->pad == pad->second) compact[i] = 1;
  }
  for (const auto& [table, pad] : padding_index_by_table)
    OT_CHECK(tables_found.count(table), kWhere, "padding index ", pad, " given for '", table,
             "', which is not the table of any embedding lookup (Gather) in the model");
  if (!region) return 0;
  const Region r = *region;

  // Token-wise ops downstream of the lookups run compact; so do those whose every reader does.
  std::set<std::string> compact_values;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (!compact[i]) {
      bool reads = false;
      for (const auto& in : n.inputs) reads = reads || compact_values.count(in);
      if (!reads || !token_wise(g, n, r, uses)) continue;
      compact[i] = 1;
    }
    compact_values.insert(n.outputs[0]);
  }
  std::unordered_map<std::string, std::vector<size_t>> readers;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (const auto& in : g.nodes[i].inputs) readers[in].push_back(i);
  for (bool grew = true; grew;) {
    grew = false;
    for (size_t i = g.nodes.size(); i-- > 0;) {
      const Node& n = g.nodes[i];
      if (compact[i] || g.is_output(n.outputs[0]) || !token_wise(g, n, r, uses)) continue;
      const auto& rd = readers[n.outputs[0]];
      bool all = !rd.empty();
      for (size_t j : rd) all = all && compact[j];
      if (all) compact[i] = 1, grew = true;
    }
  }

  // Rebuild: compact nodes read stripped operands; other readers of their outputs get them restored.
  std::vector<Node> nodes;
  Emitter e{g, nodes, r.ids + "/padding"};
  const DType ids_dtype = known_dtype(g, r.ids);
  std::string kept = "", kept_ids = "";
  auto prepare = [&] {
    if (!kept.empty()) return;
    const std::string flat_ids = e.node("Reshape", {r.ids, e.int64s({-1}, "flat")});
    kept = e.kept_positions(flat_ids, r.pad, ids_dtype, numel(r.ids_shape));
    kept_ids = e.node("Gather", {flat_ids, kept}, {{"axis", Attribute::of(int64_t(0))}});
  };
  std::unordered_map<std::string, std::string> compact_of;  // dense value -> its [K, t...] rows
  std::set<std::string> restored;
  auto strip = [&](const std::string& v, const Shape& t) {
    if (auto it = compact_of.find(v); it != compact_of.end()) return it->second;
    Shape flat{-1};
    flat.insert(flat.end(), t.begin(), t.end());
    std::string dense = v;
    if (!token_dims(g, v, r)) {  // [1, S, H]: broadcast to the tokens' shape first
      Shape full = r.ids_shape;
      full.insert(full.end(), t.begin(), t.end());
      dense = e.node("Expand", {v, e.int64s(full, "shape")});
    }
    std::string rows = e.node("Reshape", {dense, e.int64s(flat, "shape")});
    std::string c = e.node("Gather", {rows, kept}, {{"axis", Attribute::of(int64_t(0))}});
    compact_of[v] = c;
    return c;
  };
  auto restore = [&](const std::string& v) {
    if (restored.count(v) || !compact_of.count(v)) return;
    Shape t = *token_dims(g, v, r);
    // The kept rows scattered into zeros: GatherGrad is the adjoint of the strip's Gather (its
    // gradient is that Gather, K rows), one write of the dense rows and no zero row to concatenate.
    Shape flat{numel(r.ids_shape)};
    flat.insert(flat.end(), t.begin(), t.end());
    const std::string rows = g.unique_name(e.base + "/restored");
    nodes.push_back(Node{g.unique_name(e.base + "/GatherGrad"), "GatherGrad", kOnnxTrainDomain,
                         {compact_of.at(v), e.int64s(flat, "shape"), kept}, {rows}, {{"axis", Attribute::of(int64_t(0))}}});
    model.opsets.emplace(kOnnxTrainDomain, 1);
    Shape full = r.ids_shape;
    full.insert(full.end(), t.begin(), t.end());
    e.node("Reshape", {rows, e.int64s(full, "shape")}, {}, v);
    restored.insert(v);
  };
  std::vector<Node> old = std::move(g.nodes);
  std::set<std::string> produced_compact;
  int count = 0;
  for (size_t i = 0; i < old.size(); ++i) {
    Node& n = old[i];
    if (!compact[i]) {
      for (const auto& in : n.inputs)
        if (produced_compact.count(in)) restore(in);
      nodes.push_back(std::move(n));
      continue;
    }
    prepare();
    Shape t = *token_dims(g, n.outputs[0], r);
    Node c = n;
    c.name = g.unique_name(n.name + "/kept_tokens");
    if (n.domain.empty() && n.op_type == "Gather" && n.inputs[1] == r.ids) {
      c.inputs[1] = kept_ids;
    } else {
      for (auto& in : c.inputs) {
        if (in.empty()) continue;
        Operand o = classify(g, in, r, t.size());
        if (o == Operand::kTokens || o == Operand::kPartial) in = strip(in, t);
      }
      if (c.has_attr("axis"))
        c.attributes["axis"] = Attribute::of(positive_axis(n, int64_t(r.ids_shape.size() + t.size())) -
                                             int64_t(r.ids_shape.size() + t.size()));
    }
    const std::string out = g.unique_name(n.outputs[0] + "/kept_tokens");
    c.outputs = {out};
    for (size_t o = 1; o < n.outputs.size(); ++o) c.outputs.push_back("");
    compact_of[n.outputs[0]] = out;
    produced_compact.insert(n.outputs[0]);
    nodes.push_back(std::move(c));
    ++count;
  }
  for (const auto& o : g.outputs)
    if (produced_compact.count(o.name)) restore(o.name);
  g.nodes = std::move(nodes);
  for (const auto& v : produced_compact) g.value_info.erase(v);
  g.topological_sort();
  infer_shapes(g, model.opsets);
  return count;
}

}  // namespace onnxtrain
