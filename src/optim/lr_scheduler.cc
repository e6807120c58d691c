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

LRScheduler::LRScheduler(LRSchedule schedule) : schedule_(schedule) { schedule_.validate(); }

void LRScheduler::set_step_count(int64_t step) {
  OT_CHECK(step >= 0, "LR scheduler: step count must be >= 0, got ", step);
  step_ = step;
}

namespace {
LRSchedule make(LRScheduleKind kind, double initial_lr) {
  LRSchedule s;
  s.kind = kind;
  s.initial_lr = initial_lr;
  return s;
}
LRSchedule linear(int64_t warmup, int64_t total, double lr) {
  LRSchedule s = make(LRScheduleKind::kLinear, lr);
  s.warmup_step_count = warmup;
  s.total_step_count = total;
  return s;
}
LRSchedule cosine(int64_t warmup, int64_t total, double lr, double cycles) {
  LRSchedule s = make(LRScheduleKind::kCosine, lr);
  s.warmup_step_count = warmup;
  s.total_step_count = total;
  s.num_cycles = cycles;
  return s;
}
LRSchedule stepped(int64_t step_size, double gamma, double lr) {
  LRSchedule s = make(LRScheduleKind::kStep, lr);
  s.step_size = step_size;
  s.gamma = gamma;
  return s;
}
LRSchedule constant(int64_t warmup, double lr) {
  LRSchedule s = make(LRScheduleKind::kConstant, lr);
  s.warmup_step_count = warmup;
  return s;
}
}  // namespace

LinearLRScheduler::LinearLRScheduler(int64_t warmup, int64_t total, double initial_lr)
    : LRScheduler(linear(warmup, total, initial_lr)) {}
CosineLRScheduler::CosineLRScheduler(int64_t warmup, int64_t total, double initial_lr, double num_cycles)
    : LRScheduler(cosine(warmup, total, initial_lr, num_cycles)) {}
StepLRScheduler::StepLRScheduler(int64_t step_size, double gamma, double initial_lr)
    : LRScheduler(stepped(step_size, gamma, initial_lr)) {}
ConstantLRScheduler::ConstantLRScheduler(int64_t warmup, double initial_lr)
    : LRScheduler(constant(warmup, initial_lr)) {}

}  // namespace onnxtrain::optim
