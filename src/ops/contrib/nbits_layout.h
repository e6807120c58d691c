// The MatMulNBits weight layout (com.microsoft, ONNX Runtime's ContribOperators.md): W is [N, K]
// (PyTorch's Linear weight, out x in), quantized in blocks of `block_size` along K. Each row n holds
// k_blocks = ceil(K / block_size) blobs of block_size * bits / 8 bytes; inside a blob, element i sits
// at bit offset i * bits, least significant bits first (4 bits: the first value in the low nibble).
// w = (q - zero_point) * scale, one scale and zero point per (n, block); zero points are either
// packed uint8 [N, ceil(k_blocks * bits / 8)] with the same bit order, or unpacked floats [N,
// k_blocks]; without them the zero point is 2^(bits - 1). The quantizer (src/training/quantize.cc)
// and the kernels read and write it through these helpers only.
#pragma once

#include <cstdint>

namespace onnxtrain::nbits {

struct Layout {
  int64_t k = 0, n = 0, bits = 4, block_size = 32;
  int64_t k_blocks() const { return (k + block_size - 1) / block_size; }
  int64_t blob_bytes() const { return block_size * bits / 8; }
  int64_t row_bytes() const { return k_blocks() * blob_bytes(); }         // B's bytes per n
  int64_t zp_row_bytes() const { return (k_blocks() * bits + 7) / 8; }    // packed zero points per n
  int64_t default_zero_point() const { return int64_t(1) << (bits - 1); }
  int64_t max_q() const { return (int64_t(1) << bits) - 1; }
};

// Element i of a bit-packed run (blob or packed zero-point row).
inline int64_t get(const uint8_t* p, int64_t i, int64_t bits) {
  int64_t bit = i * bits;
  return (p[bit >> 3] >> (bit & 7)) & ((1 << bits) - 1);
}
inline void put(uint8_t* p, int64_t i, int64_t bits, int64_t v) {
  int64_t bit = i * bits;
  uint8_t mask = uint8_t(((1 << bits) - 1) << (bit & 7));
  p[bit >> 3] = uint8_t((p[bit >> 3] & ~mask) | ((uint8_t(v) << (bit & 7)) & mask));
}

}  // namespace onnxtrain::nbits
