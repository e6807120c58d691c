// Pattern fusions: rewrite multi-node patterns that exporters emit into one fused op.
#include <cmath>
#include <limits>
#include <algorithm>
#include <unordered_map>
#include <optional>
#include <string_view>
#include <type_traits>
#include <unordered_set>

#include "ops/registry.h"
#include "passes/passes.h"
#include "ir/subgraph.h"
#include "passes/shape_inference.h"

namespace onnxtrain {

const Tensor* constant_tensor(const Graph& g, const std::string& value) {
  if (auto it = g.initializers.find(value); it != g.initializers.end()) return &it->second;
  for (const auto& n : g.nodes)
    if (n.op_type == "Constant" && n.domain.empty() && n.outputs.size() == 1 && n.outputs[0] == value)
      return n.attr_tensor("value");
  return nullptr;
}

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
  const Tensor* t = constant_tensor(g, value);
  if (!t || t->numel() != 1 || !is_floating(t->dtype())) return false;
  return std::fabs(t->item_as_double() - expected) <= tol * std::fabs(expected);
}

bool is_op(const Node& n, const char* op) { return n.op_type == op && n.domain.empty(); }

// Every dimension known (static).
bool fully_known(const std::optional<Shape>& s) {
  return s && std::all_of(s->begin(), s->end(), [](int64_t d) { return d >= 0; });
}

// Every dimension but the first (a batch) known. Values of such shapes may broadcast against each
// other only along the batch, the outermost dim in both ONNX and channels-last order, so pairing
// them by position is right in either order.
bool known_but_batch(const std::optional<Shape>& s) {
  return s && !s->empty() && std::all_of(s->begin() + 1, s->end(), [](int64_t d) { return d >= 0; });
}


// Rebuilds g.nodes without the removed ones.
void drop_removed(Graph& g, const std::vector<char>& removed) {
  std::vector<Node> kept;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (!removed[i]) kept.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(kept);
}

// The bookkeeping of one fusion pass: who reads and who produces each value (as the graph stood
// before the pass), the nodes the pass has replaced, and how many rewrites it made. finish()
// drops the replaced nodes and returns that count.
struct FusionScan {
  explicit FusionScan(Graph& graph)
      : g(graph), uses(graph), producers(graph.producers()), removed(graph.nodes.size(), 0) {}
  int finish() {
    if (rewrites) drop_removed(g, removed);
    return rewrites;
  }
  Graph& g;
  Uses uses;
  std::unordered_map<std::string, size_t> producers;
  std::vector<char> removed;
  int rewrites = 0;
};

// The operand of a binary node other than `value`, or "" when `value` is not an operand.
std::string other_operand(const Node& n, const std::string& value) {
  if (n.inputs.size() != 2) return "";
  if (n.inputs[0] == value) return n.inputs[1];
  if (n.inputs[1] == value) return n.inputs[0];
  return "";
}

// A minimal build may leave a fused op's file out (ONNXTRAIN_OPS): its fusion then does not fire.
bool fused_op_registered(const char* op_type) {
  return !OpRegistry::global().versions(kOnnxTrainDomain, op_type).empty();
}

// Whether a fused op can be in this build at all: a minimal build's generated op list
// (ops_in_build.h) says so at compile time, so the fusions into ops it leaves out compile to
// nothing (the digits op set's library is held to 3 MB).
constexpr bool fused_op_compiled([[maybe_unused]] std::string_view op_type) {
#if defined(ONNXTRAIN_MINIMAL_OPS)
  return op_in_build(op_type);
#else
  return true;
#endif
}

}  // namespace

// Evaluated at compile time, so a false first operand leaves the rest of its function dead.
#define FUSED_OP_BUILT(op_type) \
  (std::bool_constant<fused_op_compiled(op_type)>::value && fused_op_registered(op_type))

namespace {

}  // namespace

