// Module, Optimizer and learning-rate schedulers: ONNX Runtime's on-device training loop objects,
// over the artifacts generate_artifacts writes (onnxtrain/artifacts.h).
//
//   auto state = onnxtrain::CheckpointState::load("out/checkpoint");
//   onnxtrain::Module module("out/training_model.onnx", state, "out/eval_model.onnx");
//   onnxtrain::Optimizer optimizer("out/optimizer_model.onnx", module);
//   onnxtrain::LinearLRScheduler scheduler(optimizer, /*warmup*/ 10, /*total*/ 1000, /*initial_lr*/ 1e-3);
//   for (...) {
//     std::vector<Tensor> out = module.train_step({x, y});     // out[0]: the loss
//     optimizer.step();
//     module.lazy_reset_grad();
//     scheduler.step();
//   }
//   module.export_model_for_inferencing("trained.onnx", {"logits"});
//   state.save("out/checkpoint");
//
// Parameters live in the CheckpointState and are fed to the graphs without copies; each train
// step adds the graph's "<param>_grad" outputs into the parameters' gradient slots (gradient
// accumulation), unless lazy_reset_grad() asked for the next step to overwrite them. A Module
// keeps a reference to its state, an Optimizer to its Module, a scheduler to its Optimizer: each
// must outlive the objects built on it. Errors are thrown as onnxtrain::Error (onnxtrain/status.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "onnxtrain/distributed.h"
#include "onnxtrain/optimizer_config.h"
#include "onnxtrain/session.h"
#include "onnxtrain/training.h"

namespace onnxtrain {

struct Model;           // internal (src/ir/graph.h)
struct CompiledGraphs;  // internal (src/training/module.cc): graphs loaded for a Module
class DeviceState;      // internal (src/training/device_state.h): a device Module's training state

// Pre-compiled artifacts: writes training_model.otc, eval_model.otc and optimizer_model.otc next to
// the ONNX files of artifact_dir (and its checkpoint): the graphs as the runtime runs them, their
// resolved kernels and their memory plans for the input shapes given (name -> dims; inputs whose
// declared shape is static need none), parameters by reference to the checkpoint. Module and
// Optimizer, built from the ONNX paths, then load the .otc files instead when they are valid
// (format docs/DESIGN.md, "Formats"), and ignore them with a note when stale or damaged.
// Returns the paths written.
std::vector<std::string> compile_artifacts(const std::string& artifact_dir,
                                           const std::map<std::string, Shape>& input_shapes = {});

class Module {
 public:
  // `device`: where the graphs run. Device::kCuda runs every op with a CUDA kernel on the GPU (the
  // others on the CPU, named once on stderr) and keeps the training state there: a copy of each
  // parameter the graphs read (made on the first step), the gradients (accumulated there) and,
  // through the Optimizer, AdamW's moments; a step copies in its inputs and out its loss and
  // additional outputs, nothing else. The CheckpointState still shows the trained values whenever
  // the host reads it (CheckpointState::DeviceSync says how, and the one write it cannot see).
  // Throws "no CUDA device" where there is none.
  Module(const std::string& training_model_path, CheckpointState& state, const std::string& eval_model_path = "",
         Device device = Device::kCpu);
  // From graphs in memory, for callers inside the library (the torch wrapper, tests).
  Module(Model training_model, CheckpointState& state, std::optional<Model> eval_model, Device device = Device::kCpu);
  // From graphs loaded with load_model_for_runtime (src/training/module.h), whose pre-compiled
  // plans, if any, are adopted; for callers inside the library (the CLI's trainer).
  Module(std::unique_ptr<CompiledGraphs> graphs, CheckpointState& state, Device device = Device::kCpu);
  ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Forward, backward and gradient accumulation; returns the loss and any additional outputs.
  std::vector<Tensor> train_step(const std::vector<Tensor>& inputs);
  // Forward and loss with inference-mode Dropout/BatchNorm; needs the eval model.
  std::vector<Tensor> eval_step(const std::vector<Tensor>& inputs);
  void lazy_reset_grad() { reset_grad_ = true; }
  // Multiplies the accumulated gradients by `factor` in the next train_step, each as soon as that
  // step has added its part (weighting micro-batches of different sizes; the Trainer's
  // --grad-accum). Under overlapped data parallelism this happens before the gradient's bucket is
  // reduced, so the result is that of scaling after the step.
  void scale_gradients_in_next_step(double factor);
  void train() { training_ = true; }
  void eval() { training_ = false; }
  bool is_training() const { return training_; }

