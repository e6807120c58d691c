#include "passes/passes.h"

#include <set>
#include <unordered_map>
#include <unordered_set>

#include "ir/subgraph.h"
#include "ops/kernel.h"
#include "ops/registry.h"
#include "passes/shape_inference.h"

namespace onnxtrain {

void replace_uses(Graph& graph, const std::string& from, const std::string& to) {
  for (auto& node : graph.nodes) {
    for (auto& in : node.inputs)
      if (in == from) in = to;
    if (has_subgraphs(node)) rename_outer_reads(node, from, to);
  }
}

namespace {
const ValueInfo* static_info(const Graph& g, const std::string& value) {
  auto it = g.value_info.find(value);
  if (it != g.value_info.end()) return &it->second;
  for (const auto& in : g.inputs)
    if (in.name == value) return &in.info;
  return nullptr;
}
}  // namespace

namespace {
// An If whose condition is a constant is replaced by the nodes of the branch it takes (their values
// renamed apart from the graph's), then Identity nodes onto the If's outputs.
int inline_constant_ifs(Graph& g) {
  std::unordered_set<std::string> names;
  for (const auto& [name, t] : g.initializers) names.insert(name);
  for (const auto& in : g.inputs) names.insert(in.name);
  for (const auto& n : g.nodes) {
    names.insert(n.name);
    for (const auto& o : n.outputs) names.insert(o);
  }
  auto fresh = [&](const std::string& base) {
    std::string n = base;
    for (int i = 1; names.count(n); ++i) n = base + "_" + std::to_string(i);
    names.insert(n);
    return n;
  };
  int inlined = 0;
  std::vector<Node> nodes;
  for (const auto& node : g.nodes) {
    const Tensor* cond = node.domain.empty() && node.op_type == "If" && node.has_input(0) &&
                                 g.is_initializer(node.inputs[0]) ? &g.initializers.at(node.inputs[0]) : nullptr;
    const Attribute* a = cond && cond->numel() == 1
                             ? node.attr(cond->item_as_double(0) != 0 ? "then_branch" : "else_branch") : nullptr;
    if (!a || a->kind != Attribute::Kind::kGraph || !a->g || !a->g->inputs.empty() ||
        a->g->outputs.size() != node.outputs.size()) {
      nodes.push_back(node);
      continue;
    }
    const Graph& branch = *a->g;
    std::map<std::string, std::string> rename;
    for (const auto& [name, t] : branch.initializers) {
      rename[name] = fresh(node.name + "/" + name);
      g.initializers[rename[name]] = t;
    }
    for (const auto& n : branch.nodes)
      for (const auto& o : n.outputs)
        if (!o.empty()) rename[o] = fresh(node.name + "/" + o);
    auto mapped = [&](const std::string& v) {
      auto it = rename.find(v);
      return it == rename.end() ? v : it->second;
    };
    for (const auto& bn : branch.nodes) {
      Node c = bn;
      c.name = fresh(node.name + "/" + (bn.name.empty() ? bn.op_type : bn.name));
      for (auto& v : c.inputs) v = mapped(v);
      for (auto& v : c.outputs) v = mapped(v);
      if (has_subgraphs(c))
        for (const auto& [from, to] : rename) rename_outer_reads(c, from, to);
      nodes.push_back(std::move(c));
    }
    for (size_t i = 0; i < node.outputs.size(); ++i)
      if (node.has_output(i))
        nodes.push_back(Node{fresh(node.name + "/output"), "Identity", "", {mapped(branch.outputs[i].name)},
                             {node.outputs[i]}, {}});
    ++inlined;
  }
  g.nodes = std::move(nodes);
  return inlined;
}
}  // namespace

namespace {

// Nodes of `g` that read only constants become initializers; the model gives the opsets. With
// `static_shapes`, a node that reads only an input's shape folds when the shape is static (the
// top-level graph, whose value_info shape inference has just written).
int fold_graph_constants(Graph& g, const Model& model, bool static_shapes) {
  int folded = 0;
  std::vector<Node> kept;
  for (auto& node : g.nodes) {
    int64_t opset = model.opset(node.domain);
    const OpSchema* schema = OpRegistry::global().find(node.domain, node.op_type, opset);
    bool foldable = schema && schema->cpu && !is_nondeterministic(node) && !node.outputs.empty();
    for (const auto& [k, a] : node.attributes)
      if (a.kind == Attribute::Kind::kGraph) foldable = false;
    std::vector<Tensor> inputs;
    for (size_t i = 0; foldable && i < node.inputs.size(); ++i) {
      const std::string& in = node.inputs[i];
      if (in.empty()) { inputs.emplace_back(); continue; }
      if (g.is_initializer(in)) { inputs.push_back(g.initializers.at(in)); continue; }
      const ValueInfo* info = static_info(g, in);
      bool shape_only = static_shapes && node.reads_only_shape(i) && info && info->has_static_shape();
      if (shape_only) {  // only the shape is read: a data-less tensor of that shape will do
        DType dt = info->dtype == DType::kUndefined ? DType::kFloat32 : info->dtype;
        inputs.push_back(Tensor::borrow(dt, *info->shape, nullptr));
        continue;
      }
      foldable = false;
    }
    if (foldable) {
      try {
        auto results = run_node_once(node, opset, inputs);
        bool ok = results.size() >= node.outputs.size();
        for (size_t i = 0; ok && i < node.outputs.size(); ++i)
          ok = node.outputs[i].empty() || results[i].defined();
        if (ok) {
          for (size_t i = 0; i < node.outputs.size(); ++i) {
            if (node.outputs[i].empty()) continue;
            // Views must not alias inputs that may later be dropped: own the bytes.
            g.initializers[node.outputs[i]] = results[i].clone();
            g.value_info.erase(node.outputs[i]);
          }
          ++folded;
          continue;
        }
      } catch (const Error&) {
        // Leave it to run time, where the error (if any) is reported with full context.
      }
    }
    kept.push_back(std::move(node));
  }
  g.nodes = std::move(kept);
  return folded;
}

// Subgraphs (If branches, Loop and Scan bodies), deepest first: what reads only the subgraph's own
// constants (its Constant nodes and initializers, and what folds from them) becomes an initializer
// of the subgraph, and what then goes unread is dropped. Subgraphs are shared between models, so
// a changed one is a copy. Values of the enclosing scopes stay run-time values.
int fold_subgraph_constants(Graph& g, const Model& model) {
  int folded = 0;
  for (auto& node : g.nodes)
    for (auto& [name, a] : node.attributes) {
      if (a.kind != Attribute::Kind::kGraph || !a.g) continue;
      auto copy = std::make_shared<Graph>(*a.g);
      // Shapes are not folded here: a subgraph's value_info is the exporter's word, not inferred.
      const int n = fold_subgraph_constants(*copy, model) + fold_graph_constants(*copy, model, false);
      if (n == 0) continue;
      eliminate_dead_code(*copy);
      a.g = std::move(copy);
      folded += n;
    }
  return folded;
}

}  // namespace

int fold_constants(Model& model) {
  Graph& g = model.graph;
  int folded = inline_constant_ifs(g);
  // Static shapes let Shape/Size of inputs with fixed dims fold too.
  infer_shapes(g, model.opsets);
  return folded + fold_graph_constants(g, model, true);
}

int eliminate_dead_code(Graph& g) {
  std::unordered_set<std::string> live;
  for (const auto& out : g.outputs) live.insert(out.name);
  std::vector<char> keep(g.nodes.size(), 0);
  for (size_t i = g.nodes.size(); i-- > 0;) {
    const Node& n = g.nodes[i];
    bool used = false;
    for (const auto& o : n.outputs) used = used || (!o.empty() && live.count(o));
    if (!used) continue;
    keep[i] = 1;
    for (const auto& in : n.inputs) if (!in.empty()) live.insert(in);
    for (const auto& in : outer_scope_reads(n)) live.insert(in);  // subgraphs read outer values by name
  }
  int removed = 0;
  std::vector<Node> kept;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (keep[i]) kept.push_back(std::move(g.nodes[i]));
    else ++removed;
  }
  g.nodes = std::move(kept);
  for (auto it = g.initializers.begin(); it != g.initializers.end();) {
    if (!live.count(it->first)) it = g.initializers.erase(it);
    else ++it;
  }
  return removed;
}

