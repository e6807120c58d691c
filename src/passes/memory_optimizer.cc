#include "passes/memory_optimizer.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "passes/passes.h"
#include "passes/shape_inference.h"

namespace onnxtrain {

namespace {

const std::string kWhere = "memory optimizer: ";
constexpr size_t kMaxSubgraphNodes = 64;  // a recompute subgraph larger than this is not offered
// Level 1 recomputes values inside the layers until the stashed bytes are down by this fraction
// (or every candidate is taken). On the bench's encoder and decoder 45% is reached with the
// GELU and LayerNorm outputs, the attention probabilities and contexts, and at most one FFN
// up-projection (about 5% more FLOPs a step); recomputing down to half cost another up-projection.
constexpr double kLayerwiseSavingGoal = 0.45;

// Probe level 1: cheap ops (elementwise, data movement, Dropout with its saved mask, Gelu).
// Probe level 2 adds the GEMMs and normalisations.
bool cheap_op(const Node& n) {
  static const std::unordered_set<std::string> kOnnx = {
      "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Erf", "Sqrt",
      "Reciprocal", "Pow", "Exp", "Log", "Where", "Equal", "Not", "Cast", "Reshape", "Transpose", "Squeeze",
      "Unsqueeze", "Flatten", "Expand", "Slice", "Gather", "Concat", "Split", "Identity", "Dropout", "Shape",
      "Constant", "ConstantOfShape"};
  if (n.domain.empty()) return kOnnx.count(n.op_type) > 0;
  return n.domain == kOnnxTrainDomain && n.op_type == "Gelu";
}
bool expensive_op(const Node& n) {
  if (n.domain.empty())
    return n.op_type == "MatMul" || n.op_type == "Gemm" || n.op_type == "LayerNormalization" || n.op_type == "Softmax";
  return n.domain == kOnnxTrainDomain && n.op_type == "FusedMatMul";
}
// A Dropout in training mode is recomputed from its saved mask; one without a mask output cannot be.
bool dropout_training(const Node& n) { return n.domain.empty() && n.op_type == "Dropout" && n.has_input(2); }

bool recomputable(const Node& n, int probe) {
  if (!(cheap_op(n) || (probe >= 2 && expensive_op(n)))) return false;
  if (n.domain.empty() && n.op_type == "Dropout") return !dropout_training(n) || n.has_output(1);
  return !is_nondeterministic(n);
}

// Bytes as a polynomial in the symbolic dims: exponent vector -> coefficient.
using Poly = std::map<std::vector<int>, int64_t>;

struct Values {
  std::unordered_map<std::string, int64_t> bytes;  // current shapes (absent: not static)
  std::unordered_map<std::string, Poly> poly;      // absent: not a monomial of the dims
  std::unordered_map<std::string, ValueInfo> info;  // current shapes
  std::vector<std::string> syms;                    // the symbolic dims, in Poly's exponent order
  // Shapes with every dim the caller left unbound at kNominalDim: what level 1 ranks by when the
  // current shapes are not static (the same as `info` when they are).
  std::unordered_map<std::string, ValueInfo> nominal_info;
};

// An unbound symbolic dim (batch, sequence) counts as this long when level 1 ranks values by
// bytes per FLOP: long enough that a sequence-squared value (attention scores) weighs as it does
// in training, where these dims are tens to thousands.
constexpr int64_t kNominalDim = 128;

std::unordered_map<std::string, ValueInfo> infer_with(const Model& model, const std::vector<std::string>& syms,
                                                      const std::vector<int64_t>& values) {
  Graph g = model.graph;
  for (auto& in : g.inputs) {
    if (!in.info.shape) continue;
    for (size_t d = 0; d < in.info.shape->size(); ++d) {
      if ((*in.info.shape)[d] >= 0) continue;
      std::string name = d < in.info.dim_params.size() && !in.info.dim_params[d].empty()
                             ? in.info.dim_params[d] : in.name + "_dim" + std::to_string(d);
      auto it = std::find(syms.begin(), syms.end(), name);
      if (it != syms.end() && values[size_t(it - syms.begin())] > 0) (*in.info.shape)[d] = values[size_t(it - syms.begin())];
    }
  }
  g.value_info.clear();
  infer_shapes(g, model.opsets);
  std::unordered_map<std::string, ValueInfo> out(g.value_info.begin(), g.value_info.end());
  for (const auto& in : g.inputs) out[in.name] = in.info;
  return out;
}

int64_t bytes_of(const ValueInfo& info) {
  if (!info.shape || info.dtype == DType::kUndefined || info.dtype == DType::kString) return -1;
  for (int64_t d : *info.shape) if (d < 0) return -1;
  return numel(*info.shape) * int64_t(dtype_size(info.dtype));
}

// Symbolic sizes: bind every symbol to 2, then each in turn to 4 (the ratio's log2 is its
// exponent), and check the monomial against all symbols at 3.
Values measure(const Model& model, const std::map<std::string, int64_t>& dims) {
  std::vector<std::string> syms;
  for (const auto& in : model.graph.inputs)
    if (in.info.shape)
      for (size_t d = 0; d < in.info.shape->size(); ++d)
        if ((*in.info.shape)[d] < 0) {
          std::string name = d < in.info.dim_params.size() && !in.info.dim_params[d].empty()
                                 ? in.info.dim_params[d] : in.name + "_dim" + std::to_string(d);
          if (std::find(syms.begin(), syms.end(), name) == syms.end()) syms.push_back(name);
        }
  Values v;
  v.syms = syms;
  std::vector<int64_t> current(syms.size(), -1);
  for (size_t s = 0; s < syms.size(); ++s)
    if (auto it = dims.find(syms[s]); it != dims.end()) current[s] = it->second;
  v.info = infer_with(model, syms, current);
  if (std::find(current.begin(), current.end(), -1) == current.end()) {
    v.nominal_info = v.info;
  } else {
    std::vector<int64_t> nominal = current;
    for (auto& d : nominal) if (d < 0) d = kNominalDim;
    v.nominal_info = infer_with(model, syms, nominal);
  }
  for (const auto& [name, info] : v.info)
    if (int64_t b = bytes_of(info); b >= 0) v.bytes[name] = b;
  auto sized = [&](const std::vector<int64_t>& binding) {
    std::unordered_map<std::string, int64_t> out;
    for (const auto& [name, info] : infer_with(model, syms, binding))
      if (int64_t b = bytes_of(info); b >= 0) out[name] = b;
    return out;
  };
  if (syms.empty()) {
    for (const auto& [name, b] : v.bytes) v.poly[name] = Poly{{std::vector<int>{}, b}};
    return v;
  }
  const auto base = sized(std::vector<int64_t>(syms.size(), 2));
  const auto check = sized(std::vector<int64_t>(syms.size(), 3));
  std::vector<std::unordered_map<std::string, int64_t>> moved;
  for (size_t s = 0; s < syms.size(); ++s) {
    std::vector<int64_t> b(syms.size(), 2);
    b[s] = 4;
    moved.push_back(sized(b));
  }
  for (const auto& [name, b2] : base) {
    std::vector<int> exps(syms.size(), 0);
    bool ok = b2 > 0 && check.count(name);
    int total = 0;
    for (size_t s = 0; ok && s < syms.size(); ++s) {
      auto it = moved[s].find(name);
      if (it == moved[s].end() || it->second % b2) { ok = false; break; }
      int64_t ratio = it->second / b2;
      int k = 0;
      while (ratio > 1 && ratio % 2 == 0) { ratio /= 2; ++k; }
      ok = ratio == 1;
      exps[s] = k;
      total += k;
    }
    if (!ok || b2 % (int64_t(1) << total)) continue;
    int64_t coeff = b2 >> total;
    int64_t at3 = coeff;
    for (int k = 0; k < total; ++k) at3 *= 3;
    if (at3 != check.at(name)) continue;
    v.poly[name] = Poly{{exps, coeff}};
  }
  return v;
}

std::string poly_str(const Poly& p, const std::vector<std::string>& syms) {
  std::string out;
  for (const auto& [exps, c] : p) {
    if (c == 0) continue;
    std::string term = std::to_string(c < 0 ? -c : c);
    for (size_t s = 0; s < exps.size(); ++s)
      for (int k = 0; k < exps[s]; ++k) term += "*" + syms[s];
    out += out.empty() ? (c < 0 ? "-" + term : term) : (c < 0 ? " - " + term : " + " + term);
  }
  return out.empty() ? "0" : out;
}

bool is_gemm(const Node& n) {
  return expensive_op(n) && (n.op_type == "MatMul" || n.op_type == "Gemm" || n.op_type == "FusedMatMul");
}

// The reduction length of a GEMM node (0 when unknown).
int64_t gemm_k(const Node& n, const std::unordered_map<std::string, ValueInfo>& info) {
  auto it = info.find(n.inputs[0]);
  if (it == info.end() || !it->second.shape || it->second.shape->empty()) return 0;
  const Shape& a = *it->second.shape;
  const bool trans_a = n.attr_int("transA", 0) != 0;
  return std::max<int64_t>(a.size() == 1 ? a[0] : (trans_a ? a[a.size() - 2] : a.back()), 0);
}

int64_t flops_of(const Node& n, const std::unordered_map<std::string, ValueInfo>& info) {
  auto numel_of = [&](const std::string& v) -> int64_t {
    auto it = info.find(v);
    if (it == info.end() || !it->second.shape) return 0;
    for (int64_t d : *it->second.shape) if (d < 0) return 0;
    return numel(*it->second.shape);
  };
  if (!n.has_output(0)) return 0;
  const int64_t out = numel_of(n.outputs[0]);
  if (is_gemm(n)) return 2 * out * gemm_k(n, info);
  if (n.op_type == "LayerNormalization") return 8 * out;
  if (n.op_type == "Softmax" || n.op_type == "Gelu") return 8 * out;
  static const std::unordered_set<std::string> kMoves = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten",
      "Expand", "Slice", "Gather", "Concat", "Split", "Identity", "Cast", "Shape", "Constant", "ConstantOfShape"};
  return kMoves.count(n.op_type) ? 0 : out;
}

// Ops whose output aliases their input's buffer in the executor.
const std::unordered_set<std::string> kViewOps = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"};

// What recomputing node `n` costs when level 1 ranks values: its FLOPs, and for data movement
// one operation per element it writes (a Transpose is memory-bound, not free); views cost nothing.
int64_t recompute_cost(const Node& n, const std::unordered_map<std::string, ValueInfo>& info) {
  if (!n.domain.empty() || !(kViewOps.count(n.op_type) || n.op_type == "Shape" || n.op_type == "Constant")) {
    const int64_t flops = flops_of(n, info);
    if (flops > 0 || !n.has_output(0)) return flops;
    auto it = info.find(n.outputs[0]);
    if (it != info.end() && it->second.shape && it->second.has_static_shape()) return numel(*it->second.shape);
  }
  return 0;
}

// The training graph as the pass sees it.
struct Analysis {
  const Graph* g = nullptr;
  std::unordered_map<std::string, size_t> producer;
  std::vector<char> forward;             // per node
  std::vector<std::string> stashed;      // forward values a backward node reads, by producer order
  std::unordered_set<std::string> stashed_set;
  std::unordered_set<std::string> data_read;  // the stashed values a backward node reads more than the shape of
  Values values;