namespace {

// The shared end of both GELU patterns: plus1 = inner + 1 (inner: the Erf or Tanh output), then
// either (x * plus1) * 0.5, (x * 0.5) * plus1 or 0.5 * (x * plus1). Appends the nodes it matched
// to `chain` and returns the pattern's output, or "" when it does not match.
std::string match_gelu_tail(const Graph& g, const Uses& uses, const std::unordered_map<std::string, size_t>& producers,
                            const std::string& inner, const std::string& x, std::vector<size_t>& chain) {
  int a = uses.sole_reader(inner);
  if (a < 0 || !is_op(g.nodes[size_t(a)], "Add") || !is_scalar_constant(g, other_operand(g.nodes[size_t(a)], inner), 1.0))
    return "";
  const std::string& plus1 = g.nodes[size_t(a)].outputs[0];
  int m1 = uses.sole_reader(plus1);
  if (m1 < 0 || !is_op(g.nodes[size_t(m1)], "Mul")) return "";
  std::string partner = other_operand(g.nodes[size_t(m1)], plus1);
  chain.push_back(size_t(a));
  chain.push_back(size_t(m1));
  if (partner == x) {
    int m2 = uses.sole_reader(g.nodes[size_t(m1)].outputs[0]);
    if (m2 < 0 || !is_op(g.nodes[size_t(m2)], "Mul") ||
        !is_scalar_constant(g, other_operand(g.nodes[size_t(m2)], g.nodes[size_t(m1)].outputs[0]), 0.5))
      return "";
    chain.push_back(size_t(m2));
    return g.nodes[size_t(m2)].outputs[0];
  }
  auto hp = producers.find(partner);
  if (hp == producers.end()) return "";
  const Node& half = g.nodes[hp->second];
  if (!is_op(half, "Mul") || other_operand(half, x).empty() || !is_scalar_constant(g, other_operand(half, x), 0.5) ||
      uses.sole_reader(partner) != m1)
    return "";
  chain.push_back(hp->second);
  return g.nodes[size_t(m1)].outputs[0];
}

// The producer of `value` if it is an `op` read only by `reader`, else nullptr.
const Node* sole_producer(const Graph& g, const Uses& uses, const std::unordered_map<std::string, size_t>& producers,
                          const std::string& value, const char* op, int reader, std::vector<size_t>& chain) {
  auto it = producers.find(value);
  if (it == producers.end() || !is_op(g.nodes[it->second], op) || uses.sole_reader(value) != reader) return nullptr;
  chain.push_back(it->second);
  return &g.nodes[it->second];
}

// x^3 as exporters write it: Pow(x, 3), x * (x * x) or (x * x) * x. Returns x, or "".
std::string match_cube(const Graph& g, const Uses& uses, const std::unordered_map<std::string, size_t>& producers,
                       const std::string& cube, int reader, std::vector<size_t>& chain) {
  auto it = producers.find(cube);
  if (it == producers.end() || uses.sole_reader(cube) != reader) return "";
  const Node& n = g.nodes[it->second];
  if (is_op(n, "Pow") && is_scalar_constant(g, n.inputs[1], 3.0)) {
    chain.push_back(it->second);
    return n.inputs[0];
  }
  if (!is_op(n, "Mul")) return "";
  for (int side = 0; side < 2; ++side) {
    const std::string& x = n.inputs[size_t(side)];
    const std::string& sq = n.inputs[size_t(1 - side)];
    auto sp = producers.find(sq);
    if (sp == producers.end()) continue;
    const Node& s = g.nodes[sp->second];
    if (is_op(s, "Mul") && s.inputs[0] == x && s.inputs[1] == x && uses.sole_reader(sq) == int(it->second)) {
      chain.push_back(it->second);
      chain.push_back(sp->second);
      return x;
    }
  }
  return "";
}

// kappa x^2 as exporters write it: (x * kappa) * x, x * (x * kappa), kappa * (x * x) or
// (x * x) * kappa. Returns x, or "".
std::string match_kappa_square(const Graph& g, const Uses& uses, const std::unordered_map<std::string, size_t>& producers,
                               const std::string& value, int reader, std::vector<size_t>& chain) {
  const Node* n = sole_producer(g, uses, producers, value, "Mul", reader, chain);
  if (!n) return "";
  const int index = int(chain.back());
  for (int side = 0; side < 2; ++side) {
    const std::string& a = n->inputs[size_t(side)];
    const std::string& b = n->inputs[size_t(1 - side)];
    std::vector<size_t> part;
    const Node* m = sole_producer(g, uses, producers, b, "Mul", index, part);
    if (!m) continue;
    std::string x;
    if (is_scalar_constant(g, a, 0.044715) && m->inputs[0] == m->inputs[1]) x = m->inputs[0];  // kappa * (x * x)
    else if (m->inputs[0] == a && is_scalar_constant(g, m->inputs[1], 0.044715)) x = a;       // x * (x * kappa)
    else if (m->inputs[1] == a && is_scalar_constant(g, m->inputs[0], 0.044715)) x = a;       // x * (kappa * x)
    if (x.empty()) continue;
    chain.insert(chain.end(), part.begin(), part.end());
    return x;
  }
  return "";
}

// tanh's argument in GPT-2's form, sqrt(2/pi) * (x + 0.044715 * x^3), or in Hugging Face's
// FastGELU form, (x * sqrt(2/pi)) * (1 + 0.044715 * x * x); operands in either order. Returns x,
// or "".
std::string match_gelu_tanh_argument(const Graph& g, const Uses& uses,
                                     const std::unordered_map<std::string, size_t>& producers, const Node& tanh,
                                     int tanh_index, std::vector<size_t>& chain) {
  const Node* outer = sole_producer(g, uses, producers, tanh.inputs[0], "Mul", tanh_index, chain);
  if (!outer) return "";
  const int outer_index = int(chain.back());
  constexpr double kSqrt2OverPi = 0.79788456080286535588;
  for (int side = 0; side < 2; ++side) {
    const std::string& p = outer->inputs[size_t(side)];
    const std::string& q = outer->inputs[size_t(1 - side)];
    std::vector<size_t> part;
    if (is_scalar_constant(g, p, kSqrt2OverPi)) {  // sqrt(2/pi) * (x + kappa x^3)
      const Node* add = sole_producer(g, uses, producers, q, "Add", outer_index, part);
      if (!add) continue;
      const int add_index = int(part.back());
      for (int k = 0; k < 2; ++k) {  // which operand of the Add is x
        const std::string& x = add->inputs[size_t(k)];
        std::vector<size_t> tail = part;
        const Node* kappa = sole_producer(g, uses, producers, add->inputs[size_t(1 - k)], "Mul", add_index, tail);
        if (!kappa) continue;
        std::string cube;
        for (int c = 0; c < 2; ++c)
          if (is_scalar_constant(g, kappa->inputs[size_t(c)], 0.044715)) cube = kappa->inputs[size_t(1 - c)];
        if (cube.empty() || match_cube(g, uses, producers, cube, int(tail.back()), tail) != x) continue;
        chain.insert(chain.end(), tail.begin(), tail.end());
        return x;
      }
      continue;
    }
    // (x * sqrt(2/pi)) * (1 + kappa x^2)
    const Node* scaled = sole_producer(g, uses, producers, p, "Mul", outer_index, part);
    if (!scaled) continue;
    std::string x;
    for (int c = 0; c < 2; ++c)
      if (is_scalar_constant(g, scaled->inputs[size_t(c)], kSqrt2OverPi)) x = scaled->inputs[size_t(1 - c)];
    const Node* plus1 = x.empty() ? nullptr : sole_producer(g, uses, producers, q, "Add", outer_index, part);
    if (!plus1) continue;
    const int plus1_index = int(part.back());
    for (int c = 0; c < 2; ++c) {
      if (!is_scalar_constant(g, plus1->inputs[size_t(c)], 1.0)) continue;
      std::vector<size_t> tail = part;
      if (match_kappa_square(g, uses, producers, plus1->inputs[size_t(1 - c)], plus1_index, tail) != x) continue;
      chain.insert(chain.end(), tail.begin(), tail.end());
      return x;
    }
  }
  return "";
}

}  // namespace

// Both GELU forms into onnxtrain.Gelu:
//   erf:  0.5 x (1 + erf(x / sqrt 2))                        -> Gelu(x)
//   tanh: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))    -> Gelu(x, approximate="tanh")
//         0.5 x (1 + tanh(x sqrt(2/pi) (1 + 0.044715 x x)))  -> Gelu(x, approximate="tanh")
// as torch exports F.gelu (both approximate modes) and the written-out forms (GPT-2's gelu_new,
// Hugging Face's NewGELUActivation and FastGELUActivation).
// Every intermediate must have the pattern's next node as its only reader.
int fuse_gelu(Graph& g) {
  if (!FUSED_OP_BUILT("Gelu")) return 0;
  Uses uses(g);
  std::vector<char> removed(g.nodes.size(), 0);
  int fused = 0;
  auto producers = g.producers();
  for (size_t e = 0; e < g.nodes.size(); ++e) {
    const Node& head = g.nodes[e];
    const bool erf = is_op(head, "Erf"), tanh = is_op(head, "Tanh");
    if ((!erf && !tanh) || removed[e]) continue;
    std::vector<size_t> chain = {e};
    std::string x;
    if (erf) {
      // scaled = x / sqrt(2)  or  x * (1 / sqrt(2))
      auto pit = producers.find(head.inputs[0]);
      if (pit == producers.end()) continue;
      const Node& scale = g.nodes[pit->second];
      if (is_op(scale, "Div") && is_scalar_constant(g, scale.inputs[1], std::sqrt(2.0))) x = scale.inputs[0];
      else if (is_op(scale, "Mul") && is_scalar_constant(g, scale.inputs[1], 1 / std::sqrt(2.0))) x = scale.inputs[0];
      else if (is_op(scale, "Mul") && is_scalar_constant(g, scale.inputs[0], 1 / std::sqrt(2.0))) x = scale.inputs[1];
      if (x.empty() || uses.sole_reader(scale.outputs[0]) != int(e)) continue;
      chain.push_back(pit->second);
    } else {
      x = match_gelu_tanh_argument(g, uses, producers, head, int(e), chain);
      if (x.empty()) continue;
    }
    std::string out = match_gelu_tail(g, uses, producers, head.outputs[0], x, chain);
    if (out.empty()) continue;
    bool free = true;
    for (size_t k : chain) free = free && !removed[k];
    if (!free) continue;
    for (size_t k : chain) removed[k] = 1;
    Node gelu;
    gelu.op_type = "Gelu";
    gelu.domain = kOnnxTrainDomain;
    gelu.name = head.name + "/gelu";
    gelu.inputs = {x};
    gelu.outputs = {out};
    if (tanh) gelu.attributes["approximate"] = Attribute::of(std::string("tanh"));
    // Put the fused node where the last node of the chain was, keeping topological order.
    size_t last = *std::max_element(chain.begin(), chain.end());
    g.nodes[last] = gelu;
    removed[last] = 0;
    ++fused;
  }
  if (fused) drop_removed(g, removed);
  return fused;
}

