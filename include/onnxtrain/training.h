// On-device training state: CheckpointState holds parameters (with gradients and requires_grad),
// optimizer state and user properties, and saves/loads them as one checkpoint file.
//
//   auto state = onnxtrain::CheckpointState::load("out/checkpoint");
//   Tensor w = state.get_parameter("fc.weight");
//   state.add_property("epoch", int64_t{3});
//   state.save("out/checkpoint");                      // atomic: old file kept on failure
//
// The file is in the safetensors layout (see src/training/checkpoint.cc for the exact keys):
// parameters keep their ONNX initializer names; optimizer tensors are "__optimizer__/<param>/<name>";
// everything else lives in "__metadata__" under "onnxtrain.*" keys, with CRC-32C checksums of the
// header and the data. load() also reads ONNX Runtime's training checkpoints (its flatbuffer
// format, versions 1 and 2, external data in "<path>.data"), and save(..., CheckpointFormat::kOrt)
// writes them (src/training/ort_checkpoint.h); the format is told by the file's bytes.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "onnxtrain/tensor.h"

namespace onnxtrain {

class Graph;

using PropertyValue = std::variant<int64_t, double, std::string>;
const char* property_type_name(const PropertyValue& value);  // "int", "float", "string"

// One model parameter. Its dtype and shape are fixed when it is created; data and grad must match
// them. In a nominal checkpoint, data is undefined until filled.
class Parameter {
 public:
  Parameter() = default;
  Parameter(std::string name, DType dtype, Shape shape, bool requires_grad);
  // A nominal parameter whose shape is not known yet (ONNX Runtime's nominal checkpoints store
  // names and dtypes only): the first data set fixes its shape.
  static Parameter unshaped(std::string name, DType dtype, bool requires_grad);

  const std::string& name() const { return name_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }  // empty when !shape_known()
  bool shape_known() const { return shape_known_; }
  int64_t numel() const { return onnxtrain::numel(shape_); }
  bool requires_grad() const { return requires_grad_; }
  void set_requires_grad(bool r) { requires_grad_ = r; }

  bool has_data() const { return data_.defined(); }
  // The parameter's storage. Tensor copies share storage, so `Tensor t = p.data();` then writing
  // through t updates the parameter in place.
  // Throws for a nominal parameter that has no data yet.
  const Tensor& data() const;
  // Copies value into the parameter's storage (allocating it for a nominal parameter), so every
  // alias of data() sees the new values. Checks dtype and shape.
  void set_data(const Tensor& value);
  // Adopts value as the storage without copying. Checks dtype and shape.
  void adopt_data(Tensor value);

  // Gradient slot: undefined until allocated.
  bool has_grad() const { return grad_.defined(); }
  const Tensor& grad() const { return grad_; }
  Tensor& ensure_grad();  // allocates zeros when missing
  void set_grad(Tensor g);  // checks dtype and shape; an undefined tensor clears the slot
  void zero_grad();       // fills an allocated gradient with zeros

 private:
  void check_matches(const Tensor& t, const char* what) const;
  std::string name_;
  DType dtype_ = DType::kUndefined;
  Shape shape_;
  bool requires_grad_ = false;
  bool shape_known_ = true;
  Tensor data_;
  Tensor grad_;
};

// Optimizer state: a step count, an optional learning rate, and named tensors per parameter
// (e.g. "exp_avg", "exp_avg_sq" for AdamW). State names may not contain '/'.
struct SavedOptimizerState {
  int64_t step = 0;
  std::optional<double> learning_rate;
  std::map<std::string, std::map<std::string, Tensor>> param_states;  // param -> name -> tensor
};

// The file formats a checkpoint can be written in (load() tells them apart by their bytes).
enum class CheckpointFormat {
  kOnnxtrain,  // safetensors layout with onnxtrain's metadata (the default)
  kOrt,        // ONNX Runtime's training checkpoint (flatbuffer "ODTC", version 2)
};
const char* checkpoint_format_name(CheckpointFormat f);  // "onnxtrain", "ort"

class CheckpointState {
 public:
  CheckpointState() = default;
  // Copies share tensor storage; clone() gives a deep copy. A copy holds the trained values of a
  // device Module's state (see DeviceSync) but is not attached to the Module.
  CheckpointState(const CheckpointState& other);
  CheckpointState(CheckpointState&& other);
  CheckpointState& operator=(const CheckpointState& other);
  CheckpointState& operator=(CheckpointState&& other);
  ~CheckpointState() = default;
  CheckpointState clone() const;