  bool forward_value(const std::string& v) const {
    auto it = producer.find(v);
    return it != producer.end() && forward[it->second];
  }
  int64_t bytes(const std::string& v) const {
    auto it = values.bytes.find(v);
    return it == values.bytes.end() ? -1 : it->second;
  }
  int64_t nominal_bytes(const std::string& v) const {
    auto it = values.nominal_info.find(v);
    return it == values.nominal_info.end() ? -1 : bytes_of(it->second);
  }
};

Analysis analyse(const Model& model, const std::vector<std::string>& forward_outputs,
                 const std::map<std::string, int64_t>& dims) {
  Analysis a;
  const Graph& g = model.graph;
  a.g = &g;
  a.producer = g.producers();
  a.forward.assign(g.nodes.size(), 0);
  std::vector<std::string> pending;
  for (const auto& name : forward_outputs) {
    OT_CHECK(g.is_output(name) || a.producer.count(name) || g.is_input(name), kWhere, "forward output '", name,
             "' is not a value of the model");
    pending.push_back(name);
  }
  while (!pending.empty()) {
    std::string v = std::move(pending.back());
    pending.pop_back();
    auto it = a.producer.find(v);
    if (v.empty() || it == a.producer.end() || a.forward[it->second]) continue;
    a.forward[it->second] = 1;
    for (const auto& in : g.nodes[it->second].inputs) pending.push_back(in);
  }
  std::set<std::pair<size_t, std::string>> found;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (a.forward[i]) continue;
    for (size_t k = 0; k < g.nodes[i].inputs.size(); ++k) {
      const std::string& in = g.nodes[i].inputs[k];
      if (in.empty() || !a.forward_value(in) || g.is_output(in)) continue;
      found.emplace(a.producer.at(in), in);
      if (!g.nodes[i].reads_only_shape(k)) a.data_read.insert(in);
    }
  }
  for (const auto& [idx, v] : found) {
    a.stashed.push_back(v);
    a.stashed_set.insert(v);
  }
  a.values = measure(model, dims);
  return a;
}

