// CRC-32C (Castagnoli), the checksum of onnxtrain's file formats: checkpoints (safetensors) and
// pre-compiled models (runtime/compiled_model). zlib-style update:
// crc32c(crc32c(0, a), b) == crc32c(0, a + b).
#pragma once

#include <cstddef>
#include <cstdint>

namespace onnxtrain {

// False only in fuzzing builds (FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION, tests/fuzz): there a
// checksum mismatch is ignored, so that the fuzzer's mutations reach the parsing behind the check
// (a mutated file almost never carries a matching checksum). The checksums are still computed.
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
inline constexpr bool kChecksumsEnforced = false;
#else
inline constexpr bool kChecksumsEnforced = true;
#endif

// Uses the SSE4.2 instruction when compiled for it, the portable table otherwise.
uint32_t crc32c(uint32_t crc, const void* data, size_t n);
uint32_t crc32c_portable(uint32_t crc, const void* data, size_t n);

}  // namespace onnxtrain
