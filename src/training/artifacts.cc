#include "training/artifacts.h"

#include <algorithm>
#include <set>

#include "autodiff/autodiff.h"
#include "ops/graph_builder.h"
#include "ops/kernel.h"     // run_node_once: a Constant node's value
#include "ops/registry.h"
#include "passes/compute_optimizer.h"
#include "passes/mixed_precision.h"
#include "passes/passes.h"
#include "passes/shape_inference.h"
#include "passes/sparsity.h"
#include "training/json.h"

namespace onnxtrain {

namespace {

const std::string kWhere = "generate_artifacts: ";

std::string names_json(const std::vector<std::string>& names) {
  json::Value a = json::Value::array();
  for (const auto& n : names) a.push_back(json::Value::string(n));
  return json::dump(a);
}

// The model's outputs, or the named ones, feed the loss; targets become new graph inputs.
void attach_loss(Model& m, const TrainingGraphOptions& o, std::vector<std::string>& preds,
                 std::vector<std::string>& targets) {
  Graph& g = m.graph;
  preds = o.loss_input_names;
  if (preds.empty()) {
    OT_CHECK(!g.outputs.empty(), kWhere, "the model has no outputs to compute a loss from");
    preds = {g.outputs[0].name};
  }
  for (const auto& p : preds) {
    bool produced = g.is_output(p) || g.is_input(p);
    for (const auto& n : g.nodes)
      for (const auto& out : n.outputs) produced = produced || out == p;
    OT_CHECK(produced, kWhere, "loss input '", p, "' is not a value of the model");
  }
  infer_shapes(g, m.opsets);
  if (o.custom_loss) {
    // Splice the loss model in: its first inputs take the predictions, the rest become targets.
    const Graph& lg = o.custom_loss->graph;
    OT_CHECK(lg.outputs.size() == 1, kWhere, "a custom loss model has exactly one output (the loss), it has ",
             lg.outputs.size());
    OT_CHECK(lg.inputs.size() >= preds.size(), kWhere, "the custom loss model takes ", lg.inputs.size(),
             " inputs, fewer than the ", preds.size(), " predictions");
    std::map<std::string, std::string> rename;
    std::unordered_set<std::string> names = collect_names(g);
    auto fresh = [&](const std::string& base) {
      std::string n = base;
      for (int i = 1; names.count(n); ++i) n = base + "_" + std::to_string(i);
      names.insert(n);
      return n;
    };
    for (size_t i = 0; i < lg.inputs.size(); ++i) {
      if (i < preds.size()) {
        rename[lg.inputs[i].name] = preds[i];
      } else {
        std::string t = fresh(lg.inputs[i].name);
        rename[lg.inputs[i].name] = t;
        g.inputs.push_back({t, lg.inputs[i].info});
        targets.push_back(t);
      }
    }
    auto mapped = [&](const std::string& v) {
      if (v.empty()) return v;
      auto it = rename.find(v);
      if (it != rename.end()) return it->second;
      return rename[v] = (v == lg.outputs[0].name ? fresh("loss") : fresh("loss/" + v));
    };
    for (const auto& [name, t] : lg.initializers) g.initializers[mapped(name)] = t;
    for (const auto& n : lg.nodes) {
      Node c = n;
      c.name = fresh("loss/" + n.name);
      for (auto& v : c.inputs) v = mapped(v);
      for (auto& v : c.outputs) v = mapped(v);
      g.nodes.push_back(std::move(c));
    }
    for (const auto& [domain, version] : o.custom_loss->opsets)
      m.opsets[domain] = std::max(m.opsets[domain], version);
    std::string loss = mapped(lg.outputs[0].name);
    if (loss != "loss") g.nodes.push_back(Node{"loss/identity", "Identity", "", {loss}, {"loss"}, {}});
    return;
  }
  OT_CHECK(o.loss.has_value(), kWhere, "no loss given: pass a LossType or a custom loss model");
  OT_CHECK(preds.size() == 1, kWhere, loss_type_name(*o.loss), " takes one prediction, got ", preds.size());
  LossType type = *o.loss;
  DType pred_dtype = DType::kFloat32;
  std::optional<Shape> pred_shape;
  if (auto it = g.value_info.find(preds[0]); it != g.value_info.end()) {
    pred_dtype = it->second.dtype;
    pred_shape = it->second.shape;
  }
  for (const auto& out : g.outputs)
    if (out.name == preds[0] && out.info.dtype != DType::kUndefined) {
      pred_dtype = out.info.dtype;
      if (out.info.shape) pred_shape = out.info.shape;
    }
  ValueInfo target;
  if (type == LossType::kCrossEntropy || type == LossType::kNLL) {
    target.dtype = DType::kInt64;
    if (pred_shape && !pred_shape->empty()) {  // [N, C, d...] -> [N, d...]
      Shape s = *pred_shape;
      s.erase(s.begin() + (s.size() > 1 ? 1 : 0));
      target.shape = s;
    }
  } else {
    target.dtype = pred_dtype;
    target.shape = pred_shape;
  }
  std::string target_name = "target";
  for (int i = 1; g.is_input(target_name) || g.is_initializer(target_name); ++i) target_name = "target_" + std::to_string(i);
  g.inputs.push_back({target_name, target});
  targets.push_back(target_name);
  add_loss(m, type, preds[0], target_name, "loss", o.loss_options);
}

// Inputs whose values are sizes, scales or regions rather than data (never parameters).
bool shape_like_slot(const Node& consumer, size_t slot) {
  if (!consumer.domain.empty()) return false;
  if (consumer.op_type == "Resize") return slot >= 1;    // roi, scales, sizes
  if (consumer.op_type == "Upsample") return slot == 1;  // scales
  return false;
}

// A value is a parameter candidate when some node reads it as data through an op with a gradient:
// constants read only as shapes/scales or only by non-differentiable ops (comparisons, Shape, ...)
// are not.
// `graph` is the model's graph or one of its subgraphs (If branches, loop bodies), which read the
// values of the graphs around them by name.
bool read_as_data(const Model& model, const Graph& graph, const std::string& value) {
  bool data = false;
  for (const auto& n : graph.nodes) {
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (n.inputs[i] != value || shape_like_slot(n, i)) continue;
      const OpSchema* s = OpRegistry::global().find(n.domain, n.op_type, model.opset(n.domain));
      if (!s || s->gradient_status != GradientStatus::kNotDifferentiable) data = true;
    }
    for (const auto& [key, a] : n.attributes)
      if (a.kind == Attribute::Kind::kGraph && a.g) data = data || read_as_data(model, *a.g, value);
  }
  for (const auto& out : graph.outputs) data = data || out.name == value;
  return data;
}
bool read_as_data(const Model& model, const std::string& value) { return read_as_data(model, model.graph, value); }

// The value of a Constant node (any of its value_* attributes).
Tensor constant_node_value(const Model& model, const Node& n) {
  std::vector<Tensor> v = run_node_once(n, model.opset(""), {});
  return v.at(0);
}

bool is_constant_node(const Node& n) { return n.domain.empty() && n.op_type == "Constant" && n.outputs.size() == 1; }

// Moves the wanted Constant nodes of `graph` into `top`'s initializers (throwing for a non-float one).
void move_wanted_constants(const Model& model, Graph& graph, Graph& top, std::set<std::string>& wanted) {
  std::vector<Node> kept;
  for (auto& n : graph.nodes) {
    if (!is_constant_node(n) || !wanted.count(n.outputs[0])) {
      kept.push_back(std::move(n));
      continue;
    }
    Tensor t = constant_node_value(model, n);
    OT_CHECK(is_floating(t.dtype()), kWhere, n.context(), "'", n.outputs[0], "' is named as a parameter but is a ",
             dtype_name(t.dtype()), " constant: only floating-point constants can be parameters");
    top.initializers[n.outputs[0]] = t;
    wanted.erase(n.outputs[0]);
  }
  graph.nodes = std::move(kept);
}

// The same for the subgraphs of `graph` (exporters such as spox put weights inside If branches):
// the subgraphs then read them from the outer scope, as ONNX's unique value names allow. A subgraph
// is copied before it changes (Model copies share subgraphs).
void move_wanted_subgraph_constants(const Model& model, Graph& graph, Graph& top, std::set<std::string>& wanted) {
  for (auto& n : graph.nodes)
    for (auto& [key, a] : n.attributes) {
      if (a.kind != Attribute::Kind::kGraph || !a.g || wanted.empty()) continue;
      auto copy = std::make_shared<Graph>(*a.g);
      const size_t before = wanted.size();
      move_wanted_constants(model, *copy, top, wanted);
      move_wanted_subgraph_constants(model, *copy, top, wanted);
      if (wanted.size() != before) a.g = copy;
    }
}

// The float Constant nodes of >= 2 elements in `graph` and its subgraphs that are read as data and
// are not declared state.
void constant_parameters(const Model& model, const Graph& graph, const std::set<std::string>& buffers,
                         std::vector<std::string>& names) {
  for (const auto& n : graph.nodes) {
    for (const auto& [key, a] : n.attributes)
      if (a.kind == Attribute::Kind::kGraph && a.g) constant_parameters(model, *a.g, buffers, names);
    if (!is_constant_node(n) || buffers.count(n.outputs[0]) || !read_as_data(model, graph, n.outputs[0])) continue;
    Tensor t;
    try {
      t = constant_node_value(model, n);
    } catch (const Error&) {
      continue;  // string or sparse constants: never parameters
    }
    if (is_floating(t.dtype()) && t.numel() >= 2) names.push_back(n.outputs[0]);
  }
}

}  // namespace

