// A device Module's training state on the device (docs/DESIGN.md, "Devices"): a copy of every
// parameter its graphs read (made when a step first needs it), the trainable parameters'
// gradients (which the training graph's backward hands over on the device) and the optimizer's
// moments. Each copy knows which side is newer. Steps and Optimizer::step read and write the
// device side; the CheckpointState calls back (CheckpointState::DeviceSync) when the host reads
// (what the device holds newer is copied down) or may write (the device copy is stale: uploaded
// again before the device next reads it). Methods other than the callbacks are called with the
// state's DeviceSyncPause held (the Module's steps), so they see the host tensors as they are.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/device_update.h"
#include "onnxtrain/training.h"

namespace onnxtrain {

class DeviceState final : public CheckpointState::DeviceSync {
 public:
  // `stream`: the training executor's, so that updates queue in order with its steps.
  DeviceState(CheckpointState& state, Device device, DeviceUpdate& update, Stream stream);
  ~DeviceState() override;  // the host gets what the device holds newer; detaches
  DeviceState(const DeviceState&) = delete;
  DeviceState& operator=(const DeviceState&) = delete;

  Device device() const { return device_; }
  DeviceUpdate& update() { return update_; }
  const Stream& stream() const { return stream_; }
  // Waits for the work queued on the stream (before another stream reads the parameters).
  void synchronize();
  // Before a step: attached to the state again when another device Module took it over since
  // (every copy is then uploaded again).
  void attach();

  // Parameter `name` on the device, uploaded first when the host's is newer.
  const Tensor& parameter(const std::string& name);
  // `value` (a device tensor, kept) is the parameter's new value: an updated buffer.
  void set_parameter(const std::string& name, Tensor value);
  // The device updated these parameters in place (the optimizer).
  void parameters_updated(const std::vector<std::string>& names);

  // The gradient of `name` on the device (uploaded first when the host's is newer); undefined
  // when it has none.
  const Tensor& gradient(const std::string& name);
  // `g` (a device tensor, kept) is the gradient of `name` now.
  void set_gradient(const std::string& name, Tensor g);
  // The device changed the gradient of `name` in place (accumulated, scaled).
  void gradient_updated(const std::string& name);

  // Optimizer state `state_name` of parameter `param` on the device, whose host side is `host`
  // (the Optimizer's tensor, which the checkpoint's optimizer state shares): uploaded first when
  // the host's is newer or `host` is another tensor than before.
  Tensor& optimizer_tensor(const std::string& param, const std::string& state_name, const Tensor& host);
  // The device updated every optimizer tensor in place.
  void optimizer_tensors_updated();

  // CheckpointState::DeviceSync
  void to_host() override;
  void host_writes(const std::string& param) override;
  void host_writes_optimizer_state() override;
  void detached() override;

 private:
  struct Copy {
    Tensor device;
    bool device_stale = true;  // the host's is newer: upload before the device reads
    bool host_stale = false;   // the device's is newer: copy down before the host reads
    Tensor host;               // optimizer tensors: the host side
  };
  void device_wrote(Copy& c);
  // c.device = host's bytes (in c.device's storage when it fits), or undefined for no host tensor.
  void upload(Copy& c, const Tensor& host);

  CheckpointState& state_;
  Device device_;
  DeviceUpdate& update_;
  Stream stream_;
  std::map<std::string, Copy> parameters_, gradients_;
  std::map<std::pair<std::string, std::string>, Copy> optimizer_;
  bool host_stale_ = false;  // some copy's host side is stale
};

}  // namespace onnxtrain
