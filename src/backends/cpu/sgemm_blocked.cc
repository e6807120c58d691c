#include "backends/cpu/sgemm_blocked.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "backends/cpu/thread_scratch.h"
#include "backends/cpu/vec.h"
#include "core/parallel.h"

namespace onnxtrain::cpu {
namespace {

using namespace vec;  // NOLINT: the kernels' one SIMD vocabulary (Vec, kLanes, load, store, splat)

// kMR x kNV vector accumulators, leaving room for the kNV B vectors and the broadcast A value:
// 8 x 3 (24 registers) where there are 32 (ZMM, NEON q), 6 x 2 where there are 16 (YMM, SSE).
// 8 x 3 loads fewer values per multiply-add: 8-16% faster than 6 x 2 on the digits CNN's three
// convolution GEMMs (AVX-512, one thread, medians of 10 interleaved pairs, 2026-11-24).
#if defined(__AVX512F__) || defined(__ARM_NEON)
constexpr int kMR = 8;
constexpr int kNV = 3;
#else
constexpr int kMR = 6;
constexpr int kNV = 2;
#endif
constexpr int kNR = kNV * kLanes;
constexpr int64_t kKC = 384;         // most depth of one packed slice: an A panel (6 x 384) stays in L1
constexpr int64_t kMC = 768;                 // rows of A packed at once (768 x 384 floats: 1.1 MB, L2)
constexpr int64_t kNC = kNR * (4096 / kNR);  // columns of B packed at once, whole panels
// Below this many multiply-adds one thread does the whole product (waking the pool costs more).
constexpr int64_t kParallelFlops = int64_t(1) << 18;

// tile[kMR][kNR] = sum over p < kc of A panel column p times B panel row p.
inline void micro_kernel(int64_t kc, const float* ap, const float* bp, Vec (&acc)[kMR][kNV]) {
  for (int i = 0; i < kMR; ++i)
    for (int v = 0; v < kNV; ++v) acc[i][v] = Vec{};
  for (int64_t p = 0; p < kc; ++p) {
    Vec b[kNV];
    for (int v = 0; v < kNV; ++v) b[v] = load(bp + v * kLanes);
    for (int i = 0; i < kMR; ++i) {
      const Vec a = splat(ap[i]);
      for (int v = 0; v < kNV; ++v) acc[i][v] += a * b[v];
    }
    ap += kMR;
    bp += kNR;
  }
}

// Rows [i0, i0 + rows) of A's columns [p0, p0 + kc) as kMR-tall panels (column-major within a
// panel, zero rows past the end).
void pack_a(const SgemmArgs& g, int64_t i0, int64_t rows, int64_t p0, int64_t kc, float* out) {
  const int64_t panels = (rows + kMR - 1) / kMR;
  auto pack = [&](int64_t begin, int64_t end) {
    for (int64_t panel = begin; panel < end; ++panel) {
      float* dst = out + panel * kMR * kc;
      const int64_t r0 = i0 + panel * kMR, valid = std::min<int64_t>(kMR, i0 + rows - r0);
      for (int64_t p = 0; p < kc; ++p) {
        const float* src = g.a + r0 * g.a_row + (p0 + p) * g.a_col;
        for (int64_t i = 0; i < kMR; ++i) dst[p * kMR + i] = i < valid ? src[i * g.a_row] : 0.0f;
      }
    }
  };
  pack(0, panels);
}

// B's rows [p0, p0 + kc) and columns [j0, j0 + cols) as kNR-wide panels (row-major within a
// panel, zero columns past the end).
void pack_b(const SgemmArgs& g, int64_t j0, int64_t cols, int64_t p0, int64_t kc, float* out) {
  const int64_t panels = (cols + kNR - 1) / kNR;
  auto pack = [&](int64_t begin, int64_t end) {
    for (int64_t panel = begin; panel < end; ++panel) {
      float* dst = out + panel * kNR * kc;
      const int64_t c0 = j0 + panel * kNR, valid = std::min<int64_t>(kNR, j0 + cols - c0);
      if (g.b_row == 1 && g.b_col != 1) {  // B transposed: read each column along its contiguous depth
        for (int64_t j = 0; j < kNR; ++j) {
          const float* src = g.b + p0 + (c0 + j) * g.b_col;
          for (int64_t p = 0; p < kc; ++p) dst[p * kNR + j] = j < valid ? src[p] : 0.0f;
        }
        continue;
      }
      for (int64_t p = 0; p < kc; ++p) {
        const float* src = g.b + (p0 + p) * g.b_row + c0 * g.b_col;
        float* row = dst + p * kNR;
        if (g.b_col == 1 && valid == kNR) {
          std::memcpy(row, src, sizeof(float) * kNR);
        } else {
          for (int64_t j = 0; j < kNR; ++j) row[j] = j < valid ? src[j * g.b_col] : 0.0f;
        }
      }
    }
  };
  pack(0, panels);
}

// A whole tile into C, in vectors; the same arithmetic, element by element, as store_tile.
void store_full_tile(const SgemmArgs& g, const Vec (&acc)[kMR][kNV], int64_t i0, int64_t j0, bool first_slice) {
  const Vec alpha = splat(g.alpha), beta = splat(g.beta);
  for (int i = 0; i < kMR; ++i) {
    float* c = g.c + (i0 + i) * g.ldc + j0;
    for (int h = 0; h < kNV; ++h) {
      float* ch = c + h * kLanes;
      if (!first_slice) {
        store(ch, load(ch) + alpha * acc[i][h]);
        continue;
      }
      Vec v = alpha * acc[i][h];
      if (g.beta != 0.0f) v += beta * load(ch);
      if (g.bias) v += load(g.bias + j0 + h * kLanes);
      store(ch, v);
    }
  }
}

// Writes a tile's valid part into C: the first depth slice applies beta and the bias, later
// slices accumulate.
void store_tile(const SgemmArgs& g, const float* tile, int64_t i0, int64_t j0, int64_t rows, int64_t cols,
                bool first_slice) {
  for (int64_t i = 0; i < rows; ++i) {
    float* c = g.c + (i0 + i) * g.ldc + j0;
    const float* t = tile + i * kNR;
    if (!first_slice) {
      for (int64_t j = 0; j < cols; ++j) c[j] += g.alpha * t[j];
      continue;
    }
    for (int64_t j = 0; j < cols; ++j) {
      float v = g.alpha * t[j];
      if (g.beta != 0.0f) v += g.beta * c[j];
      if (g.bias) v += g.bias[j0 + j];
      c[j] = v;
    }
  }
}

float* scratch(int which, int64_t count) { return thread_scratch<ScratchUser::kGemm>(which, count); }

// The whole product on the calling thread.
void sgemm_serial(const SgemmArgs& g) {
  for (int64_t j0 = 0; j0 < g.n; j0 += kNC) {
    const int64_t cols = std::min(kNC, g.n - j0), n_panels = (cols + kNR - 1) / kNR;
    // Depth slices of at most kKC, evened out (k = 288 is one slice, not 256 + 32: every slice
    // costs a pass over C).
    const int64_t slices = (g.k + kKC - 1) / kKC, slice_depth = (g.k + slices - 1) / slices;
    for (int64_t p0 = 0; p0 < g.k; p0 += slice_depth) {
      const int64_t kc = std::min(slice_depth, g.k - p0);
      float* b_pack = scratch(1, n_panels * kNR * kc);
      pack_b(g, j0, cols, p0, kc, b_pack);
      for (int64_t i0 = 0; i0 < g.m; i0 += kMC) {
        const int64_t rows = std::min(kMC, g.m - i0), m_panels = (rows + kMR - 1) / kMR;
        float* a_pack = scratch(0, m_panels * kMR * kc);
        pack_a(g, i0, rows, p0, kc, a_pack);
        // Tiles in B-panel-major order: consecutive tiles of one thread share a B panel.
        auto compute = [&](int64_t begin, int64_t end) {  // tiles [begin, end)
          Vec acc[kMR][kNV];
          for (int64_t t = begin; t < end; ++t) {
            const int64_t jp = t / m_panels, ip = t % m_panels;
            micro_kernel(kc, a_pack + ip * kMR * kc, b_pack + jp * kNR * kc, acc);
            const int64_t r = ip * kMR, c = jp * kNR;
            if (rows - r >= kMR && cols - c >= kNR) {
              store_full_tile(g, acc, i0 + r, j0 + c, p0 == 0);
            } else {
              alignas(64) float tile[kMR * kNR];
              std::memcpy(tile, acc, sizeof acc);
              store_tile(g, tile, i0 + r, j0 + c, std::min<int64_t>(kMR, rows - r), std::min<int64_t>(kNR, cols - c),
                         p0 == 0);
            }
          }
        };
        compute(0, m_panels * n_panels);
      }
    }
  }
}

// Narrow products whose A rows and B columns both run contiguously along k (X W^T of a classifier
// head, N = classes): a register tile kNR wide would be mostly padding, so each output is a dot
// product instead, kDotRows x kDotCols of them at once in vector partial sums over k; each partial
// sum vector then adds up its lanes in order and the scalar tail of k after it.
constexpr int kDotRows = 4, kDotCols = vec::kRegisters == 32 ? 4 : 2;
// sgemm_dots and sgemm_rows finish the last rows with cases 3, 2 and 1: exactly kDotRows - 1 of them.
static_assert(kDotRows == 4, "the remainder switches in sgemm_dots and sgemm_rows handle 1 to 3 rows");

bool narrow_dots(const SgemmArgs& g) { return g.a_col == 1 && g.b_row == 1 && g.n * 2 < kNR && g.k >= kLanes; }

// kRows rows from i0 (all present) against every column, kDotCols columns at a time.
template <int kRows>
void dots_rows(const SgemmArgs& g, int64_t i0) {
  const int64_t k_vec = g.k / kLanes * kLanes;
  const float* a[kRows];
  for (int r = 0; r < kRows; ++r) a[r] = g.a + (i0 + r) * g.a_row;
  for (int64_t j0 = 0; j0 < g.n; j0 += kDotCols) {
    const float* b[kDotCols];
    for (int c = 0; c < kDotCols; ++c) b[c] = g.b + std::min<int64_t>(j0 + c, g.n - 1) * g.b_col;
    Vec acc[kRows][kDotCols];
    for (int r = 0; r < kRows; ++r)
      for (int c = 0; c < kDotCols; ++c) acc[r][c] = Vec{};
    for (int64_t p = 0; p < k_vec; p += kLanes) {
      Vec bv[kDotCols];
      for (int c = 0; c < kDotCols; ++c) bv[c] = load(b[c] + p);
      for (int r = 0; r < kRows; ++r) {
        const Vec av = load(a[r] + p);
        for (int c = 0; c < kDotCols; ++c) acc[r][c] += av * bv[c];
      }
    }
    for (int r = 0; r < kRows; ++r)
      for (int c = 0; c < kDotCols && j0 + c < g.n; ++c) {
        float sum = 0.0f;
        for (int l = 0; l < kLanes; ++l) sum += acc[r][c][l];
        for (int64_t p = k_vec; p < g.k; ++p) sum += a[r][p] * b[c][p];
        float* out = g.c + (i0 + r) * g.ldc + j0 + c;
        float v = g.alpha * sum;
        if (g.beta != 0.0f) v += g.beta * *out;
        if (g.bias) v += g.bias[j0 + c];
        *out = v;
      }
  }
}

// Rows [row_begin, row_end): kDotRows at a time, the last few by a kernel of their own count (a
// short product's single row is not computed four times).
void sgemm_dots(const SgemmArgs& g, int64_t row_begin, int64_t row_end) {
  int64_t i0 = row_begin;
  for (; i0 + kDotRows <= row_end; i0 += kDotRows) dots_rows<kDotRows>(g, i0);
  switch (row_end - i0) {
    case 3: dots_rows<3>(g, i0); break;
    case 2: dots_rows<2>(g, i0); break;
    case 1: dots_rows<1>(g, i0); break;
    default: break;
  }
}

// Short products: fewer rows of A than a register tile (one request's frame or token). Packing
// costs a pass over all of B per call and fills kMR-tall tiles with zero rows, which for a handful
// of rows is most of the work: an openWakeWord head's 1 x 1536 x 128 product spent about 40 us
// packing B against a few of arithmetic. These kernels read A and B where they lie.
bool short_rows(const SgemmArgs& g) { return g.m < kMR; }

// kRows rows of C from i0 over kVecs vectors of columns from j0, B's rows contiguous along n
// (b_col == 1): C(i, j) = sum over p in order of A(i, p) B(p, j), each B row loaded once per p and
// used for every row.
template <int kRows, int kVecs>
void rows_block(const SgemmArgs& g, int64_t i0, int64_t j0) {
  const float* a[kRows];
  for (int r = 0; r < kRows; ++r) a[r] = g.a + (i0 + r) * g.a_row;
  Vec acc[kRows][kVecs];
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < kVecs; ++v) acc[r][v] = Vec{};
  const float* b = g.b + j0;
  for (int64_t p = 0; p < g.k; ++p, b += g.b_row) {
    Vec bv[kVecs];
    for (int v = 0; v < kVecs; ++v) bv[v] = load(b + v * kLanes);
    for (int r = 0; r < kRows; ++r) {
      const Vec av = splat(a[r][p * g.a_col]);
      for (int v = 0; v < kVecs; ++v) acc[r][v] += av * bv[v];
    }
  }
  const Vec alpha = splat(g.alpha), beta = splat(g.beta);
  for (int r = 0; r < kRows; ++r)
    for (int v = 0; v < kVecs; ++v) {
      float* c = g.c + (i0 + r) * g.ldc + j0 + v * kLanes;
      Vec out = alpha * acc[r][v];
      if (g.beta != 0.0f) out += beta * load(c);
      if (g.bias) out += load(g.bias + j0 + v * kLanes);
      store(c, out);
    }
}

// The columns [j0, n) that make no whole vector, element by element in the same order.
void rows_tail(const SgemmArgs& g, int64_t i0, int64_t rows, int64_t j0) {
  for (int64_t i = i0; i < i0 + rows; ++i)
    for (int64_t j = j0; j < g.n; ++j) {
      float sum = 0.0f;
      for (int64_t p = 0; p < g.k; ++p) sum += g.a[i * g.a_row + p * g.a_col] * g.b[p * g.b_row + j];
      float* c = g.c + i * g.ldc + j;
      float v = g.alpha * sum;
      if (g.beta != 0.0f) v += g.beta * *c;
      if (g.bias) v += g.bias[j];
      *c = v;
    }
}

// kRows rows from i0 across every column: blocks of kVecs vectors, then single vectors, then the tail.
template <int kRows>
void rows_group(const SgemmArgs& g, int64_t i0) {
  constexpr int kVecs = vec::kRegisters == 32 ? 4 : 2;  // kDotRows x kVecs accumulators at most
  int64_t j0 = 0;
  for (; j0 + kVecs * kLanes <= g.n; j0 += kVecs * kLanes) rows_block<kRows, kVecs>(g, i0, j0);
  for (; j0 + kLanes <= g.n; j0 += kLanes) rows_block<kRows, 1>(g, i0, j0);
  if (j0 < g.n) rows_tail(g, i0, kRows, j0);
}

// kDotRows rows at a time, the last few by a kernel of their own count.
void sgemm_rows(const SgemmArgs& g) {
  int64_t i0 = 0;
  for (; i0 + kDotRows <= g.m; i0 += kDotRows) rows_group<kDotRows>(g, i0);
  switch (g.m - i0) {
    case 3: rows_group<3>(g, i0); break;
    case 2: rows_group<2>(g, i0); break;
    case 1: rows_group<1>(g, i0); break;
    default: break;
  }
}

// Whether a short product has a kernel that reads its operands in place: B along n
// (sgemm_rows), or A and B both along k (dot products, sgemm_dots).
bool reads_in_place(const SgemmArgs& g) { return g.b_col == 1 || (g.a_col == 1 && g.b_row == 1 && g.k >= kLanes); }

void sgemm_short(const SgemmArgs& g) {
  if (g.b_col == 1) sgemm_rows(g);
  else sgemm_dots(g, 0, g.m);
}

// C split over the pool in `threads` bands of whole units of columns (by_columns) or rows, each
// band a product of its own.
template <typename F>
void by_bands(const SgemmArgs& g, bool by_columns, int64_t unit, int threads, F&& product) {
  const int64_t extent = by_columns ? g.n : g.m;
  const int64_t band = (extent / threads + unit - 1) / unit * unit;
  const int64_t bands = (extent + band - 1) / band;
  parallel_for(bands, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t start = t * band, size = std::min(band, extent - start);
      SgemmArgs part = g;
      if (by_columns) {
        part.n = size;
        part.b += start * g.b_col;
        part.c += start;
        if (part.bias) part.bias += start;
      } else {
        part.m = size;
        part.a += start * g.a_row;
        part.c += start * g.ldc;
      }
      product(part);
    }
  });
}

}  // namespace