// The nodes that recompute `v` from values `keep` accepts (besides graph inputs and initializers),
// and the values it must keep alive that were not stashed before (outputs of ops it cannot redo).
struct Subgraph {
  std::vector<size_t> nodes;          // sorted by position
  std::vector<std::string> new_stash;
  bool ok = true;
};

Subgraph collect(const Analysis& a, const std::string& v, int probe, const std::function<bool(const std::string&)>& keep,
                 size_t max_nodes = kMaxSubgraphNodes) {
  Subgraph s;
  std::set<size_t> nodes;
  std::set<std::string> new_stash;
  std::vector<std::string> pending{v};
  std::unordered_set<std::string> seen;
  while (!pending.empty()) {
    std::string u = std::move(pending.back());
    pending.pop_back();
    if (u.empty() || !seen.insert(u).second || !a.forward_value(u)) continue;
    if (u != v && keep(u)) continue;
    size_t idx = a.producer.at(u);
    const Node& n = a.g->nodes[idx];
    // A Dropout's mask is what its recomputation reads: never recomputed itself.
    const bool mask = dropout_training(n) && n.has_output(1) && u == n.outputs[1];
    if (mask || !recomputable(n, probe)) {
      if (u == v) { s.ok = false; return s; }
      if (!a.data_read.count(u)) new_stash.insert(u);
      continue;
    }
    if (!nodes.insert(idx).second) continue;
    if (nodes.size() > max_nodes) { s.ok = false; return s; }
    if (dropout_training(n)) {  // re-applied from the mask, which the backward keeps anyway
      pending.push_back(n.inputs[0]);
      if (!a.data_read.count(n.outputs[1])) new_stash.insert(n.outputs[1]);
      continue;
    }
    for (const auto& in : n.inputs) pending.push_back(in);
  }
  s.nodes.assign(nodes.begin(), nodes.end());
  s.new_stash.assign(new_stash.begin(), new_stash.end());
  return s;
}

std::string cluster_name(const Analysis& a, const Subgraph& s) {
  std::string name;
  for (size_t idx : s.nodes)  // Constant nodes are copied along but do not name the pattern
    if (a.g->nodes[idx].op_type != "Constant") name += a.g->nodes[idx].op_type + "+";
  return name;
}

int64_t saved_bytes(const Analysis& a, const std::string& v, const Subgraph& s) {
  int64_t b = a.bytes(v);
  if (b < 0) return -1;
  for (const auto& n : s.new_stash) {
    int64_t nb = a.bytes(n);
    if (nb < 0) return -1;
    b -= nb;
  }
  return b;
}

