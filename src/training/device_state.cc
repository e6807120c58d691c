#include "training/device_state.h"

#include <iostream>

namespace onnxtrain {

DeviceState::DeviceState(CheckpointState& state, Device device, DeviceUpdate& update, Stream stream)
    : state_(state), device_(device), update_(update), stream_(std::move(stream)) {
  state_.attach_device_sync(this);
}

DeviceState::~DeviceState() {
  try {
    if (state_.device_sync_attached(this)) {
      CheckpointState::DeviceSyncPause pause(state_);
      to_host();
    }
  } catch (const std::exception& e) {  // a destructor must not throw: say what the host lacks
    std::cerr << "onnxtrain: the " << device_name(device_)
              << " Module's last trained values could not be copied to its checkpoint state: " << e.what() << "\n";
  }
  state_.detach_device_sync(this);
}

void DeviceState::synchronize() { device_backend(device_).synchronize(stream_); }

void DeviceState::attach() {
  if (!state_.device_sync_attached(this)) state_.attach_device_sync(this);
}

void DeviceState::upload(Copy& c, const Tensor& host) {
  c.device_stale = false;
  if (!host.defined()) {
    c.device = Tensor();
    return;
  }
  if (c.device.defined() && c.device.dtype() == host.dtype() && c.device.shape() == host.shape())
    copy_into(c.device, host, stream_);
  else
    c.device = to_device(host, device_, stream_);
}

void DeviceState::device_wrote(Copy& c) {
  c.device_stale = false;
  c.host_stale = true;
  host_stale_ = true;
}

const Tensor& DeviceState::parameter(const std::string& name) {
  Copy& c = parameters_[name];
  if (c.device_stale) upload(c, state_.parameter(name).data());
  return c.device;
}

void DeviceState::set_parameter(const std::string& name, Tensor value) {
  Copy& c = parameters_[name];
  c.device = std::move(value);
  device_wrote(c);
}

void DeviceState::parameters_updated(const std::vector<std::string>& names) {
  for (const auto& name : names) device_wrote(parameters_[name]);
}

const Tensor& DeviceState::gradient(const std::string& name) {
  Copy& c = gradients_[name];
  if (c.device_stale) upload(c, state_.parameter(name).grad());
  return c.device;
}

void DeviceState::set_gradient(const std::string& name, Tensor g) {
  Copy& c = gradients_[name];
  c.device = std::move(g);
  device_wrote(c);
}

void DeviceState::gradient_updated(const std::string& name) { device_wrote(gradients_[name]); }

Tensor& DeviceState::optimizer_tensor(const std::string& param, const std::string& state_name, const Tensor& host) {
  Copy& c = optimizer_[{param, state_name}];
  if (c.host.data() != host.data() || c.host.shape() != host.shape()) {  // a new Optimizer's, or a first use
    c.host = host;
    c.device_stale = true;
    c.host_stale = false;
  }
  if (c.device_stale) upload(c, c.host);
  return c.device;
}

void DeviceState::optimizer_tensors_updated() {
  for (auto& [key, c] : optimizer_) device_wrote(c);
}

void DeviceState::to_host() {
  if (!host_stale_) return;
  for (auto& [name, c] : parameters_) {
    if (!c.host_stale) continue;
    Tensor host = state_.parameter(name).data();  // shares the checkpoint's storage
    copy_into(host, c.device, stream_);
    c.host_stale = false;
  }
  for (auto& [name, c] : gradients_) {
    if (!c.host_stale) continue;
    Parameter& p = state_.parameter(name);
    if (!c.device.defined()) {
      p.set_grad(Tensor());
    } else if (p.has_grad() && p.grad().shape() == c.device.shape()) {
      Tensor host = p.grad();
      copy_into(host, c.device, stream_);
    } else {
      p.set_grad(to_device(c.device, Device::kCpu, stream_));
    }
    c.host_stale = false;
  }
  for (auto& [key, c] : optimizer_) {
    if (!c.host_stale) continue;
    copy_into(c.host, c.device, stream_);
    c.host_stale = false;
  }
  host_stale_ = false;
}

void DeviceState::host_writes(const std::string& param) {
  for (auto* copies : {&parameters_, &gradients_})
    for (auto& [name, c] : *copies)
      if (param.empty() || name == param) c.device_stale = true;
}

void DeviceState::host_writes_optimizer_state() {
  for (auto& [key, c] : optimizer_) c.device_stale = true;
}

void DeviceState::detached() {
  for (auto* copies : {&parameters_, &gradients_})
    for (auto& [name, c] : *copies) c.device_stale = true;
  host_writes_optimizer_state();
}

}  // namespace onnxtrain
