// AVX-512 GEMV over 4-bit MatMulNBits blobs. A is rearranged once per call so that each 16-byte
// run of a blob lines up with two vectors of A: byte j of a 32-element chunk holds elements 2j (low
// nibble) and 2j+1 (high nibble), so A's chunk is stored as its 16 even then its 16 odd elements.
// Per block the 16 possible weights (q - zp) * scale form a one-register table, and a permute by
// the nibble (vpermps reads the low 4 bits of each lane) yields the dequantized weights directly:
// per 32 weights one widening load, one shift, two permutes and one FMA per row of A. Rows of W are
// split over the threads; two rows at a time keep four FMA chains in flight.
#include "ops/contrib/nbits_gemv.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "core/parallel.h"

#if defined(__AVX512F__)
// GCC 12's intrinsics self-initialise their undefined operands (_mm512_undefined_*), which
// -W(maybe-)uninitialized report at every use; the warning is about the header, not this file.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

namespace onnxtrain::nbits {

bool gemv4_supported(const Layout& l) {
#if defined(__AVX512F__)
  return l.bits == 4 && l.block_size % 32 == 0;
#else
  (void)l;
  return false;
#endif
}

#if defined(__AVX512F__)
namespace {

struct Gemv {
  const Layout& l;
  const uint8_t* b;
  const float* scales;
  const uint8_t* zp_packed;
  const float* zp_float;
  const float* ad;  // A rearranged: [rows, k_blocks * block_size], chunks of 32 as even | odd
  int64_t kp;       // its row stride

  float zero_point(int64_t n, int64_t blk) const {
    if (zp_float) return zp_float[n * l.k_blocks() + blk];
    if (zp_packed) return float(get(zp_packed + n * l.zp_row_bytes(), blk, 4));
    return 8.0f;
  }

  // acc[r][m] += row (n + r) of W times row m of A, over all blocks.
  template <int M, int R>
  void rows(int64_t n, __m512 (&acc)[R][M][2]) const {
    const int64_t kb = l.k_blocks(), chunks = l.block_size / 32, blob = l.blob_bytes();
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i low4 = _mm512_set1_epi32(15);
    for (int64_t blk = 0; blk < kb; ++blk) {
      __m512 table[R];
      const uint8_t* q[R];
      for (int r = 0; r < R; ++r) {
        const float s = scales[(n + r) * kb + blk];
        table[r] = _mm512_fmadd_ps(iota, _mm512_set1_ps(s), _mm512_set1_ps(-zero_point(n + r, blk) * s));
        q[r] = b + (n + r) * l.row_bytes() + blk * blob;
      }
      for (int64_t c = 0; c < chunks; ++c) {
        const float* a = ad + (blk * chunks + c) * 32;
        for (int r = 0; r < R; ++r) {
          const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q[r] + c * 16)));
          const __m512 w_even = _mm512_permutexvar_ps(x, table[r]);  // low nibble: permute reads bits 0-3
          const __m512 w_odd = _mm512_permutexvar_ps(_mm512_and_si512(_mm512_srli_epi32(x, 4), low4), table[r]);
          for (int m = 0; m < M; ++m) {
            acc[r][m][0] = _mm512_fmadd_ps(w_even, _mm512_loadu_ps(a + m * kp), acc[r][m][0]);
            acc[r][m][1] = _mm512_fmadd_ps(w_odd, _mm512_loadu_ps(a + m * kp + 16), acc[r][m][1]);
          }
        }
      }
    }
  }

  template <int M, int R>
  void run(int64_t n, const float* bias, float* y) const {
    __m512 acc[R][M][2];
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) acc[r][m][0] = acc[r][m][1] = _mm512_setzero_ps();
    rows<M, R>(n, acc);
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m)
        y[m * l.n + n + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][m][0], acc[r][m][1])) + (bias ? bias[n + r] : 0.0f);
  }
};

template <int M>
void gemv_rows(const Gemv& g, const float* bias, float* y) {
  const int64_t pairs = g.l.n / 2;
  // About 16 KiB of weights per thread before a second thread pays for its wake-up.
  parallel_for(pairs, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, g.l.row_bytes())), [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) g.run<M, 2>(2 * p, bias, y);
  });
  if (g.l.n % 2) g.run<M, 1>(g.l.n - 1, bias, y);
}

}  // namespace

void gemv4_f32(const Layout& l, const uint8_t* b, const float* scales, const uint8_t* zp_packed, const float* zp_float,
               const float* a, int64_t rows, const float* bias, float* y) {
  const int64_t kp = l.k_blocks() * l.block_size;
  std::vector<float> ad(size_t(rows * kp), 0.0f);  // zero past K: the last blob's padding adds nothing
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t k = 0; k < l.k; ++k) ad[size_t(m * kp + k / 32 * 32 + (k % 2) * 16 + (k % 32) / 2)] = a[m * l.k + k];
  Gemv g{l, b, scales, zp_packed, zp_float, ad.data(), kp};
  switch (rows) {
    case 1: gemv_rows<1>(g, bias, y); break;
    case 2: gemv_rows<2>(g, bias, y); break;
    case 3: gemv_rows<3>(g, bias, y); break;
    default: gemv_rows<4>(g, bias, y); break;
  }
}
#else
void gemv4_f32(const Layout&, const uint8_t*, const float*, const uint8_t*, const float*, const float*, int64_t,
               const float*, float*) {
  throw std::logic_error("nbits::gemv4_f32: built without AVX-512 (callers check gemv4_supported)");
}
#endif

}  // namespace onnxtrain::nbits