Model promote_constant_parameters(const Model& model, const std::vector<std::string>& names) {
  Model m = model;
  Graph& g = m.graph;
  std::set<std::string> wanted;
  for (const auto& name : names)
    if (!g.is_initializer(name)) wanted.insert(name);
  if (wanted.empty()) return m;
  move_wanted_constants(m, g, g, wanted);
  move_wanted_subgraph_constants(m, g, g, wanted);
  return m;
}

std::vector<std::string> all_parameters(const Model& model) {
  std::set<std::string> buffers;  // state the ops declare (BatchNorm's running statistics)
  for (const auto& n : model.graph.nodes)
    if (const OpSchema* schema = OpRegistry::global().find(n.domain, n.op_type, model.opset(n.domain)))
      for (int k : schema->state_inputs)
        if (n.has_input(size_t(k))) buffers.insert(n.inputs[size_t(k)]);
  std::vector<std::string> names;
  for (const auto& [name, t] : model.graph.initializers)
    if (is_floating(t.dtype()) && t.rank() > 0 && !buffers.count(name) && read_as_data(model, name))
      names.push_back(name);
  constant_parameters(model, model.graph, buffers, names);
  return names;
}

std::vector<BufferUpdate> buffer_updates(const Model& model, const std::set<std::string>& bound_inputs) {
  const Graph& g = model.graph;
  auto is_state = [&](const std::string& v) { return g.is_initializer(v) || (bound_inputs.count(v) && g.is_input(v)); };
  std::vector<BufferUpdate> updates;
  for (const auto& n : g.nodes) {
    const OpSchema* schema = OpRegistry::global().find(n.domain, n.op_type, model.opset(n.domain));
    if (!schema || !schema->state_updates) continue;
    for (const StateUpdate& u : schema->state_updates(n, model.opset(n.domain)))
      if (n.has_input(size_t(u.input)) && is_state(n.inputs[size_t(u.input)]))
        updates.push_back({n.inputs[size_t(u.input)], n.outputs[size_t(u.output)], n.name, u});
  }
  return updates;
}