namespace {
// perm swaps the last two axes and keeps the others in place.
bool swaps_last_two(const std::vector<int64_t>& perm) {
  size_t r = perm.size();
  if (r < 2) return false;
  for (size_t i = 0; i + 2 < r; ++i)
    if (perm[i] != int64_t(i)) return false;
  return perm[r - 2] == int64_t(r - 1) && perm[r - 1] == int64_t(r - 2);
}

}  // namespace

int fuse_matmul(Graph& g) {
  if (!FUSED_OP_BUILT("FusedMatMul")) return 0;
  FusionScan scan(g);
  for (size_t m = 0; m < g.nodes.size(); ++m) {
    Node& mm = g.nodes[m];
    // (nodes with missing operands are left for their ops' own checks to refuse)
    if (!is_op(mm, "MatMul") || mm.inputs.size() != 2 || !mm.has_output(0)) continue;
    Node fusedmm;
    fusedmm.op_type = "FusedMatMul";
    fusedmm.domain = kOnnxTrainDomain;
    fusedmm.name = mm.name + "/fused";
    fusedmm.inputs = mm.inputs;
    std::vector<size_t> absorbed;
    // Transposes of the last two axes become transA / transB (read through strides).
    for (int k = 0; k < 2; ++k) {
      auto p = scan.producers.find(mm.inputs[size_t(k)]);
      if (p == scan.producers.end()) continue;
      const Node& t = g.nodes[p->second];
      if (!is_op(t, "Transpose") || scan.removed[p->second] || !t.has_input(0) || !t.has_attr("perm") ||
          !swaps_last_two(t.attr_ints("perm")) ||
          scan.uses.sole_reader(t.outputs[0]) != int(m))
        continue;
      // 1-D operands ignore trans flags; only fold when the source has rank >= 2.
      fusedmm.inputs[size_t(k)] = t.inputs[0];
      fusedmm.attributes[k == 0 ? "transA" : "transB"] = Attribute::of(int64_t(1));
      absorbed.push_back(p->second);
    }
    // Add(bias) with a 1-D bias of the output's last dimension.
    std::string out = mm.outputs[0];
    int a = scan.uses.sole_reader(out);
    size_t last = m;
    if (a >= 0 && is_op(g.nodes[size_t(a)], "Add") && g.nodes[size_t(a)].has_output(0)) {
      std::string bias = other_operand(g.nodes[size_t(a)], out);
      auto bs = known_shape(g, bias);
      auto ws = known_shape(g, fusedmm.inputs[1]);
      bool trans_b = fusedmm.has_attr("transB");
      if (!bias.empty() && bs && bs->size() == 1 && ws && ws->size() >= 2 &&
          (*ws)[ws->size() - (trans_b ? 2 : 1)] == (*bs)[0] && (*bs)[0] > 0) {
        fusedmm.inputs.push_back(bias);
        out = g.nodes[size_t(a)].outputs[0];
        absorbed.push_back(m);
        last = size_t(a);
      }
    }
    if (absorbed.empty()) continue;
    fusedmm.outputs = {out};
    for (size_t k : absorbed) scan.removed[k] = 1;
    g.nodes[last] = fusedmm;  // where the last absorbed node stood: inputs are defined before it
    scan.removed[last] = 0;
    ++scan.rewrites;
  }
  return scan.finish();
}

namespace {

// A constant float tensor as doubles, or nullopt when `value` is not a float initializer of n elements.
std::optional<std::vector<double>> constant_doubles(const Graph& g, const std::string& value, int64_t n) {
  auto it = g.initializers.find(value);
  if (it == g.initializers.end() || it->second.numel() != n || !is_floating(it->second.dtype())) return std::nullopt;
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = it->second.item_as_double(i);
  return v;
}

// The Conv that produces node i's first input when node i is its only reader (and it is still in
// the graph): what a fusion into that Conv may rewrite.
Node* sole_feeding_conv(Graph& g, const Uses& uses, const std::unordered_map<std::string, size_t>& producers,
                        const std::vector<char>& removed, size_t i) {
  const std::string& x = g.nodes[i].inputs[0];
  auto p = producers.find(x);
  if (p == producers.end() || removed[p->second] || uses.sole_reader(x) != int(i)) return nullptr;
  Node& conv = g.nodes[p->second];
  return is_op(conv, "Conv") ? &conv : nullptr;
}

}  // namespace

