#include "optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "onnxtrain/status.h"

namespace onnxtrain::optim {

namespace {
double warmup_multiplier(int64_t step, int64_t warmup) {
  return double(step) / double(std::max<int64_t>(1, warmup));
}
}  // namespace

double linear_lr(int64_t step, int64_t warmup, int64_t total, double initial_lr) {
  if (step < warmup) return initial_lr * warmup_multiplier(step, warmup);
  double m = double(total - step) / double(std::max<int64_t>(1, total - warmup));
  return initial_lr * std::max(0.0, m);
}

double cosine_lr(int64_t step, int64_t warmup, int64_t total, double initial_lr, double num_cycles) {
  if (step < warmup) return initial_lr * warmup_multiplier(step, warmup);
  double progress = double(step - warmup) / double(std::max<int64_t>(1, total - warmup));
  double m = 0.5 * (1.0 + std::cos(std::numbers::pi * num_cycles * 2.0 * progress));
  return initial_lr * std::max(0.0, m);
}

double step_lr(int64_t step, int64_t step_size, double gamma, double initial_lr) {
  return initial_lr * std::pow(gamma, double(step / std::max<int64_t>(1, step_size)));
}

double constant_lr(int64_t step, int64_t warmup, double initial_lr) {
  if (step < warmup) return initial_lr * warmup_multiplier(step, warmup);
  return initial_lr;
}

double LRSchedule::value(int64_t step) const {
  switch (kind) {
    case LRScheduleKind::kLinear: return linear_lr(step, warmup_step_count, total_step_count, initial_lr);
    case LRScheduleKind::kCosine: return cosine_lr(step, warmup_step_count, total_step_count, initial_lr, num_cycles);
    case LRScheduleKind::kStep: return step_lr(step, step_size, gamma, initial_lr);
    case LRScheduleKind::kConstant: return constant_lr(step, warmup_step_count, initial_lr);
  }
  return initial_lr;
}

void LRSchedule::validate() const {
  OT_CHECK(std::isfinite(initial_lr) && initial_lr >= 0, "LR scheduler: invalid initial_lr ", initial_lr);
  OT_CHECK(warmup_step_count >= 0, "LR scheduler: warmup_step_count must be >= 0, got ", warmup_step_count);
  if (kind == LRScheduleKind::kLinear || kind == LRScheduleKind::kCosine)
    OT_CHECK(total_step_count >= warmup_step_count, "LR scheduler: total_step_count (", total_step_count,
             ") must be >= warmup_step_count (", warmup_step_count, ")");
  if (kind == LRScheduleKind::kStep) {
    OT_CHECK(step_size >= 1, "LR scheduler: step_size must be >= 1, got ", step_size);
    OT_CHECK(std::isfinite(gamma) && gamma >= 0, "LR scheduler: invalid gamma ", gamma);
  }
  if (kind == LRScheduleKind::kCosine) OT_CHECK(std::isfinite(num_cycles), "LR scheduler: invalid num_cycles ", num_cycles);
}

namespace {
LRSchedule validated(LRSchedule s) {
  s.validate();
  return s;
}
}  // namespace

LRSchedule LRSchedule::linear(int64_t warmup, int64_t total, double lr) {
  return validated({.kind = LRScheduleKind::kLinear, .initial_lr = lr, .warmup_step_count = warmup,
                    .total_step_count = total});
}

LRSchedule LRSchedule::cosine(int64_t warmup, int64_t total, double lr, double cycles) {
  return validated({.kind = LRScheduleKind::kCosine, .initial_lr = lr, .warmup_step_count = warmup,
                    .total_step_count = total, .num_cycles = cycles});
}

LRSchedule LRSchedule::stepped(int64_t step_size, double gamma, double lr) {
  return validated({.kind = LRScheduleKind::kStep, .initial_lr = lr, .step_size = step_size, .gamma = gamma});
}

LRSchedule LRSchedule::constant(int64_t warmup, double lr) {
  return validated({.kind = LRScheduleKind::kConstant, .initial_lr = lr, .warmup_step_count = warmup});
}

}  // namespace onnxtrain::optim