Model to_inference_mode(const Model& model) {
  Model m = model;
  for (auto& n : m.graph.nodes) {
    const OpSchema* schema = OpRegistry::global().find(n.domain, n.op_type, m.opset(n.domain));
    if (schema && schema->inference_form) schema->inference_form(n, m.opset(n.domain));
  }
  eliminate_dead_code(m.graph);
  return m;
}

TrainingGraphs build_training_graphs(const Model& inference, const TrainingGraphOptions& o) {
  TrainingGraphs out;
  std::vector<std::string> named = o.requires_grad;
  named.insert(named.end(), o.frozen_params.begin(), o.frozen_params.end());
  Model m = promote_constant_parameters(inference, named);
  Graph& g = m.graph;
  std::set<std::string> trainable(o.requires_grad.begin(), o.requires_grad.end());
  std::set<std::string> frozen(o.frozen_params.begin(), o.frozen_params.end());
  for (const auto& p : o.requires_grad) {
    OT_CHECK(!frozen.count(p), kWhere, "parameter '", p, "' is in both requires_grad and frozen_params");
    OT_CHECK(g.is_initializer(p), kWhere, "requires_grad names '", p,
             "', which is not an initializer or a Constant node's output of the model");
    OT_CHECK(is_floating(g.initializers.at(p).dtype()), kWhere, "parameter '", p, "' is ",
             dtype_name(g.initializers.at(p).dtype()), ": only floating-point parameters can be trained");
  }
  for (const auto& p : o.frozen_params)
    OT_CHECK(g.is_initializer(p), kWhere, "frozen_params names '", p,
             "', which is not an initializer or a Constant node's output of the model");
  OT_CHECK(!trainable.empty(), kWhere, "requires_grad is empty: nothing to train");
  const DType low = mixed_precision_dtype(o.mixed_precision);

  std::vector<std::string> model_inputs;
  for (const auto& in : g.inputs) model_inputs.push_back(in.name);
  std::vector<std::string> model_outputs, predictions, targets;
  for (const auto& out : g.outputs) model_outputs.push_back(out.name);
  attach_loss(m, o, predictions, targets);
  for (const auto& name : o.additional_output_names) {
    bool exists = false;
    for (const auto& n : g.nodes) for (const auto& v : n.outputs) exists = exists || v == name;
    OT_CHECK(exists || g.is_input(name), kWhere, "additional output '", name, "' is not a value of the model");
  }
  // Outputs: the loss, then any additional outputs.
  g.outputs.clear();
  g.outputs.push_back({"loss", ValueInfo{}});
  for (const auto& name : o.additional_output_names) g.outputs.push_back({name, ValueInfo{}});

  // Only the rows the loss and the additional outputs use; the model's outputs stay whole (the
  // eval graph and the models exported from it return them).
  if (o.compute_optimizer)
    move_selections_upstream(m, std::set<std::string>(model_outputs.begin(), model_outputs.end()));

  // Buffers a training step updates (BatchNorm running statistics).
  const std::vector<BufferUpdate> updates = buffer_updates(m);

  // Parameters become graph inputs: the checkpoint holds their values, Module binds them.
  std::vector<std::string> param_order;
  for (const auto& [name, t] : g.initializers)
    if (trainable.count(name)) param_order.push_back(name);
  for (const auto& [name, t] : g.initializers)
    if (!trainable.count(name) && is_floating(t.dtype()) && (frozen.count(name) || t.numel() > 1)) param_order.push_back(name);
  out.trainable.assign(param_order.begin(), param_order.begin() + long(trainable.size()));
  out.frozen.assign(param_order.begin() + long(trainable.size()), param_order.end());
  for (const auto& u : updates) out.buffers.push_back(u.buffer);

  out.user_inputs = model_inputs;
  out.user_inputs.insert(out.user_inputs.end(), targets.begin(), targets.end());

  // Training graph: gradients of the loss w.r.t. the trainable parameters.
  GradientGraphInfo info;
  // Gelu and FusedMatMul: their fused gradient kernels beat the pieces'. A copy: the eval graph
  // below is made from `m` and stays in standard ops, so exported models run in any runtime.
  // Mixed precision, likewise, is for the training graph: the eval graph and the models exported
  // from it stay fp32 (ONNX Runtime's CPU has no bf16 MatMul).
  Model fused = m;
  // Label sparsity before the fusions (it matches plain MatMul/LayerNorm); the training copy only:
  // the eval graph returns the model's outputs whole.
  if (o.label_sparsity) compute_kept_labels_only(fused);
  fuse_for_training(fused);
  // The output layer and its loss in one op, fp32 only (under mixed precision the head is a bf16 GEMM);
  // not for ONNX Runtime, which has no such op (to_ort_training_graphs).
  if (low == DType::kUndefined && !o.ort_compatible && fuse_linear_cross_entropy(fused.graph))
    fused.opsets.emplace(kOnnxTrainDomain, 1);
  if (low != DType::kUndefined)  // GEMMs in bf16; parameters stay fp32 inputs, cast once per step
    convert_to_mixed_precision(fused, low, std::set<std::string>(param_order.begin(), param_order.end()));
  // fp16: the backward starts from loss * scale, and the gradients leave the graph unscaled.
  const bool loss_scaling = low == DType::kFloat16;
  const std::string differentiated = loss_scaling ? scale_loss(fused, "loss") : std::string("loss");
  Model training = build_gradient_graph(fused, out.trainable, {differentiated}, &info);
  if (loss_scaling) unscale_gradients(training, info.gradient_outputs);
  drop_unread_unit_gradients(training.graph);
  if (low != DType::kUndefined) fold_casts_into_gemms(training);
  out.gradient_outputs = info.gradient_outputs;
  for (const auto& u : updates) {
    std::string name = u.buffer + "_updated";
    training.graph.nodes.push_back(Node{name + "/identity", "Identity", "", {u.value}, {name}, {}});
    training.graph.outputs.push_back({name, ValueInfo{}});
    out.buffer_outputs.push_back(name);
  }
  Model eval = to_inference_mode(m);

  for (Model* model : {&training, &eval}) {
    Graph& mg = model->graph;
    for (const auto& p : param_order) {
      auto it = mg.initializers.find(p);
      if (it == mg.initializers.end()) continue;  // unused in this graph (e.g. pruned in eval)
      ValueInfo vi{it->second.dtype(), it->second.shape(), {}};
      mg.initializers.erase(it);
      mg.inputs.push_back({p, vi});
    }
    infer_shapes(mg, model->opsets);
    model->metadata[kMetaModelOutputs] = names_json(model_outputs);
    model->metadata[kMetaLossInputs] = names_json(predictions);
    model->metadata[kMetaTargets] = names_json(targets);
    if (low != DType::kUndefined && model == &training) model->metadata[kMetaMixedPrecision] = mixed_precision_name(low);
    if (loss_scaling && model == &training) model->metadata[kMetaLossScaleInput] = kLossScaleInput;
  }
  out.training = std::move(training);
  out.eval = std::move(eval);
  return out;
}

std::optional<std::vector<std::string>> recorded_names(const Model& model, const std::string& key) {
  auto it = model.metadata.find(key);
  if (it == model.metadata.end()) return std::nullopt;
  try {
    std::vector<std::string> names;
    const json::Value parsed = json::parse(it->second);
    for (const json::Value& v : parsed.as_array()) names.push_back(v.as_string());
    return names;
  } catch (const Error& e) {
    OT_THROW(kInvalidModel, "metadata '", key, "' is not a JSON array of names: ", e.what());
  }
}

}  // namespace onnxtrain
