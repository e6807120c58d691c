// The C API (include/onnxtrain/c_api.h), part one: errors, tensors, checkpoints and artifacts.
// Module, optimizer, schedulers and inference are in c_api_training.cc.
#include <climits>
#include <cstring>
#include <utility>
#include <new>

#include "capi/handles.h"
#include "core/parallel.h"
#include "onnxtrain/artifacts.h"
#include "passes/mixed_precision.h"

using namespace onnxtrain;
using namespace onnxtrain::capi;

namespace onnxtrain::capi {

namespace {

thread_local std::string t_last_error;

void set_last_error(const char* message) noexcept {
  try {
    t_last_error = message;
  } catch (...) {
    t_last_error.clear();  // no memory for the message: the status still says what happened
  }
}

}  // namespace

void clear_last_error() noexcept { t_last_error.clear(); }

OtStatus status_of_current_exception() noexcept {
  try {
    throw;
  } catch (const Error& e) {
    set_last_error(e.what());
    switch (e.code()) {
      case ErrorCode::kInvalidArgument: return OT_INVALID_ARGUMENT;
      case ErrorCode::kInvalidModel: return OT_INVALID_MODEL;
      case ErrorCode::kNotImplemented: return OT_NOT_IMPLEMENTED;
      case ErrorCode::kRuntime: return OT_RUNTIME_ERROR;
    }
    return OT_RUNTIME_ERROR;
  } catch (const std::bad_alloc&) {
    set_last_error("out of memory");
  } catch (const std::exception& e) {
    set_last_error(e.what());
  } catch (...) {
    set_last_error("unknown error");
  }
  return OT_RUNTIME_ERROR;
}

void Call::fail(const std::string& message) const {
  OT_THROW(kInvalidArgument, "[C API] ", function_, ": ", message);
}

void Call::null_argument(const char* what) const { fail(std::string(what) + " is NULL"); }

std::vector<std::string> Call::names(const char* const* list, size_t n, const char* what) const {
  if (n > 0 && !list) null_argument(what);
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) {
    if (!list[i]) fail(detail::concat(what, "[", i, "] is NULL"));
    out.emplace_back(list[i]);
  }
  return out;
}

DType dtype_from_c(OtDType dtype, const std::string& what) {
  DType dt = static_cast<DType>(dtype);
  OT_CHECK(int(dtype) > 0 && dtype_supported(dt), what, ": dtype ", int(dtype),
           " is not a supported ONNX tensor data type");
  return dt;
}

Tensor Call::borrow(const void* data, OtDType dtype, const int64_t* shape, size_t rank, const std::string& what) const {
  DType dt = dtype_from_c(dtype, detail::concat("[C API] ", function_, ": ", what));
  if (rank > 0 && !shape) fail(detail::concat(what, ": shape is NULL for rank ", rank));
  Shape dims(shape, shape + rank);
  int64_t count = 1;
  for (int64_t d : dims) {
    if (d < 0 || __builtin_mul_overflow(count, d, &count) || count > INT64_MAX / 16)
      fail(detail::concat(what, ": invalid shape ", shape_str(dims)));
  }
  if (count > 0 && !data) fail(what + ": data is NULL");
  return Tensor::borrow(dt, std::move(dims), const_cast<void*>(data));
}

void Call::check_outputs(OtTensor** outputs, size_t num_outputs, size_t expected) const {
  if (num_outputs != expected)
    fail(detail::concat("expected room for ", expected, " outputs, got ", num_outputs));
  if (expected > 0 && !outputs) null_argument("outputs");
  for (size_t i = 0; i < num_outputs; ++i) outputs[i] = nullptr;
}

void Call::hand_out(std::vector<Tensor> results, OtTensor** outputs) {
  std::vector<std::unique_ptr<OtTensor>> made;  // all allocated before any is handed over
  for (auto& t : results) made.push_back(std::make_unique<OtTensor>(OtTensor{std::move(t)}));
  for (size_t i = 0; i < made.size(); ++i) outputs[i] = made[i].release();
}

}  // namespace onnxtrain::capi

