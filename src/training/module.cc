#include "training/module.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <numeric>
#include <set>
#include <utility>

#include "ir/subgraph.h"
#include "onnx/model_io.h"
#include "ops/optimizer/optimizer_ops.h"
#include "passes/passes.h"
#include "runtime/compiled_model.h"
#include "runtime/executor.h"
#include "training/artifacts.h"
#include "training/lora.h"
#include "training/ort_artifacts.h"
#include "core/dispatch.h"
#include "core/memory.h"
#include "training/device_state.h"
#include "distributed/data_parallel.h"
#include "optim/loss_scaler.h"

namespace onnxtrain {

namespace {

// The parameter whose gradient ("<p>_grad") or updated buffer ("<p>_updated") a training output
// is, or "" for a user output (the loss, additional outputs).
std::string parameter_of_output(const std::string& out, const std::string& suffix, const CheckpointState& state) {
  if (out.size() <= suffix.size() || out.compare(out.size() - suffix.size(), suffix.size(), suffix) != 0) return "";
  std::string stem = out.substr(0, out.size() - suffix.size());
  return state.has_parameter(stem) ? stem : "";
}

// A graph (its executor holds the model) with its split of inputs into user inputs and
// checkpoint parameters.
struct BoundGraph {
  std::unique_ptr<Executor> executor;
  std::vector<std::string> user_inputs, param_inputs, outputs;
  const Model& model() const { return executor->model(); }
};

// The executor takes the model over: one copy of the graph, not two (copying BERT h256's training
// graph took 3-8 ms of its Module's 25-40 ms on the loaded machine, mostly first touches of fresh
// heap pages).
void bind(BoundGraph& b, Model model, const CheckpointState& state, const char* what, Device device) {
  for (const auto& in : model.graph.inputs) {
    (state.has_parameter(in.name) ? b.param_inputs : b.user_inputs).push_back(in.name);
    if (!state.has_parameter(in.name)) continue;
    // A checkpoint of another model (same names, other dtypes or dims) is refused here, by name,
    // not by a kernel's shape error later. Dims the graph leaves symbolic (-1) match any size.
    const Parameter& p = state.parameter(in.name);
    const ValueInfo& vi = in.info;
    bool same = vi.dtype == DType::kUndefined || vi.dtype == p.dtype();
    if (same && vi.shape) {
      same = vi.shape->size() == p.shape().size();
      for (size_t k = 0; same && k < p.shape().size(); ++k) same = (*vi.shape)[k] < 0 || (*vi.shape)[k] == p.shape()[k];
    }
    OT_CHECK(same, "Module: ", what, " model input '", in.name, "' expects ", dtype_name(vi.dtype), " ",
             vi.shape ? shape_str(*vi.shape) : std::string("(any shape)"), ", but the checkpoint's parameter is ",
             dtype_name(p.dtype()), " ", shape_str(p.shape()), ": the checkpoint belongs to another model");
  }
  for (const auto& out : model.graph.outputs) b.outputs.push_back(out.name);
  OT_CHECK(!b.outputs.empty(), what, " model has no outputs");
  ExecutorOptions options;
  options.profile = profile_requested_by_environment();  // Module::profile
  options.device = device;
  // On a device, gradients and updated buffers stay there (DeviceState); the loss comes back.
  if (device != Device::kCpu)
    for (const auto& out : b.outputs)
      if (!parameter_of_output(out, "_grad", state).empty() || !parameter_of_output(out, "_updated", state).empty())
        options.device_outputs.push_back(out);
  b.executor = std::make_unique<Executor>(std::move(model), options);
}

// The fp16 loss scaler's state, from the checkpoint's reserved properties (defaults when absent).
optim::LossScaler load_loss_scaler(const CheckpointState& state) {
  optim::LossScaler s;
  if (state.has_property(CheckpointState::kLossScaleProperty)) {
    const PropertyValue& v = state.get_property(CheckpointState::kLossScaleProperty);
    const double* scale = std::get_if<double>(&v);
    OT_CHECK(scale, "checkpoint property '", CheckpointState::kLossScaleProperty, "' should be a float, got ",
             property_type_name(v));
    OT_CHECK(std::isfinite(*scale) && *scale > 0, "checkpoint property '", CheckpointState::kLossScaleProperty,
             "' should be a finite positive loss scale, got ", *scale);
    s.scale = *scale;
  }
  for (auto [name, slot] : {std::pair{CheckpointState::kLossScaleGoodStepsProperty, &s.good_steps},
                            std::pair{CheckpointState::kSkippedStepsProperty, &s.skipped_steps}}) {
    if (!state.has_property(name)) continue;
    const int64_t* count = std::get_if<int64_t>(&state.get_property(name));
    OT_CHECK(count && *count >= 0, "checkpoint property '", name, "' should be a count (an int >= 0), got ",
             count ? std::to_string(*count) : std::string(property_type_name(state.get_property(name))));
    *slot = *count;
  }
  return s;
}

void store_loss_scaler(CheckpointState& state, const optim::LossScaler& s) {
  state.add_property(CheckpointState::kLossScaleProperty, s.scale);
  state.add_property(CheckpointState::kLossScaleGoodStepsProperty, s.good_steps);
  state.add_property(CheckpointState::kSkippedStepsProperty, s.skipped_steps);
}

}  // namespace

struct Module::Graphs {
  BoundGraph training;
  std::optional<BoundGraph> eval;
  std::vector<std::pair<std::string, std::string>> grads;    // (parameter, output) for "<p>_grad"
  std::vector<std::pair<std::string, std::string>> buffers;  // (parameter, output) for "<b>_updated"
  std::vector<std::string> user_outputs;                     // loss and additional outputs
  std::vector<int> grad_of_output;  // per training output: its index in `grads` (and trainable_), or -1
  // Data parallelism overlapped with the backward (Optimizer::set_data_parallel).
  distributed::GradientAllreducer* reducer = nullptr;
  int64_t accumulation_steps = 1;
  int64_t micro_steps = 0;        // train steps since the update began
  bool update_from_reset = false; // the update's first train step overwrote the gradients
  bool reduced = false;           // the update's gradients were averaged during its last train step
  std::string loss_scale_input;                              // fp16: fed from the checkpoint's scaler
  std::vector<Tensor> grad_buffers;  // per entry of `grads`, once a step has overwritten them (gradient_buffers)
  std::vector<std::weak_ptr<void>> grad_buffer_holders;  // how many tensors share each buffer
  // A device Module's parameters, gradients and moments on the device (null on the CPU).
  std::unique_ptr<DeviceState> device_state;
};

namespace {

std::unique_ptr<CompiledGraphs> load_graphs(const std::string& training_path, const std::string& eval_path) {
  auto g = std::make_unique<CompiledGraphs>();
  g->training = load_model_for_runtime(training_path);
  if (!eval_path.empty()) g->eval = load_model_for_runtime(eval_path);
  return g;
}

// A pre-compiled model's plans become the executor's, so its first run of those shapes is planned.
// They are an optimisation: plans that do not fit are dropped with a note, the model still runs.
void adopt_plans(BoundGraph& b, const CompiledModel& c) {
  if (c.plans.empty()) return;
  try {
    OT_CHECK(b.executor->kernel_versions() == c.kernel_versions, "its nodes resolve to other kernel versions here");
    for (const auto& plan : c.plans) b.executor->adopt_plan(plan);
  } catch (const Error& e) {
    std::fprintf(stderr, "onnxtrain: note: ignoring the plans of pre-compiled model '%s' (%s); planning on the "
                 "first step instead\n", c.compiled_from.c_str(), e.what());
  }
}

}  // namespace

Module::Module(const std::string& training_model_path, CheckpointState& state, const std::string& eval_model_path,
               Device device)
    : Module(load_graphs(training_model_path, eval_model_path), state, device) {}

Module::Module(std::unique_ptr<CompiledGraphs> loaded, CheckpointState& state, Device device)
    : Module(std::move(loaded->training.model), state,
             loaded->eval ? std::optional<Model>(std::move(loaded->eval->model)) : std::nullopt, device) {
  adopt_plans(graphs_->training, loaded->training);
  if (loaded->eval) adopt_plans(*graphs_->eval, *loaded->eval);
}

Module::Module(Model training_model, CheckpointState& state, std::optional<Model> eval_model, Device device)
    : state_(state), device_(device), graphs_(std::make_unique<Graphs>()) {
  OT_CHECK(!state.is_nominal(), "Module: the checkpoint is nominal (shapes only); fill its parameters first");
  {  // a checkpoint saved in one precision mode must not silently train graphs of another
    auto mode = training_model.metadata.find(kMetaMixedPrecision);
    std::string graph_mode = mode == training_model.metadata.end() ? "" : mode->second;
    std::string ckpt_mode;
    if (state.has_property(kMetaMixedPrecision)) {
      const std::string* v = std::get_if<std::string>(&state.get_property(kMetaMixedPrecision));
      OT_CHECK(v, "Module: checkpoint property '", kMetaMixedPrecision, "' should be a string, got ",
               property_type_name(state.get_property(kMetaMixedPrecision)));
      ckpt_mode = *v;
    }
    auto shown = [](const std::string& m) { return m.empty() ? std::string("fp32") : "mixed precision " + m; };
    OT_CHECK(graph_mode == ckpt_mode, "Module: the checkpoint was saved for ", shown(ckpt_mode),
             " training, the training model is ", shown(graph_mode),
             "; generate the artifacts again with the checkpoint's mode");
  }
  // LoRA adapters belong to the base they were trained on: the checkpoint records its hash.
  if (state.has_property(kLoraBaseHashProperty)) {
    const auto* ck = std::get_if<std::string>(&state.get_property(kLoraBaseHashProperty));
    std::string model_hash = lora_info(training_model).base_hash;
    OT_CHECK(ck && !model_hash.empty() && *ck == model_hash, "Module: the checkpoint's LoRA adapters were trained on base "
             "model ", ck ? *ck : "?", ", but this training model's base is ",
             model_hash.empty() ? std::string("not a LoRA model") : model_hash, " (hash mismatch: a different base)");
  }
  if (is_ort_training_model(training_model)) {  // ONNX Runtime's generator wrote these artifacts
    adapt_ort_training_model(training_model, state);
    if (eval_model) adapt_ort_eval_model(*eval_model, state);
  }
  bind(graphs_->training, std::move(training_model), state, "training", device);
  if (auto it = graphs_->training.model().metadata.find(kMetaLossScaleInput);
      it != graphs_->training.model().metadata.end()) {
    std::vector<std::string>& user = graphs_->training.user_inputs;
    auto input = std::find(user.begin(), user.end(), it->second);
    OT_CHECK(input != user.end(), "Module: the training model names '", it->second,
             "' as its loss-scale input, but has no such input");
    user.erase(input);
    graphs_->loss_scale_input = it->second;
    store_loss_scaler(state, load_loss_scaler(state));  // checks the properties, writes defaults where absent
  }
  for (const auto& out : graphs_->training.outputs) {
    std::string stem;
    if (!(stem = parameter_of_output(out, "_grad", state)).empty()) {
      OT_CHECK(state.parameter(stem).requires_grad(), "Module: the training model outputs a gradient for '", stem,
               "', which the checkpoint marks frozen");
      graphs_->grads.emplace_back(stem, out);
      trainable_.push_back(stem);
    } else if (!(stem = parameter_of_output(out, "_updated", state)).empty()) {
      graphs_->buffers.emplace_back(stem, out);
    } else {
      graphs_->user_outputs.push_back(out);
    }
  }
  OT_CHECK(!trainable_.empty(), "Module: the training model outputs no '<parameter>_grad' of a checkpoint parameter");
  graphs_->grad_of_output.assign(graphs_->training.outputs.size(), -1);
  for (size_t k = 0; k < graphs_->grads.size(); ++k) {
    const auto& outs = graphs_->training.outputs;
    graphs_->grad_of_output[size_t(std::find(outs.begin(), outs.end(), graphs_->grads[k].second) - outs.begin())] = int(k);
  }
  if (eval_model) {
    graphs_->eval.emplace();
    bind(*graphs_->eval, std::move(*eval_model), state, "eval", device);
  }
  // The training run's random stream continues from the checkpoint (a fresh seed when it has none).
  auto int_property = [&](const char* name) -> std::optional<int64_t> {
    if (!state.has_property(name)) return std::nullopt;
    const int64_t* v = std::get_if<int64_t>(&state.get_property(name));
    OT_CHECK(v, "Module: checkpoint property '", name, "' should be an int, got ",
             property_type_name(state.get_property(name)));
    return *v;
  };
  std::optional<int64_t> seed = int_property(CheckpointState::kRandomSeedProperty);
  if (!seed) {
    seed = int64_t(graphs_->training.executor->random_seed());
    state.add_property(CheckpointState::kRandomSeedProperty, *seed);
  }
  std::optional<int64_t> steps = int_property(CheckpointState::kTrainStepsProperty);
  OT_CHECK(!steps || *steps >= 0, "Module: checkpoint property '", CheckpointState::kTrainStepsProperty,
           "' is negative: ", *steps);
  graphs_->training.executor->set_random_state(uint64_t(*seed), uint64_t(steps.value_or(0)));
  if (device != Device::kCpu) {
    DeviceUpdate* update = device_update(device);
    OT_CHECK(update, "Module: this build's ", device_name(device), " backend registers no training update");
    graphs_->device_state =
        std::make_unique<DeviceState>(state, device, *update, graphs_->training.executor->stream());
  }
}

Module::~Module() = default;

const Executor& CompileAccess::executor(const Module& module, bool training) {
  OT_CHECK(training || module.graphs_->eval, "Module: no eval model was given");
  return training ? *module.graphs_->training.executor : *module.graphs_->eval->executor;
}

bool Module::has_loss_scaler() const { return !graphs_->loss_scale_input.empty(); }

std::vector<std::string> Module::input_names(bool training) const {
  OT_CHECK(training || graphs_->eval, "Module: no eval model was given");
  return training ? graphs_->training.user_inputs : graphs_->eval->user_inputs;
}

std::vector<std::string> Module::output_names(bool training) const {
  OT_CHECK(training || graphs_->eval, "Module: no eval model was given");
  return training ? graphs_->user_outputs : graphs_->eval->outputs;
}

std::vector<Tensor> Module::run(bool training, const std::vector<Tensor>& inputs,
                                const std::function<bool(size_t, const Tensor&)>& on_output_ready,
                                const std::vector<Tensor>& output_buffers) {
  BoundGraph& g = training ? graphs_->training : *graphs_->eval;
  const char* step = training ? "train_step" : "eval_step";
  if (inputs.size() != g.user_inputs.size()) {
    std::string names;
    for (const auto& n : g.user_inputs) names += (names.empty() ? "" : ", ") + n;
    OT_THROW(kInvalidArgument, "Module.", step, ": expected ", g.user_inputs.size(), " inputs (", names, "), got ",
             inputs.size());
  }
  std::map<std::string, Tensor> feeds;
  for (size_t i = 0; i < inputs.size(); ++i) feeds[g.user_inputs[i]] = inputs[i];
  if (DeviceState* ds = graphs_->device_state.get()) {
    ds->attach();
    for (const auto& p : g.param_inputs) feeds[p] = ds->parameter(p);
    if (!training) ds->synchronize();  // the eval graph's stream reads what the training stream updated
  } else {
    for (const auto& p : g.param_inputs) feeds[p] = state_.parameter(p).data();  // shares storage
  }
  if (training && has_loss_scaler())
    feeds[graphs_->loss_scale_input] = Tensor::scalar<float>(float(load_loss_scaler(state_).scale));
  std::vector<std::string> wanted = training ? graphs_->training.outputs : g.outputs;
  return g.executor->run(feeds, wanted, on_output_ready, output_buffers);
}

// A step that overwrites the gradients (after lazy_reset_grad) writes each one into a buffer of
// the Module's, the same every step, rather than into fresh storage: a gradient's first write to
// fresh pages cost as much as computing it (BERT h256: 5000 page faults per step). All buffers are
// one allocation (huge pages: the first step's writes fault 2 MiB at a time), made on the first
// such step. A buffer is only given while nothing but the Module and its parameter's gradient
// slot holds it: a gradient the caller kept keeps its values, and that step gets fresh storage.
std::vector<Tensor> Module::gradient_buffers() {
  Graphs& gr = *graphs_;
  if (gr.device_state) return device_gradient_buffers();
  if (gr.grad_buffers.empty()) {
    std::vector<TensorSpec> specs;
    for (const auto& [param, out] : gr.grads) {
      const Parameter& p = state_.parameter(param);
      specs.push_back({p.dtype(), p.shape()});
    }
    gr.grad_buffers = allocate_tensors(specs, Fill::kUninitialized, &gr.grad_buffer_holders);
  }
  std::vector<Tensor> given(gr.training.outputs.size());
  for (size_t i = 0; i < given.size(); ++i) {
    const int k = gr.grad_of_output[i];
    if (k < 0) continue;
    const Tensor& buffer = gr.grad_buffers[size_t(k)];
    const Parameter& p = state_.parameter(gr.grads[size_t(k)].first);
    const long in_slot = p.has_grad() && p.grad().shares_storage_with(buffer) ? 1 : 0;
    if (gr.grad_buffer_holders[size_t(k)].use_count() == 1 + in_slot) given[i] = buffer;
  }
  return given;
}

// On a device the gradients are the Module's alone (the host sees copies), so a step that
// overwrites them writes into the same device buffers every step: allocated once.
std::vector<Tensor> Module::device_gradient_buffers() {
  Graphs& gr = *graphs_;
  if (gr.grad_buffers.empty())
    for (const auto& [param, out] : gr.grads) {
      const Parameter& p = state_.parameter(param);
      gr.grad_buffers.push_back(empty_on(device_, p.dtype(), p.shape()));
    }
  std::vector<Tensor> given(gr.training.outputs.size());
  for (size_t i = 0; i < given.size(); ++i)
    if (const int k = gr.grad_of_output[i]; k >= 0) given[i] = gr.grad_buffers[size_t(k)];
  return given;
}

void Module::scale_gradients_in_next_step(double factor) {
  OT_CHECK(std::isfinite(factor), "Module.scale_gradients_in_next_step: the factor must be finite, got ", factor);
  next_gradient_scale_ = factor;
}

std::vector<Tensor> Module::train_step(const std::vector<Tensor>& inputs) {
  Graphs& gr = *graphs_;
  DeviceState* ds = gr.device_state.get();
  std::optional<CheckpointState::DeviceSyncPause> pause;  // a device step reads the device side only
  if (ds) pause.emplace(state_);
  const bool reset = reset_grad_;
  if (reset) {
    gr.micro_steps = 0;
    gr.update_from_reset = true;
  }
  OT_CHECK(!gr.reduced, "Module.train_step: with data parallelism and gradient_accumulation_steps = ",
           gr.accumulation_steps, ", this update's gradients were averaged over the ranks during its train step ",
           gr.accumulation_steps, "; call Optimizer.step() and lazy_reset_grad() before the next train step (or set "
           "gradient_accumulation_steps to the number of train steps per update, or overlap = false)");
  ++gr.micro_steps;
  // The update's gradients are final in this backward: reduce each bucket as soon as it is.
  const bool overlap = gr.reducer && gr.update_from_reset && gr.micro_steps == gr.accumulation_steps;
  const double scale = std::exchange(next_gradient_scale_, 1.0);
  if (overlap) {
    std::vector<Tensor> like;
    for (const auto& name : trainable_) like.push_back(state_.parameter(name).data());
    gr.reducer->begin(like);
  }
  // Each gradient is added to its parameter's slot as soon as the backward has finished it
  // (the executor then frees its buffer), scaled, and handed to the allreducer.
  auto take_gradient = [&](size_t output, const Tensor& g) {
    const int k = gr.grad_of_output[output];
    if (k < 0) return false;
    const std::string& name = gr.grads[size_t(k)].first;
    if (ds) {  // on the device, queued on the training graph's stream
      Tensor acc = reset ? Tensor() : ds->gradient(name);
      if (acc.defined()) {
        ds->update().add(acc, g, ds->stream());
      } else {
        acc = g;  // the device buffer the executor wrote, or fresh storage: adopted
      }
      if (scale != 1.0) ds->update().scale(acc, scale, ds->stream());
      ds->set_gradient(name, acc);
      return true;
    }
    Parameter& p = state_.parameter(name);
    if (reset || !p.has_grad()) {
      p.set_grad(g);  // the executor hands over fresh storage or our gradient buffer: adopt, no copy
    } else {
      Tensor& acc = p.ensure_grad();
      dispatch_float(acc.dtype(), [&]<typename T>() {
        T* a = acc.data<T>();
        const T* b = g.data<T>();
        for (int64_t i = 0; i < acc.numel(); ++i) a[i] = T(compute_t<T>(a[i]) + compute_t<T>(b[i]));
      });
    }
    if (scale != 1.0) {
      Tensor& acc = p.ensure_grad();
      dispatch_float(acc.dtype(), [&]<typename T>() {
        T* a = acc.data<T>();
        const compute_t<T> f = compute_t<T>(scale);
        for (int64_t i = 0; i < acc.numel(); ++i) a[i] = T(compute_t<T>(a[i]) * f);
      });
    }
    if (overlap) gr.reducer->ready(size_t(k), p.grad());
    return true;
  };
  std::vector<Tensor> outs;
  try {
    outs = run(true, inputs, take_gradient, reset ? gradient_buffers() : std::vector<Tensor>{});
  } catch (...) {
    if (overlap) gr.reducer->abandon();
    throw;
  }
  reset_grad_ = false;
  if (overlap) {
    gr.reducer->finish();
    gr.reduced = true;
  }
  state_.add_property(CheckpointState::kTrainStepsProperty, int64_t(gr.training.executor->next_run_index()));
  // Outputs come in graph order: classify by name (the gradients were taken above).
  std::map<std::string, Tensor> by_name;
  for (size_t i = 0; i < outs.size(); ++i) by_name[gr.training.outputs[i]] = outs[i];
  for (const auto& [param, out] : gr.buffers) {
    if (ds) ds->set_parameter(param, by_name.at(out));  // a device tensor, kept
    else state_.parameter(param).set_data(by_name.at(out));
  }
  std::vector<Tensor> result;
  for (const auto& name : graphs_->user_outputs) result.push_back(by_name.at(name));
  return result;
}

std::vector<NodeProfile> Module::profile() const { return graphs_->training.executor->profile(); }

std::string Module::memory_report() const {
  const MemoryReport r = graphs_->training.executor->memory_report();
  auto mib = [](size_t b) { return std::to_string(double(b) / (1024.0 * 1024.0)).substr(0, 7) + " MiB"; };
  return "training arena " + mib(r.planned_arena_bytes) + " planned (naive " + mib(r.naive_bytes) + "), peak live " +
         mib(r.peak_live_bytes) + " of which stashed activations " + mib(r.stashed_at_peak_bytes) + " (all stashed: " +
         mib(r.stashed_bytes) + "), " + std::to_string(r.dynamic_allocations) + " allocations in the last step";
}

std::vector<Tensor> Module::eval_step(const std::vector<Tensor>& inputs) {
  OT_CHECK(graphs_->eval.has_value(), "Module.eval_step: no eval model was given");
  std::optional<CheckpointState::DeviceSyncPause> pause;
  if (graphs_->device_state) pause.emplace(state_);
  return run(false, inputs);
}

void Module::export_model_for_inferencing(const std::string& path, const std::vector<std::string>& output_names) const {
  OT_CHECK(graphs_->eval.has_value(), "Module.export_model_for_inferencing: needs the eval model");
  OT_CHECK(!output_names.empty(), "Module.export_model_for_inferencing: no output names given");
  Model m = graphs_->eval->model();
  Graph& g = m.graph;
  std::set<std::string> produced;
  for (const auto& n : g.nodes) for (const auto& o : n.outputs) produced.insert(o);
  g.outputs.clear();
  for (const auto& name : output_names) {
    OT_CHECK(produced.count(name) || g.is_input(name), "Module.export_model_for_inferencing: '", name,
             "' is not a value of the eval model");
    g.outputs.push_back({name, g.value_info.count(name) ? g.value_info.at(name) : ValueInfo{}});
  }
  // Parameters become initializers again, with their trained values (shared, not copied: the
  // model is only written out).
  std::vector<NamedValue> kept;
  for (auto& in : g.inputs) {
    if (state_.has_parameter(in.name)) g.initializers[in.name] = std::as_const(state_).parameter(in.name).data();
    else kept.push_back(in);
  }
  g.inputs = kept;
  eliminate_dead_code(g);  // drops the loss and anything only it used
  std::set<std::string> read;
  for (const auto& n : g.nodes) {
    for (const auto& i : n.inputs) read.insert(i);
    for (const auto& i : outer_scope_reads(n)) read.insert(i);  // read inside If/Loop/Scan bodies
  }
  for (const auto& o : g.outputs) read.insert(o.name);
  std::vector<NamedValue> used;
  for (const auto& in : g.inputs) if (read.count(in.name)) used.push_back(in);  // targets go
  g.inputs = used;
  for (const char* key : {kMetaModelOutputs, kMetaLossInputs, kMetaTargets}) m.metadata.erase(key);  // training-only
  save_model(m, path);
}

// ---- Optimizer

Optimizer::Optimizer(const std::string& optimizer_model_path, Module& module)
    : Optimizer([&] {
        Model m = load_model_for_runtime(optimizer_model_path).model;
        if (std::optional<OptimizerConfig> ort = ort_optimizer_config(m)) return *ort;
        for (const auto& n : m.graph.nodes)
          if (n.domain == kOnnxTrainDomain) {
            OptimizerConfig c = optim::config_from_update_node(n);
            if (auto it = m.graph.initializers.find("learning_rate"); it != m.graph.initializers.end())
              c.lr = it->second.item_as_double();
            return c;
          }
        OT_THROW(kInvalidModel, "optimizer model '", optimizer_model_path, "' has no onnxtrain update node");
      }(), module) {}

struct Optimizer::Rule {
  optim::MultiTensorOptimizer optimizer;
  optim::OptimizerState state;
  DataParallelOptions data_parallel;
  std::unique_ptr<distributed::GradientAllreducer> reducer;  // set when data parallel
  std::vector<ParamGroup> groups;
  std::vector<int> group_of;  // per trainable parameter: its group, or -1 for the optimizer's config
};

Optimizer::Optimizer(OptimizerConfig config, Module& module)
    : module_(module), rule_(std::make_unique<Rule>(Rule{optim::MultiTensorOptimizer(config), {}, {}, nullptr, {}, {}})) {
  load_state();
}

Optimizer::~Optimizer() {
  if (module_.graphs_->reducer == rule_->reducer.get()) module_.graphs_->reducer = nullptr;
}

std::vector<size_t> Module::gradient_ready_order() const {
  const Executor& e = *graphs_->training.executor;
  std::vector<size_t> order(graphs_->grads.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return e.output_ready_step(graphs_->grads[a].second) < e.output_ready_step(graphs_->grads[b].second);
  });
  return order;
}