std::string saved_formula(const Analysis& a, const std::string& v, const Subgraph& s) {
  auto it = a.values.poly.find(v);
  if (it == a.values.poly.end()) return "?";
  Poly p = it->second;
  for (const auto& n : s.new_stash) {
    auto jt = a.values.poly.find(n);
    if (jt == a.values.poly.end()) return "?";
    for (const auto& [exps, c] : jt->second) p[exps] -= c;
  }
  return poly_str(p, a.values.syms);
}

// Residual-stream values: the skip operand of each Add(x, f(x)) in the forward, and the output
// of the last such Add. Transformer layers lie between them.
struct Layers {
  std::unordered_set<std::string> checkpoints;
  std::unordered_set<std::string> inside;  // forward values strictly between the boundaries
};

Layers find_layers(const Analysis& a) {
  const Graph& g = *a.g;
  Layers layers;
  auto is_ancestor = [&](const std::string& anc, const std::string& of) {
    std::vector<std::string> pending{of};
    std::unordered_set<std::string> seen;
    while (!pending.empty()) {
      std::string u = std::move(pending.back());
      pending.pop_back();
      if (u == anc) return true;
      if (!seen.insert(u).second) continue;
      auto it = a.producer.find(u);
      if (it == a.producer.end() || !a.forward[it->second]) continue;
      for (const auto& in : g.nodes[it->second].inputs) if (!in.empty()) pending.push_back(in);
    }
    return false;
  };
  std::string first_skip, last_add;
  size_t first_pos = SIZE_MAX;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (!a.forward[i] || !n.domain.empty() || n.op_type != "Add" || n.inputs.size() != 2) continue;
    const std::string &x = n.inputs[0], &y = n.inputs[1];
    if (!(a.forward_value(x) || g.is_input(x)) || !(a.forward_value(y) || g.is_input(y))) continue;
    std::string skip = is_ancestor(x, y) ? x : is_ancestor(y, x) ? y : "";
    if (skip.empty()) continue;
    layers.checkpoints.insert(skip);
    last_add = n.outputs[0];
    auto it = a.producer.find(skip);
    size_t pos = it == a.producer.end() ? 0 : it->second;
    if (first_skip.empty() || pos < first_pos) { first_skip = skip; first_pos = pos; }
  }
  if (last_add.empty()) return layers;
  layers.checkpoints.insert(last_add);
  // Inside: descendants of the first boundary that the last Add depends on.
  std::unordered_set<std::string> desc{first_skip};
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (!a.forward[i]) continue;
    bool reached = false;
    for (const auto& in : g.nodes[i].inputs) reached = reached || desc.count(in);
    if (reached) for (const auto& o : g.nodes[i].outputs) if (!o.empty()) desc.insert(o);
  }
  std::vector<std::string> pending{last_add};
  std::unordered_set<std::string> anc;
  while (!pending.empty()) {
    std::string u = std::move(pending.back());
    pending.pop_back();
    if (!anc.insert(u).second) continue;
    auto it = a.producer.find(u);
    if (it == a.producer.end() || !a.forward[it->second]) continue;
    for (const auto& o : g.nodes[it->second].outputs) if (!o.empty() && desc.count(o)) anc.insert(o);
    for (const auto& in : g.nodes[it->second].inputs) if (!in.empty()) pending.push_back(in);
  }
  for (const auto& v : anc)
    if (desc.count(v) && !layers.checkpoints.count(v)) layers.inside.insert(v);
  return layers;
}

// The forward nodes of a checkpoint region: those that depend on one of its inputs and that one
// of its outputs depends on. Empty when its boundary values are not in the graph any more.
std::set<size_t> region_nodes(const Analysis& a, const CheckpointRegion& r) {
  const Graph& g = *a.g;
  auto present = [&](const std::string& v) { return a.producer.count(v) || g.is_input(v) || g.is_initializer(v); };
  std::unordered_set<std::string> desc;
  for (const auto& v : r.inputs) if (present(v)) desc.insert(v);
  std::vector<char> below(g.nodes.size(), 0);
  for (size_t i = 0; i < g.nodes.size(); ++i) {  // topologically sorted
    if (!a.forward[i]) continue;
    for (const auto& in : g.nodes[i].inputs) below[i] = below[i] || (!in.empty() && desc.count(in));
    if (below[i]) for (const auto& o : g.nodes[i].outputs) if (!o.empty()) desc.insert(o);
  }
  std::set<size_t> nodes;
  std::vector<std::string> pending;
  for (const auto& v : r.outputs) if (present(v)) pending.push_back(v);
  std::unordered_set<std::string> seen;
  while (!pending.empty()) {
    std::string u = std::move(pending.back());
    pending.pop_back();
    if (u.empty() || !seen.insert(u).second) continue;
    auto it = a.producer.find(u);
    if (it == a.producer.end() || !a.forward[it->second] || !below[it->second]) continue;
    nodes.insert(it->second);
    for (const auto& in : g.nodes[it->second].inputs) pending.push_back(in);
  }
  return nodes;
}

struct ConfigEntry {
  std::string cluster;
  int strategy = 0;
  int count = -1;
};

std::string cluster_list(const MemoryPlan& plan) {
  std::string out;
  for (const auto& c : plan.clusters) out += (out.empty() ? "" : ", ") + c.name;
  return out.empty() ? "(none: the model has no recomputable stashed activation)" : out;
}

