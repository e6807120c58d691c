// The safetensors file format, as checkpoints (and exported adapters) use it: an 8-byte
// little-endian header length N; N bytes of JSON header, padded with spaces so the data section
// starts 8-byte aligned; the data section, where every tensor's bytes are [begin, end) relative to
// its start, contiguous, in header order.
//
//   {"__metadata__": {"key": "string value", ...},
//    "<tensor>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, ...}
//
// Integrity: write() adds two metadata keys, "onnxtrain.data_crc32c" (CRC-32C of the data
// section) and "onnxtrain.header_crc32c" (of the compact header JSON without that key), and read()
// verifies each one present. Reads validate every dtype, shape and offset (64-bit, overflow-checked)
// before allocating; writes are atomic (temporary file, fsync, rename). Any safetensors reader
// opens these files, and read() opens theirs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/crc32c.h"
#include "onnxtrain/tensor.h"
#include "training/json.h"

namespace onnxtrain::safetensors {

inline constexpr std::string_view kMetadataKey = "__metadata__";
inline constexpr const char* kKeyDataCrc = "onnxtrain.data_crc32c";
inline constexpr const char* kKeyHeaderCrc = "onnxtrain.header_crc32c";
// Headers larger than this are rejected before anything is allocated.
inline constexpr uint64_t kMaxHeaderBytes = uint64_t(1) << 30;

using Metadata = std::vector<std::pair<std::string, std::string>>;    // in header order
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;      // in file order

struct Contents {
  Metadata metadata;    // every __metadata__ entry, the checksum keys included
  NamedTensors tensors; // in header order
  bool has_metadata_key(std::string_view key) const;
  const std::string* metadata_value(std::string_view key) const;
};

// Writes `tensors` (their bytes, in this order) with `metadata` plus the two checksum keys.
// Throws kInvalidArgument for a dtype safetensors cannot hold or a repeated name; the file is
// untouched then.
void write(const std::string& path, const Metadata& metadata, const NamedTensors& tensors);
// Reads and validates a file; errors (kInvalidModel, kRuntime) say what is wrong without the path,
// which callers add.
Contents read(const std::string& path);

// The format's checksum (src/core/crc32c.h).
using onnxtrain::crc32c;
using onnxtrain::crc32c_portable;
std::string hex32(uint32_t v);  // 8 lowercase hex digits

// safetensors dtype names: "F32", "BF16", "BOOL", ...
const char* safetensors_dtype(DType dt);  // throws for dtypes a file cannot hold
bool can_hold(DType dt);
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

}  // namespace onnxtrain::safetensors
