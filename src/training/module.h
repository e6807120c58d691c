// Module and Optimizer: ONNX Runtime's on-device training loop objects over onnxtrain's executor.
//
//   CheckpointState state = CheckpointState::load("out/checkpoint");
//   Module module("out/training_model.onnx", state, "out/eval_model.onnx");
//   Optimizer optimizer("out/optimizer_model.onnx", module);
//   auto loss = module.train_step({x, y});  optimizer.step();  module.lazy_reset_grad();
//
// Parameters live in the CheckpointState and are fed to the graphs without copies; each train
// step adds the graph's "<param>_grad" outputs into the parameters' gradient slots (gradient
// accumulation), unless lazy_reset_grad() asked for the next step to overwrite them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "onnxtrain/training.h"
#include "optim/optimizer.h"

namespace onnxtrain {

class Executor;

class Module {
 public:
  Module(const std::string& training_model_path, CheckpointState& state, const std::string& eval_model_path = "");
  Module(Model training_model, CheckpointState& state, std::optional<Model> eval_model);
  ~Module();

  // Forward, backward and gradient accumulation; returns the loss and any additional outputs.
  std::vector<Tensor> train_step(const std::vector<Tensor>& inputs);
  // Forward and loss with inference-mode Dropout/BatchNorm; needs the eval model.
  std::vector<Tensor> eval_step(const std::vector<Tensor>& inputs);
  void lazy_reset_grad() { reset_grad_ = true; }
  void train() { training_ = true; }
  void eval() { training_ = false; }
  bool is_training() const { return training_; }

  std::vector<std::string> input_names(bool training = true) const;
  std::vector<std::string> output_names(bool training = true) const;
  int64_t get_parameters_size(bool trainable_only = true) const { return state_.buffer_numel(trainable_only); }
  Tensor get_contiguous_parameters(bool trainable_only = true) const { return state_.to_contiguous_buffer(trainable_only); }
  void copy_buffer_to_parameters(const Tensor& buffer, bool trainable_only = true) {
    state_.fill_parameters_from_buffer(buffer, trainable_only);
  }
  // Writes the eval graph (or the training graph's forward) with the current parameters as
  // initializers and the named outputs, ready for InferenceSession or ONNX Runtime.
  void export_model_for_inferencing(const std::string& path, const std::vector<std::string>& output_names) const;

  CheckpointState& state() { return state_; }
  const std::vector<std::string>& trainable_parameters() const { return trainable_; }

 private:
  struct Graphs;
  std::vector<Tensor> run(bool training, const std::vector<Tensor>& inputs);

  CheckpointState& state_;
  std::unique_ptr<Graphs> graphs_;
  std::vector<std::string> trainable_;
  bool training_ = true;
  bool reset_grad_ = true;
};

class Optimizer {
 public:
  // The update rule and its hyperparameters come from the optimizer model's update node.
  Optimizer(const std::string& optimizer_model_path, Module& module);
  Optimizer(optim::OptimizerConfig config, Module& module);

  // One fused multi-tensor update of every trainable parameter from its gradient; the step count
  // and moments live in the checkpoint's optimizer state.
  optim::StepStats step();
  void set_learning_rate(double lr);
  double get_learning_rate() const { return optimizer_.lr(); }
  int64_t step_count() const;

 private:
  void load_state();
  void store_state();

  Module& module_;
  optim::MultiTensorOptimizer optimizer_;
  optim::OptimizerState state_;
};

}  // namespace onnxtrain
