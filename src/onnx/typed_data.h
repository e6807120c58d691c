// A TensorProto's typed repeated fields (float_data, int32_data, ...: used when raw_data is
// absent) into a tensor of the proto's dtype; shared by model_io.cc and the wire-format reader.
#pragma once

#include <string>
#include <type_traits>

#include "core/dispatch.h"

namespace onnxtrain {

// Field: anything with size() and Get(int) (protobuf's RepeatedField, wire_format's decoded lists).
template <typename Src, typename Field>
void copy_field(const Field& field, Tensor& t, const std::string& what) {
  OT_CHECK(int64_t(field.size()) == t.numel(), what, ": holds ", field.size(), " values for shape ",
           shape_str(t.shape()));
  dispatch_all(t.dtype(), [&]<typename T>() {
    T* out = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>)
        out[i] = T::from_bits(uint16_t(field.Get(int(i))));  // int32_data holds the raw bits
      else
        out[i] = static_cast<T>(static_cast<Src>(field.Get(int(i))));
    }
  });
}

}  // namespace onnxtrain