std::vector<ConfigEntry> parse_config(const std::string& config, const MemoryPlan& plan) {
  std::vector<ConfigEntry> entries;
  std::stringstream ss(config);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    size_t c2 = item.rfind(':');
    size_t c1 = c2 == std::string::npos || c2 == 0 ? std::string::npos : item.rfind(':', c2 - 1);
    ConfigEntry e;
    bool ok = c1 != std::string::npos && c1 > 0;
    if (ok) {
      e.cluster = item.substr(0, c1);
      try {
        size_t used = 0;
        std::string s = item.substr(c1 + 1, c2 - c1 - 1), n = item.substr(c2 + 1);
        e.strategy = std::stoi(s, &used);
        ok = used == s.size();
        e.count = std::stoi(n, &used);
        ok = ok && used == n.size();
      } catch (const std::exception&) {
        ok = false;
      }
    }
    OT_CHECK(ok, kWhere, "config entry '", item, "' is not cluster:strategy:count (clusters of this model: ",
             cluster_list(plan), ")");
    OT_CHECK(e.strategy >= 0 && e.strategy <= 2, kWhere, "config entry '", item, "': strategy must be 0 (none), 1 ",
             "(recompute) or 2 (compromised), got ", e.strategy);
    OT_CHECK(e.count >= -1, kWhere, "config entry '", item, "': count must be -1 (all) or a count, got ", e.count);
    bool known = false;
    for (const auto& c : plan.clusters) known = known || c.name == e.cluster;
    OT_CHECK(known, kWhere, "config entry '", item, "' names no cluster of this model (clusters: ", cluster_list(plan), ")");
    entries.push_back(e);
  }
  return entries;
}

MemoryPlan plan_clusters(const Analysis& a) {
  MemoryPlan plan;
  std::map<std::string, size_t> index;
  auto stashed = [&](const std::string& u) { return a.data_read.count(u) > 0; };
  for (const auto& v : a.stashed) {
    if (int64_t b = a.bytes(v); b > 0 && a.data_read.count(v)) plan.stashed_bytes_before += b;
    if (a.g->nodes[a.producer.at(v)].op_type == "Constant") continue;  // a constant: nothing to recompute
    Subgraph full = collect(a, v, 2, stashed);
    if (!full.ok || full.nodes.empty()) continue;
    std::string name = cluster_name(a, full);
    auto [it, inserted] = index.emplace(name, plan.clusters.size());
    if (inserted) {
      RecomputeCluster c;
      c.name = name;
      c.bytes_saved = saved_bytes(a, v, full);
      c.bytes_formula = saved_formula(a, v, full);
      for (size_t idx : full.nodes) c.extra_flops += flops_of(a.g->nodes[idx], a.values.info);
      Subgraph cheap = collect(a, v, 1, stashed);
      if (cheap.ok && !cheap.nodes.empty() && cheap.nodes != full.nodes) c.compromised_bytes_saved = saved_bytes(a, v, cheap);
      plan.clusters.push_back(std::move(c));
    }
    plan.clusters[it->second].stashed.push_back(v);
  }
  return plan;
}

// Copies the chosen forward nodes for the backward and places each copy before its first reader.
std::vector<std::string> apply_recompute(Model& model, const Analysis& a, const std::set<size_t>& chosen) {
  Graph& g = model.graph;
  std::unordered_map<std::string, std::string> renamed;  // forward value -> its recomputed copy
  std::vector<Node> copies;
  std::unordered_map<std::string, size_t> copy_of_value;  // copy output -> index in copies
  std::vector<std::string> names;
  for (size_t idx : chosen) {
    const Node& n = g.nodes[idx];
    Node c;
    c.name = g.unique_name(n.name.empty() ? n.outputs[0] + "/recompute" : n.name + "/recompute");
    if (dropout_training(n)) {  // y = DropoutGrad(x, mask, ratio, training_mode): the forward's own formula
      c.op_type = "DropoutGrad";
      c.domain = kOnnxTrainDomain;
      c.inputs = {n.inputs[0], n.outputs[1], n.has_input(1) ? n.inputs[1] : "", n.inputs[2]};
      c.outputs = {""};
      model.opsets.emplace(kOnnxTrainDomain, 1);
    } else {
      c = Node{c.name, n.op_type, n.domain, n.inputs, std::vector<std::string>(n.outputs.size()), n.attributes};
    }
    for (auto& in : c.inputs)
      if (auto it = renamed.find(in); it != renamed.end()) in = it->second;
    for (size_t k = 0; k < c.outputs.size(); ++k) {
      if (!n.has_output(k)) continue;
      std::string out = g.unique_name(n.outputs[k] + "_recompute");
      c.outputs[k] = out;
      renamed[n.outputs[k]] = out;
      copy_of_value[out] = copies.size();
      if (auto it = g.value_info.find(n.outputs[k]); it != g.value_info.end()) g.value_info[out] = it->second;
    }
    names.push_back(c.name);
    copies.push_back(std::move(c));
  }
  std::vector<char> emitted(copies.size(), 0);
  std::vector<Node> nodes;
  nodes.reserve(g.nodes.size() + copies.size());
  std::function<void(size_t)> emit = [&](size_t k) {
    if (emitted[k]) return;
    emitted[k] = 1;
    for (const auto& in : copies[k].inputs)
      if (auto it = copy_of_value.find(in); it != copy_of_value.end()) emit(it->second);
    nodes.push_back(copies[k]);
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node n = std::move(g.nodes[i]);
    if (!a.forward[i]) {
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        // A backward Shape of a forward value (sum_to's target, placed by autodiff beside the
        // value's producer) keeps reading the forward value: the copy has the same shape, and
        // emitting the copy there would recompute it in the forward and stash it after all.
        if (n.reads_only_shape(k)) continue;
        if (auto it = renamed.find(n.inputs[k]); it != renamed.end()) {
          n.inputs[k] = it->second;
          emit(copy_of_value.at(n.inputs[k]));
        }
      }
    }
    nodes.push_back(std::move(n));
  }
  g.nodes = std::move(nodes);
  // Copies no backward node reached (an unused output's node) are left out.
  std::vector<std::string> kept;
  for (size_t k = 0; k < copies.size(); ++k) if (emitted[k]) kept.push_back(names[k]);
  return kept;
}

}  // namespace