void Optimizer::load_state() {
  CheckpointState& ckpt = module_.state();
  std::vector<Tensor> params;
  for (const auto& name : module_.trainable_parameters()) params.push_back(ckpt.parameter(name).data());
  std::vector<std::string> names = rule_->optimizer.config().state_names();
  if (ckpt.has_optimizer_state()) {
    const SavedOptimizerState& saved = ckpt.optimizer_state();
    rule_->state.step = saved.step;
    if (saved.learning_rate) rule_->optimizer.set_lr(*saved.learning_rate);
    for (const auto& n : names)
      for (const auto& p : module_.trainable_parameters()) {
        auto ps = saved.param_states.find(p);
        if (ps == saved.param_states.end() || !ps->second.count(n)) continue;
        rule_->state.tensors[n].push_back(ps->second.at(n));
      }
    for (const auto& n : names)
      if (rule_->state.tensors[n].size() != params.size()) rule_->state.tensors[n].clear();  // incomplete: start fresh
  }
  rule_->optimizer.init_state(params, rule_->state);
  store_state();
}

void Optimizer::store_state() {
  CheckpointState& ckpt = module_.state();
  SavedOptimizerState& saved = ckpt.optimizer_state();
  saved.step = rule_->state.step;
  saved.learning_rate = rule_->optimizer.lr();
  const auto& params = module_.trainable_parameters();
  for (const auto& [name, tensors] : rule_->state.tensors)
    for (size_t i = 0; i < tensors.size() && i < params.size(); ++i)
      saved.param_states[params[i]][name] = tensors[i];  // shares storage: updated in place
}