void sgemm_blocked(const SgemmArgs& g, bool parallel) {
  if (g.m <= 0 || g.n <= 0) return;
  if (g.k <= 0) {  // an empty sum: C = beta C + bias
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        float* c = g.c + i * g.ldc + j;
        *c = (g.beta != 0.0f ? g.beta * *c : 0.0f) + (g.bias ? g.bias[j] : 0.0f);
      }
    return;
  }
  const int threads = parallel && g.m * g.n * g.k >= kParallelFlops ? num_threads() : 1;
  // Narrow products on the calling thread: a head's X W^T is microseconds (the digits head's 327 K
  // multiply-adds: 12 us), less than waking the pool.
  if (narrow_dots(g)) return sgemm_dots(g, 0, g.m);
  if (short_rows(g) && reads_in_place(g)) {
    // A few rows: each thread a band of columns, read in place (no packing).
    if (threads <= 1) return sgemm_short(g);
    return by_bands(g, true, kLanes, threads, [](const SgemmArgs& part) { sgemm_short(part); });
  }
  if (threads <= 1) return sgemm_serial(g);
  // One parallel region per product: each thread computes a band of C's columns (or rows, when C
  // is taller than wide) with its own packing buffers; bands are whole register tiles.
  const bool by_columns = g.n >= g.m;
  by_bands(g, by_columns, by_columns ? kNR : kMR, threads, [](const SgemmArgs& part) { sgemm_serial(part); });
}

std::string sgemm_blocked_isa() { return std::string("blocked-") + vec::kIsa; }

}  // namespace onnxtrain::cpu