// Conv -> BatchNormalization (inference form, constant statistics) folds into the Conv:
//   s = scale / sqrt(var + eps),  W' = W * s (per output channel),  B' = (B - mean) * s + beta.
int fuse_conv_batchnorm(Graph& g) {
  FusionScan scan(g);
  for (size_t b = 0; b < g.nodes.size(); ++b) {
    const Node& bn = g.nodes[b];
    if (!is_op(bn, "BatchNormalization") || bn.outputs.size() != 1 || bn.attr_int("training_mode", 0) != 0 ||
        bn.inputs.size() != 5)
      continue;
    Node* producer = sole_feeding_conv(g, scan.uses, scan.producers, scan.removed, b);
    if (!producer || producer->inputs.size() < 2) continue;
    Node& conv = *producer;
    auto wit = g.initializers.find(conv.inputs[1]);
    if (wit == g.initializers.end() || wit->second.rank() < 3 || wit->second.dtype() != DType::kFloat32) continue;
    const Tensor& w = wit->second;
    const int64_t m = w.dim(0), per_channel = w.numel() / std::max<int64_t>(m, 1);
    auto scale = constant_doubles(g, bn.inputs[1], m), beta = constant_doubles(g, bn.inputs[2], m),
         mean = constant_doubles(g, bn.inputs[3], m), var = constant_doubles(g, bn.inputs[4], m);
    std::optional<std::vector<double>> bias = std::vector<double>(size_t(m), 0.0);
    if (conv.inputs.size() > 2 && !conv.inputs[2].empty()) bias = constant_doubles(g, conv.inputs[2], m);
    if (!scale || !beta || !mean || !var || !bias) continue;
    const double eps = bn.attr_float("epsilon", 1e-5f);
    Tensor new_w = Tensor::empty(DType::kFloat32, w.shape());
    Tensor new_b = Tensor::empty(DType::kFloat32, {m});
    const float* pw = w.data<float>();
    float* nw = new_w.data<float>();
    float* nb = new_b.data<float>();
    for (int64_t c = 0; c < m; ++c) {
      const double s = (*scale)[size_t(c)] / std::sqrt((*var)[size_t(c)] + eps);
      for (int64_t i = 0; i < per_channel; ++i) nw[c * per_channel + i] = float(pw[c * per_channel + i] * s);
      nb[c] = float(((*bias)[size_t(c)] - (*mean)[size_t(c)]) * s + (*beta)[size_t(c)]);
    }
    std::string w_name = g.unique_name(conv.inputs[1] + "/bn_folded");
    std::string b_name = g.unique_name(bn.name.empty() ? conv.inputs[1] + "/bn_bias" : bn.name + "/folded_bias");
    g.initializers.emplace(w_name, std::move(new_w));
    g.initializers.emplace(b_name, std::move(new_b));
    conv.inputs.resize(3);
    conv.inputs[1] = w_name;
    conv.inputs[2] = b_name;
    conv.outputs[0] = bn.outputs[0];
    scan.removed[b] = 1;
    ++scan.rewrites;
  }
  return scan.finish();
}

namespace {

// A Clip's bounds (attributes before opset 11, optional constant inputs after); false when an
// input bound is not a constant scalar.
bool clip_bounds(const Graph& g, const Node& clip, float& lo, float& hi) {
  lo = clip.attr_float("min", -std::numeric_limits<float>::infinity());
  hi = clip.attr_float("max", std::numeric_limits<float>::infinity());
  auto bound = [&](size_t i, float& v) {
    if (clip.inputs.size() <= i || clip.inputs[i].empty()) return true;
    const Tensor* t = constant_tensor(g, clip.inputs[i]);
    if (!t || t->numel() != 1) return false;
    v = float(t->item_as_double());
    return true;
  };
  return bound(1, lo) && bound(2, hi);
}

// The plain Conv (fp32 constant weights, constant or no bias) producing `value`, read only by
// node `reader`; null otherwise.
Node* sole_constant_conv(Graph& g, const Uses& uses, const std::unordered_map<std::string, size_t>& producers,
                         const std::vector<char>& removed, const std::string& value, size_t reader) {
  auto p = producers.find(value);
  if (p == producers.end() || removed[p->second] || uses.sole_reader(value) != int(reader)) return nullptr;
  Node& conv = g.nodes[p->second];
  if (!is_op(conv, "Conv") || conv.inputs.size() < 2 || conv.outputs[0] != value) return nullptr;
  auto w = g.initializers.find(conv.inputs[1]);
  if (w == g.initializers.end() || w->second.dtype() != DType::kFloat32 || w->second.rank() < 3) return nullptr;
  if (conv.inputs.size() > 2 && !conv.inputs[2].empty() && !constant_doubles(g, conv.inputs[2], w->second.dim(0)))
    return nullptr;
  return &conv;
}

// Turns a Conv into onnxtrain.FusedConv (same inputs and attributes) with `activation` ("": none).
void make_fused_conv(Node& conv, const std::string& activation) {
  conv.op_type = "FusedConv";
  conv.domain = kOnnxTrainDomain;
  if (!activation.empty()) conv.attributes["activation"] = Attribute::of(activation);
}

// A float scalar constant's value.
std::optional<double> scalar_constant(const Graph& g, const std::string& value) {
  const Tensor* t = constant_tensor(g, value);
  if (!t || t->numel() != 1 || !is_floating(t->dtype())) return std::nullopt;
  return t->item_as_double();
}

}  // namespace

// Conv -> Mul / Div / Add / Sub by a scalar constant folds into the Conv's constant weights and
// bias (the per-layer affine PP-LCNetV3 puts after its convolutions, among others):
//   s * (W x + B) = (s W) x + s B,   (W x + B) / s = (W / s) x + B / s,   (W x + B) + t = W x + (B + t).
int fold_conv_scalar_affine(Graph& g) {
  FusionScan scan(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& op = g.nodes[i];
    bool mul = is_op(op, "Mul"), div = is_op(op, "Div"), add = is_op(op, "Add"), sub = is_op(op, "Sub");
    if (!(mul || div || add || sub) || op.inputs.size() != 2 || op.outputs.size() != 1) continue;
    // The conv operand: either side of Mul and Add, the left of Div and Sub.
    Node* conv = nullptr;
    std::optional<double> k;
    for (size_t side = 0; side < 2 && !conv; ++side) {
      if (side == 1 && (div || sub)) break;
      k = scalar_constant(g, op.inputs[1 - side]);
      if (k) conv = sole_constant_conv(g, scan.uses, scan.producers, scan.removed, op.inputs[side], i);
    }
    if (!conv || !std::isfinite(*k) || (div && *k == 0.0)) continue;
    const std::string conv_value = conv->outputs[0];
    const Tensor& w = g.initializers.at(conv->inputs[1]);
    const int64_t m = w.dim(0), per_channel = w.numel() / std::max<int64_t>(m, 1);
    std::vector<double> bias(size_t(m), 0.0);
    if (conv->inputs.size() > 2 && !conv->inputs[2].empty()) bias = *constant_doubles(g, conv->inputs[2], m);
    const double scale = mul ? *k : div ? 1.0 / *k : 1.0, shift = add ? *k : sub ? -*k : 0.0;
    if (scale != 1.0) {
      Tensor new_w = Tensor::empty(DType::kFloat32, w.shape());
      const float* pw = w.data<float>();
      float* nw = new_w.data<float>();
      for (int64_t e = 0; e < m * per_channel; ++e) nw[e] = div ? float(pw[e] / *k) : float(pw[e] * scale);
      std::string w_name = g.unique_name(conv->inputs[1] + "/scaled");
      g.initializers.emplace(w_name, std::move(new_w));
      conv->inputs[1] = w_name;
    }
    Tensor new_b = Tensor::empty(DType::kFloat32, {m});
    for (int64_t c = 0; c < m; ++c)
      new_b.data<float>()[c] = float((div ? bias[size_t(c)] / *k : bias[size_t(c)] * scale) + shift);
    std::string b_name = g.unique_name((op.name.empty() ? conv->inputs[1] : op.name) + "/folded_bias");
    g.initializers.emplace(b_name, std::move(new_b));
    conv->inputs.resize(3);
    conv->inputs[2] = b_name;
    conv->outputs[0] = op.outputs[0];
    scan.producers[op.outputs[0]] = scan.producers.at(conv_value);  // a second scalar op may fold in next
    scan.removed[i] = 1;
    ++scan.rewrites;
  }
  return scan.finish();
}

