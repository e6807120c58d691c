#include "core/device.h"
#include "core/device_update.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <utility>

namespace onnxtrain {

namespace {

struct Slot {
  DeviceProbe probe = nullptr;
  bool probed = false;
  DeviceBackend* backend = nullptr;
  std::string why_not;
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
Slot& slot(Device device) {
  static Slot slots[2];
  OT_CHECK(device == Device::kCuda, "device '", device_name(device), "' has no device backend");
  return slots[1];
}

// The backend or null, probing once.
DeviceBackend* find(Device device, std::string* why_not) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  Slot& s = slot(device);
  if (!s.probe) {
    if (why_not) *why_not = std::string("this build has no ") + (device == Device::kCuda ? "CUDA" : device_name(device)) +
                            " backend (configure with -DONNXTRAIN_CUDA=ON)";
    return nullptr;
  }
  if (!s.probed) {
    s.backend = s.probe(&s.why_not);
    s.probed = true;
  }
  if (!s.backend && why_not) *why_not = s.why_not;
  return s.backend;
}

}  // namespace

DeviceProbe register_device_backend(Device device, DeviceProbe probe) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  Slot& s = slot(device);
  DeviceProbe previous = s.probe;
  s = Slot{probe, false, nullptr, {}};
  return previous;
}

DeviceBackend& device_backend(Device device) {
  std::string why_not;
  if (DeviceBackend* b = find(device, &why_not)) return *b;
  bool built = why_not.rfind("this build", 0) != 0;
  if (built) throw Error(ErrorCode::kRuntime, why_not);
  throw Error(ErrorCode::kNotImplemented, why_not);
}

bool device_available(Device device, std::string* why_not) { return find(device, why_not) != nullptr; }

Tensor empty_on(Device device, DType dtype, const Shape& shape) {
  if (device == Device::kCpu) return Tensor::empty(dtype, shape);
  OT_CHECK(dtype_supported(dtype), "cannot allocate a ", device_name(device), " tensor of dtype ", dtype_name(dtype));
  for (int64_t d : shape) OT_CHECK(d >= 0, "cannot allocate a tensor of shape ", shape_str(shape));
  std::shared_ptr<void> storage = device_backend(device).allocate(std::max<size_t>(size_t(numel(shape)) * dtype_size(dtype), 1));
  void* data = storage.get();
  return Tensor::borrow(dtype, shape, data, std::move(storage), device);
}

Tensor to_device(const Tensor& t, Device device, const Stream& stream) {
  if (!t.defined() || t.device() == device) return t;
  const Device remote = device == Device::kCpu ? t.device() : device;
  DeviceBackend& backend = device_backend(remote);
  Tensor out = empty_on(device, t.dtype(), t.shape());
  if (t.nbytes()) backend.copy(out.data(), device, t.data(), t.device(), t.nbytes(), stream);
  return out;
}

void copy_into(Tensor& dst, const Tensor& src, const Stream& stream) {
  OT_CHECK(dst.dtype() == src.dtype() && dst.shape() == src.shape(), "copy_into: expected a ", dtype_name(dst.dtype()),
           " ", shape_str(dst.shape()), " source, got ", dtype_name(src.dtype()), " ", shape_str(src.shape()));
  if (!src.nbytes() || dst.data() == src.data()) return;
  if (dst.device() == Device::kCpu && src.device() == Device::kCpu) {
    std::memcpy(dst.data(), src.data(), src.nbytes());
    return;
  }
  const Device remote = dst.device() == Device::kCpu ? src.device() : dst.device();
  device_backend(remote).copy(dst.data(), dst.device(), src.data(), src.device(), src.nbytes(), stream);
}

Tensor copy_on_device(const Tensor& t) {
  DeviceBackend& backend = device_backend(t.device());
  Tensor out = empty_on(t.device(), t.dtype(), t.shape());
  if (t.nbytes()) backend.copy(out.data(), t.device(), t.data(), t.device(), t.nbytes(), {});
  backend.synchronize({});
  return out;
}

namespace {
DeviceUpdate*& update_slot(Device device) {
  static DeviceUpdate* cuda = nullptr;
  OT_CHECK(device == Device::kCuda, "device '", device_name(device), "' has no device update");
  return cuda;
}
}  // namespace

DeviceUpdate* register_device_update(Device device, DeviceUpdate* update) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return std::exchange(update_slot(device), update);
}

DeviceUpdate* device_update(Device device) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return update_slot(device);
}

}  // namespace onnxtrain