std::vector<CheckpointRegion> take_checkpoint_regions(Graph& g) {
  std::map<int64_t, CheckpointRegion> by_number;
  std::vector<Node> kept;
  std::unordered_map<std::string, std::string> mark_input;  // mark output -> its input
  for (auto& n : g.nodes) {
    if (n.domain != kCheckpointBoundaryDomain || n.op_type != kCheckpointBoundaryOp) {
      kept.push_back(std::move(n));
      continue;
    }
    OT_CHECK(n.inputs.size() == 1 && n.outputs.size() == 1 && n.has_attr("region") && n.has_attr("end"), kWhere,
             "node '", n.name, "' (", kCheckpointBoundaryOp, "): expected one input, one output and the attributes "
             "'region' and 'end'");
    CheckpointRegion& r = by_number[n.attr_int("region", 0)];
    (n.attr_int("end", 0) == 0 ? r.inputs : r.outputs).push_back(n.inputs[0]);
    if (g.is_output(n.outputs[0]))  // a returned value keeps its name
      kept.push_back(Node{n.name, "Identity", "", {n.inputs[0]}, {n.outputs[0]}, {}});
    else
      mark_input[n.outputs[0]] = n.inputs[0];
  }
  g.nodes = std::move(kept);
  // Marks in a row (one call's output entering the next call) resolve to the first mark's input.
  auto unmarked = [&](std::string v) {
    for (auto it = mark_input.find(v); it != mark_input.end(); it = mark_input.find(v)) v = it->second;
    return v;
  };
  for (const auto& [mark, input] : mark_input) {
    replace_uses(g, mark, unmarked(input));
    g.value_info.erase(mark);
  }
  std::vector<CheckpointRegion> regions;
  for (auto& [number, r] : by_number) {
    for (auto* names : {&r.inputs, &r.outputs})
      for (auto& v : *names) v = unmarked(v);
    regions.push_back(std::move(r));
  }
  return regions;
}

MemoryPlan analyze_memory(const Model& model, const std::vector<std::string>& forward_outputs,
                          const MemoryOptimizerOptions& options, const std::map<std::string, int64_t>& dims) {
  Model copy = model;
  MemoryPlan plan = optimize_memory(copy, forward_outputs, options, dims);
  plan.recompute_nodes.clear();
  return plan;
}