// hard-swish written out after a Conv becomes the Conv's activation (onnxtrain.FusedConv,
// activation HardSwish: one oneDNN post-op instead of four passes). Either form exporters emit:
//   y * Clip(y + 3, 0, 6) / 6   (or * (1/6)),      y * HardSigmoid(y; alpha 1/6, beta 1/2).
int fuse_conv_hard_swish(Graph& g) {
  if (!FUSED_OP_BUILT("FusedConv")) return 0;
  FusionScan scan(g);
  auto reader = [&](const std::string& v) { return scan.uses.sole_reader(v); };
  for (size_t c = 0; c < g.nodes.size(); ++c) {
    Node& conv = g.nodes[c];
    if (scan.removed[c] || !is_op(conv, "Conv") || conv.outputs.size() != 1) continue;
    const std::string y = conv.outputs[0];
    auto readers = scan.uses.readers.find(y);
    if (readers == scan.uses.readers.end() || readers->second.size() != 2 || g.is_output(y)) continue;
    // The gate (Add -> Clip, or HardSigmoid) and the product y * gate, in either order.
    std::vector<size_t> chain;
    std::string gate;
    size_t product = 0;
    for (size_t r : readers->second) {
      const Node& n = g.nodes[r];
      if (is_op(n, "Mul") && !other_operand(n, y).empty() && other_operand(n, y) != y) {
        product = r;
        continue;
      }
      if (is_op(n, "HardSigmoid") && std::fabs(n.attr_float("alpha", 0.2f) - 1 / 6.0) < 1e-5 &&
          std::fabs(n.attr_float("beta", 0.5f) - 0.5) < 1e-6) {
        chain = {r};
        gate = n.outputs[0];
      } else if (is_op(n, "Add") && is_scalar_constant(g, other_operand(n, y), 3.0) && reader(n.outputs[0]) >= 0) {
        const Node& clip = g.nodes[size_t(reader(n.outputs[0]))];
        float lo, hi;
        if (is_op(clip, "Clip") && clip.inputs[0] == n.outputs[0] && clip_bounds(g, clip, lo, hi) && lo == 0.0f &&
            hi == 6.0f) {
          chain = {r, size_t(reader(n.outputs[0]))};
          gate = clip.outputs[0];
        }
      }
    }
    if (gate.empty() || !product || other_operand(g.nodes[product], y) != gate || reader(gate) != int(product)) continue;
    std::string out = g.nodes[product].outputs[0];
    chain.push_back(product);
    if (g.nodes[chain[0]].op_type != "HardSigmoid") {  // the Clip form still divides by 6
      int d = reader(out);
      if (d < 0) continue;
      const Node& div = g.nodes[size_t(d)];
      bool by_six = (is_op(div, "Div") && div.inputs[0] == out && is_scalar_constant(g, div.inputs[1], 6.0)) ||
                    (is_op(div, "Mul") && is_scalar_constant(g, other_operand(div, out), 1 / 6.0));
      if (!by_six) continue;
      chain.push_back(size_t(d));
      out = div.outputs[0];
    }
    if (std::any_of(chain.begin(), chain.end(), [&](size_t k) { return scan.removed[k] != 0; })) continue;
    for (size_t k : chain) scan.removed[k] = 1;
    make_fused_conv(conv, "HardSwish");
    conv.outputs[0] = out;
    ++scan.rewrites;
  }
  return scan.finish();
}

// Conv -> Add(., Z) [-> Relu], Z of the sum's static shape (a residual connection), becomes
// onnxtrain.FusedConv with Z as its fourth input: Y = relu(conv(X) + B + Z) in one primitive (a
// oneDNN sum post-op), instead of two more passes over Y. The fused node takes the place of the last
// node it replaces, where Z is certainly computed.
int fuse_conv_residual_add(Graph& g) {
  if (!FUSED_OP_BUILT("FusedConv")) return 0;
  FusionScan scan(g);
  for (size_t a = 0; a < g.nodes.size(); ++a) {
    const Node& add = g.nodes[a];
    if (!is_op(add, "Add") || add.inputs.size() != 2 || add.inputs[0] == add.inputs[1] || scan.removed[a]) continue;
    auto out_shape = known_shape(g, add.outputs[0]);
    auto out_info = g.value_info.find(add.outputs[0]);
    if (!fully_known(out_shape) || out_info == g.value_info.end() || out_info->second.dtype != DType::kFloat32) continue;
    for (size_t side = 0; side < 2; ++side) {
      const std::string &y = add.inputs[side], &z = add.inputs[1 - side];
      auto zs = known_shape(g, z), ys = known_shape(g, y);
      if (!zs || *zs != *out_shape || !ys || *ys != *out_shape) continue;
      Node* conv = sole_constant_conv(g, scan.uses, scan.producers, scan.removed, y, a);
      if (!conv || conv->has_attr("activation")) continue;
      size_t conv_index = scan.producers.at(y), last = a;
      std::string out = add.outputs[0];
      int r = scan.uses.sole_reader(out);
      std::string activation;
      if (r >= 0 && is_op(g.nodes[size_t(r)], "Relu") && !scan.removed[size_t(r)]) {
        activation = "Relu";
        last = size_t(r);
        out = g.nodes[last].outputs[0];
      }
      Node f = *conv;
      make_fused_conv(f, activation);
      f.name = conv->name + "/residual";
      f.inputs.resize(3);  // X, W, B (empty: none), Z
      f.inputs.push_back(z);
      f.outputs = {out};
      scan.removed[conv_index] = scan.removed[a] = 1;
      g.nodes[last] = std::move(f);
      scan.removed[last] = 0;
      ++scan.rewrites;
      break;
    }
  }
  return scan.finish();
}

