// What training on a device does besides running graphs: accumulating and scaling gradients,
// checking them for overflow, and the optimizer's update, on tensors that live on the device. A
// device backend registers an implementation beside its DeviceBackend (src/backends/cuda/
// device_update.cc, from the kernels it already has); the training layer reaches it only through
// this interface, so a build without the backend links nothing of it, and tests register a
// host-memory stand-in as they do for the device itself.
//
//   DeviceUpdate* update = device_update(Device::kCuda);   // null: none registered
//   update->add(grad, micro_batch_grad, stream);             // grad += micro_batch_grad
#pragma once

#include <cstdint>
#include <vector>

#include "core/device.h"

namespace onnxtrain {

// One AdamW step (torch.optim.AdamW, or transformers' AdamW when hf), with clipping of the
// gradients' global L2 norm to max_grad_norm over the tensors of the call (0: none).
struct DeviceAdamW {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2, max_grad_norm = 0;
  int64_t step = 1;  // this update's number, counting from 1
  bool hf = false, correct_bias = true, maximize = false;
};

class DeviceUpdate {
 public:
  virtual ~DeviceUpdate() = default;
  // Work is queued on `stream` in order with the graphs' steps; tensors are on the device.
  // dst += src (same floating dtype and shape).
  virtual void add(Tensor& dst, const Tensor& src, const Stream& stream) = 0;
  // t *= factor, computed in t's compute type (float for float32, float16 and bfloat16).
  virtual void scale(Tensor& t, double factor, const Stream& stream) = 0;
  // Whether every element is finite. The answer is read on the host: waits for the stream.
  virtual bool all_finite(const std::vector<Tensor>& tensors, const Stream& stream) = 0;
  // The global L2 norm of the tensors (read on the host: waits for the stream).
  virtual double l2_norm(const std::vector<Tensor>& tensors, const Stream& stream) = 0;
  // Whether adamw() updates tensors of this dtype.
  virtual bool adamw_supports(DType dtype) const = 0;
  // One multi-tensor AdamW update in place: params[i], exp_avg[i] and exp_avg_sq[i] from grads[i].
  virtual void adamw(const DeviceAdamW& config, std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                     std::vector<Tensor>& exp_avg, std::vector<Tensor>& exp_avg_sq, const Stream& stream) = 0;
};

// Registers the update of a device and returns the one it replaces (null: none).
DeviceUpdate* register_device_update(Device device, DeviceUpdate* update);
// The registered update of `device`, or null.
DeviceUpdate* device_update(Device device);

}  // namespace onnxtrain
