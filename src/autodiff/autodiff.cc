#include "autodiff/autodiff.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "ir/subgraph.h"
#include "ops/gradient_builder.h"
#include "ops/graph_builder.h"
#include "ops/registry.h"
#include "ops/subgraph.h"
#include "passes/passes.h"
#include "passes/shape_inference.h"

namespace onnxtrain {

namespace {

// Gradient contributions per value, summed on first read.
class GradientAccumulator {
 public:
  void add(const std::string& value, const std::string& grad) { parts_[value].push_back(grad); }
  bool has(const std::string& value) const { return parts_.count(value) > 0; }
  // `sequence`: the value is a sequence, whose gradients are summed element by element.
  std::string get(const std::string& value, std::vector<Node>& backward, std::unordered_set<std::string>& names,
                  bool sequence = false) {
    auto it = parts_.find(value);
    if (it == parts_.end()) return "";
    auto& parts = it->second;
    if (parts.size() > 1) {  // fan-out: d(value) = sum of every consumer's contribution
      Node sum;
      sum.op_type = sequence ? "SequenceSum" : "Sum";
      if (sequence) sum.domain = kOnnxTrainDomain;
      sum.name = unique(value + "/grad/accumulate", names);
      sum.inputs = parts;
      sum.outputs = {unique(value + "/grad/sum", names)};
      backward.push_back(sum);
      parts = {sum.outputs[0]};
    }
    return parts[0];
  }

  static std::string unique(const std::string& base, std::unordered_set<std::string>& names) {
    std::string n = base;
    for (int i = 1; names.count(n); ++i) n = base + "_" + std::to_string(i);
    names.insert(n);
    return n;
  }

