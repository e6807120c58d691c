#include "training/forward_backward.h"

#include <set>
#include <unordered_map>
#include <unordered_set>

#include "autodiff/autodiff.h"
#include "ops/graph_builder.h"
#include "passes/mixed_precision.h"
#include "passes/compute_optimizer.h"
#include "passes/sparsity.h"
#include "passes/passes.h"
#include "passes/shape_inference.h"
#include "training/artifacts.h"

namespace onnxtrain {

namespace {

const std::string kWhere = "build_forward_backward: ";

// torch updates running_var = m * rv + (1 - m) * var_unbiased; ONNX's r = m * rv + (1 - m) * var
// uses the population variance, and var_unbiased = var * n / (n - 1), so torch's value is
// r + (r - m * rv) / (n - 1). Returns the corrected value. n, the values per channel, is a constant
// when the input's shape is static, else read from its shape at run time (TrainModule's symbolic
// batch: it makes no symbol of a size below 2, so n > 1 there too, as torch requires).
std::string unbiased_running_var(Model& m, const Node& bn, const StateUpdate& update) {
  GraphBuilder b(m, bn.name + "/unbiased_running_var");
  const std::string& running_var = bn.inputs[size_t(update.input)];
  std::optional<Shape> x = b.static_shape(bn.inputs[0]);
  bool known = x && x->size() >= 2;
  for (size_t d = 0; known && d < x->size(); ++d) known = (*x)[d] >= 0;
  std::string inverse;  // 1 / (n - 1)
  if (known) {
    const int64_t n = numel(*x) / std::max<int64_t>((*x)[1], 1);
    OT_CHECK(n > 1, bn.context(), "expected more than 1 value per channel when training, got input shape ",
             shape_str(*x));
    inverse = b.scalar_like(1.0 / double(n - 1), running_var);
  } else {
    std::string channels = b.emit("Gather", {b.shape(bn.inputs[0]), b.constant(Tensor::scalar<int64_t>(1))});
    std::string n = b.div(b.emit("Size", {bn.inputs[0]}), channels);
    n = b.emit("Cast", {n}, {{"to", Attribute::of(int64_t(b.dtype(running_var)))}});
    inverse = b.div(b.scalar_like(1.0, running_var), b.sub(n, b.scalar_like(1.0, running_var)));
  }
  const std::string& onnx_update = bn.outputs[size_t(update.output)];
  const double momentum = bn.attr_float("momentum", 0.9f);
  std::string batch_term = b.sub(onnx_update, b.mul(running_var, b.scalar_like(momentum, running_var)));
  std::string result = b.add(onnx_update, b.mul(batch_term, inverse));
  b.commit();
  return result;
}

// Makes "<buffer>_updated" graph outputs for the state updates (BatchNorm statistics) of bound
// initializers; `unbiased` corrects running variances to torch's unbiased form.
void add_buffer_outputs(Model& m, const std::set<std::string>& bound, bool unbiased, ForwardBackwardGraphs& fb) {
  Graph& g = m.graph;
  for (BufferUpdate u : buffer_updates(m, bound)) {
    if (!bound.count(u.buffer)) continue;  // a constant of the export: nothing to write back
    if (unbiased && u.update.running_variance)
      for (size_t i = 0; i < g.nodes.size(); ++i)
        if (g.nodes[i].name == u.node) {
          const Node producer = g.nodes[i];  // a copy: the builder appends to g.nodes
          u.value = unbiased_running_var(m, producer, u.update);
          break;
        }
    std::string name = g.unique_name(u.buffer + "_updated");
    g.nodes.push_back(Node{name + "/identity", "Identity", "", {u.value}, {name}, {}});
    g.outputs.push_back({name, ValueInfo{}});
    fb.buffers.push_back(u.buffer);
    fb.buffer_outputs.push_back(name);
  }
  g.topological_sort();
}

ValueInfo info_of(const Graph& g, const std::string& name) {
  for (const auto& v : g.inputs) if (v.name == name) return v.info;
  for (const auto& v : g.outputs) if (v.name == name && v.info.dtype != DType::kUndefined) return v.info;
  if (auto it = g.value_info.find(name); it != g.value_info.end()) return it->second;
  return {};
}

// Drops graph inputs nothing reads (except `keep`), and value_info of values no longer in the graph.
void prune(Graph& g, const std::unordered_set<std::string>& keep) {
  eliminate_dead_code(g);
  std::unordered_set<std::string> read, present;
  for (const auto& n : g.nodes) {
    for (const auto& i : n.inputs) read.insert(i);
    for (const auto& o : n.outputs) present.insert(o);
  }
  for (const auto& o : g.outputs) read.insert(o.name);
  std::vector<NamedValue> inputs;
  for (auto& in : g.inputs)
    if (read.count(in.name) || keep.count(in.name)) inputs.push_back(std::move(in));
  g.inputs = std::move(inputs);
  for (auto it = g.value_info.begin(); it != g.value_info.end();)
    it = present.count(it->first) ? std::next(it) : g.value_info.erase(it);
}

std::vector<std::string> feeds_of(const Graph& g, const std::vector<std::string>& host_order) {
  std::vector<std::string> out;
  for (const auto& name : host_order)
    if (g.is_input(name)) out.push_back(name);
  return out;
}

// Splits the gradient graph `full` at the upstream gradients (see the header).
void split(const Model& full, ForwardBackwardGraphs& fb) {
  const Graph& g = full.graph;
  const size_t n = g.nodes.size();

  // Nodes downstream of an upstream gradient can only run in the backward.
  std::unordered_set<std::string> seed_dependent(fb.seeds.begin(), fb.seeds.end());
  std::vector<char> after_seed(n, 0);
  for (size_t i = 0; i < n; ++i) {
    for (const auto& in : g.nodes[i].inputs) after_seed[i] = after_seed[i] || (!in.empty() && seed_dependent.count(in));
    if (after_seed[i]) seed_dependent.insert(g.nodes[i].outputs.begin(), g.nodes[i].outputs.end());
  }
  // The memory optimizer's recompute copies, and whatever reads them, run in the backward only.
  const std::unordered_set<std::string> copies(fb.memory_plan.recompute_nodes.begin(), fb.memory_plan.recompute_nodes.end());
  std::vector<char> in_backward = after_seed, is_copy(n, 0);
  std::unordered_set<std::string> copied_values;
  for (size_t i = 0; i < n; ++i) {
    bool reads_copy = copies.count(g.nodes[i].name) > 0;
    for (const auto& in : g.nodes[i].inputs) reads_copy = reads_copy || (!in.empty() && copied_values.count(in));
    if (!reads_copy) continue;
    in_backward[i] = is_copy[i] = 1;
    copied_values.insert(g.nodes[i].outputs.begin(), g.nodes[i].outputs.end());
  }

  // What the backward reads and does not compute: saved forward values, or host feeds.
  std::unordered_set<std::string> computed_in_backward, saved_set;
  for (size_t i = 0; i < n; ++i)
    if (in_backward[i]) computed_in_backward.insert(g.nodes[i].outputs.begin(), g.nodes[i].outputs.end());
  auto need = [&](const std::string& v) {
    if (v.empty() || computed_in_backward.count(v) || g.is_initializer(v) || g.is_input(v)) return;
    if (saved_set.insert(v).second) fb.saved.push_back(v);
  };
  for (size_t i = 0; i < n; ++i)
    if (in_backward[i])
      for (const auto& in : g.nodes[i].inputs) need(in);
  for (const auto& grad : fb.gradients) need(grad);

  std::unordered_set<std::string> seeds(fb.seeds.begin(), fb.seeds.end());
  Model backward = full;
  Graph& bg = backward.graph;
  backward.description = full.description + " (backward)";
  bg.nodes.clear();
  for (size_t i = 0; i < n; ++i)
    if (in_backward[i]) bg.nodes.push_back(g.nodes[i]);
  bg.inputs.clear();
  for (const auto& s : fb.seeds) bg.inputs.push_back({s, info_of(g, s)});
  for (const auto& s : fb.saved) bg.inputs.push_back({s, info_of(g, s)});
  for (const auto& in : g.inputs)
    if (!seeds.count(in.name)) bg.inputs.push_back(in);
  bg.outputs.clear();
  for (const auto& grad : fb.gradients) bg.outputs.push_back({grad, info_of(g, grad)});
  std::unordered_set<std::string> keep(fb.seeds.begin(), fb.seeds.end());
  keep.insert(fb.saved.begin(), fb.saved.end());
  prune(bg, keep);

  Model forward = full;
  Graph& fg = forward.graph;
  forward.description = full.description + " (forward)";
  fg.nodes.clear();
  for (size_t i = 0; i < n; ++i)
    if (!after_seed[i] && !is_copy[i]) fg.nodes.push_back(g.nodes[i]);
  fg.inputs.clear();
  for (const auto& in : g.inputs)
    if (!seeds.count(in.name)) fg.inputs.push_back(in);
  fg.outputs.clear();
  // The model's outputs as they are (one value may be returned twice), then the rest once each.
  std::unordered_set<std::string> listed(fb.outputs.begin(), fb.outputs.end());
  for (const auto& v : fb.outputs) fg.outputs.push_back({v, info_of(g, v)});
  for (const auto* names : {&fb.buffer_outputs, &fb.saved})
    for (const auto& v : *names)
      if (listed.insert(v).second) fg.outputs.push_back({v, info_of(g, v)});
  prune(fg, {});

  fb.forward = std::move(forward);
  fb.backward = std::move(backward);
}

// Labels first (their row gather may reach the positions the compute optimizer takes), padding
// last (so a head on token 0 still runs on those rows only, not on every kept token).
// Returns how many losses the label pass rewrote.
int optimize_rows(Model& m, const ForwardBackwardOptions& o) {
  const int kept_label_losses = o.label_sparsity ? compute_kept_labels_only(m) : 0;
  if (o.compute_optimizer) move_selections_upstream(m);
  strip_padding(m, o.padding_index);
  return kept_label_losses;
}

}  // namespace

ForwardBackwardGraphs build_forward_backward(const Model& model, const ForwardBackwardOptions& o) {
  ForwardBackwardGraphs fb;
  Model m = model;
  Graph& g = m.graph;
  const std::vector<CheckpointRegion> checkpoints = take_checkpoint_regions(g);  // TrainModule's marks
  g.topological_sort();
  infer_shapes(g, m.opsets);
  for (const auto& in : g.inputs) fb.inputs.push_back(in.name);
  for (const auto& out : g.outputs) fb.outputs.push_back(out.name);

  std::set<std::string> bound;
  for (const auto& name : o.bind) {
    OT_CHECK(g.is_initializer(name) || g.is_input(name), kWhere, "'", name,
             "' is neither an initializer nor an input of the model");
    OT_CHECK(bound.insert(name).second, kWhere, "'", name, "' is bound twice");
  }
  add_buffer_outputs(m, bound, o.unbiased_running_var, fb);
  for (const auto& name : o.bind) {  // host-owned values become inputs, fed without copies
    if (!g.is_initializer(name)) continue;  // an input already (initializers_as_inputs)
    const Tensor& t = g.initializers.at(name);
    g.inputs.push_back({name, ValueInfo{t.dtype(), t.shape(), {}}});
    g.initializers.erase(name);
    fb.inputs.push_back(name);
  }
  std::set<std::string> feedable(fb.inputs.begin(), fb.inputs.end());
  for (const auto& w : o.wrt)
    OT_CHECK(feedable.count(w), kWhere, "'", w, "' to differentiate is neither a model input nor a bound initializer");

  const DType low = mixed_precision_dtype(o.mixed_precision);
  if (o.wrt.empty()) {
    fb.kept_label_losses = optimize_rows(m, o);
    if (low != DType::kUndefined) {
      fuse_for_training(m);
      convert_to_mixed_precision(m, low);
    }
    if (o.optimize) optimize_for_inference(m);
    if (low != DType::kUndefined) fold_casts_into_gemms(m);
    m.description += " (forward)";
    prune(g, {});
    fb.forward = std::move(m);
    fb.forward_feeds = feeds_of(fb.forward.graph, fb.inputs);
    return fb;
  }

  // Simplify, then fuse GELU and MatMul with transposes and bias, whose fused gradient rules beat
  // differentiating the pieces. Inference-only fusions (FusedConv, no gradient) wait until the
  // whole graph is built.
  if (o.optimize) simplify_graph(m);
  // The row passes, then the output layer and its loss in one op (fp32: under mixed precision the
  // head's GEMM is bf16), as generate_artifacts orders them: the label pass gathers the kept rows
  // above the head (and the last block's row-wise ops), and the fused op then runs on those rows.
  fb.kept_label_losses = optimize_rows(m, o);
  if (low == DType::kUndefined) {
    infer_shapes(g, m.opsets);  // the fusion checks operand shapes
    if (fuse_linear_cross_entropy(g)) m.opsets.emplace(kOnnxTrainDomain, 1);
  }
  fuse_for_training(m);
  if (low != DType::kUndefined) convert_to_mixed_precision(m, low);  // host values stay fp32 inputs
  GradientGraphInfo info;
  GradientGraphOptions go;
  go.seed_scalars_with_one = false;  // the host passes every upstream gradient, a loss's too
  go.skip_independent_outputs = true;
  Model full = build_gradient_graph(m, o.wrt, fb.outputs, &info, go);
  fb.seeded_outputs = info.seeded_outputs;
  fb.seeds = info.seed_inputs;
  fb.gradients = info.gradient_outputs;
  drop_unread_unit_gradients(full.graph);
  if (o.optimize) optimize_for_inference(full);
  if (low != DType::kUndefined) fold_casts_into_gemms(full);
  full.graph.topological_sort();
  if (o.memory.level != 0 || !o.memory.config.empty() || !checkpoints.empty()) {
    std::vector<std::string> forward_outputs = fb.outputs;
    forward_outputs.insert(forward_outputs.end(), fb.buffer_outputs.begin(), fb.buffer_outputs.end());
    fb.memory_plan = optimize_memory(full, forward_outputs, o.memory, {}, checkpoints);
  }
  split(full, fb);
  fb.forward_feeds = feeds_of(fb.forward.graph, fb.inputs);
  fb.backward_feeds = feeds_of(fb.backward.graph, fb.inputs);
  return fb;
}

int64_t saved_bytes(const ForwardBackwardGraphs& graphs) {
  static const std::set<std::string> kViews = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"};
  const Graph& g = graphs.forward.graph;
  const auto producer = g.producers();
  auto buffer_of = [&](std::string v) {
    for (auto it = producer.find(v); it != producer.end(); it = producer.find(v)) {
      const Node& n = g.nodes[it->second];
      if (!n.domain.empty() || !kViews.count(n.op_type) || n.inputs.empty()) break;
      v = n.inputs[0];
    }
    return v;
  };
  std::set<std::string> saved(graphs.saved.begin(), graphs.saved.end()), buffers;
  int64_t bytes = 0;
  for (const auto& out : g.outputs)
    if (saved.erase(out.name) && out.info.has_static_shape() && out.info.dtype != DType::kUndefined &&
        buffers.insert(buffer_of(out.name)).second)
      bytes += numel(*out.info.shape) * int64_t(dtype_size(out.info.dtype));
  return bytes;
}

}  // namespace onnxtrain
