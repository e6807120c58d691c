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

#include "onnxtrain/tensor.h"

namespace onnxtrain::optim {

enum class OptimizerType { kAdamW, kAdam, kHFAdamW, kSGD, kLamb, kAdagrad };

// "adamw", "adam", "hf_adamw", "sgd", "lamb", "adagrad"
const char* optimizer_type_name(OptimizerType type);
// Accepts the names above (case-insensitive) and "hf"; throws naming the accepted ones.
OptimizerType parse_optimizer_type(const std::string& name);

struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdamW;
  double lr = 1e-3;
  std::array<double, 2> betas{0.9, 0.999};  // Adam family and Lamb
  double eps = 1e-8;
  double weight_decay = 1e-2;               // torch.optim.AdamW's default; see defaults()
  bool amsgrad = false;                     // kAdamW, kAdam
  bool maximize = false;                    // kAdamW, kAdam, kSGD, kAdagrad (torch's maximize)
  bool correct_bias = true;                 // kHFAdamW correct_bias; kLamb bias_correction
  // kSGD
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  // kLamb (apex FusedLAMB)
  bool adam_w_mode = true;      // decoupled decay added to the update; false: L2 decay on the grad
  bool grad_averaging = true;   // m = b1*m + (1-b1)*g; false: m = b1*m + g
  bool use_nvlamb = false;      // apply the trust ratio even when weight_decay == 0
  // kAdagrad
  double lr_decay = 0.0;
  double initial_accumulator_value = 0.0;
  // All: clip the global gradient L2 norm to this value first; <= 0 disables.
  double max_grad_norm = 0.0;

  // The reference defaults of each rule: torch.optim for AdamW (wd 0.01), Adam (wd 0), SGD
  // (lr 1e-3 here: torch has no default), Adagrad (lr 1e-2, eps 1e-10); transformers' AdamW
  // (eps 1e-6, wd 0); apex FusedLAMB (eps 1e-6, wd 0.01, max_grad_norm 1).
  static OptimizerConfig defaults(OptimizerType type);

  // Throws kInvalidArgument for values the references reject (negative lr, betas outside [0, 1),
  // nesterov without momentum or with dampening, amsgrad outside Adam/AdamW, ...).
  void validate() const;

  // Names of the per-parameter state tensors, in the order the kernels take them:
  //   Adam family, Lamb: exp_avg, exp_avg_sq[, max_exp_avg_sq when amsgrad]
  //   SGD: momentum_buffer when momentum != 0, else none
  //   Adagrad: sum
  std::vector<std::string> state_names() const;
};

// Optimizer state, named so a checkpoint can store it: the number of completed steps and, per
// state name, one tensor per parameter (same shape and dtype as the parameter).
struct OptimizerState {
  int64_t step = 0;
  std::map<std::string, std::vector<Tensor>> tensors;
};

// What one step saw.
struct StepStats {
  double grad_norm = -1.0;   // global L2 norm of the gradients before clipping; -1 if not computed
  double clip_coef = 1.0;    // the factor the gradients were scaled by
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