// Conv -> Relu / LeakyRelu / Sigmoid / Tanh / Clip (constant bounds) becomes onnxtrain.FusedConv
// with the activation applied inside the convolution (oneDNN: a post-op): one pass over the output instead of two.
int fuse_conv_activation(Graph& g) {
  if (!FUSED_OP_BUILT("FusedConv")) return 0;
  FusionScan scan(g);
  for (size_t a = 0; a < g.nodes.size(); ++a) {
    const Node& act = g.nodes[a];
    if (!act.domain.empty() || act.inputs.empty()) continue;
    std::vector<float> params;
    if (act.op_type == "LeakyRelu") {
      params = {act.attr_float("alpha", 0.01f)};
    } else if (act.op_type == "Clip") {
      float lo, hi;
      if (!clip_bounds(g, act, lo, hi)) continue;
      params = {lo, hi};
    } else if (act.op_type != "Relu" && act.op_type != "Sigmoid" && act.op_type != "Tanh") {
      continue;
    }
    Node* producer = sole_feeding_conv(g, scan.uses, scan.producers, scan.removed, a);
    if (!producer) continue;
    Node& conv = *producer;
    make_fused_conv(conv, act.op_type);
    if (!params.empty()) conv.attributes["activation_params"] = Attribute::of(params);
    conv.outputs[0] = act.outputs[0];
    scan.removed[a] = 1;
    ++scan.rewrites;
  }
  return scan.finish();
}

namespace {

// Ops that compute each output element from the same element of every input (plus scalars), so
// they run unchanged on values stored in any order, as long as all their full-size operands and
// their output share it.
bool is_layout_agnostic_elementwise(const Node& n) {
  static const std::unordered_set<std::string> ops = {
      "Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Elu", "Neg", "Abs",
      "Add", "Sub", "Mul", "Div", "Max", "Min", "Sum"};
  return n.domain.empty() && n.outputs.size() == 1 && !n.inputs.empty() && ops.count(n.op_type);
}

// A pool that has a channels-last form (onnxtrain.ChannelsLastPool): MaxPool without Indices,
// AveragePool and the global average / max pools, of a rank >= 3 fp32 input of known shape; the
// windowed ones with explicit pads (or none), no ceil mode and no window wholly in the padding, the
// geometry the backend's pooling computes in any layout. Returns the ChannelsLastPool mode, or "".
std::string channels_last_pool_mode(const Graph& g, const Node& n) {
  if (!n.domain.empty() || n.inputs.size() != 1 || n.outputs.empty() || !FUSED_OP_BUILT("ChannelsLastPool")) return "";
  auto vi = g.value_info.find(n.inputs[0]);
  auto s = known_shape(g, n.inputs[0]);
  if (vi == g.value_info.end() || vi->second.dtype != DType::kFloat32 || !known_but_batch(s) || s->size() < 3) return "";
  if (n.op_type == "GlobalAveragePool") return "global_average";
  if (n.op_type == "GlobalMaxPool") return "global_max";
  bool max = n.op_type == "MaxPool";
  if (!max && n.op_type != "AveragePool") return "";
  if (max && n.outputs.size() > 1 && !n.outputs[1].empty()) return "";  // Indices count in ONNX order
  std::string auto_pad = n.attr_string("auto_pad", "NOTSET");
  if ((auto_pad != "NOTSET" && auto_pad != "VALID") || n.attr_int("ceil_mode", 0) != 0 || !n.has_attr("kernel_shape"))
    return "";
  std::vector<int64_t> kernel = n.attr_ints("kernel_shape");
  size_t nd = s->size() - 2;
  std::vector<int64_t> pads = auto_pad == "VALID" ? std::vector<int64_t>(2 * nd, 0) : n.attr_ints("pads", std::vector<int64_t>(2 * nd, 0));
  std::vector<int64_t> dil = n.attr_ints("dilations", std::vector<int64_t>(nd, 1));
  if (kernel.size() != nd || pads.size() != 2 * nd || dil.size() != nd) return "";
  for (size_t i = 0; i < nd; ++i) {
    int64_t extent = (kernel[i] - 1) * dil[i] + 1;
    if (pads[i] >= extent || pads[i + nd] >= extent) return "";
  }
  return max ? "max" : "average";
}

}  // namespace

// Values between layout-aware nodes stay channels last ([N, spatial..., C] order for an
// [N, C, spatial...] value), the order oneDNN's fp32 convolutions compute in: fp32 Conv / FusedConv
// with constant weights read and write them so (input_channels_last / output_channels_last; a Conv
// becomes a FusedConv without activation), and same-shape elementwise ops between them (residual
// Adds, activations, Max) need no change at all. What remains is the set of values whose every
// producer and reader is one of those nodes: a value read by anything else (a pooling, a reshape,
// a broadcast, a graph output, a subgraph) stays in ONNX's order, and with it every value tied to
// it through an elementwise op. Each value kept channels last saves a reorder out of one
// convolution and one into the next.
int keep_channels_last(Graph& g) {
  if (!FUSED_OP_BUILT("FusedConv")) return 0;  // a minimal build without it runs the plain Conv
  auto fp32_conv = [&](const Node& n) {
    bool conv = (n.op_type == "FusedConv" && n.domain == kOnnxTrainDomain) || is_op(n, "Conv");
    if (!conv || n.inputs.size() < 2 || n.outputs.size() != 1) return false;
    auto w = g.initializers.find(n.inputs[1]);
    return w != g.initializers.end() && w->second.dtype() == DType::kFloat32 && w->second.rank() >= 3;
  };
  // Candidates: rank >= 3 fp32 outputs of convolutions and elementwise ops, not graph outputs.
  std::unordered_set<std::string> kept;
  std::vector<std::string> pool_mode(g.nodes.size());
  if (FUSED_OP_BUILT("ChannelsLastPool"))  // else pools are ordinary readers: their values stay in ONNX order
    for (size_t i = 0; i < g.nodes.size(); ++i) pool_mode[i] = channels_last_pool_mode(g, g.nodes[i]);
  auto windowed = [](const std::string& mode) { return mode == "max" || mode == "average"; };
  auto unit_spatial = [&](const std::string& value) {
    auto s = known_shape(g, value);
    return s && s->size() >= 3 && std::all_of(s->begin() + 2, s->end(), [](int64_t d) { return d == 1; });
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (!fp32_conv(n) && !is_layout_agnostic_elementwise(n) && !windowed(pool_mode[i])) continue;
    auto s = known_shape(g, n.outputs[0]);
    auto vi = g.value_info.find(n.outputs[0]);
    bool fp32 = vi != g.value_info.end() && vi->second.dtype == DType::kFloat32;
    if (fp32 && s && s->size() >= 3 && !g.is_output(n.outputs[0])) kept.insert(n.outputs[0]);
  }
  auto drop_all = [&](const std::vector<std::string>& values) {
    bool changed = false;
    for (const auto& v : values) changed = kept.erase(v) > 0 || changed;
    return changed;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const Node& n = g.nodes[i];
      // A windowed pool keeps X's layout for Y; a global one (or a window covering X) reads X in
      // either and writes [N, C, 1...], the same bytes in both orders (Y stays a plain value).
      if (windowed(pool_mode[i]) && !unit_spatial(n.outputs[0])) {
        if (kept.count(n.inputs[0]) != kept.count(n.outputs[0])) changed = drop_all({n.inputs[0], n.outputs[0]}) || changed;
        changed = drop_all({n.outputs.begin() + 1, n.outputs.end()}) || changed;
        continue;
      }
      if (!pool_mode[i].empty()) {
        changed = drop_all(n.outputs) || changed;
        continue;
      }
      if (fp32_conv(n)) {  // X may be channels last; a summand Z shares Y's layout; W, B never
        changed = drop_all({n.inputs.begin() + 1, n.inputs.begin() + std::min<size_t>(n.inputs.size(), 3)}) || changed;
        if (n.inputs.size() > 3 && !n.inputs[3].empty() && kept.count(n.inputs[3]) != kept.count(n.outputs[0]))
          changed = drop_all({n.inputs[3], n.outputs[0]}) || changed;
        continue;
      }
      if (!is_layout_agnostic_elementwise(n)) {
        changed = drop_all(n.inputs) || changed;
        changed = drop_all(n.outputs) || changed;
        if (has_subgraphs(n)) changed = drop_all(outer_scope_reads(n)) || changed;
        continue;
      }
      // Elementwise: every operand of the output's full shape, and the output, share one layout;
      // the others must be single elements (a broadcast of anything larger reads by position).
      // An unknown batch dim is no obstacle (known_but_batch); an unknown spatial one is.
      auto out_shape = known_shape(g, n.outputs[0]);
      std::vector<std::string> tied = {n.outputs[0]};
      bool agnostic = known_but_batch(out_shape);
      for (const auto& in : n.inputs) {
        if (in.empty()) continue;
        auto s = known_shape(g, in);
        if (agnostic && s && *s == *out_shape) tied.push_back(in);
        else if (!(s && fully_known(s) && numel(*s) == 1)) agnostic = false;
      }
      if (!agnostic) {
        changed = drop_all(n.inputs) || changed;
        changed = drop_all(n.outputs) || changed;
        continue;
      }
      bool all_kept = std::all_of(tied.begin(), tied.end(), [&](const std::string& v) { return kept.count(v) > 0; });
      if (!all_kept) changed = drop_all(tied) || changed;
    }
  }
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    if (!pool_mode[i].empty() && kept.count(n.inputs[0])) {
      n.domain = kOnnxTrainDomain;
      n.op_type = "ChannelsLastPool";
      n.attributes["mode"] = Attribute::of(pool_mode[i]);
      n.outputs.resize(1);
      continue;
    }
    if (!fp32_conv(n)) continue;
    bool x_last = kept.count(n.inputs[0]) > 0, y_last = kept.count(n.outputs[0]) > 0;
    if (!x_last && !y_last) continue;
    make_fused_conv(n, "");
    if (x_last) n.attributes["input_channels_last"] = Attribute::of(int64_t(1));
    if (y_last) n.attributes["output_channels_last"] = Attribute::of(int64_t(1));
  }
  return int(kept.size());
}

}  // namespace onnxtrain