  // A Module training on a device (Module(..., Device::kCuda)) keeps the parameters it reads,
  // their gradients and the optimizer's moments there and attaches a DeviceSync for as long as it
  // lives. The host tensors here stay the truth for whoever looks: every accessor that reads
  // parameters, gradients or optimizer state (parameter(), parameters(), get_parameter, save,
  // to_contiguous_buffer, clone, copies, optimizer_state()) first copies back what the device
  // holds newer, and every accessor that may write them (non-const parameter(), set_parameter,
  // fill_parameters_from_buffer, non-const optimizer_state(), set_optimizer_tensor) also marks
  // the device copies stale, so the next step uploads them again. What this cannot see is a write
  // through a Tensor alias taken before training (`Tensor w = state.parameter("w").data();`, then
  // steps, then writing w): write through set_parameter, or take the alias again after the steps
  // (ONNX Runtime's CopyBufferToParameters has the same rule).
  class DeviceSync {
   public:
    virtual ~DeviceSync() = default;
    // Copies to the host what the device holds newer than the host.
    virtual void to_host() = 0;
    // The host may now write `param` (empty: every parameter) or the optimizer state.
    virtual void host_writes(const std::string& param) = 0;
    virtual void host_writes_optimizer_state() = 0;
    // Another DeviceSync was attached in its place (to_host() has run): its device copies are
    // no longer kept current.
    virtual void detached() = 0;
  };
  // Attaches `sync` (the one attached before is brought to the host and detached); detach_device
  // _sync removes it when it is the one attached.
  void attach_device_sync(DeviceSync* sync);
  void detach_device_sync(DeviceSync* sync);
  bool device_sync_attached(const DeviceSync* sync) const { return hook_.sync == sync; }
  // While one lives, accessors do not call the attached DeviceSync: the Module's own accesses
  // during a step, and the DeviceSync's inside its callbacks.
  class DeviceSyncPause {
   public:
    explicit DeviceSyncPause(const CheckpointState& state) : state_(state) { ++state_.hook_.paused; }
    ~DeviceSyncPause() { --state_.hook_.paused; }
    DeviceSyncPause(const DeviceSyncPause&) = delete;
    DeviceSyncPause& operator=(const DeviceSyncPause&) = delete;

   private:
    const CheckpointState& state_;
  };

  // Reads and validates a checkpoint. Errors (onnxtrain::Error) name the path and the problem.
  static CheckpointState load(const std::string& path);
  // Writes atomically (temporary file in the same directory, fsync, rename, fsync of the
  // directory). On failure the previous file at path is untouched. kOrt writes ONNX Runtime's
  // format (external data in "<path>.data" past 1800 MiB of tensors, as ORT does).
  void save(const std::string& path, bool include_optimizer_state = true,
            CheckpointFormat format = CheckpointFormat::kOnnxtrain) const;
  // The format of the file at path, from its first bytes; throws when it is neither.
  static CheckpointFormat file_format(const std::string& path);

  // Every initializer of graph becomes a parameter (data copied); those named in trainable
  // require grad (each must be a floating-point initializer). nominal: shapes and dtypes only.
  // share_data: the parameters share the graph's tensors instead of copying them (for a state
  // that is only written out, as generate_artifacts does: no second copy of a large model).
  static CheckpointState from_initializers(const Graph& graph, const std::vector<std::string>& trainable,
                                           bool nominal = false, bool share_data = false);