namespace {

// Whether an update of `config` over tensors of `dtypes` runs on the device: AdamW in torch's and
// transformers' forms without amsgrad, where the device's kernel takes the dtype.
bool runs_on_device(const OptimizerConfig& config, const std::vector<DType>& dtypes, const DeviceUpdate& update) {
  if ((config.type != OptimizerType::kAdamW && config.type != OptimizerType::kHFAdamW) || config.amsgrad) return false;
  return std::all_of(dtypes.begin(), dtypes.end(), [&](DType d) { return update.adamw_supports(d); });
}

DeviceAdamW device_adamw(const OptimizerConfig& c, int64_t step, double max_grad_norm) {
  DeviceAdamW d;
  d.lr = c.lr;
  d.beta1 = c.betas[0];
  d.beta2 = c.betas[1];
  d.eps = c.eps;
  d.weight_decay = c.weight_decay;
  d.max_grad_norm = max_grad_norm;
  d.step = step;
  d.hf = c.type == OptimizerType::kHFAdamW;
  d.correct_bias = c.correct_bias;
  d.maximize = c.maximize;
  return d;
}

}  // namespace

StepStats Optimizer::step() {
  CheckpointState& ckpt = module_.state();
  if (DeviceState* ds = module_.graphs_->device_state.get()) {
    std::vector<DType> dtypes;
    {
      CheckpointState::DeviceSyncPause pause(ckpt);  // dtypes only
      for (const auto& name : module_.trainable_parameters()) dtypes.push_back(std::as_const(ckpt).parameter(name).dtype());
    }
    if (runs_on_device(rule_->optimizer.config(), dtypes, ds->update())) return device_step(*ds);
    // The other rules update the checkpoint's host tensors: its accessors below copy the
    // parameters and gradients down and mark them stale on the device (uploaded next step).
    static std::mutex reported_mutex;
    static std::set<std::string> reported;
    const std::string rule = optimizer_type_name(rule_->optimizer.config().type) +
                             std::string(rule_->optimizer.config().amsgrad ? " (amsgrad)" : "");
    std::lock_guard<std::mutex> lock(reported_mutex);
    if (reported.insert(rule).second)
      std::cerr << "onnxtrain: no " << device_name(ds->device()) << " update for " << rule
                << ": Optimizer.step runs it on the CPU, with the parameters, gradients and state copied each step\n";
  }
  std::vector<Tensor> params, grads;
  for (const auto& name : module_.trainable_parameters()) {
    Parameter& p = ckpt.parameter(name);
    OT_CHECK(p.has_grad(), "Optimizer.step: parameter '", name, "' has no gradient (run Module.train_step first)");
    params.push_back(p.data());
    grads.push_back(p.grad());
  }
  // Overlapped data parallelism averaged them during the update's last train step; either way
  // every rank then sees the same overflow.
  if (rule_->reducer && !std::exchange(module_.graphs_->reduced, false)) rule_->reducer->average(grads);
  std::optional<optim::LossScaler> scaler;
  bool finite = true;
  if (module_.has_loss_scaler()) {
    scaler = load_loss_scaler(ckpt);
    finite = optim::all_finite(grads);
  }
  StepStats stats;
  if (finite)
    stats = rule_->groups.empty() ? rule_->optimizer.step(params, grads, rule_->state) : grouped_step(params, grads);
  if (scaler) {
    stats.skipped = !scaler->update(finite);
    stats.loss_scale = scaler->scale;
    store_loss_scaler(ckpt, *scaler);
  }
  if (!finite) return stats;  // nothing else moved
  store_state();
  if (rule_->reducer && rule_->data_parallel.check_every > 0 && rule_->state.step % rule_->data_parallel.check_every == 0)
    distributed::check_same_on_all_ranks(distributed::world(), distributed::checksum(params),
                                         "the parameters after step " + std::to_string(rule_->state.step));
  return stats;
}

