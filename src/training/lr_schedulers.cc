// The public LR schedulers (include/onnxtrain/module.h): the schedules of src/optim/lr_scheduler.h,
// driven by an Optimizer's step count as ONNX Runtime's schedulers are.
#include "optim/lr_scheduler.h"
#include "training/module.h"

namespace onnxtrain {

struct LRScheduler::Schedule : optim::LRSchedule {};

LRScheduler::LRScheduler(Optimizer& optimizer, const Schedule& schedule)
    : optimizer_(optimizer), schedule_(std::make_unique<Schedule>(schedule)) {
  step();
}

LRScheduler::~LRScheduler() = default;

double LRScheduler::step() {
  double lr = lr_at(optimizer_.step_count());
  optimizer_.set_learning_rate(lr);
  return lr;
}

double LRScheduler::lr_at(int64_t step) const { return schedule_->value(step); }

LinearLRScheduler::LinearLRScheduler(Optimizer& optimizer, int64_t warmup_step_count, int64_t total_step_count,
                                     double initial_lr)
    : LRScheduler(optimizer, {optim::LRSchedule::linear(warmup_step_count, total_step_count, initial_lr)}) {}

CosineLRScheduler::CosineLRScheduler(Optimizer& optimizer, int64_t warmup_step_count, int64_t total_step_count,
                                     double initial_lr, double num_cycles)
    : LRScheduler(optimizer, {optim::LRSchedule::cosine(warmup_step_count, total_step_count, initial_lr, num_cycles)}) {}

StepLRScheduler::StepLRScheduler(Optimizer& optimizer, int64_t step_size, double gamma, double initial_lr)
    : LRScheduler(optimizer, {optim::LRSchedule::stepped(step_size, gamma, initial_lr)}) {}

ConstantLRScheduler::ConstantLRScheduler(Optimizer& optimizer, int64_t warmup_step_count, double initial_lr)
    : LRScheduler(optimizer, {optim::LRSchedule::constant(warmup_step_count, initial_lr)}) {}

}  // namespace onnxtrain
