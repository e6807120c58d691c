// Model files and ONNX external data (a tensor's bytes in a file next to the model), read and
// written the same way by the protobuf-based model_io.cc and the wire-format model_io_minimal.cc.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "onnxtrain/tensor.h"

namespace onnxtrain {

// Protobuf's limit on one serialized message: larger models keep their initializers as external data.
inline constexpr int64_t kProtobufLimit = (int64_t(1) << 31) - 1;

// The whole model file; a missing or unreadable file is Error(kInvalidArgument) naming it.
std::string read_model_file(const std::string& path);

// Fills t (already shaped) from the external_data entries (key, value): "location" relative to
// base_dir, "offset", "length" (absent: t's byte size). Throws, naming `what`, on a location that
// leaves the model folder, a range outside the file, or a length that is not t's size.
void read_external_data(Tensor& t, const std::vector<std::pair<std::string, std::string>>& entries,
                        const std::string& base_dir, const std::string& what);

// Writes the tensors' bytes one after another into data_path, each at a page-aligned (4096) offset
// as ONNX's writer does, atomically (temporary file, then rename); returns their offsets.
std::vector<int64_t> write_external_data_file(const std::vector<const Tensor*>& tensors, const std::string& data_path);

// Initializers smaller than this always stay inline (as ONNX's own external-data writer does).
inline constexpr size_t kExternalDataMinBytes = 1024;

}  // namespace onnxtrain