int eliminate_identities(Graph& g) {
  int removed = 0;
  std::vector<Node> kept;
  for (auto& node : g.nodes) {
    bool identity = node.op_type == "Identity" && node.domain.empty();
    // Inference-mode Dropout with no mask output is the identity.
    if (node.op_type == "Dropout" && node.domain.empty() && !node.has_output(1) && !node.has_input(2))
      identity = true;
    // (a node without an output is left for the op's own check to refuse)
    if (identity && node.has_input(0) && node.has_output(0) && !g.is_output(node.outputs[0])) {
      replace_uses(g, node.outputs[0], node.inputs[0]);
      ++removed;
      continue;
    }
    kept.push_back(std::move(node));
  }
  g.nodes = std::move(kept);
  return removed;
}

namespace {
std::string attribute_key(const Attribute& a) {
  std::string k = std::to_string(int(a.kind)) + ":";
  switch (a.kind) {
    case Attribute::Kind::kFloat: return k + std::to_string(a.f);
    case Attribute::Kind::kInt: return k + std::to_string(a.i);
    case Attribute::Kind::kString: return k + a.s;
    case Attribute::Kind::kInts: for (auto v : a.ints) k += std::to_string(v) + ","; return k;
    case Attribute::Kind::kFloats: for (auto v : a.floats) k += std::to_string(v) + ","; return k;
    case Attribute::Kind::kStrings: for (auto& v : a.strings) k += v + ","; return k;
    case Attribute::Kind::kTensor:
      k += std::to_string(int(a.t.dtype())) + shape_str(a.t.shape());
      k.append(static_cast<const char*>(a.t.data()), a.t.nbytes());
      return k;
    default: return "";  // graphs and tensor lists: never merged
  }
}
}  // namespace

