// Optimizer settings: which update rule and its hyperparameters. The rules themselves run in
// src/optim (one fused multi-tensor pass); their semantics follow torch.optim, transformers and
// apex (see src/optim/optimizer.h).
//
//   OptimizerConfig c = OptimizerConfig::defaults(OptimizerType::kAdamW);
//   c.lr = 3e-4;
#pragma once

#include <array>
#include <string>
#include <vector>

namespace onnxtrain {

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

// What one optimizer step saw.
struct StepStats {
  double grad_norm = -1.0;   // global L2 norm of the gradients before clipping; -1 if not computed
  double clip_coef = 1.0;    // the factor the gradients were scaled by
  // fp16 mixed precision (dynamic loss scaling): true when a gradient was inf or NaN and the
  // update was skipped; loss_scale is the scale after this step (0 without loss scaling).
  bool skipped = false;
  double loss_scale = 0.0;
};

}  // namespace onnxtrain
