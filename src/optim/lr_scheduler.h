// Learning-rate schedules: pure functions of the step.
//
// `step` is the number of scheduler steps taken so far (0 before the first update), the
// convention of torch.optim.lr_scheduler (last_epoch), transformers' LambdaLR schedules and ONNX
// Runtime's training API (which reads the optimizer's completed step count). So the learning rate
// of update number k (1-based) is schedule(k - 1), and after k updates the scheduler reports
// schedule(k).
//
//   linear_lr      ONNX Runtime's LinearLRScheduler = transformers' get_linear_schedule_with_warmup:
//                  step / max(1, warmup) during warmup, then
//                  max(0, (total - step) / max(1, total - warmup))
//   cosine_lr      transformers' get_cosine_schedule_with_warmup: after warmup,
//                  max(0, 0.5 * (1 + cos(pi * num_cycles * 2 * progress)))
//   step_lr        torch.optim.lr_scheduler.StepLR: gamma ^ (step / step_size)
//   constant_lr    transformers' get_constant_schedule_with_warmup: linear warmup, then 1
//
// Each returns initial_lr times that multiplier.
#pragma once

#include <cstdint>

namespace onnxtrain::optim {

double linear_lr(int64_t step, int64_t warmup_step_count, int64_t total_step_count, double initial_lr);
double cosine_lr(int64_t step, int64_t warmup_step_count, int64_t total_step_count, double initial_lr,
                 double num_cycles = 0.5);
double step_lr(int64_t step, int64_t step_size, double gamma, double initial_lr);
double constant_lr(int64_t step, int64_t warmup_step_count, double initial_lr);

enum class LRScheduleKind { kLinear, kCosine, kStep, kConstant };

// One schedule's parameters; value(step) evaluates it. Built by the named constructors, which
// validate. There is no step counter here: the schedulers that drive an optimizer
// (include/onnxtrain/module.h, bound to C and Python) read the optimizer's step count, so a
// resumed run continues its schedule.
struct LRSchedule {
  LRScheduleKind kind = LRScheduleKind::kConstant;
  double initial_lr = 1e-3;
  int64_t warmup_step_count = 0;  // kLinear, kCosine, kConstant
  int64_t total_step_count = 0;   // kLinear, kCosine
  double num_cycles = 0.5;        // kCosine
  int64_t step_size = 1;          // kStep
  double gamma = 0.1;             // kStep

  static LRSchedule linear(int64_t warmup_step_count, int64_t total_step_count, double initial_lr);
  static LRSchedule cosine(int64_t warmup_step_count, int64_t total_step_count, double initial_lr,
                           double num_cycles = 0.5);
  static LRSchedule stepped(int64_t step_size, double gamma, double initial_lr);
  static LRSchedule constant(int64_t warmup_step_count, double initial_lr);

  double value(int64_t step) const;
  void validate() const;          // throws on negative counts, total < warmup, step_size < 1, ...
};

}  // namespace onnxtrain::optim