  // The user inputs (model inputs, then loss targets) and outputs (loss, additional outputs) of
  // the training graph, or of the eval graph with training = false.
  std::vector<std::string> input_names(bool training = true) const;
  std::vector<std::string> output_names(bool training = true) const;
  int64_t get_parameters_size(bool trainable_only = true) const { return state_.buffer_numel(trainable_only); }
  Tensor get_contiguous_parameters(bool trainable_only = true) const {
    return state_.to_contiguous_buffer(trainable_only);
  }
  void copy_buffer_to_parameters(const Tensor& buffer, bool trainable_only = true) {
    state_.fill_parameters_from_buffer(buffer, trainable_only);
  }
  // Writes the eval graph with the current parameters as initializers and the named outputs,
  // ready for InferenceSession or ONNX Runtime.
  void export_model_for_inferencing(const std::string& path, const std::vector<std::string>& output_names) const;

  // The training graph's arena after the last train step: planned bytes, the peak of live bytes
  // and the part of it held by stashed activations (forward values the backward reads).
  std::string memory_report() const;

  // Per-node kernel times of the training graph (forward, backward, gradient accumulation; not
  // the optimizer's update), summed since the Module was made. Empty unless the environment held
  // ONNXTRAIN_PROFILE=1 when it was made (profiling times every kernel call).
  std::vector<NodeProfile> profile() const;

  CheckpointState& state() { return state_; }
  const std::vector<std::string>& trainable_parameters() const { return trainable_; }
  // fp16 artifacts: the training graph takes a loss scale, which Module feeds from the
  // checkpoint (CheckpointState::kLossScaleProperty; Optimizer::step moves it).
  bool has_loss_scaler() const;
  Device device() const { return device_; }

 private:
  struct Graphs;
  friend class Optimizer;    // connects its gradient allreducer to the training graph's backward
  friend struct CompileAccess;  // compile_artifacts reads the executors' recorded plans
  // Indices into trainable_parameters() in the order the backward finishes their gradients.
  std::vector<size_t> gradient_ready_order() const;
  std::vector<Tensor> run(bool training, const std::vector<Tensor>& inputs,
                          const std::function<bool(size_t, const Tensor&)>& on_output_ready = {},
                          const std::vector<Tensor>& output_buffers = {});
  // Per training output: the buffer its gradient may be written into (see train_step).
  std::vector<Tensor> gradient_buffers();
  std::vector<Tensor> device_gradient_buffers();

  CheckpointState& state_;
  Device device_ = Device::kCpu;
  std::unique_ptr<Graphs> graphs_;
  std::vector<std::string> trainable_;
  bool training_ = true;
  bool reset_grad_ = true;
  double next_gradient_scale_ = 1.0;
};

// Parameters named here take their own hyperparameters (lr, weight decay, betas, ...); the
// update rule (config.type) must be the optimizer's own.
struct ParamGroup {
  std::vector<std::string> params;
  OptimizerConfig config;
};

class Optimizer {
 public:
  // The update rule and its hyperparameters come from the optimizer model's update node.
  Optimizer(const std::string& optimizer_model_path, Module& module);
  Optimizer(OptimizerConfig config, Module& module);
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One fused multi-tensor update of every trainable parameter from its gradient; the step count
  // and moments live in the checkpoint's optimizer state. With a loss scaler (fp16 artifacts) it
  // first checks every gradient: an inf or NaN skips the update (StepStats::skipped) and halves
  // the scale; 2000 finite steps in a row double it (src/optim/loss_scaler.h). On a device Module
  // AdamW (torch's or transformers', float32, no amsgrad) updates on the device, where the
  // gradient norm for clipping stays: StepStats::grad_norm is then -1 unless param groups are set
  // (their global clipping norm is read back). Other rules update on the CPU with copies, said
  // once per process by name.
  StepStats step();
  void set_learning_rate(double lr);
  double get_learning_rate() const;
  int64_t step_count() const;

