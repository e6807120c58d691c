// Devices besides the host. A device backend (src/backends/cuda) registers itself here from a
// static initialiser; the rest of the runtime reaches device memory, streams and copies only
// through this interface, so a build without the backend links nothing of it and a build with it
// runs on a machine without the device until something asks for one.
//
//   DeviceBackend& cuda = device_backend(Device::kCuda);   // throws "no CUDA device: ..." here
//   Tensor x = to_device(host_tensor, Device::kCuda);       // one copy; x.device() == kCuda
//   Tensor back = to_device(x, Device::kCpu);
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "onnxtrain/tensor.h"

namespace onnxtrain {

// A stream: work queued on it runs in order; the executor queues every step of a run on one.
using Stream = std::shared_ptr<void>;

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual Device device() const = 0;
  // The card, for reports: "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB)".
  virtual std::string description() const = 0;
  // `bytes` of device memory (at least 256-byte aligned), released when the last copy dies.
  // Throws kRuntime naming the size when the device is out of memory.
  virtual std::shared_ptr<void> allocate(size_t bytes) = 0;
  virtual Stream create_stream() = 0;
  // Copies between host and device or within the device, queued on `stream` (null: the default
  // stream). A copy to or from the host returns when the bytes have arrived.
  virtual void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes,
                    const Stream& stream) = 0;
  // Waits for everything queued on `stream`; reports the first asynchronous error by name.
  virtual void synchronize(const Stream& stream) = 0;
};

// Called once, on first use: returns the backend, or null with the reason in *why_not ("no CUDA
// device: cudaGetDeviceCount says 0 devices").
using DeviceProbe = DeviceBackend* (*)(std::string* why_not);
// Registers the probe for a device and returns the one it replaces (tests put a host-memory
// double in place of a device and restore the real one).
DeviceProbe register_device_backend(Device device, DeviceProbe probe);

// The backend of `device`. Throws kNotImplemented when this build has none ("this build has no
// CUDA backend (configure with -DONNXTRAIN_CUDA=ON)") and kRuntime when the machine has no such
// device ("no CUDA device: ..."). kCpu has no backend: asking for it is a programming error.
DeviceBackend& device_backend(Device device);
// Whether device_backend(device) would succeed; otherwise the reason it would give.
bool device_available(Device device, std::string* why_not = nullptr);

// `t` on `device`: `t` itself when it is there already, else a copy in fresh storage.
Tensor to_device(const Tensor& t, Device device, const Stream& stream = {});
// Copies src's bytes into dst's storage (same dtype and shape; either may be on the device).
void copy_into(Tensor& dst, const Tensor& src, const Stream& stream = {});
// A copy of a device tensor in fresh storage on the same device (Tensor::clone of a device tensor).
Tensor copy_on_device(const Tensor& t);
// An uninitialised tensor in fresh storage on `device`.
Tensor empty_on(Device device, DType dtype, const Shape& shape);

}  // namespace onnxtrain
