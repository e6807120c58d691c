// The decode-time (one to four rows of A) MatMulNBits kernel for 4-bit weights: y = a W^T read
// straight from the blobs (nbits_layout.h), W never dequantized to memory. Apart from the scalar
// path in matmul_nbits.cc, which serves float64 and the layouts this one declines.
#pragma once

#include <cstdint>

#include "ops/contrib/nbits_layout.h"

namespace onnxtrain::nbits {

// True when gemv4_f32 handles the layout on this build (4 bits, block_size a multiple of 32,
// AVX-512 compiled in).
bool gemv4_supported(const Layout& l);

// y[m, n] = sum_k a[m, k] (q[n, k] - zp[n, k / bs]) scale[n, k / bs] (+ bias[n]) for m < rows <= 4.
// Zero points are packed (zp_packed), unpacked floats (zp_float) or absent (both null: 8).
void gemv4_f32(const Layout& l, const uint8_t* b, const float* scales, const uint8_t* zp_packed,
               const float* zp_float, const float* a, int64_t rows, const float* bias, float* y);

}  // namespace onnxtrain::nbits