namespace {

// Copies between a parameter and caller memory after checking the caller's dtype and shape.
void check_like(const Call& c, const Parameter& p, const Tensor& caller) {
  if (caller.dtype() != p.dtype() || caller.shape() != p.shape())
    c.fail(detail::concat("parameter '", p.name(), "' is ", dtype_name(p.dtype()), " ", shape_str(p.shape()),
                          ", the buffer is ", dtype_name(caller.dtype()), " ", shape_str(caller.shape())));
}

const PropertyValue& property(const Call& c, const CheckpointState& s, const char* name) {
  if (!s.has_property(c.str(name, "name"))) c.fail(detail::concat("no property named '", name, "'"));
  return s.get_property(name);
}

template <typename T>
const T& typed_property(const Call& c, const CheckpointState& s, const char* name, const char* type) {
  const PropertyValue& v = property(c, s, name);
  if (!std::holds_alternative<T>(v))
    c.fail(detail::concat("property '", name, "' is ", property_type_name(v), ", not ", type));
  return std::get<T>(v);
}

const std::string& nth_property_name(const Call& c, const CheckpointState& s, size_t index) {
  if (index >= s.properties().size())
    c.fail(detail::concat("property index ", index, " is out of range (", s.properties().size(), " properties)"));
  return std::next(s.properties().begin(), std::ptrdiff_t(index))->first;
}

LossType loss_from_c(const Call& c, OtLossType loss) {
  switch (loss) {
    case OT_LOSS_MSE: return LossType::kMSE;
    case OT_LOSS_L1: return LossType::kL1;
    case OT_LOSS_SMOOTH_L1: return LossType::kSmoothL1;
    case OT_LOSS_HUBER: return LossType::kHuber;
    case OT_LOSS_CROSS_ENTROPY: return LossType::kCrossEntropy;
    case OT_LOSS_NLL: return LossType::kNLL;
    case OT_LOSS_BCE: return LossType::kBCE;
    case OT_LOSS_BCE_WITH_LOGITS: return LossType::kBCEWithLogits;
    case OT_LOSS_KL_DIV: return LossType::kKLDiv;
  }
  c.fail(detail::concat("unknown loss type ", int(loss)));
}

OptimizerType optimizer_from_c(const Call& c, OtOptimizerType type) {
  switch (type) {
    case OT_OPTIMIZER_ADAMW: return OptimizerType::kAdamW;
    case OT_OPTIMIZER_ADAM: return OptimizerType::kAdam;
    case OT_OPTIMIZER_HF_ADAMW: return OptimizerType::kHFAdamW;
    case OT_OPTIMIZER_SGD: return OptimizerType::kSGD;
    case OT_OPTIMIZER_LAMB: return OptimizerType::kLamb;
    case OT_OPTIMIZER_ADAGRAD: return OptimizerType::kAdagrad;
  }
  c.fail(detail::concat("unknown optimizer type ", int(type)));
}

}  // namespace

