#include "onnxtrain/tensor.h"

#include <cmath>
#include <cstdlib>

#include "core/device.h"
#include "core/dispatch.h"
#include "core/memory.h"

namespace onnxtrain {

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::kFloat32: case DType::kInt32: case DType::kUint32: return 4;
    case DType::kFloat64: case DType::kInt64: case DType::kUint64: return 8;
    case DType::kFloat16: case DType::kBFloat16: case DType::kInt16: case DType::kUint16: return 2;
    case DType::kInt8: case DType::kUint8: case DType::kBool: return 1;
    default: OT_THROW(kNotImplemented, "dtype ", dtype_name(dt), " has no fixed element size");
  }
}

std::string dtype_name(DType dt) {
  switch (dt) {
    case DType::kUndefined: return "undefined";
    case DType::kFloat32: return "float32";
    case DType::kUint8: return "uint8";
    case DType::kInt8: return "int8";
    case DType::kUint16: return "uint16";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kString: return "string";
    case DType::kBool: return "bool";
    case DType::kFloat16: return "float16";
    case DType::kFloat64: return "float64";
    case DType::kUint32: return "uint32";
    case DType::kUint64: return "uint64";
    case DType::kBFloat16: return "bfloat16";
  }
  return "dtype(" + std::to_string(int(dt)) + ")";
}

bool is_floating(DType dt) {
  return dt == DType::kFloat32 || dt == DType::kFloat64 || dt == DType::kFloat16 ||
         dt == DType::kBFloat16;
}

bool is_integer(DType dt) {
  switch (dt) {
    case DType::kInt8: case DType::kUint8: case DType::kInt16: case DType::kUint16:
    case DType::kInt32: case DType::kUint32: case DType::kInt64: case DType::kUint64: return true;
    default: return false;
  }
}

bool dtype_supported(DType dt) { return dt != DType::kUndefined && dt != DType::kString && int(dt) <= 16 && int(dt) != 14 && int(dt) != 15; }

float16::float16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mag = x & 0x7fffffffu;
  if (mag >= 0x7f800000u) {  // inf or nan
    bits = uint16_t(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0u));
    return;
  }
  if (mag >= 0x477ff000u) {  // rounds past the largest half: inf
    bits = uint16_t(sign | 0x7c00u);
    return;
  }
  if (mag < 0x38800000u) {  // subnormal half (or zero): let float addition do the rounding
    float a;
    std::memcpy(&a, &mag, 4);
    a += 0.5f;  // 0.5 = 2^-1; subnormal half spacing is 2^-24, so the low bits hold the result
    uint32_t r;
    std::memcpy(&r, &a, 4);
    bits = uint16_t(sign | (r - 0x3f000000u));
    return;
  }
  // normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even
  uint32_t odd = (mag >> 13) & 1u;
  mag += 0xc8000fffu + odd;  // (15 - 127) << 23, plus the rounding bias
  bits = uint16_t(sign | (mag >> 13));
}

float16::operator float() const {
  uint32_t sign = uint32_t(bits & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t man = bits & 0x3ffu;
  uint32_t out;
  if (exp == 0x1f) {
    out = sign | 0x7f800000u | (man << 13);
  } else if (exp == 0) {
    if (man == 0) {
      out = sign;
    } else {  // subnormal: value = man * 2^-24
      float f = float(man) * 5.9604644775390625e-08f;
      std::memcpy(&out, &f, 4);
      out |= sign;
    }
  } else {
    out = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

bfloat16::bfloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) {  // nan stays nan
    bits = uint16_t((x >> 16) | 0x40u);
    return;
  }
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
  bits = uint16_t(x >> 16);
}

int64_t numel(const Shape& shape) {
  // Declared shapes come from files: a product past 64 bits is an error, not a wrapped count
  // (unless a 0 makes the shape empty, whatever its other dims).
  int64_t n = 1;
  bool overflow = false;
  for (int64_t d : shape) {
    if (d == 0) return 0;
    overflow = overflow || __builtin_mul_overflow(n, d, &n);
  }
  OT_CHECK(!overflow, "shape ", shape_str(shape), " has more elements than an int64 can count");
  return n;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Tensor Tensor::empty(DType dtype, Shape shape) {
  const size_t bytes = checked_tensor_bytes(dtype, shape);
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  if (bytes >= kLargeTensorBytes) {  // huge pages of its own (core/memory.h)
    t.holder_ = allocate_storage(bytes, Fill::kUninitialized);
    t.data_ = t.holder_.get();
    return t;
  }
  charge_storage(bytes);  // the memory limit (include/onnxtrain/limits.h)
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  if (!p) {
    release_storage(bytes);
    OT_THROW(kRuntime, "out of memory allocating ", bytes, " bytes");
  }
  t.holder_ = std::shared_ptr<void>(p, [bytes](void* q) { std::free(q); release_storage(bytes); });
  t.data_ = p;
  return t;
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor t = empty(dtype, std::move(shape));
  std::memset(t.data_, 0, t.nbytes());
  return t;
}

const char* device_name(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }

Tensor Tensor::borrow(DType dtype, Shape shape, void* data, std::shared_ptr<void> holder, Device device) {
  Tensor t;
  t.device_ = device;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.data_ = data;
  t.holder_ = holder ? std::move(holder) : std::shared_ptr<void>(data, [](void*) {});
  return t;
}

Tensor Tensor::reshaped(Shape shape) const {
  OT_CHECK(onnxtrain::numel(shape) == numel(), "cannot view a tensor of shape ", shape_str(shape_),
           " as ", shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::view_as(DType dtype) const {
  OT_CHECK(dtype_size(dtype) == dtype_size(dtype_), "cannot view ", dtype_name(dtype_), " as ", dtype_name(dtype),
           ": element sizes differ");
  Tensor t = *this;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::clone() const {
  if (device_ != Device::kCpu) return copy_on_device(*this);
  Tensor t = empty(dtype_, shape_);
  if (nbytes()) std::memcpy(t.data_, data_, nbytes());
  return t;
}

double Tensor::item_as_double(int64_t i) const {
  OT_CHECK(device_ == Device::kCpu, "cannot read an element of a ", device_name(device_), " tensor on the host: copy it with to_device first");
  OT_CHECK(i >= 0 && i < numel(), "element ", i, " out of range for shape ", shape_str(shape_));
  return dispatch_all(dtype_, [&]<typename T>() {
    return cast_value<double>(static_cast<const T*>(data_)[i]);
  });
}

int64_t Tensor::item_as_int(int64_t i) const {
  OT_CHECK(device_ == Device::kCpu, "cannot read an element of a ", device_name(device_), " tensor on the host: copy it with to_device first");
  OT_CHECK(i >= 0 && i < numel(), "element ", i, " out of range for shape ", shape_str(shape_));
  return dispatch_all(dtype_, [&]<typename T>() {
    return cast_value<int64_t>(static_cast<const T*>(data_)[i]);
  });
}

std::vector<int64_t> Tensor::to_int_vector() const {
  std::vector<int64_t> v(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) v[size_t(i)] = item_as_int(i);
  return v;
}

}  // namespace onnxtrain