MemoryPlan optimize_memory(Model& model, const std::vector<std::string>& forward_outputs_in,
                           const MemoryOptimizerOptions& options, const std::map<std::string, int64_t>& dims,
                           const std::vector<CheckpointRegion>& regions) {
  model.graph.topological_sort();
  const std::vector<std::string> forward_outputs =
      forward_outputs_in.empty() ? default_forward_outputs(model.graph) : forward_outputs_in;
  const Analysis a = analyse(model, forward_outputs, dims);
  MemoryPlan plan = plan_clusters(a);
  plan.level = options.level;
  OT_CHECK(options.level >= 0 && options.level <= 2, kWhere, "level must be 0, 1 or 2, got ", options.level,
           " (clusters of this model: ", cluster_list(plan), ")");
  const std::vector<ConfigEntry> entries = parse_config(options.config, plan);

  std::unordered_set<std::string> excluded;  // strategy 0: kept stashed whatever the level
  for (const auto& e : entries)
    if (e.strategy == 0)
      for (const auto& c : plan.clusters)
        if (c.name == e.cluster) excluded.insert(c.stashed.begin(), c.stashed.end());

  std::set<size_t> chosen;
  std::unordered_set<std::string> recomputed;  // stashed values the plan recomputes
  // Checkpoint regions: every stashed value computed inside is recomputed from what enters the
  // region (and what the region returns, which stays stashed as torch keeps it).
  for (size_t k = 0; k < regions.size(); ++k) {
    const std::set<size_t> inside = region_nodes(a, regions[k]);
    if (inside.empty()) {
      plan.notes.push_back("checkpoint region " + std::to_string(k) +
                           ": its boundary values were rewritten by an earlier pass; computed as exported");
      continue;
    }
    std::unordered_set<std::string> outputs(regions[k].outputs.begin(), regions[k].outputs.end());
    auto keep = [&](const std::string& u) {
      auto it = a.producer.find(u);
      return it == a.producer.end() || !inside.count(it->second) || outputs.count(u) || excluded.count(u);
    };
    int n = 0;
    for (const auto& v : a.stashed) {
      if (keep(v)) continue;
      Subgraph s = collect(a, v, 2, keep, a.g->nodes.size());
      if (!s.ok) continue;
      chosen.insert(s.nodes.begin(), s.nodes.end());
      recomputed.insert(v);
      ++n;
    }
    if (n) ++plan.checkpoint_regions;
  }
  for (auto& c : plan.clusters) {
    int n = 0;
    for (const auto& v : c.stashed) n += recomputed.count(v) ? 1 : 0;
    if (n) { c.applied_strategy = 1; c.applied_count = n; }
  }
  if (options.level >= 1) {
    const Layers layers = find_layers(a);
    plan.layer_boundaries = int(layers.checkpoints.size());
    if (layers.checkpoints.empty()) plan.notes.push_back("level " + std::to_string(options.level) +
        ": no residual connection (Add(x, f(x))) found, so no transformer layer to recompute");
    // Which values inside the layers to recompute: each candidate's cost is its recompute
    // subgraph's with every other stashed value kept (its marginal cost), and candidates are taken
    // by bytes saved per unit of cost, best first, until the stashed bytes are down by the goal.
    // Cheap, large values (LayerNorm and GELU outputs, attention probabilities) go first; the
    // projections' outputs, which cost a GEMM of the layer's width per byte, stay unless needed.
    auto boundary = [&](const std::string& u) { return layers.checkpoints.count(u) || excluded.count(u); };
    // Alive anyway: what the backward reads more than the shape of (a value read only for its
    // shape dies in the forward, so recomputing from it would stash it after all).
    auto kept_now = [&](const std::string& u) { return boundary(u) || a.data_read.count(u) > 0; };
    // A view (Reshape, Squeeze, ...) of a value alive anyway shares its buffer: nothing to save.
    auto view_of_kept = [&](const std::string& v) {
      const Node& n = a.g->nodes[a.producer.at(v)];
      return n.domain.empty() && kViewOps.count(n.op_type) && !n.inputs.empty() && kept_now(n.inputs[0]);
    };
    using Candidate = MemoryPlan::LayerwiseCandidate;
    std::vector<Candidate> candidates;
    int64_t total = 0;
    // A value the backward reads only the shape of stays alive just until that Shape (placed
    // beside its producer): recomputing it would save nothing.
    for (const auto& v : a.stashed) {
      if (!a.data_read.count(v) || view_of_kept(v)) continue;
      if (int64_t b = a.nominal_bytes(v); b > 0) total += b;
      if (!layers.inside.count(v) || boundary(v)) continue;
      Subgraph s = collect(a, v, 2, kept_now);
      if (!s.ok || s.nodes.empty()) continue;
      int64_t bytes = a.nominal_bytes(v), cost = 0;
      for (const auto& n : s.new_stash) bytes -= std::max<int64_t>(a.nominal_bytes(n), 0);
      if (bytes <= 0) continue;  // new stashes outweigh it (or its size is unknown)
      for (size_t idx : s.nodes) cost += recompute_cost(a.g->nodes[idx], a.values.nominal_info);
      candidates.push_back({v, bytes, cost, false});
    }
    // bytes/cost descending without division (cost 0: views of kept values, first); ties keep
    // forward order.
    std::stable_sort(candidates.begin(), candidates.end(), [](const Candidate& x, const Candidate& y) {
      return __int128(x.bytes) * y.cost > __int128(y.bytes) * x.cost;
    });
    const int64_t goal = int64_t(double(total) * kLayerwiseSavingGoal);
    // Greedy by ratio, except that the last step takes the cheapest candidate that reaches the
    // goal alone when that costs less than the next by ratio (a 1 MiB projection output at the
    // same bytes per FLOP as a 4 MiB one, when 1 MiB is missing).
    std::unordered_set<std::string> selected;
    std::vector<char> taken(candidates.size(), 0);
    int64_t planned = 0;
    for (size_t next = 0; planned < goal;) {
      while (next < candidates.size() && taken[next]) ++next;
      if (next == candidates.size()) break;
      size_t pick = next;
      for (size_t k = next + 1; k < candidates.size(); ++k)
        if (!taken[k] && candidates[k].bytes >= goal - planned && candidates[k].cost < candidates[pick].cost) pick = k;
      if (pick != next && candidates[pick].bytes < goal - planned) pick = next;
      taken[pick] = 1;
      candidates[pick].recomputed = true;
      selected.insert(candidates[pick].value);
      planned += candidates[pick].bytes;
    }
    // Kept: the residual boundaries, what the config excludes and the stashed values not selected
    // (a config entry with strategy 1 still recomputes those).
    auto keep = [&](const std::string& u) { return boundary(u) || (a.data_read.count(u) && !selected.count(u)); };
    for (const auto& v : a.stashed) {
      if (!selected.count(v)) continue;
      Subgraph s = collect(a, v, 2, keep);
      if (!s.ok) continue;
      chosen.insert(s.nodes.begin(), s.nodes.end());
      recomputed.insert(v);
    }
    plan.layerwise = std::move(candidates);
    for (auto& c : plan.clusters) {
      int n = 0;
      for (const auto& v : c.stashed) n += recomputed.count(v) ? 1 : 0;
      if (n) { c.applied_strategy = 1; c.applied_count = n; }
    }
  }
  auto apply_cluster = [&](RecomputeCluster& c, int strategy, int count) {
    const int64_t per = strategy == 1 ? c.bytes_saved : c.compromised_bytes_saved;
    if (strategy == 2 && c.compromised_bytes_saved < 0 && c.bytes_saved >= 0) {
      plan.notes.push_back(c.name + ": no compromised plan (its subgraph has no cheaper part); not applied");
      return;
    }
    if (per <= 0 && per != -1) {
      plan.notes.push_back(c.name + ": strategy " + std::to_string(strategy) + " would save " + std::to_string(per) +
                           " bytes per occurrence (new stashes outweigh it); not applied");
      return;
    }
    auto stashed = [&](const std::string& u) { return a.data_read.count(u) > 0 && !recomputed.count(u); };
    int n = 0;
    for (const auto& v : c.stashed) {
      if (count >= 0 && n >= count) break;
      if (excluded.count(v)) continue;
      Subgraph s = collect(a, v, strategy == 1 ? 2 : 1, stashed);
      if (!s.ok || s.nodes.empty()) continue;
      chosen.insert(s.nodes.begin(), s.nodes.end());
      recomputed.insert(v);
      ++n;
    }
    c.applied_strategy = strategy;
    c.applied_count = std::max(c.applied_count, n);
  };
  if (options.level == 2) {  // compromised plans for the values outside the layers
    for (auto& c : plan.clusters) {
      if (c.applied_strategy || c.compromised_bytes_saved <= 0) continue;
      bool outside = true;
      for (const auto& v : c.stashed) outside = outside && !recomputed.count(v);
      if (outside) apply_cluster(c, 2, -1);
    }
  }
  for (const auto& e : entries)
    for (auto& c : plan.clusters)
      if (c.name == e.cluster && e.strategy != 0) apply_cluster(c, e.strategy, e.count);

  for (size_t idx : chosen) plan.extra_flops += flops_of(model.graph.nodes[idx], a.values.info);
  if (!chosen.empty()) plan.recompute_nodes = apply_recompute(model, a, chosen);
  // What stays stashed, measured on the rewritten graph.
  Analysis after;
  after.g = &model.graph;
  after.producer = model.graph.producers();
  std::unordered_set<std::string> fwd_values;
  std::vector<std::string> pending(forward_outputs);
  after.forward.assign(model.graph.nodes.size(), 0);
  while (!pending.empty()) {
    std::string v = std::move(pending.back());
    pending.pop_back();
    auto it = after.producer.find(v);
    if (v.empty() || it == after.producer.end() || after.forward[it->second]) continue;
    after.forward[it->second] = 1;
    for (const auto& in : model.graph.nodes[it->second].inputs) pending.push_back(in);
  }
  std::unordered_set<std::string> still;
  for (size_t i = 0; i < model.graph.nodes.size(); ++i)
    if (!after.forward[i])
      for (size_t k = 0; k < model.graph.nodes[i].inputs.size(); ++k) {
        const std::string& in = model.graph.nodes[i].inputs[k];
        if (!in.empty() && !model.graph.nodes[i].reads_only_shape(k) && after.forward_value(in) &&
            !model.graph.is_output(in))
          still.insert(in);
      }
  for (const auto& v : still) if (int64_t b = a.bytes(v); b > 0) plan.stashed_bytes_after += b;
  if (!plan.recompute_nodes.empty()) model.metadata[kMetaMemoryPlan] = plan_table(plan);
  return plan;
}

