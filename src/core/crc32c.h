// CRC-32C (Castagnoli), the checksum of onnxtrain's file formats: checkpoints (safetensors) and
// pre-compiled models (runtime/compiled_model). zlib-style update:
// crc32c(crc32c(0, a), b) == crc32c(0, a + b).
#pragma once

#include <cstddef>
#include <cstdint>

namespace onnxtrain {

// Uses the SSE4.2 instruction when compiled for it, the portable table otherwise.
uint32_t crc32c(uint32_t crc, const void* data, size_t n);
uint32_t crc32c_portable(uint32_t crc, const void* data, size_t n);

}  // namespace onnxtrain