// AdamW on the device: the parameters, gradients and moments there, one launch for all of them
// (one per param group); only the loss scaler's overflow check (fp16) and, with param groups, the
// global norm for clipping are read on the host.
StepStats Optimizer::device_step(DeviceState& ds) {
  CheckpointState& ckpt = module_.state();
  CheckpointState::DeviceSyncPause pause(ckpt);
  ds.attach();
  const std::vector<std::string>& names = module_.trainable_parameters();
  const std::vector<Tensor>& host_m = rule_->state.tensors.at("exp_avg");
  const std::vector<Tensor>& host_v = rule_->state.tensors.at("exp_avg_sq");
  std::vector<Tensor> params, grads, exp_avg, exp_avg_sq;
  for (size_t i = 0; i < names.size(); ++i) {
    const Tensor& g = ds.gradient(names[i]);
    OT_CHECK(g.defined(), "Optimizer.step: parameter '", names[i], "' has no gradient (run Module.train_step first)");
    grads.push_back(g);
    params.push_back(ds.parameter(names[i]));
    exp_avg.push_back(ds.optimizer_tensor(names[i], "exp_avg", host_m[i]));
    exp_avg_sq.push_back(ds.optimizer_tensor(names[i], "exp_avg_sq", host_v[i]));
  }
  std::optional<optim::LossScaler> scaler;
  bool finite = true;
  if (module_.has_loss_scaler()) {
    scaler = load_loss_scaler(ckpt);
    finite = ds.update().all_finite(grads, ds.stream());
  }
  StepStats stats;  // without param groups the norm stays on the device: grad_norm -1
  if (finite) {
    const OptimizerConfig& main = rule_->optimizer.config();
    const int64_t step = rule_->state.step + 1;
    if (rule_->groups.empty()) {
      ds.update().adamw(device_adamw(main, step, main.max_grad_norm), params, grads, exp_avg, exp_avg_sq, ds.stream());
    } else {
      if (main.max_grad_norm > 0) {  // one global norm over every group, as on the CPU
        stats.grad_norm = ds.update().l2_norm(grads, ds.stream());
        stats.clip_coef = std::min(1.0, main.max_grad_norm / (stats.grad_norm + 1e-6));
        if (stats.clip_coef < 1.0)
          for (size_t i = 0; i < grads.size(); ++i) {
            ds.update().scale(grads[i], stats.clip_coef, ds.stream());
            ds.gradient_updated(names[i]);
          }
      }
      for (int g = -1; g < int(rule_->groups.size()); ++g) {
        const OptimizerConfig& config = g < 0 ? main : rule_->groups[size_t(g)].config;
        std::vector<Tensor> p, gr, m, v;
        for (size_t i = 0; i < names.size(); ++i) {
          if (rule_->group_of[i] != g) continue;
          p.push_back(params[i]);
          gr.push_back(grads[i]);
          m.push_back(exp_avg[i]);
          v.push_back(exp_avg_sq[i]);
        }
        if (!p.empty()) ds.update().adamw(device_adamw(config, step, 0), p, gr, m, v, ds.stream());
      }
    }
    rule_->state.step = step;
    ds.parameters_updated(names);
    ds.optimizer_tensors_updated();
  }
  if (scaler) {
    stats.skipped = !scaler->update(finite);
    stats.loss_scale = scaler->scale;
    store_loss_scaler(ckpt, *scaler);
  }
  if (finite) store_state();
  return stats;
}