 private:
  std::unordered_map<std::string, std::vector<std::string>> parts_;
};

// The gradient graph of a subgraph for control-flow rules (ops/subgraph.h): differentiated as a
// graph whose inputs are its formal inputs and the outer values it reads, then those inputs dropped
// again (the caller defines the formal inputs and seeds; outer values stay reads by name).
SubgraphGradient differentiate_subgraph(const Graph& sub, const std::vector<bool>& seeded,
                                        const std::vector<std::string>& wrt,
                                        const std::function<ValueInfo(const std::string&)>& outer_info,
                                        const std::map<std::string, int64_t>& opsets) {
  Model m;
  m.graph = sub;
  m.opsets = opsets;
  m.description = "'" + sub.name + "'";
  for (auto& in : m.graph.inputs) {  // declared subgraph shapes are often loose: keep the dtype
    in.info.shape.reset();
    in.info.dim_params.clear();
  }
  std::vector<std::string> reads = free_values(sub);
  std::unordered_set<std::string> present(reads.begin(), reads.end());
  for (const auto& in : sub.inputs) present.insert(in.name);
  for (const auto& w : wrt)
    if (!present.count(w)) reads.push_back(w);  // not read here: its gradient is 0
  for (const auto& v : reads) m.graph.inputs.push_back({v, outer_info(v)});
  std::vector<std::string> outputs;
  for (size_t i = 0; i < sub.outputs.size(); ++i)
    if (i < seeded.size() && seeded[i]) outputs.push_back(sub.outputs[i].name);
  GradientGraphOptions options;
  options.seed_scalars_with_one = false;
  options.skip_independent_outputs = true;
  GradientGraphInfo info;
  Model gm = build_gradient_graph(m, wrt, outputs, &info, options);
  SubgraphGradient out;
  out.graph = std::move(gm.graph);
  out.seeds.assign(sub.outputs.size(), "");
  for (size_t j = 0; j < info.seed_inputs.size(); ++j)
    for (size_t i = 0; i < sub.outputs.size(); ++i)
      if (i < seeded.size() && seeded[i] && sub.outputs[i].name == info.seeded_outputs[j] && out.seeds[i].empty()) {
        out.seeds[i] = info.seed_inputs[j];
        break;
      }
  out.grads = info.gradient_outputs;
  out.graph.inputs.clear();
  out.graph.outputs.clear();
  for (const auto& name : out.grads) out.graph.outputs.push_back({name, ValueInfo{}});
  eliminate_dead_code(out.graph);
  return out;
}

[[maybe_unused]] const bool kSubgraphDifferentiatorInstalled = (set_subgraph_differentiator(differentiate_subgraph), true);

// Appends the backward nodes to the forward graph. A Shape node of a forward value (sum_to's
// target shape) moves to just after that value's producer: read at its place in the backward, it
// would keep the whole activation alive through the forward only for its shape.
void append_backward(Graph& g, std::vector<Node> backward) {
  std::unordered_set<std::string> from_backward, from_forward;
  for (const auto& n : backward)
    for (const auto& o : n.outputs) from_backward.insert(o);
  for (const auto& n : g.nodes)
    for (const auto& o : n.outputs) from_forward.insert(o);
  std::unordered_map<std::string, std::vector<Node>> after;  // forward value -> Shape nodes reading it
  std::vector<Node> early;                                   // Shape nodes of graph inputs, initializers
  std::vector<Node> rest;
  for (auto& n : backward) {
    if (n.op_type == "Shape" && n.domain.empty() && n.inputs.size() == 1 && !from_backward.count(n.inputs[0])) {
      (from_forward.count(n.inputs[0]) ? after[n.inputs[0]] : early).push_back(std::move(n));
    } else {
      rest.push_back(std::move(n));
    }
  }
  std::vector<Node> nodes = std::move(early);
  for (auto& f : g.nodes) {
    std::vector<std::string> outs = f.outputs;
    nodes.push_back(std::move(f));
    for (const auto& o : outs)
      if (auto it = after.find(o); it != after.end())
        for (auto& s : it->second) nodes.push_back(std::move(s));
  }
  for (auto& n : rest) nodes.push_back(std::move(n));
  g.nodes = std::move(nodes);
}

}  // namespace

Model build_gradient_graph(const Model& forward, const std::vector<std::string>& wrt,
                           const std::vector<std::string>& outputs, GradientGraphInfo* info,
                           const GradientGraphOptions& options) {
  Model model = forward;
  Graph& g = model.graph;
  const std::string where = "build_gradient_graph(" + forward.description + "): ";
  g.topological_sort();
  infer_shapes(g, model.opsets);  // rules read operand dtypes and shapes
  if (!model.opsets.count(kOnnxTrainDomain)) model.opsets[kOnnxTrainDomain] = 1;

  std::unordered_set<std::string> names = collect_names(g);
  auto dtype_of = [&](const std::string& v) {
    if (auto it = g.initializers.find(v); it != g.initializers.end()) return it->second.dtype();
    if (auto it = g.value_info.find(v); it != g.value_info.end()) return it->second.dtype;
    for (const auto& in : g.inputs) if (in.name == v) return in.info.dtype;
    return DType::kUndefined;
  };

  // 1. Which values depend on wrt (forward pass over the graph).
  std::unordered_set<std::string> requires_grad;
  for (const auto& w : wrt) {
    OT_CHECK(g.is_initializer(w) || g.is_input(w), where, "'", w, "' is not an initializer or graph input");
    DType dt = dtype_of(w);
    OT_CHECK(is_floating(dt), where, "'", w, "' is ", dtype_name(dt),
             ": only floating-point values have gradients");
    requires_grad.insert(w);
  }
  for (const auto& node : g.nodes) {
    const OpSchema* schema = OpRegistry::global().find(node.domain, node.op_type, model.opset(node.domain));
    if (schema && schema->gradient_status == GradientStatus::kNotDifferentiable) continue;
    bool any = false;
    for (const auto& in : node.inputs) any = any || (!in.empty() && requires_grad.count(in));
    for (const auto& in : outer_scope_reads(node)) any = any || requires_grad.count(in);  // read by a subgraph
    if (!any) continue;
    for (const auto& o : node.outputs) {
      DType dt = dtype_of(o);
      if (!o.empty() && (dt == DType::kUndefined || is_floating(dt))) requires_grad.insert(o);
    }
  }

  // 2. Seeds.
  GradientAccumulator grads;
  std::vector<Node> backward;
  GradientGraphInfo result;
  {
    GraphBuilder b(model, "gradient_seed", &names, &backward);
    for (const auto& out : outputs) {
      auto producers = g.producers();
      OT_CHECK(producers.count(out) || g.is_input(out) || g.is_initializer(out), where, "output '", out,
               "' is not a value of the graph");
      if (!requires_grad.count(out) && options.skip_independent_outputs) continue;
      OT_CHECK(requires_grad.count(out), where, "output '", out, "' does not depend on any of the values to differentiate");
      auto it = g.value_info.find(out);
      bool scalar = options.seed_scalars_with_one && it != g.value_info.end() && it->second.is_tensor() &&
                    it->second.has_static_shape() && numel(*it->second.shape) == 1;
      if (scalar) {
        grads.add(out, b.emit("Expand", {b.scalar_like(1.0, out), b.shape(out)}));
      } else {
        std::string seed = GradientAccumulator::unique(out + "_grad", names);
        ValueInfo vi = it != g.value_info.end() ? it->second : ValueInfo{dtype_of(out), std::nullopt, {}};
        g.inputs.push_back({seed, vi});
        grads.add(out, seed);
        result.seed_inputs.push_back(seed);
        result.seeded_outputs.push_back(out);
      }
    }
  }

  // 3. Reverse sweep over the nodes that both depend on wrt and have a gradient flowing in.
  for (size_t k = g.nodes.size(); k-- > 0;) {
    const Node node = g.nodes[k];  // a copy: rules may add initializers and value_info to g
    std::vector<std::string> dys;
    bool any_dy = false;
    for (const auto& o : node.outputs) {
      auto info = g.value_info.find(o);
      const bool sequence = info != g.value_info.end() && info->second.kind == ValueKind::kSequence;
      std::string d = o.empty() ? "" : grads.get(o, backward, names, sequence);
      any_dy = any_dy || !d.empty();
      dys.push_back(d);
    }
    if (!any_dy) continue;
    std::vector<bool> needs;
    bool any_need = false;
    for (const auto& in : node.inputs) {
      bool n = !in.empty() && requires_grad.count(in) && is_floating(dtype_of(in) == DType::kUndefined ? DType::kFloat32 : dtype_of(in));
      needs.push_back(n);
      any_need = any_need || n;
    }
    // Values the node's subgraphs read from this graph are inputs num_inputs() + k (ops/subgraph.h).
    const std::vector<std::string> outer = outer_scope_reads(node);
    for (const auto& in : outer) {
      bool n = requires_grad.count(in) && is_floating(dtype_of(in) == DType::kUndefined ? DType::kFloat32 : dtype_of(in));
      needs.push_back(n);
      any_need = any_need || n;
    }
    if (!any_need) continue;
    const OpSchema* schema = OpRegistry::global().find(node.domain, node.op_type, model.opset(node.domain));
    if (!schema) OT_THROW(kNotImplemented, where, node.context(), "unknown op");
    switch (schema->gradient_status) {
      case GradientStatus::kDifferentiable: break;
      case GradientStatus::kNotDifferentiable: continue;
      case GradientStatus::kNotImplemented:
        OT_THROW(kNotImplemented, where, node.context(), "no gradient rule: ", schema->gradient_note);
      case GradientStatus::kUnstated:
        OT_THROW(kNotImplemented, where, node.context(), "no gradient rule");
    }
    GradientBuilder builder(g, node, model.opset(node.domain), model.opset(kOnnxDomain), dys, needs, names, backward);
    schema->gradient(builder);
    for (size_t i = 0; i < needs.size(); ++i) {
      if (!needs[i]) continue;
      auto it = builder.results().find(i);
      const std::string& input = i < node.inputs.size() ? node.inputs[i] : outer[i - node.inputs.size()];
      if (it == builder.results().end())
        OT_THROW(kRuntime, where, node.context(), "the gradient rule produced no gradient for input ", i,
                 " ('", input, "')");
      grads.add(input, it->second);
    }
  }

  // 4. Name the gradients "<wrt>_grad" and make them graph outputs. Each naming Identity goes
  // right after the node that finishes the gradient, not at the end: the executor then sees the
  // gradient final there (Executor::OutputReadyFn), and data parallelism and TrainModule's
  // memory-efficient gradients hand it over while the rest of the backward runs.
  std::vector<std::pair<size_t, Node>> namings;  // (after backward[slot - 1], the Identity)
  for (const auto& w : wrt) {
    std::string grad = grads.get(w, backward, names);
    GraphBuilder b(model, w + "/grad", &names, &backward);
    if (grad.empty()) grad = b.zeros_like(w);  // the outputs do not depend on w: its gradient is 0
    std::string out = GradientAccumulator::unique(w + "_grad", names);
    Node id;
    id.op_type = "Identity";
    id.name = out + "/identity";
    id.inputs = {grad};
    id.outputs = {out};
    size_t slot = backward.size();  // a value the forward made, or zeros just appended: at the end
    for (size_t k = backward.size(); k-- > 0;)
      if (std::find(backward[k].outputs.begin(), backward[k].outputs.end(), grad) != backward[k].outputs.end()) {
        slot = k + 1;
        break;
      }
    namings.emplace_back(slot, std::move(id));
    ValueInfo vi{dtype_of(w), std::nullopt, {}};
    if (auto it = g.initializers.find(w); it != g.initializers.end()) vi.shape = it->second.shape();
    for (const auto& in : g.inputs) if (in.name == w) vi = in.info;
    g.outputs.push_back({out, vi});
    result.gradient_outputs.push_back(out);
  }
  std::stable_sort(namings.begin(), namings.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Node> ordered;
  ordered.reserve(backward.size() + namings.size());
  auto naming = namings.begin();
  for (size_t k = 0; k <= backward.size(); ++k) {
    for (; naming != namings.end() && naming->first == k; ++naming) ordered.push_back(std::move(naming->second));
    if (k < backward.size()) ordered.push_back(std::move(backward[k]));
  }
  append_backward(g, std::move(ordered));
  if (info) *info = result;
  return model;
}

}  // namespace onnxtrain
