// Parameter update rules ("optim": not to be confused with graph passes). Every rule runs as ONE
// multi-tensor pass: the parameters are seen as one concatenated space cut into chunks, the chunks
// are spread over the OpenMP pool, and the inner loops are vectorised. Semantics and defaults
// follow the reference implementations, so a model trained here and in PyTorch with the same
// settings follows the same curve:
//
//   kAdamW    torch.optim.AdamW   decoupled decay p *= 1 - lr*wd, bias correction, amsgrad
//   kAdam     torch.optim.Adam    L2 decay g += wd*p, bias correction, amsgrad
//   kHFAdamW  transformers.AdamW  eps outside the bias correction, correct_bias flag, decay after
//                                 the step (p -= lr*wd*p_new)
//   kSGD      torch.optim.SGD     momentum (buffer = g on the first step), dampening, nesterov, L2
//   kLamb     apex FusedLAMB      Adam moments, per-tensor trust ratio |p| / |update|
//   kAdagrad  torch.optim.Adagrad lr_decay, initial_accumulator_value, eps
//
// Optional global gradient clipping (max_grad_norm > 0) first computes the L2 norm over all
// gradients in one pass and scales them by min(1, max_grad_norm / (norm + 1e-6)) on the fly, as
// torch.nn.utils.clip_grad_norm_ does; the gradients themselves are left untouched.
//
// Parameters and state are updated IN PLACE (Tensor handles alias their storage). fp32 parameters
// keep fp32 state; float64 works too (tests). Parameters, gradients and state of one call share
// one dtype.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "onnxtrain/optimizer_config.h"
#include "onnxtrain/tensor.h"

namespace onnxtrain::optim {

// The settings are public (include/onnxtrain/optimizer_config.h); the kernels below are not.
using onnxtrain::OptimizerConfig;
using onnxtrain::OptimizerType;
using onnxtrain::optimizer_type_name;
using onnxtrain::parse_optimizer_type;
using onnxtrain::StepStats;

// Optimizer state, named so a checkpoint can store it: the number of completed steps and, per
// state name, one tensor per parameter (same shape and dtype as the parameter).
struct OptimizerState {
  int64_t step = 0;
  std::map<std::string, std::vector<Tensor>> tensors;
};

// The global L2 norm over all tensors (accumulated in double), in one parallel pass.
double global_l2_norm(const std::vector<Tensor>& tensors);

// One update in place: `step` is the number of this update counting from 1 (torch's state
// ["step"] after its increment). `state[k][i]` is state tensor k (config.state_names()[k]) of
// parameter i. Checks counts, dtypes and shapes and throws with the offending index.
StepStats apply_update(const OptimizerConfig& config, int64_t step, std::vector<Tensor>& params,
                       const std::vector<Tensor>& grads, std::vector<std::vector<Tensor>>& state);

class MultiTensorOptimizer {
 public:
  explicit MultiTensorOptimizer(OptimizerConfig config);

  const OptimizerConfig& config() const { return config_; }
  double lr() const { return config_.lr; }
  void set_lr(double lr);

  // Creates missing state tensors (zeros; Adagrad's sum = initial_accumulator_value) and checks
  // existing ones against the parameters.
  void init_state(const std::vector<Tensor>& params, OptimizerState& state) const;

  // state.step += 1, then one multi-tensor update of every parameter in place.
  StepStats step(std::vector<Tensor>& params, const std::vector<Tensor>& grads, OptimizerState& state) const;

 private:
  OptimizerConfig config_;
};

}  // namespace onnxtrain::optim