std::string plan_table(const MemoryPlan& plan) {
  auto mib = [](int64_t b) {
    std::ostringstream s;
    s.setf(std::ios::fixed);
    s.precision(2);
    s << double(b) / (1024.0 * 1024.0) << " MiB";
    return s.str();
  };
  std::ostringstream out;
  out << "Memory optimizer plan (level " << plan.level << "): " << plan.clusters.size() << " clusters\n";
  out << "  cluster | occurrences | bytes saved per occurrence (formula) | bytes (current shapes) | "
         "compromised bytes | extra FLOPs per occurrence | applied (strategy:count)\n";
  for (const auto& c : plan.clusters) {
    out << "  " << c.name << " | " << c.stashed.size() << " | " << c.bytes_formula << " | "
        << (c.bytes_saved >= 0 ? std::to_string(c.bytes_saved) : "?") << " | "
        << (c.compromised_bytes_saved >= 0 ? std::to_string(c.compromised_bytes_saved) : "-") << " | "
        << c.extra_flops << " | " << c.applied_strategy << ":" << c.applied_count << "\n";
  }
  if (plan.level >= 1)
    out << "  layer-wise: " << plan.layer_boundaries << " residual boundaries kept; "
        << std::count_if(plan.layerwise.begin(), plan.layerwise.end(), [](const auto& c) { return c.recomputed; })
        << " of " << plan.layerwise.size() << " stashed values inside the layers recomputed (most bytes per FLOP "
        << "first, until the stashed bytes are down by " << int(kLayerwiseSavingGoal * 100) << "%)\n";
  if (plan.checkpoint_regions) out << "  torch.utils.checkpoint: " << plan.checkpoint_regions << " regions recomputed\n";
  out << "  stashed activations: " << mib(plan.stashed_bytes_before) << " before, " << mib(plan.stashed_bytes_after)
      << " after (" << plan.stashed_bytes_before << " and " << plan.stashed_bytes_after << " bytes); " << plan.recompute_nodes.size() << " nodes recomputed, " << plan.extra_flops << " extra FLOPs\n";
  for (const auto& n : plan.notes) out << "  note: " << n << "\n";
  return out.str();
}

}  // namespace onnxtrain