  // Data parallelism (onnxtrain/distributed.h): from now on step() first averages the gradients
  // over the ranks of distributed_init()'s world. All ranks must call it together; it throws,
  // naming the ranks, when their parameters or optimizer state differ.
  void set_data_parallel(const DataParallelOptions& options);

  // Per-parameter hyperparameters: every group's parameters are updated with its config, the
  // rest with the optimizer's. Gradient clipping (the optimizer's max_grad_norm) stays global:
  // with groups the gradients are scaled in place before the updates. Calling it again replaces
  // the groups (the moments are kept); an empty list removes them.
  void set_param_groups(const std::vector<ParamGroup>& groups);
  const std::vector<ParamGroup>& param_groups() const;
  DataParallelStats data_parallel_stats() const;
  const DataParallelOptions& data_parallel_options() const;

 private:
  struct Rule;  // the update kernels and their state (src/optim)
  void load_state();
  void store_state();
  StepStats grouped_step(std::vector<Tensor>& params, std::vector<Tensor>& grads);
  StepStats device_step(DeviceState& state);

  Module& module_;
  std::unique_ptr<Rule> rule_;
};

// Learning-rate schedulers with ONNX Runtime's semantics: the learning rate is
// initial_lr * multiplier(optimizer.step_count()), set on the optimizer when the scheduler is
// built and by every step() (call it after Optimizer::step()). Reading the optimizer's count makes
// a resumed run continue the schedule where it stopped.
//
//   LinearLRScheduler    ONNX Runtime's LinearLRScheduler: step / max(1, warmup) during warmup,
//                        then max(0, (total - step) / max(1, total - warmup))
//   CosineLRScheduler    transformers' cosine schedule with warmup (num_cycles 0.5: down to 0)
//   StepLRScheduler      torch's StepLR: gamma ^ (step / step_size)
//   ConstantLRScheduler  transformers' constant schedule with warmup: linear warmup, then 1
class LRScheduler {
 public:
  ~LRScheduler();
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Sets the optimizer's learning rate for its current step count and returns it.
  double step();
  // The schedule's learning rate after `step` optimizer steps.
  double lr_at(int64_t step) const;

 protected:
  struct Schedule;  // src/optim/lr_scheduler.h
  LRScheduler(Optimizer& optimizer, const Schedule& schedule);

 private:
  Optimizer& optimizer_;
  std::unique_ptr<Schedule> schedule_;
};

class LinearLRScheduler : public LRScheduler {
 public:
  LinearLRScheduler(Optimizer& optimizer, int64_t warmup_step_count, int64_t total_step_count, double initial_lr);
};
class CosineLRScheduler : public LRScheduler {
 public:
  CosineLRScheduler(Optimizer& optimizer, int64_t warmup_step_count, int64_t total_step_count, double initial_lr,
                    double num_cycles = 0.5);
};
class StepLRScheduler : public LRScheduler {
 public:
  StepLRScheduler(Optimizer& optimizer, int64_t step_size, double gamma, double initial_lr);
};
class ConstantLRScheduler : public LRScheduler {
 public:
  ConstantLRScheduler(Optimizer& optimizer, int64_t warmup_step_count, double initial_lr);
};

}  // namespace onnxtrain
