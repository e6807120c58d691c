// The C API (include/onnxtrain/c_api.h), part two: Module, Optimizer, LR schedulers and
// InferenceSession.
#include <cstring>
#include <map>

#include "capi/handles.h"

using namespace onnxtrain;
using namespace onnxtrain::capi;

namespace {

void require_eval(const Call& c, const OtModule& m) {
  if (!m.has_eval) c.fail("the module has no eval model (none was given to ot_module_create)");
}

// The names of the graph the module's mode selects.
const std::vector<std::string>& module_names(const Call& c, const OtModule& m, bool inputs) {
  bool training = m.module->is_training();
  if (!training) require_eval(c, m);
  if (inputs) return training ? m.train_inputs : m.eval_inputs;
  return training ? m.train_outputs : m.eval_outputs;
}

const char* nth_name(const Call& c, const std::vector<std::string>& names, size_t index, const char* what) {
  if (index >= names.size())
    c.fail(detail::concat(what, " index ", index, " is out of range (", names.size(), " ", what, "s)"));
  return names[index].c_str();
}

std::vector<Tensor> borrow_inputs(const Call& c, const OtTensorView* inputs, size_t num_inputs) {
  if (num_inputs > 0 && !inputs) c.fail("inputs is NULL");
  std::vector<Tensor> out;
  for (size_t i = 0; i < num_inputs; ++i) {
    const OtTensorView& v = inputs[i];
    out.push_back(c.borrow(v.data, v.dtype, v.shape, v.rank, detail::concat("input ", i)));
  }
  return out;
}

using StepFn = std::vector<Tensor> (Module::*)(const std::vector<Tensor>&);

OtStatus run_step(const char* function, OtModule* module, bool training, const OtTensorView* inputs,
                  size_t num_inputs, OtTensor** outputs, size_t num_outputs) {
  return guard(function, [&](Call& c) {
    OtModule& m = c.ref(module, "module");
    if (!training) require_eval(c, m);
    c.check_outputs(outputs, num_outputs, (training ? m.train_outputs : m.eval_outputs).size());
    std::vector<Tensor> feeds = borrow_inputs(c, inputs, num_inputs);
    StepFn step = training ? &Module::train_step : &Module::eval_step;
    Call::hand_out(((*m.module).*step)(feeds), outputs);
  });
}

template <typename Make>
OtStatus make_scheduler(const char* function, OtOptimizer* optimizer, OtLRScheduler** out, Make make) {
  return guard(function, [&](Call& c) {
    OtLRScheduler*& result = c.out(out, "out");
    OtOptimizer& o = c.ref(optimizer, "optimizer");
    auto s = std::make_unique<OtLRScheduler>(OtLRScheduler{o.state, o.module, o.optimizer, nullptr});
    s->scheduler = make(*o.optimizer);
    result = s.release();
  });
}

}  // namespace