extern "C" {

// ---- errors, version, threads

const char* ot_last_error(void) { return t_last_error.c_str(); }

const char* ot_status_name(OtStatus status) {
  switch (status) {
    case OT_OK: return "OK";
    case OT_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case OT_INVALID_MODEL: return "INVALID_MODEL";
    case OT_NOT_IMPLEMENTED: return "NOT_IMPLEMENTED";
    case OT_RUNTIME_ERROR: return "RUNTIME_ERROR";
  }
  return "UNKNOWN_STATUS";
}

const char* ot_version(void) { return ONNXTRAIN_VERSION_STRING; }

OtStatus ot_set_num_threads(int num_threads) {
  return guard(__func__, [&](Call&) { set_num_threads(num_threads); });
}

// ---- tensors

OtStatus ot_tensor_info(const OtTensor* tensor, OtDType* dtype, const int64_t** shape, size_t* rank) {
  return guard(__func__, [&](Call& c) {
    const Tensor& t = c.ref(tensor, "tensor").tensor;
    if (dtype) *dtype = static_cast<OtDType>(t.dtype());
    if (shape) *shape = t.shape().data();
    if (rank) *rank = t.shape().size();
  });
}

OtStatus ot_tensor_data(const OtTensor* tensor, const void** data) {
  return guard(__func__, [&](Call& c) {
    const Tensor& t = c.ref(tensor, "tensor").tensor;
    c.ref(data, "data") = t.data();
  });
}

void ot_tensor_release(OtTensor* tensor) { delete tensor; }

// ---- checkpoint

OtStatus ot_checkpoint_load(const char* path, OtCheckpoint** out) {
  return guard(__func__, [&](Call& c) {
    OtCheckpoint*& result = c.out(out, "out");
    auto state = std::make_shared<CheckpointState>(CheckpointState::load(c.str(path, "path")));
    result = new OtCheckpoint{std::move(state)};
  });
}

OtStatus ot_checkpoint_save(const OtCheckpoint* checkpoint, const char* path, int include_optimizer_state) {
  return guard(__func__, [&](Call& c) {
    c.ref(checkpoint, "checkpoint").state->save(c.str(path, "path"), include_optimizer_state != 0);
  });
}

OtStatus ot_checkpoint_save_as(const OtCheckpoint* checkpoint, const char* path, int include_optimizer_state,
                               OtCheckpointFormat format) {
  return guard(__func__, [&](Call& c) {
    if (format != OT_CHECKPOINT_ONNXTRAIN && format != OT_CHECKPOINT_ORT)
      c.fail(detail::concat("format: expected OT_CHECKPOINT_ONNXTRAIN (0) or OT_CHECKPOINT_ORT (1), got ", int(format)));
    c.ref(checkpoint, "checkpoint")
        .state->save(c.str(path, "path"), include_optimizer_state != 0,
                     format == OT_CHECKPOINT_ORT ? CheckpointFormat::kOrt : CheckpointFormat::kOnnxtrain);
  });
}

OtStatus ot_checkpoint_file_format(const char* path, OtCheckpointFormat* format) {
  return guard(__func__, [&](Call& c) {
    const CheckpointFormat f = CheckpointState::file_format(c.str(path, "path"));
    c.ref(format, "format") = f == CheckpointFormat::kOrt ? OT_CHECKPOINT_ORT : OT_CHECKPOINT_ONNXTRAIN;
  });
}

void ot_checkpoint_release(OtCheckpoint* checkpoint) { delete checkpoint; }

OtStatus ot_checkpoint_parameter_count(const OtCheckpoint* checkpoint, size_t* count) {
  return guard(__func__, [&](Call& c) {
    c.ref(count, "count") = c.ref(checkpoint, "checkpoint").state->num_parameters();
  });
}

OtStatus ot_checkpoint_parameter_name(const OtCheckpoint* checkpoint, size_t index, const char** name) {
  return guard(__func__, [&](Call& c) {
    const auto& params = c.ref(checkpoint, "checkpoint").state->parameters();
    c.ref(name, "name");
    if (index >= params.size())
      c.fail(detail::concat("parameter index ", index, " is out of range (", params.size(), " parameters)"));
    *name = params[index].name().c_str();
  });
}

OtStatus ot_checkpoint_parameter_info(const OtCheckpoint* checkpoint, const char* name, OtDType* dtype,
                                      const int64_t** shape, size_t* rank, int* requires_grad) {
  return guard(__func__, [&](Call& c) {
    const Parameter& p = std::as_const(*c.ref(checkpoint, "checkpoint").state).parameter(c.str(name, "name"));
    if (dtype) *dtype = static_cast<OtDType>(p.dtype());
    if (shape) *shape = p.shape().data();
    if (rank) *rank = p.shape().size();
    if (requires_grad) *requires_grad = p.requires_grad() ? 1 : 0;
  });
}

OtStatus ot_checkpoint_get_parameter(const OtCheckpoint* checkpoint, const char* name, void* data, OtDType dtype,
                                     const int64_t* shape, size_t rank) {
  return guard(__func__, [&](Call& c) {
    const Parameter& p = std::as_const(*c.ref(checkpoint, "checkpoint").state).parameter(c.str(name, "name"));
    Tensor buffer = c.borrow(data, dtype, shape, rank, "buffer");
    check_like(c, p, buffer);
    const Tensor& value = p.data();  // throws for a nominal parameter
    if (value.nbytes() > 0) std::memcpy(buffer.data(), value.data(), value.nbytes());
  });
}

OtStatus ot_checkpoint_set_parameter(OtCheckpoint* checkpoint, const char* name, const void* data, OtDType dtype,
                                     const int64_t* shape, size_t rank) {
  return guard(__func__, [&](Call& c) {
    Parameter& p = c.ref(checkpoint, "checkpoint").state->parameter(c.str(name, "name"));
    Tensor value = c.borrow(data, dtype, shape, rank, "value");
    check_like(c, p, value);
    p.set_data(value);
  });
}

OtStatus ot_checkpoint_set_int_property(OtCheckpoint* checkpoint, const char* name, int64_t value) {
  return guard(__func__, [&](Call& c) {
    c.ref(checkpoint, "checkpoint").state->add_property(c.str(name, "name"), value);
  });
}

OtStatus ot_checkpoint_set_float_property(OtCheckpoint* checkpoint, const char* name, double value) {
  return guard(__func__, [&](Call& c) {
    c.ref(checkpoint, "checkpoint").state->add_property(c.str(name, "name"), value);
  });
}

OtStatus ot_checkpoint_set_string_property(OtCheckpoint* checkpoint, const char* name, const char* value) {
  return guard(__func__, [&](Call& c) {
    c.ref(checkpoint, "checkpoint").state->add_property(c.str(name, "name"), std::string(c.str(value, "value")));
  });
}

OtStatus ot_checkpoint_get_property_type(const OtCheckpoint* checkpoint, const char* name, OtPropertyType* type) {
  return guard(__func__, [&](Call& c) {
    const CheckpointState& s = *c.ref(checkpoint, "checkpoint").state;
    OtPropertyType& result = c.ref(type, "type");
    if (!s.has_property(c.str(name, "name"))) {
      result = OT_PROPERTY_NONE;
      return;
    }
    const PropertyValue& v = s.get_property(name);
    result = std::holds_alternative<int64_t>(v) ? OT_PROPERTY_INT
             : std::holds_alternative<double>(v) ? OT_PROPERTY_FLOAT
                                                 : OT_PROPERTY_STRING;
  });
}

OtStatus ot_checkpoint_get_int_property(const OtCheckpoint* checkpoint, const char* name, int64_t* value) {
  return guard(__func__, [&](Call& c) {
    c.ref(value, "value") = typed_property<int64_t>(c, *c.ref(checkpoint, "checkpoint").state, name, "int");
  });
}

OtStatus ot_checkpoint_get_float_property(const OtCheckpoint* checkpoint, const char* name, double* value) {
  return guard(__func__, [&](Call& c) {
    c.ref(value, "value") = typed_property<double>(c, *c.ref(checkpoint, "checkpoint").state, name, "float");
  });
}

OtStatus ot_checkpoint_get_string_property(const OtCheckpoint* checkpoint, const char* name, const char** value) {
  return guard(__func__, [&](Call& c) {
    c.ref(value, "value") =
        typed_property<std::string>(c, *c.ref(checkpoint, "checkpoint").state, name, "string").c_str();
  });
}

OtStatus ot_checkpoint_remove_property(OtCheckpoint* checkpoint, const char* name) {
  return guard(__func__, [&](Call& c) {
    CheckpointState& s = *c.ref(checkpoint, "checkpoint").state;
    property(c, s, name);
    s.remove_property(name);
  });
}

OtStatus ot_checkpoint_property_count(const OtCheckpoint* checkpoint, size_t* count) {
  return guard(__func__, [&](Call& c) {
    c.ref(count, "count") = c.ref(checkpoint, "checkpoint").state->properties().size();
  });
}

OtStatus ot_checkpoint_property_name(const OtCheckpoint* checkpoint, size_t index, const char** name) {
  return guard(__func__, [&](Call& c) {
    c.ref(name, "name") = nth_property_name(c, *c.ref(checkpoint, "checkpoint").state, index).c_str();
  });
}

// ---- artifacts

OtStatus ot_artifact_options_create(OtArtifactOptions** out) {
  return guard(__func__, [&](Call& c) {
    OtArtifactOptions*& result = c.out(out, "out");
    result = new OtArtifactOptions{};
  });
}

void ot_artifact_options_release(OtArtifactOptions* options) { delete options; }

OtStatus ot_artifact_options_set_requires_grad(OtArtifactOptions* options, const char* const* names,
                                               size_t num_names) {
  return guard(__func__, [&](Call& c) {
    c.ref(options, "options").options.graphs.requires_grad = c.names(names, num_names, "names");
  });
}

OtStatus ot_artifact_options_set_frozen_params(OtArtifactOptions* options, const char* const* names,
                                               size_t num_names) {
  return guard(__func__, [&](Call& c) {
    c.ref(options, "options").options.graphs.frozen_params = c.names(names, num_names, "names");
  });
}

OtStatus ot_artifact_options_set_loss(OtArtifactOptions* options, OtLossType loss) {
  return guard(__func__, [&](Call& c) { c.ref(options, "options").options.graphs.loss = loss_from_c(c, loss); });
}

OtStatus ot_artifact_options_set_optimizer(OtArtifactOptions* options, OtOptimizerType optimizer,
                                           double learning_rate) {
  return guard(__func__, [&](Call& c) {
    ArtifactOptions& o = c.ref(options, "options").options;
    OptimizerConfig config = OptimizerConfig::defaults(optimizer_from_c(c, optimizer));
    config.lr = learning_rate;
    config.validate();
    o.optimizer = config;
  });
}

OtStatus ot_artifact_options_set_additional_output_names(OtArtifactOptions* options, const char* const* names,
                                                         size_t num_names) {
  return guard(__func__, [&](Call& c) {
    c.ref(options, "options").options.graphs.additional_output_names = c.names(names, num_names, "names");
  });
}

OtStatus ot_artifact_options_set_nominal_checkpoint(OtArtifactOptions* options, int nominal) {
  return guard(__func__, [&](Call& c) { c.ref(options, "options").options.nominal_checkpoint = nominal != 0; });
}

OtStatus ot_artifact_options_set_mixed_precision(OtArtifactOptions* options, const char* mode) {
  return guard(__func__, [&](Call& c) {
    std::string m = mode ? mode : "";
    mixed_precision_dtype(m);  // an unknown mode fails here, naming it
    c.ref(options, "options").options.graphs.mixed_precision = m;
  });
}

OtStatus ot_artifact_options_set_memory_optimizer(OtArtifactOptions* options, int level, const char* config) {
  return guard(__func__, [&](Call& c) {
    MemoryOptimizerOptions& m = c.ref(options, "options").options.memory;
    OT_CHECK(level >= 0 && level <= 2, "memory optimizer level must be 0, 1 or 2, got ", level);
    m.level = level;
    m.config = config ? config : "";
  });
}

OtStatus ot_artifact_options_set_compute_optimizer(OtArtifactOptions* options, int enabled) {
  return guard(__func__, [&](Call& c) { c.ref(options, "options").options.graphs.compute_optimizer = enabled != 0; });
}

OtStatus ot_artifact_options_set_label_sparsity(OtArtifactOptions* options, int enabled) {
  return guard(__func__, [&](Call& c) { c.ref(options, "options").options.graphs.label_sparsity = enabled != 0; });
}

OtStatus ot_artifact_options_set_ort_compatible(OtArtifactOptions* options, int enabled) {
  return guard(__func__, [&](Call& c) { c.ref(options, "options").options.graphs.ort_compatible = enabled != 0; });
}

OtStatus ot_generate_artifacts(const char* model_path, const OtArtifactOptions* options,
                               const char* artifact_directory) {
  return guard(__func__, [&](Call& c) {
    ArtifactOptions o = c.ref(options, "options").options;
    o.directory = c.str(artifact_directory, "artifact_directory");
    generate_artifacts(std::string(c.str(model_path, "model_path")), o);
  });
}

}  // extern "C"