StepStats Optimizer::grouped_step(std::vector<Tensor>& params, std::vector<Tensor>& grads) {
  const OptimizerConfig& main = rule_->optimizer.config();
  rule_->optimizer.init_state(params, rule_->state);
  StepStats stats;
  if (main.max_grad_norm > 0) {  // one global norm over every group, as without groups
    stats.grad_norm = optim::global_l2_norm(grads);
    stats.clip_coef = std::min(1.0, main.max_grad_norm / (stats.grad_norm + 1e-6));
    if (stats.clip_coef < 1.0)
      for (Tensor& g : grads)
        dispatch_float(g.dtype(), [&]<typename T>() {
          T* p = g.data<T>();
          for (int64_t i = 0; i < g.numel(); ++i) p[i] = T(compute_t<T>(p[i]) * compute_t<T>(stats.clip_coef));
        });
  }
  const int64_t step = rule_->state.step + 1;
  const std::vector<std::string> names = main.state_names();
  for (int g = -1; g < int(rule_->groups.size()); ++g) {
    OptimizerConfig config = g < 0 ? main : rule_->groups[size_t(g)].config;
    config.max_grad_norm = 0;  // clipped above
    std::vector<Tensor> p, gr;
    std::vector<std::vector<Tensor>> state(names.size());
    for (size_t i = 0; i < params.size(); ++i) {
      if (rule_->group_of[i] != g) continue;
      p.push_back(params[i]);
      gr.push_back(grads[i]);
      for (size_t k = 0; k < names.size(); ++k) state[k].push_back(rule_->state.tensors.at(names[k])[i]);
    }
    if (!p.empty()) optim::apply_update(config, step, p, gr, state);
  }
  rule_->state.step = step;
  return stats;
}

