// DType, Shape and Tensor: the values that flow through graphs and across every API.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "onnxtrain/status.h"

namespace onnxtrain {

// Values match onnx::TensorProto::DataType so conversion is a cast.
enum class DType : int32_t {
  kUndefined = 0,
  kFloat32 = 1,
  kUint8 = 2,
  kInt8 = 3,
  kUint16 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kString = 8,
  kBool = 9,
  kFloat16 = 10,
  kFloat64 = 11,
  kUint32 = 12,
  kUint64 = 13,
  kBFloat16 = 16,
};

size_t dtype_size(DType dt);             // bytes per element; throws for string/undefined
std::string dtype_name(DType dt);        // "float32", "int64", ...
bool is_floating(DType dt);              // float16, bfloat16, float32, float64
bool is_integer(DType dt);               // signed and unsigned integers (not bool)
bool dtype_supported(DType dt);          // dtypes the runtime stores

// IEEE binary16, stored as bits; arithmetic goes through float.
struct float16 {
  uint16_t bits = 0;
  float16() = default;
  float16(float f);  // NOLINT: implicit by design, so generic kernels compute in float
  operator float() const;
  static float16 from_bits(uint16_t b) { float16 h; h.bits = b; return h; }
};

// bfloat16: the upper half of a float32, rounded to nearest even.
struct bfloat16 {
  uint16_t bits = 0;
  bfloat16() = default;
  bfloat16(float f);  // NOLINT
  operator float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static bfloat16 from_bits(uint16_t b) { bfloat16 h; h.bits = b; return h; }
};

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::kFloat32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::kFloat64; };
template <> struct dtype_of<float16> { static constexpr DType value = DType::kFloat16; };
template <> struct dtype_of<bfloat16> { static constexpr DType value = DType::kBFloat16; };
template <> struct dtype_of<int8_t> { static constexpr DType value = DType::kInt8; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::kUint8; };
template <> struct dtype_of<int16_t> { static constexpr DType value = DType::kInt16; };
template <> struct dtype_of<uint16_t> { static constexpr DType value = DType::kUint16; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::kInt32; };
template <> struct dtype_of<uint32_t> { static constexpr DType value = DType::kUint32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::kInt64; };
template <> struct dtype_of<uint64_t> { static constexpr DType value = DType::kUint64; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::kBool; };
template <typename T> inline constexpr DType dtype_v = dtype_of<T>::value;

// Where a tensor's bytes live. A kCuda tensor's data() is a device pointer: only kernels of that
// device read it; the host reaches it through a copy (core/device.h's to_device).
enum class Device : int32_t { kCpu = 0, kCuda = 1 };
const char* device_name(Device d);  // "cpu", "cuda"

using Shape = std::vector<int64_t>;
// The product of the dims (0 when any is 0); throws Error when it passes what an int64 holds.
int64_t numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[2, 3]"

// A dense, row-major tensor. Storage is shared: copies of a Tensor alias the same bytes.
// Owning storage is 64-byte aligned; borrowed storage wraps caller memory (kept alive by an
// optional holder) without copying.
class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(DType dtype, Shape shape);
  static Tensor zeros(DType dtype, Shape shape);
  static Tensor borrow(DType dtype, Shape shape, void* data, std::shared_ptr<void> holder = {},
                       Device device = Device::kCpu);
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, Shape shape) {
    Tensor t = empty(dtype_v<T>, std::move(shape));
    OT_CHECK(size_t(t.numel()) == values.size(), "Tensor::from_vector: ", values.size(),
             " values for shape ", shape_str(t.shape()));
    if constexpr (std::is_same_v<T, bool>) {
      for (size_t i = 0; i < values.size(); ++i) t.data<bool>()[i] = values[i];
    } else if (!values.empty()) {
      std::memcpy(t.data(), values.data(), values.size() * sizeof(T));
    }
    return t;
  }
  template <typename T>
  static Tensor scalar(T value) { return from_vector<T>({value}, {}); }

  bool defined() const { return dtype_ != DType::kUndefined; }
  Device device() const { return device_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? i + rank() : i); }
  int rank() const { return int(shape_.size()); }
  int64_t numel() const { return onnxtrain::numel(shape_); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }

  void* data() { return data_; }
  const void* data() const { return data_; }
  template <typename T> T* data() { check_type<T>(); return static_cast<T*>(data_); }
  template <typename T> const T* data() const { check_type<T>(); return static_cast<const T*>(data_); }

  // Same bytes viewed with another shape of equal element count.
  Tensor reshaped(Shape shape) const;
  // Same bytes read as another dtype of the same element size (bfloat16 bits as uint16, ...).
  Tensor view_as(DType dtype) const;
  // A deep copy into fresh owning storage on the tensor's device.
  Tensor clone() const;
  // Reads element i as double / int64, whatever the dtype (for small shape tensors and tests).
  double item_as_double(int64_t i = 0) const;
  int64_t item_as_int(int64_t i = 0) const;
  std::vector<int64_t> to_int_vector() const;

  bool shares_storage_with(const Tensor& other) const { return holder_ && holder_ == other.holder_; }

 private:
  template <typename T> void check_type() const {
    OT_CHECK(dtype_v<T> == dtype_, "tensor of dtype ", dtype_name(dtype_), " read as ",
             dtype_name(dtype_v<T>));
  }
  DType dtype_ = DType::kUndefined;
  Shape shape_;
  std::shared_ptr<void> holder_;
  void* data_ = nullptr;
  Device device_ = Device::kCpu;
};

}  // namespace onnxtrain