int eliminate_common_subexpressions(Graph& g) {
  std::unordered_map<std::string, size_t> seen;  // key -> index in kept
  std::vector<Node> kept;
  int merged = 0;
  for (auto& node : g.nodes) {
    bool mergeable = !is_nondeterministic(node);
    std::string key = node.domain + "|" + node.op_type + "|";
    for (const auto& in : node.inputs) key += in + ",";
    key += "|";
    for (const auto& [name, a] : node.attributes) {
      std::string ak = attribute_key(a);
      if (ak.empty()) mergeable = false;
      key += name + "=" + ak + ";";
    }
    key += "|" + std::to_string(node.outputs.size());
    if (mergeable) {
      auto it = seen.find(key);
      if (it != seen.end()) {
        const Node& first = kept[it->second];
        bool outputs_free = true;
        for (const auto& o : node.outputs) outputs_free = outputs_free && !g.is_output(o);
        if (outputs_free) {
          for (size_t i = 0; i < node.outputs.size(); ++i)
            if (!node.outputs[i].empty()) replace_uses(g, node.outputs[i], first.outputs[i]);
          ++merged;
          continue;
        }
      }
      seen.emplace(key, kept.size());
    }
    kept.push_back(std::move(node));
  }
  g.nodes = std::move(kept);
  return merged;
}

namespace {
// Every node whose op this build knows has as many inputs and outputs as its op takes (the count
// the executor checks when it compiles), here and in its subgraphs, before any pass reads them:
// the passes index a node's first operands, and a model from a file may give fewer (found by the
// model_run fuzzer: an Identity and a MatMul without an output). Unknown ops are the executor's to
// report; subgraph nodes are checked at their graph's opsets.
void check_operand_counts(const Graph& g, const std::map<std::string, int64_t>& opsets) {
  for (const Node& node : g.nodes) {
    auto opset = opsets.find(node.domain);
    if (opset != opsets.end())
      if (const OpSchema* schema = OpRegistry::global().find(node.domain, node.op_type, opset->second)) {
        const int n_in = int(node.inputs.size()), n_out = int(node.outputs.size());
        OT_CHECK(n_in >= schema->min_inputs && n_in <= schema->max_inputs, node.context(), "takes ",
                 schema->min_inputs, " to ", schema->max_inputs, " inputs, got ", n_in);
        OT_CHECK(n_out >= schema->min_outputs && n_out <= schema->max_outputs, node.context(), "produces ",
                 schema->min_outputs, " to ", schema->max_outputs, " outputs, got ", n_out);
      }
    for (const auto& [name, attr] : node.attributes)
      if (attr.kind == Attribute::Kind::kGraph && attr.g) check_operand_counts(*attr.g, opsets);
  }
}
}  // namespace

void simplify_graph(Model& model) {
  Graph& g = model.graph;
  check_operand_counts(g, model.opsets);
  g.topological_sort();
  for (int round = 0; round < 8; ++round) {
    int changed = fold_constants(model);
    changed += eliminate_identities(g);
    changed += eliminate_common_subexpressions(g);
    changed += eliminate_dead_code(g);
    if (changed == 0) break;
  }
}

void optimize_for_inference(Model& model) {
  Graph& g = model.graph;
  simplify_graph(model);
  // Inference only: training keeps subgraphs' Constant nodes, which requires_grad="all" promotes
  // to parameters.
  fold_subgraph_constants(g, model);
  // Inference-only fusions on top of the training ones: BatchNorm folds into constant Conv weights
  // (after fold_constants made the statistics initializers), activations into the Conv primitive.
  int fused = fuse_for_training(model) + fuse_conv_batchnorm(g) + fold_conv_scalar_affine(g) +
              fuse_conv_hard_swish(g) + fuse_conv_activation(g);
  if (fused) model.opsets.emplace(kOnnxTrainDomain, 1);
  // The residual fusion and the layout pass compare operand shapes (the renamed outputs included).
  infer_shapes(g, model.opsets);
  fused += fuse_conv_residual_add(g);
  fused += keep_channels_last(g);
  if (fused) {
    model.opsets.emplace(kOnnxTrainDomain, 1);
    eliminate_dead_code(g);
  }
}

int fuse_for_training(Model& model) {
  Graph& g = model.graph;
  check_operand_counts(g, model.opsets);
  g.topological_sort();
  infer_shapes(g, model.opsets);  // fusions check operand shapes
  int fused = fuse_gelu(g) + fuse_matmul(g);
  if (fused) model.opsets.emplace(kOnnxTrainDomain, 1);
  return fused;
}

}  // namespace onnxtrain