void Optimizer::set_param_groups(const std::vector<ParamGroup>& groups) {
  const auto& trainable = module_.trainable_parameters();
  std::vector<int> group_of(trainable.size(), -1);
  for (size_t g = 0; g < groups.size(); ++g) {
    const OptimizerConfig& c = groups[g].config;
    OT_CHECK(c.type == rule_->optimizer.config().type, "Optimizer.set_param_groups: group ", g, " uses ",
             optimizer_type_name(c.type), " but the optimizer is ", optimizer_type_name(rule_->optimizer.config().type));
    OT_CHECK(c.state_names() == rule_->optimizer.config().state_names(), "Optimizer.set_param_groups: group ", g,
             " keeps other state (amsgrad or momentum differ from the optimizer's)");
    c.validate();
    for (const auto& name : groups[g].params) {
      auto it = std::find(trainable.begin(), trainable.end(), name);
      OT_CHECK(it != trainable.end(), "Optimizer.set_param_groups: group ", g, " names '", name,
               "', which is not a trainable parameter of the module");
      int& slot = group_of[size_t(it - trainable.begin())];
      OT_CHECK(slot < 0, "Optimizer.set_param_groups: '", name, "' is in groups ", slot, " and ", g);
      slot = int(g);
    }
  }
  rule_->groups = groups;
  rule_->group_of = std::move(group_of);
}

