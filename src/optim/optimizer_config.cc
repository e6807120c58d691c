// OptimizerConfig: names, reference defaults and validation of every update rule's settings.
#include "onnxtrain/optimizer_config.h"

#include <cctype>
#include <cmath>

#include "onnxtrain/status.h"

namespace onnxtrain {

const char* optimizer_type_name(OptimizerType type) {
  switch (type) {
    case OptimizerType::kAdamW: return "adamw";
    case OptimizerType::kAdam: return "adam";
    case OptimizerType::kHFAdamW: return "hf_adamw";
    case OptimizerType::kSGD: return "sgd";
    case OptimizerType::kLamb: return "lamb";
    case OptimizerType::kAdagrad: return "adagrad";
  }
  return "?";
}

OptimizerType parse_optimizer_type(const std::string& name) {
  std::string n;
  for (char c : name) n += char(std::tolower(static_cast<unsigned char>(c)));
  if (n == "adamw") return OptimizerType::kAdamW;
  if (n == "adam") return OptimizerType::kAdam;
  if (n == "hf_adamw" || n == "hf") return OptimizerType::kHFAdamW;
  if (n == "sgd") return OptimizerType::kSGD;
  if (n == "lamb") return OptimizerType::kLamb;
  if (n == "adagrad") return OptimizerType::kAdagrad;
  OT_THROW(kInvalidArgument, "unknown optimizer type '", name,
           "': expected one of adamw, adam, hf_adamw, sgd, lamb, adagrad");
}

OptimizerConfig OptimizerConfig::defaults(OptimizerType type) {
  OptimizerConfig c;
  c.type = type;
  switch (type) {
    case OptimizerType::kAdamW: break;  // lr 1e-3, betas (0.9, 0.999), eps 1e-8, wd 1e-2
    case OptimizerType::kAdam: c.weight_decay = 0.0; break;
    case OptimizerType::kHFAdamW: c.eps = 1e-6; c.weight_decay = 0.0; break;
    case OptimizerType::kSGD: c.weight_decay = 0.0; break;
    case OptimizerType::kLamb: c.eps = 1e-6; c.weight_decay = 0.01; c.max_grad_norm = 1.0; break;
    case OptimizerType::kAdagrad: c.lr = 1e-2; c.eps = 1e-10; c.weight_decay = 0.0; break;
  }
  return c;
}

void OptimizerConfig::validate() const {
  const char* name = optimizer_type_name(type);
  OT_CHECK(std::isfinite(lr) && lr >= 0, "optimizer ", name, ": invalid learning rate ", lr);
  OT_CHECK(eps >= 0, "optimizer ", name, ": invalid eps ", eps);
  OT_CHECK(weight_decay >= 0, "optimizer ", name, ": invalid weight_decay ", weight_decay);
  OT_CHECK(!std::isnan(max_grad_norm), "optimizer ", name, ": max_grad_norm is NaN");
  bool adam_like = type == OptimizerType::kAdamW || type == OptimizerType::kAdam ||
                   type == OptimizerType::kHFAdamW || type == OptimizerType::kLamb;
  if (adam_like) {
    OT_CHECK(betas[0] >= 0 && betas[0] < 1, "optimizer ", name, ": invalid beta1 ", betas[0], " (expected [0, 1))");
    OT_CHECK(betas[1] >= 0 && betas[1] < 1, "optimizer ", name, ": invalid beta2 ", betas[1], " (expected [0, 1))");
  }
  OT_CHECK(!amsgrad || type == OptimizerType::kAdamW || type == OptimizerType::kAdam, "optimizer ", name,
           ": amsgrad is only defined for adam and adamw");
  if (type == OptimizerType::kSGD) {
    OT_CHECK(momentum >= 0, "optimizer sgd: invalid momentum ", momentum);
    OT_CHECK(!nesterov || (momentum > 0 && dampening == 0), "optimizer sgd: nesterov momentum requires a "
             "momentum and zero dampening (momentum ", momentum, ", dampening ", dampening, ")");
  }
  if (type == OptimizerType::kAdagrad) {
    OT_CHECK(lr_decay >= 0, "optimizer adagrad: invalid lr_decay ", lr_decay);
    OT_CHECK(initial_accumulator_value >= 0, "optimizer adagrad: invalid initial_accumulator_value ",
             initial_accumulator_value);
  }
}

std::vector<std::string> OptimizerConfig::state_names() const {
  switch (type) {
    case OptimizerType::kAdamW:
    case OptimizerType::kAdam:
      if (amsgrad) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
      return {"exp_avg", "exp_avg_sq"};
    case OptimizerType::kHFAdamW:
    case OptimizerType::kLamb: return {"exp_avg", "exp_avg_sq"};
    case OptimizerType::kSGD:
      if (momentum != 0) return {"momentum_buffer"};
      return {};
    case OptimizerType::kAdagrad: return {"sum"};
  }
  return {};
}

}  // namespace onnxtrain