extern "C" {

OtStatus ot_compile_artifacts(const char* artifact_directory, const char* const* input_names,
                              const int64_t* const* dims, const size_t* ranks, size_t num_shapes) {
  return guard(__func__, [&](Call& c) {
    const std::string dir = c.str(artifact_directory, "artifact_directory");
    OT_CHECK(num_shapes == 0 || (input_names && dims && ranks), "input_names, dims and ranks must not be NULL when "
             "num_shapes is ", num_shapes);
    std::map<std::string, Shape> shapes;
    for (size_t i = 0; i < num_shapes; ++i) {
      const std::string name = c.str(input_names[i], "input_names[i]");
      OT_CHECK(ranks[i] == 0 || dims[i], "dims[", i, "] is NULL for rank ", ranks[i]);
      OT_CHECK(shapes.emplace(name, Shape(dims[i], dims[i] + ranks[i])).second, "input '", name, "' is given twice");
    }
    compile_artifacts(dir, shapes);
  });
}

// ---- module

namespace {

void create_module(Call& c, const char* training_model_path, OtCheckpoint* checkpoint, const char* eval_model_path,
                   Device device, OtModule** out) {
  OtModule*& result = c.out(out, "out");
  auto m = std::make_unique<OtModule>();
  m->state = c.ref(checkpoint, "checkpoint").state;
  std::string eval = eval_model_path ? eval_model_path : "";
  m->module = std::make_shared<Module>(c.str(training_model_path, "training_model_path"), *m->state, eval, device);
  m->train_inputs = m->module->input_names(true);
  m->train_outputs = m->module->output_names(true);
  m->has_eval = !eval.empty();
  if (m->has_eval) {
    m->eval_inputs = m->module->input_names(false);
    m->eval_outputs = m->module->output_names(false);
  }
  result = m.release();
}

}  // namespace

OtStatus ot_module_create(const char* training_model_path, OtCheckpoint* checkpoint, const char* eval_model_path,
                          OtModule** out) {
  return guard(__func__, [&](Call& c) {
    create_module(c, training_model_path, checkpoint, eval_model_path, Device::kCpu, out);
  });
}

OtStatus ot_module_create_on_device(const char* training_model_path, OtCheckpoint* checkpoint,
                                    const char* eval_model_path, const char* device, OtModule** out) {
  return guard(__func__, [&](Call& c) {
    const std::string where = c.str(device, "device");
    if (where != "cpu" && where != "cuda")
      c.fail(detail::concat("device should be \"cpu\" or \"cuda\", got \"", where, "\""));
    create_module(c, training_model_path, checkpoint, eval_model_path, where == "cuda" ? Device::kCuda : Device::kCpu,
                  out);
  });
}

void ot_module_release(OtModule* module) { delete module; }

OtStatus ot_module_train_step(OtModule* module, const OtTensorView* inputs, size_t num_inputs, OtTensor** outputs,
                              size_t num_outputs) {
  return run_step(__func__, module, true, inputs, num_inputs, outputs, num_outputs);
}

OtStatus ot_module_eval_step(OtModule* module, const OtTensorView* inputs, size_t num_inputs, OtTensor** outputs,
                             size_t num_outputs) {
  return run_step(__func__, module, false, inputs, num_inputs, outputs, num_outputs);
}

OtStatus ot_module_lazy_reset_grad(OtModule* module) {
  return guard(__func__, [&](Call& c) { c.ref(module, "module").module->lazy_reset_grad(); });
}

OtStatus ot_module_train(OtModule* module) {
  return guard(__func__, [&](Call& c) { c.ref(module, "module").module->train(); });
}

OtStatus ot_module_eval(OtModule* module) {
  return guard(__func__, [&](Call& c) { c.ref(module, "module").module->eval(); });
}

OtStatus ot_module_is_training(const OtModule* module, int* training) {
  return guard(__func__, [&](Call& c) {
    c.ref(training, "training") = c.ref(module, "module").module->is_training() ? 1 : 0;
  });
}

OtStatus ot_module_input_count(const OtModule* module, size_t* count) {
  return guard(__func__, [&](Call& c) {
    c.ref(count, "count") = module_names(c, c.ref(module, "module"), true).size();
  });
}

OtStatus ot_module_input_name(const OtModule* module, size_t index, const char** name) {
  return guard(__func__, [&](Call& c) {
    c.ref(name, "name") = nth_name(c, module_names(c, c.ref(module, "module"), true), index, "input");
  });
}

OtStatus ot_module_output_count(const OtModule* module, size_t* count) {
  return guard(__func__, [&](Call& c) {
    c.ref(count, "count") = module_names(c, c.ref(module, "module"), false).size();
  });
}

OtStatus ot_module_output_name(const OtModule* module, size_t index, const char** name) {
  return guard(__func__, [&](Call& c) {
    c.ref(name, "name") = nth_name(c, module_names(c, c.ref(module, "module"), false), index, "output");
  });
}

OtStatus ot_module_get_parameters_size(const OtModule* module, int trainable_only, int64_t* size) {
  return guard(__func__, [&](Call& c) {
    c.ref(size, "size") = c.ref(module, "module").module->get_parameters_size(trainable_only != 0);
  });
}

OtStatus ot_module_get_contiguous_parameters(const OtModule* module, int trainable_only, void* buffer, OtDType dtype,
                                             int64_t numel) {
  return guard(__func__, [&](Call& c) {
    const Module& m = *c.ref(module, "module").module;
    Tensor out = c.borrow(buffer, dtype, &numel, 1, "buffer");
    Tensor flat = m.get_contiguous_parameters(trainable_only != 0);
    if (flat.dtype() != out.dtype() || flat.numel() != out.numel())
      c.fail(detail::concat("the parameters are ", flat.numel(), " ", dtype_name(flat.dtype()),
                            " values, the buffer holds ", out.numel(), " ", dtype_name(out.dtype())));
    if (flat.nbytes() > 0) std::memcpy(out.data(), flat.data(), flat.nbytes());
  });
}

OtStatus ot_module_copy_buffer_to_parameters(OtModule* module, int trainable_only, const void* buffer, OtDType dtype,
                                             int64_t numel) {
  return guard(__func__, [&](Call& c) {
    Module& m = *c.ref(module, "module").module;
    m.copy_buffer_to_parameters(c.borrow(buffer, dtype, &numel, 1, "buffer"), trainable_only != 0);
  });
}

OtStatus ot_module_export_model_for_inferencing(const OtModule* module, const char* path,
                                                const char* const* output_names, size_t num_output_names) {
  return guard(__func__, [&](Call& c) {
    const Module& m = *c.ref(module, "module").module;
    m.export_model_for_inferencing(c.str(path, "path"), c.names(output_names, num_output_names, "output_names"));
  });
}

// ---- optimizer

OtStatus ot_optimizer_create(const char* optimizer_model_path, OtModule* module, OtOptimizer** out) {
  return guard(__func__, [&](Call& c) {
    OtOptimizer*& result = c.out(out, "out");
    OtModule& m = c.ref(module, "module");
    auto o = std::make_unique<OtOptimizer>(OtOptimizer{m.state, m.module, nullptr});
    o->optimizer = std::make_shared<Optimizer>(c.str(optimizer_model_path, "optimizer_model_path"), *m.module);
    result = o.release();
  });
}

void ot_optimizer_release(OtOptimizer* optimizer) { delete optimizer; }

OtStatus ot_optimizer_step(OtOptimizer* optimizer) {
  return guard(__func__, [&](Call& c) { c.ref(optimizer, "optimizer").optimizer->step(); });
}

OtStatus ot_optimizer_step_report(OtOptimizer* optimizer, int* skipped, double* loss_scale) {
  return guard(__func__, [&](Call& c) {
    StepStats stats = c.ref(optimizer, "optimizer").optimizer->step();
    if (skipped) *skipped = stats.skipped ? 1 : 0;
    if (loss_scale) *loss_scale = stats.loss_scale;
  });
}

OtStatus ot_optimizer_set_learning_rate(OtOptimizer* optimizer, double learning_rate) {
  return guard(__func__, [&](Call& c) { c.ref(optimizer, "optimizer").optimizer->set_learning_rate(learning_rate); });
}

OtStatus ot_optimizer_get_learning_rate(const OtOptimizer* optimizer, double* learning_rate) {
  return guard(__func__, [&](Call& c) {
    c.ref(learning_rate, "learning_rate") = c.ref(optimizer, "optimizer").optimizer->get_learning_rate();
  });
}

OtStatus ot_optimizer_step_count(const OtOptimizer* optimizer, int64_t* count) {
  return guard(__func__, [&](Call& c) {
    c.ref(count, "count") = c.ref(optimizer, "optimizer").optimizer->step_count();
  });
}

OtStatus ot_optimizer_set_data_parallel(OtOptimizer* optimizer, int enabled, int64_t bucket_bytes, int64_t check_every,
                                        double timeout_seconds) {
  return guard(__func__, [&](Call& c) {
    DataParallelOptions o;
    o.enabled = enabled != 0;
    if (bucket_bytes > 0) o.bucket_bytes = bucket_bytes;
    o.check_every = check_every;
    if (timeout_seconds > 0) o.timeout_seconds = timeout_seconds;
    c.ref(optimizer, "optimizer").optimizer->set_data_parallel(o);
  });
}

OtStatus ot_optimizer_set_data_parallel_overlap(OtOptimizer* optimizer, int overlap,
                                                int64_t gradient_accumulation_steps) {
  return guard(__func__, [&](Call& c) {
    Optimizer& o = *c.ref(optimizer, "optimizer").optimizer;
    DataParallelOptions d = o.data_parallel_options();
    OT_CHECK(d.enabled, "the optimizer is not data parallel: call ot_optimizer_set_data_parallel first");
    d.overlap = overlap != 0;
    d.gradient_accumulation_steps = gradient_accumulation_steps;
    o.set_data_parallel(d);
  });
}

OtStatus ot_distributed_init(int* rank, int* size, int* local_rank) {
  return guard(__func__, [&](Call&) {
    const DistributedWorld w = distributed_init();
    if (rank) *rank = w.rank;
    if (size) *size = w.size;
    if (local_rank) *local_rank = w.local_rank;
  });
}

// ---- LR schedulers

OtStatus ot_lr_scheduler_create_linear(OtOptimizer* optimizer, int64_t warmup_step_count, int64_t total_step_count,
                                       double initial_lr, OtLRScheduler** out) {
  return make_scheduler(__func__, optimizer, out, [&](Optimizer& o) {
    return std::make_unique<LinearLRScheduler>(o, warmup_step_count, total_step_count, initial_lr);
  });
}

OtStatus ot_lr_scheduler_create_cosine(OtOptimizer* optimizer, int64_t warmup_step_count, int64_t total_step_count,
                                       double initial_lr, double num_cycles, OtLRScheduler** out) {
  return make_scheduler(__func__, optimizer, out, [&](Optimizer& o) {
    return std::make_unique<CosineLRScheduler>(o, warmup_step_count, total_step_count, initial_lr, num_cycles);
  });
}

OtStatus ot_lr_scheduler_create_step(OtOptimizer* optimizer, int64_t step_size, double gamma, double initial_lr,
                                     OtLRScheduler** out) {
  return make_scheduler(__func__, optimizer, out, [&](Optimizer& o) {
    return std::make_unique<StepLRScheduler>(o, step_size, gamma, initial_lr);
  });
}

OtStatus ot_lr_scheduler_create_constant(OtOptimizer* optimizer, int64_t warmup_step_count, double initial_lr,
                                         OtLRScheduler** out) {
  return make_scheduler(__func__, optimizer, out, [&](Optimizer& o) {
    return std::make_unique<ConstantLRScheduler>(o, warmup_step_count, initial_lr);
  });
}

OtStatus ot_lr_scheduler_step(OtLRScheduler* scheduler, double* learning_rate) {
  return guard(__func__, [&](Call& c) {
    double lr = c.ref(scheduler, "scheduler").scheduler->step();
    if (learning_rate) *learning_rate = lr;
  });
}

void ot_lr_scheduler_release(OtLRScheduler* scheduler) { delete scheduler; }

// ---- inference

OtStatus ot_session_create(const char* model_path, OtInferenceSession** out) {
  return guard(__func__, [&](Call& c) {
    OtInferenceSession*& result = c.out(out, "out");
    auto s = std::make_unique<OtInferenceSession>();
    s->session = std::make_unique<InferenceSession>(c.str(model_path, "model_path"));
    for (const auto& io : s->session->inputs()) s->inputs.push_back(io.name);
    for (const auto& io : s->session->outputs()) s->outputs.push_back(io.name);
    result = s.release();
  });
}

void ot_session_release(OtInferenceSession* session) { delete session; }

OtStatus ot_session_input_count(const OtInferenceSession* session, size_t* count) {
  return guard(__func__, [&](Call& c) { c.ref(count, "count") = c.ref(session, "session").inputs.size(); });
}

OtStatus ot_session_input_name(const OtInferenceSession* session, size_t index, const char** name) {
  return guard(__func__, [&](Call& c) {
    c.ref(name, "name") = nth_name(c, c.ref(session, "session").inputs, index, "input");
  });
}

OtStatus ot_session_output_count(const OtInferenceSession* session, size_t* count) {
  return guard(__func__, [&](Call& c) { c.ref(count, "count") = c.ref(session, "session").outputs.size(); });
}

OtStatus ot_session_output_name(const OtInferenceSession* session, size_t index, const char** name) {
  return guard(__func__, [&](Call& c) {
    c.ref(name, "name") = nth_name(c, c.ref(session, "session").outputs, index, "output");
  });
}

OtStatus ot_session_run(OtInferenceSession* session, const char* const* input_names, const OtTensorView* inputs,
                        size_t num_inputs, OtTensor** outputs, size_t num_outputs) {
  return guard(__func__, [&](Call& c) {
    OtInferenceSession& s = c.ref(session, "session");
    c.check_outputs(outputs, num_outputs, s.outputs.size());
    std::vector<std::string> names = c.names(input_names, num_inputs, "input_names");
    std::vector<Tensor> tensors = borrow_inputs(c, inputs, num_inputs);
    std::map<std::string, Tensor> feeds;
    for (size_t i = 0; i < names.size(); ++i)
      if (!feeds.emplace(names[i], tensors[i]).second) c.fail(detail::concat("input '", names[i], "' is given twice"));
    Call::hand_out(s.session->run(feeds), outputs);
  });
}

}  // extern "C"