const std::vector<ParamGroup>& Optimizer::param_groups() const { return rule_->groups; }

void Optimizer::set_data_parallel(const DataParallelOptions& o) {
  OT_CHECK(!module_.graphs_->reduced, "Optimizer.set_data_parallel: the module's gradients were averaged during its "
           "last train step and not applied yet; call step() first");
  if (module_.graphs_->reducer == rule_->reducer.get()) module_.graphs_->reducer = nullptr;
  if (!o.enabled) {
    rule_->reducer.reset();
    rule_->data_parallel = o;
    return;
  }
  if (module_.graphs_->device_state)
    OT_THROW(kNotImplemented, "Optimizer.set_data_parallel: data parallelism on a ", device_name(module_.device()),
             " Module (its gradients stay on the device; there is no NCCL backend): train on the CPU");
  OT_CHECK(o.bucket_bytes > 0, "Optimizer.set_data_parallel: bucket_bytes must be > 0, got ", o.bucket_bytes);
  OT_CHECK(o.gradient_accumulation_steps >= 1, "Optimizer.set_data_parallel: gradient_accumulation_steps must be "
           ">= 1, got ", o.gradient_accumulation_steps);
  OT_CHECK(o.check_every >= 0, "Optimizer.set_data_parallel: check_every must be >= 0, got ", o.check_every);
  OT_CHECK(o.timeout_seconds > 0, "Optimizer.set_data_parallel: timeout_seconds must be > 0, got ", o.timeout_seconds);
  distributed::Communicator& comm = distributed::world();
  if (!std::getenv("ONNXTRAIN_DP_TIMEOUT")) comm.set_timeout(o.timeout_seconds);
  // Every rank must start from the same parameters, optimizer state and settings.
  CheckpointState& ckpt = module_.state();
  std::vector<Tensor> held;
  std::string names;
  for (const auto& name : module_.trainable_parameters()) {
    held.push_back(ckpt.parameter(name).data());
    names += name + ";";
  }
  for (const auto& [state_name, tensors] : rule_->state.tensors) held.insert(held.end(), tensors.begin(), tensors.end());
  uint64_t h = distributed::checksum(held, distributed::checksum_bytes(names.data(), names.size()));
  const int64_t step = rule_->state.step;
  const double lr = rule_->optimizer.lr();
  const int32_t type = int32_t(rule_->optimizer.config().type);
  h = distributed::checksum_bytes(&step, sizeof step, h);
  h = distributed::checksum_bytes(&lr, sizeof lr, h);
  h = distributed::checksum_bytes(&type, sizeof type, h);
  distributed::check_same_on_all_ranks(comm, h, "the trainable parameters, optimizer state and settings");
  rule_->data_parallel = o;
  rule_->reducer = std::make_unique<distributed::GradientAllreducer>(comm, o.bucket_bytes);
  // Buckets follow the order the backward finishes the gradients (overlapped or not: the same
  // buckets, so both give the same bits).
  rule_->reducer->set_order(module_.gradient_ready_order());
  if (o.overlap && comm.size() > 1) {
    module_.graphs_->reducer = rule_->reducer.get();
    module_.graphs_->accumulation_steps = o.gradient_accumulation_steps;
  }
}

const DataParallelOptions& Optimizer::data_parallel_options() const { return rule_->data_parallel; }

DataParallelStats Optimizer::data_parallel_stats() const {
  return rule_->reducer ? rule_->reducer->stats() : DataParallelStats{};
}

void Optimizer::set_learning_rate(double lr) {
  rule_->optimizer.set_lr(lr);
  CheckpointState::DeviceSyncPause pause(module_.state());  // the rate only: the moments stay where they are
  module_.state().optimizer_state().learning_rate = lr;
}

double Optimizer::get_learning_rate() const { return rule_->optimizer.lr(); }

int64_t Optimizer::step_count() const { return rule_->state.step; }

}  // namespace onnxtrain