  // ---- parameters, in insertion order
  Parameter& add_parameter(const std::string& name, Tensor data, bool requires_grad);
  Parameter& add_nominal_parameter(const std::string& name, DType dtype, Shape shape, bool requires_grad);
  Parameter& add_unshaped_parameter(const std::string& name, DType dtype, bool requires_grad);
  bool has_parameter(const std::string& name) const { return index_.count(name) > 0; }
  Parameter& parameter(const std::string& name);
  const Parameter& parameter(const std::string& name) const;
  std::vector<std::string> parameter_names() const;
  const std::vector<Parameter>& parameters() const {
    to_host();
    return params_;
  }
  size_t num_parameters() const { return params_.size(); }
  Tensor get_parameter(const std::string& name) const { return parameter(name).data(); }
  // Copies value into the parameter; the error names the parameter, expected vs got dtype/shape.
  void set_parameter(const std::string& name, const Tensor& value) { parameter(name).set_data(value); }
  // True when some parameter has no data (shapes and dtypes only).
  bool is_nominal() const;

  // ---- one contiguous buffer of (trainable, or all) parameters, in parameter order. Every
  // selected parameter must have the same dtype.
  std::vector<std::string> buffer_parameter_names(bool trainable_only) const;
  int64_t buffer_numel(bool trainable_only) const;
  Tensor to_contiguous_buffer(bool trainable_only) const;  // 1-D
  // Checks the whole buffer first (dtype, numel), then copies; fills nominal parameters.
  void fill_parameters_from_buffer(const Tensor& flat, bool trainable_only);

  // ---- properties (int, float, string)
  // Reserved: the random stream of a training run (Dropout masks drawn from this seed and the
  // number of train steps taken), written by generate_artifacts and Module, so that a run resumed
  // from a checkpoint draws exactly what an uninterrupted one would.
  static constexpr const char* kRandomSeedProperty = "onnxtrain.random_seed";
  static constexpr const char* kTrainStepsProperty = "onnxtrain.train_steps";
  // Reserved: fp16 dynamic loss scaling, so a resumed run scales exactly as an uninterrupted one:
  // the scale (float), the finite steps since it last changed and the updates skipped (ints).
  static constexpr const char* kLossScaleProperty = "onnxtrain.loss_scale";
  static constexpr const char* kLossScaleGoodStepsProperty = "onnxtrain.loss_scale_good_steps";
  static constexpr const char* kSkippedStepsProperty = "onnxtrain.skipped_steps";
  void add_property(const std::string& name, PropertyValue value);
  const PropertyValue& get_property(const std::string& name) const;
  bool has_property(const std::string& name) const { return properties_.count(name) > 0; }
  bool remove_property(const std::string& name) { return properties_.erase(name) > 0; }
  const std::map<std::string, PropertyValue>& properties() const { return properties_; }

  // ---- optimizer state
  bool has_optimizer_state() const { return optimizer_.has_value(); }
  SavedOptimizerState& optimizer_state();  // created empty when missing
  const SavedOptimizerState& optimizer_state() const;  // throws when missing
  void clear_optimizer_state() {
    host_writes_optimizer_state();
    optimizer_.reset();
  }
  // Sets one optimizer tensor; the parameter must exist and the name must not contain '/'.
  void set_optimizer_tensor(const std::string& param, const std::string& name, Tensor value);

 private:
  // The attached DeviceSync, called unless paused (copies and moves of the state start without).
  struct Hook {
    DeviceSync* sync = nullptr;
    int paused = 0;
  };
  void to_host() const {
    if (hook_.sync && !hook_.paused) call_to_host();
  }
  void call_to_host() const;
  void host_writes(const std::string& param);
  void host_writes_optimizer_state();
  const Parameter& find_parameter(const std::string& name) const;

  mutable Hook hook_;
  std::vector<Parameter> params_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, PropertyValue> properties_;
  std::optional<SavedOptimizerState> optimizer_;
};

}  // namespace onnxtrain
