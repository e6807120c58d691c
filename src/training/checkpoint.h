// Checkpoint internals: the file layout pieces that tests exercise directly (checksums, dtype
// names, header and layout validation with 64-bit offsets). The public API is
// include/onnxtrain/training.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "onnxtrain/training.h"
#include "training/json.h"

namespace onnxtrain::checkpoint {

inline constexpr const char* kFormatVersion = "1";
inline constexpr std::string_view kMetadataKey = "__metadata__";
inline constexpr std::string_view kOptimizerPrefix = "__optimizer__/";
// __metadata__ keys (all values are strings, as safetensors requires).
inline constexpr std::string_view kKeyPrefix = "onnxtrain.";
inline constexpr const char* kKeyFormatVersion = "onnxtrain.format_version";
inline constexpr const char* kKeyParameters = "onnxtrain.parameters";
inline constexpr const char* kKeyOptimizer = "onnxtrain.optimizer";
inline constexpr const char* kKeyPropertyPrefix = "onnxtrain.property.";
inline constexpr const char* kKeyDataCrc = "onnxtrain.data_crc32c";
inline constexpr const char* kKeyHeaderCrc = "onnxtrain.header_crc32c";
// Headers larger than this are rejected before anything is allocated.
inline constexpr uint64_t kMaxHeaderBytes = uint64_t(1) << 30;

// CRC-32C (Castagnoli), zlib-style update: crc32c(crc32c(0, a), b) == crc32c(0, a + b).
// Uses the SSE4.2 instruction when compiled for it, the portable table otherwise.
uint32_t crc32c(uint32_t crc, const void* data, size_t n);
uint32_t crc32c_portable(uint32_t crc, const void* data, size_t n);
std::string hex32(uint32_t v);  // 8 lowercase hex digits

// safetensors dtype names: "F32", "BF16", "BOOL", ...
const char* safetensors_dtype(DType dt);  // throws for dtypes a checkpoint cannot hold
std::optional<DType> dtype_from_safetensors(std::string_view name);

struct TensorEntry {
  std::string name;
  DType dtype = DType::kUndefined;
  Shape shape;
  uint64_t begin = 0;  // offsets relative to the start of the data section
  uint64_t end = 0;
};

// Parses the tensor entries of a parsed header (every key but __metadata__), checking each dtype,
// shape and offset pair, with overflow-checked 64-bit arithmetic. Then checks the layout: the
// tensors tile [0, data_size) exactly, with no overlap and no gap. Returns the entries in header
// order. Throws Error(kInvalidModel) naming the tensor (the caller adds the path).
std::vector<TensorEntry> parse_tensor_entries(const json::Value& header, uint64_t data_size);
void validate_layout(const std::vector<TensorEntry>& entries, uint64_t data_size);
// Bytes of a tensor of this dtype and shape; throws on negative dims or 64-bit overflow.
uint64_t checked_nbytes(DType dtype, const Shape& shape, const std::string& name);

}  // namespace onnxtrain::checkpoint