namespace onnxtrain {

namespace {

// Whether a Reshape of `logits` (rank `rank`, last dim `classes`) to 2-D keeps the last dim: its
// shape is a constant ending in `classes`, or (an export with symbolic dims) a Concat whose last
// element is Unsqueeze(Gather(Shape(logits), rank - 1 or -1)). In that second form the nodes that
// read the logits' shape are appended to `chain` (they go with the Reshape); any other reader of
// the logits fails the match.
bool reshape_keeps_classes(const Graph& g, const FusionScan& scan, const Node& reshape, const std::string& logits,
                           int64_t rank, int64_t classes, std::vector<size_t>& chain) {
  const Tensor* fixed = constant_tensor(g, reshape.inputs[1]);
  if (fixed) {
    const std::vector<int64_t> dims = fixed->to_int_vector();
    return dims.size() == 2 && dims[1] == classes;
  }
  auto producer = [&](const std::string& v, const char* op, int reader) -> std::optional<size_t> {
    auto it = scan.producers.find(v);
    if (it == scan.producers.end() || scan.removed[it->second] || !is_op(g.nodes[it->second], op) ||
        scan.uses.sole_reader(v) != reader)
      return std::nullopt;
    return it->second;
  };
  const auto it_reshape = scan.producers.find(reshape.outputs[0]);
  if (it_reshape == scan.producers.end()) return false;
  const auto concat = producer(reshape.inputs[1], "Concat", int(it_reshape->second));
  if (!concat || g.nodes[*concat].attr_int("axis", 0) != 0) return false;
  const std::string last = g.nodes[*concat].inputs.back();
  if (const Tensor* c = constant_tensor(g, last)) return c->numel() == 1 && c->item_as_int() == classes;
  const auto unsqueeze = producer(last, "Unsqueeze", int(*concat));
  if (!unsqueeze) return false;
  const auto gather = producer(g.nodes[*unsqueeze].inputs[0], "Gather", int(*unsqueeze));
  if (!gather || g.nodes[*gather].attr_int("axis", 0) != 0) return false;
  const Tensor* index = constant_tensor(g, g.nodes[*gather].inputs[1]);
  if (!index || index->numel() != 1 || (index->item_as_int() != rank - 1 && index->item_as_int() != -1)) return false;
  const auto shape = producer(g.nodes[*gather].inputs[0], "Shape", int(*gather));
  const Node* shape_node = shape ? &g.nodes[*shape] : nullptr;
  if (!shape_node || shape_node->inputs[0] != logits || shape_node->has_attr("start") || shape_node->has_attr("end")) return false;
  // The logits are read by the Reshape and this Shape only.
  auto readers = scan.uses.readers.find(logits);
  if (readers == scan.uses.readers.end() || readers->second.size() != 2 || scan.uses.graph_outputs.count(logits)) return false;
  chain.insert(chain.end(), {*concat, *unsqueeze, *gather, *shape});
  return true;
}

}  // namespace

// logits = A op(B) (+ bias) -> [Reshape to [rows, C] | Transpose [B, S, C] -> [B, C, S]] ->
// SoftmaxCrossEntropyLoss (mean or sum, no class weights, log_prob unread) -> one
// onnxtrain.LinearSoftmaxCrossEntropy (src/ops/loss/linear_cross_entropy.cc), when the logits and
// the layout op have the loss as their only reader. Both layouts keep A's row order: a Reshape to
// [*, C] of [..., C] flattens the leading dims row-major, and [B, C, S]'s targets [B, S] are
// A's rows in order. The unit-gradient outputs are named; drop_unread_unit_gradients clears those
// the gradient graph does not read.
int fuse_linear_cross_entropy(Graph& g) {
  if (!FUSED_OP_BUILT("LinearSoftmaxCrossEntropy")) return 0;
  FusionScan scan(g);
  for (size_t s = 0; s < g.nodes.size(); ++s) {
    const Node& sce = g.nodes[s];
    const bool sce_op = sce.op_type == "SoftmaxCrossEntropyLoss" && (sce.domain.empty() || sce.domain == kOnnxTrainDomain);
    if (!sce_op || sce.inputs.size() != 2 || sce.has_output(1) || sce.attr_string("reduction", "mean") == "none") continue;
    // The layout op between the product and the loss, if any.
    std::string logits = sce.inputs[0];
    std::vector<size_t> absorbed{s};
    auto p = scan.producers.find(logits);
    if (p == scan.producers.end() || scan.removed[p->second] || scan.uses.sole_reader(logits) != int(s)) continue;
    const auto scores = known_shape(g, logits);
    if (!scores || scores->size() < 2) continue;
    const Node* layout = &g.nodes[p->second];
    if (is_op(*layout, "Reshape") || is_op(*layout, "Transpose")) {
      const auto from = known_shape(g, layout->inputs[0]);
      if (!from || from->size() < 2 || from->back() <= 0) continue;
      const int64_t classes = from->back();
      std::vector<size_t> shape_chain;  // the nodes reading the logits' shape for the Reshape
      const bool rows_kept =
          is_op(*layout, "Reshape")
              ? scores->size() == 2 && ((*scores)[1] == classes ||
                                        reshape_keeps_classes(g, scan, *layout, layout->inputs[0], int64_t(from->size()),
                                                              classes, shape_chain))
              : from->size() == 3 && layout->has_attr("perm") && layout->attr_ints("perm") == std::vector<int64_t>{0, 2, 1};
      if (!rows_kept) continue;
      const size_t layout_index = p->second;
      logits = layout->inputs[0];
      p = scan.producers.find(logits);
      const bool sole = shape_chain.empty() ? scan.uses.sole_reader(logits) == int(layout_index)
                                            : !scan.uses.graph_outputs.count(logits);  // checked with the chain
      if (p == scan.producers.end() || scan.removed[p->second] || !sole) continue;
      absorbed.push_back(layout_index);
      absorbed.insert(absorbed.end(), shape_chain.begin(), shape_chain.end());
    } else if (scores->size() != 2) {
      continue;  // [N, C, d...] scores straight from a product: not rows of A
    }
    // Before fuse_matmul: nn.Linear's bias as Add(MatMul(A, B), bias), bias [C].
    std::string bias;
    if (is_op(g.nodes[p->second], "Add")) {
      const Node& add = g.nodes[p->second];
      const size_t add_index = p->second;
      bool found = false;
      for (int k = 0; k < 2 && !found; ++k) {
        const std::string product = add.inputs[size_t(k)], other = add.inputs[size_t(1 - k)];
        auto q = scan.producers.find(product);
        const auto bs = known_shape(g, other);
        const auto ps = known_shape(g, product);
        if (q == scan.producers.end() || scan.removed[q->second] || !is_op(g.nodes[q->second], "MatMul") ||
            scan.uses.sole_reader(product) != int(add_index) || !bs || bs->size() != 1 || !ps || ps->empty() ||
            (*bs)[0] != ps->back() || (*bs)[0] <= 0)
          continue;
        bias = other;
        absorbed.push_back(add_index);
        p = q;
        found = true;
      }
      if (!found) continue;
    }
    // The product: MatMul(A, B) or FusedMatMul(A, B [, bias]) with a 2-D B, no transA, alpha 1.
    const Node& mm = g.nodes[p->second];
    const bool plain = is_op(mm, "MatMul");
    const bool fused = mm.op_type == "FusedMatMul" && mm.domain == kOnnxTrainDomain && mm.attr_int("transA", 0) == 0 &&
                       mm.attr_float("alpha", 1.0f) == 1.0f && mm.attr_int("output_dtype", 0) == 0;
    if ((!plain && !fused) || (!bias.empty() && !plain)) continue;
    const auto a_shape = known_shape(g, mm.inputs[0]);
    const auto b_shape = known_shape(g, mm.inputs[1]);
    const DType dt = known_dtype(g, mm.inputs[0]);
    if (!a_shape || a_shape->size() < 2 || !b_shape || b_shape->size() != 2 || known_dtype(g, mm.inputs[1]) != dt ||
        (dt != DType::kFloat32 && dt != DType::kFloat64))
      continue;
    const size_t mm_index = p->second;
    absorbed.push_back(mm_index);
    // nn.Linear's MatMul(A, Transpose(W)) before fuse_matmul has folded it: read W with transB.
    std::string b = mm.inputs[1];
    bool trans_b = fused && mm.attr_int("transB", 0) != 0;
    if (auto t = scan.producers.find(b); plain && t != scan.producers.end() && !scan.removed[t->second] &&
                                         is_op(g.nodes[t->second], "Transpose") &&
                                         g.nodes[t->second].attr_ints("perm") == std::vector<int64_t>{1, 0} &&
                                         scan.uses.sole_reader(b) == int(mm_index)) {
      b = g.nodes[t->second].inputs[0];
      trans_b = true;
      absorbed.push_back(t->second);
    }

    Node lce;
    lce.op_type = "LinearSoftmaxCrossEntropy";
    lce.domain = kOnnxTrainDomain;
    lce.name = sce.name + "/linear_fused";
    lce.inputs = {mm.inputs[0], b, sce.inputs[1]};
    if (mm.inputs.size() > 2 && !mm.inputs[2].empty()) lce.inputs.push_back(mm.inputs[2]);
    if (!bias.empty()) lce.inputs.push_back(bias);
    if (trans_b) lce.attributes["transB"] = Attribute::of(int64_t(1));
    lce.attributes["reduction"] = Attribute::of(sce.attr_string("reduction", "mean"));
    if (sce.has_attr("ignore_index")) lce.attributes["ignore_index"] = Attribute::of(sce.attr_int("ignore_index", 0));
    const std::string base = sce.outputs[0];
    lce.outputs = {base, base + "/dA_unit", base + "/dB_unit"};
    if (lce.inputs.size() > 3) lce.outputs.push_back(base + "/dbias_unit");
    for (size_t k : absorbed) scan.removed[k] = 1;
    g.nodes[s] = lce;  // where the loss stood: every input is defined before it
    scan.removed[s] = 0;
    ++scan.rewrites;
  }
  return scan.finish();
}

int drop_unread_unit_gradients(Graph& g) {
  std::unordered_set<std::string> read;
  for (const auto& n : g.nodes)
    for (const auto& in : n.inputs) read.insert(in);
  for (const auto& o : g.outputs) read.insert(o.name);
  int dropped = 0;
  for (auto& n : g.nodes) {
    if (n.op_type != "LinearSoftmaxCrossEntropy" || n.domain != kOnnxTrainDomain) continue;
    for (size_t i = 1; i < n.outputs.size(); ++i)
      if (!n.outputs[i].empty() && !read.count(n.outputs[i])) {
        n.outputs[i].clear();
        ++dropped;
      }
    while (n.outputs.size() > 1 && n.outputs.back().empty()) n.outputs.pop_back();
  }
  return dropped;
}

}  // namespace onnxtrain
