// com.microsoft.MatMulNBits: Y = A W^T (+ bias) with W [N, K] block-quantized to 2, 4 or 8 bits
// (layout in nbits_layout.h). The weight is never dequantized whole: for longer inputs W is
// dequantized one panel of rows at a time (about 1 MiB, resident in L2) and multiplied by
// oneDNN's fp32 GEMM; for up to 4 rows of A (decode) the blobs are read once, each block's dot
// product taken on the integers and scaled once. accuracy_level: every level computes in fp32 (level 0/1 exactly; levels 2-4
// only permit lower precision, which fp32 satisfies).
//
// Gradient: dA = dY W through onnxtrain.MatMulNBitsGrad, the same panel scheme; the quantized weight
// (B, scales, zero points) is not differentiable: train LoRA adapters on it instead.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/cpu/gemm.h"
#include "ops/contrib/contrib.h"
#include "ops/contrib/nbits_gemv.h"
#include "ops/contrib/nbits_layout.h"
#include "ops/gradient_builder.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

nbits::Layout layout_of(const Node& node) {
  nbits::Layout l;
  OT_CHECK(node.has_attr("K") && node.has_attr("N") && node.has_attr("block_size"), node.context(),
           "expected attributes K, N and block_size");
  l.k = node.attr_int("K", 0);
  l.n = node.attr_int("N", 0);
  l.bits = node.attr_int("bits", 4);
  l.block_size = node.attr_int("block_size", 0);
  OT_CHECK(l.k > 0 && l.n > 0, node.context(), "expected K > 0 and N > 0, got K=", l.k, " N=", l.n);
  OT_CHECK(l.bits == 2 || l.bits == 4 || l.bits == 8, node.context(), "expected bits 2, 4 or 8, got ", l.bits);
  OT_CHECK(l.block_size >= 16 && (l.block_size & (l.block_size - 1)) == 0, node.context(),
           "expected block_size a power of 2 and >= 16, got ", l.block_size);
  return l;
}

// Validated views of the quantized weight inputs: B at input b, then scales, zero points.
template <typename T>
struct QuantWeight {
  nbits::Layout l;
  const uint8_t* b = nullptr;
  const T* scales = nullptr;
  const uint8_t* zp_packed = nullptr;
  const T* zp_float = nullptr;

  // Row n's columns [0, K) into out (K values).
  void dequant_row(int64_t n, T* out) const {
    const int64_t bs = l.block_size, kb = l.k_blocks(), blob = l.blob_bytes();
    const uint8_t* row = b + n * l.row_bytes();
    for (int64_t blk = 0; blk < kb; ++blk) {
      T s = scales[n * kb + blk];
      T z = zp_float ? zp_float[n * kb + blk]
                     : T(zp_packed ? nbits::get(zp_packed + n * l.zp_row_bytes(), blk, l.bits) : l.default_zero_point());
      const uint8_t* q = row + blk * blob;
      int64_t k0 = blk * bs, cnt = std::min(bs, l.k - k0);
      T* o = out + k0;
      if (l.bits == 4 && cnt == bs) {
        for (int64_t j = 0; j < bs / 2; ++j) {
          o[2 * j] = (T(q[j] & 15) - z) * s;
          o[2 * j + 1] = (T(q[j] >> 4) - z) * s;
        }
      } else if (l.bits == 8) {
        for (int64_t j = 0; j < cnt; ++j) o[j] = (T(q[j]) - z) * s;
      } else {
        for (int64_t j = 0; j < cnt; ++j) o[j] = (T(nbits::get(q, j, l.bits)) - z) * s;
      }
    }
  }
};

// sum a[j] b[j] in 16 independent lanes, so the compiler vectorises it without reassociating.
template <typename T>
inline T dot16(const T* a, const T* b, int64_t n) {
  T lanes[16] = {};
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (int l = 0; l < 16; ++l) lanes[l] += a[j + l] * b[j + l];
  T d = 0;
  for (; j < n; ++j) d += a[j] * b[j];
  for (int l = 0; l < 16; ++l) d += lanes[l];
  return d;
}

template <typename T>
QuantWeight<T> read_weight(const KernelContext& ctx, size_t ib) {
  const Node& node = ctx.node();
  QuantWeight<T> w;
  w.l = layout_of(node);
  const auto& l = w.l;
  const Tensor& b = ctx.input(ib);
  OT_CHECK(b.dtype() == DType::kUint8, node.context(), "expected B of dtype uint8, got ", dtype_name(b.dtype()));
  OT_CHECK(b.numel() == l.n * l.row_bytes() && (b.rank() != 3 || (b.dim(0) == l.n && b.dim(1) == l.k_blocks() &&
                                                                  b.dim(2) == l.blob_bytes())),
           node.context(), "expected B of shape [N, k_blocks, blob_size] = [", l.n, ", ", l.k_blocks(), ", ",
           l.blob_bytes(), "] for K=", l.k, " N=", l.n, " bits=", l.bits, " block_size=", l.block_size, ", got ",
           shape_str(b.shape()));
  w.b = b.data<uint8_t>();
  const Tensor& s = ctx.input(ib + 1);
  OT_CHECK(s.dtype() == (std::is_same_v<T, float> ? DType::kFloat32 : DType::kFloat64), node.context(),
           "expected scales of A's dtype, got ", dtype_name(s.dtype()));
  OT_CHECK(s.numel() == l.n * l.k_blocks(), node.context(), "expected ", l.n * l.k_blocks(),
           " scales (N x k_blocks), got shape ", shape_str(s.shape()));
  w.scales = s.data<T>();
  if (ctx.has_input(ib + 2)) {
    const Tensor& z = ctx.input(ib + 2);
    if (z.dtype() == DType::kUint8) {
      OT_CHECK(z.numel() == l.n * l.zp_row_bytes(), node.context(), "expected packed uint8 zero_points of ",
               l.n * l.zp_row_bytes(), " bytes (N x ceil(k_blocks * bits / 8)), got shape ", shape_str(z.shape()));
      w.zp_packed = z.data<uint8_t>();
    } else {
      OT_CHECK(z.dtype() == s.dtype() && z.numel() == l.n * l.k_blocks(), node.context(),
               "expected zero_points uint8 packed or ", dtype_name(s.dtype()), " [N, k_blocks] = ",
               l.n * l.k_blocks(), " values, got ", dtype_name(z.dtype()), " ", shape_str(z.shape()));
      w.zp_float = z.data<T>();
    }
  }
  return w;
}

// Rows of W per panel: about 1 MiB of dequantized weight (one core's L2 on Zen 4 / Sapphire Rapids;
// 256 KiB panels measured 5x slower, the GEMM calls too small to reach oneDNN's peak), a multiple of 16.
constexpr size_t kPanelBytes = size_t(1) << 20;
int64_t panel_rows(int64_t n, int64_t k, size_t elem) {
  int64_t rows = int64_t(kPanelBytes / (size_t(std::max<int64_t>(k, 1)) * elem));
  rows = std::max<int64_t>(16, rows / 16 * 16);
  return std::min(rows, n);
}

void matmul_nbits_shape(ShapeContext& ctx) {
  const Node& node = ctx.node();
  // Constant blobs are checked here, so inconsistent models fail when loaded or turned into
  // artifacts, before anything is written.
  if (node.has_attr("K") && node.has_attr("N") && node.has_attr("block_size")) {
    nbits::Layout l = layout_of(node);
    if (const Tensor* b = ctx.input_value(1))
      OT_CHECK(b->dtype() == DType::kUint8 && b->numel() == l.n * l.row_bytes(), node.context(),
               "expected B of uint8 [N, k_blocks, blob_size] = [", l.n, ", ", l.k_blocks(), ", ", l.blob_bytes(),
               "] for K=", l.k, " N=", l.n, " bits=", l.bits, " block_size=", l.block_size, ", got ",
               dtype_name(b->dtype()), " ", shape_str(b->shape()));
    if (const Tensor* s = ctx.input_value(2))
      OT_CHECK(s->numel() == l.n * l.k_blocks(), node.context(), "expected ", l.n * l.k_blocks(),
               " scales (N x k_blocks), got shape ", shape_str(s->shape()));
    if (const Tensor* z = ctx.has_input(3) ? ctx.input_value(3) : nullptr)
      OT_CHECK(z->numel() == (z->dtype() == DType::kUint8 ? l.n * l.zp_row_bytes() : l.n * l.k_blocks()),
               node.context(), "expected zero_points of ",
               z->dtype() == DType::kUint8 ? l.n * l.zp_row_bytes() : l.n * l.k_blocks(), " values, got shape ",
               shape_str(z->shape()));
  }
  const auto& a = ctx.input_shape(0);
  if (!a || a->empty() || !node.has_attr("N")) {
    ctx.set_output(0, ctx.input_dtype(0));
    return;
  }
  Shape y = *a;
  y.back() = node.attr_int("N", 0);
  ctx.set_output(0, ctx.input_dtype(0), y);
}

void matmul_nbits_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& a = ctx.input(0);
  OT_CHECK(!ctx.has_input(4), node.context(), "g_idx (input 4) is deprecated and not supported");
  dispatch_f32_f64(node, a.dtype(), [&]<typename T>() {
    QuantWeight<T> w = read_weight<T>(ctx, 1);
    const int64_t K = w.l.k, N = w.l.n;
    OT_CHECK(a.rank() >= 1 && a.dim(-1) == K, node.context(), "expected A of shape [..., K=", K, "], got ",
             shape_str(a.shape()));
    const T* bias = nullptr;
    if (ctx.has_input(5)) {
      const Tensor& bt = ctx.input(5);
      OT_CHECK(bt.dtype() == a.dtype() && bt.numel() == N, node.context(), "expected bias of ", N, " values of A's dtype, got ",
               dtype_name(bt.dtype()), " ", shape_str(bt.shape()));
      bias = bt.data<T>();
    }
    Shape ys = a.shape();
    ys.back() = N;
    Tensor& y = ctx.output(0, a.dtype(), ys);
    const int64_t M = a.numel() / K;
    const T* pa = a.data<T>();
    T* py = y.data<T>();
    if (M == 0) return;
    if constexpr (std::is_same_v<T, float>) {
      if (M <= 4 && nbits::gemv4_supported(w.l)) {
        nbits::gemv4_f32(w.l, w.b, w.scales, w.zp_packed, w.zp_float, pa, M, bias, py);
        return;
      }
    }
    if (M <= 4) {  // decode: W read once, straight from its blobs
      // y[m, n] = sum_blk scale (sum_k a_k q_k - zp sum_k a_k): the block sums of A are computed once
      const int64_t bs = w.l.block_size, kb = w.l.k_blocks(), blob = w.l.blob_bytes();
      std::vector<T> asum(size_t(M * kb), T(0));
      for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < K; ++k) asum[size_t(m * kb + k / bs)] += pa[m * K + k];
      parallel_for(N, 64, [&](int64_t n0, int64_t n1) {
        std::vector<T> q(static_cast<size_t>(bs));
        for (int64_t n = n0; n < n1; ++n) {
          T acc[4] = {0, 0, 0, 0};
          const uint8_t* row = w.b + n * w.l.row_bytes();
          for (int64_t blk = 0; blk < kb; ++blk) {
            const uint8_t* qb = row + blk * blob;
            const int64_t k0 = blk * bs, cnt = std::min(bs, K - k0);
            if (w.l.bits == 4) {
              for (int64_t j = 0; j < bs / 2; ++j) {
                q[size_t(2 * j)] = T(qb[j] & 15);
                q[size_t(2 * j + 1)] = T(qb[j] >> 4);
              }
            } else {
              for (int64_t j = 0; j < cnt; ++j) q[size_t(j)] = T(nbits::get(qb, j, w.l.bits));
            }
            const T s = w.scales[n * kb + blk];
            const T z = w.zp_float ? w.zp_float[n * kb + blk]
                                   : T(w.zp_packed ? nbits::get(w.zp_packed + n * w.l.zp_row_bytes(), blk, w.l.bits)
                                                   : w.l.default_zero_point());
            for (int64_t m = 0; m < M; ++m) {
              acc[m] += s * (dot16(pa + m * K + k0, q.data(), cnt) - z * asum[size_t(m * kb + blk)]);
            }
          }
          for (int64_t m = 0; m < M; ++m) py[m * N + n] = acc[m] + (bias ? bias[n] : T(0));
        }
      });
      return;
    }
    const int64_t P = panel_rows(N, K, sizeof(T));
    std::vector<T> panel(size_t(P * K)), out(size_t(M * P));
    for (int64_t n0 = 0; n0 < N; n0 += P) {
      const int64_t np = std::min(P, N - n0);
      parallel_for(np, 4, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) w.dequant_row(n0 + r, panel.data() + r * K);
      });
      contrib_gemm<T>(M, np, K, /*trans_a=*/false, /*trans_b=*/true, 0.0f, pa, panel.data(), out.data());
      parallel_for(M, 64, [&](int64_t m0, int64_t m1) {
        for (int64_t m = m0; m < m1; ++m) {
          T* dst = py + m * N + n0;
          const T* src = out.data() + m * np;
          if (bias) for (int64_t j = 0; j < np; ++j) dst[j] = src[j] + bias[n0 + j];
          else std::memcpy(dst, src, size_t(np) * sizeof(T));
        }
      });
    }
  });
}

// onnxtrain.MatMulNBitsGrad(dY, B, scales, zero_points?) with MatMulNBits' attributes: dA = dY W.
void matmul_nbits_grad_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& dy = ctx.input(0);
  dispatch_f32_f64(node, dy.dtype(), [&]<typename T>() {
    QuantWeight<T> w = read_weight<T>(ctx, 1);
    const int64_t K = w.l.k, N = w.l.n;
    OT_CHECK(dy.rank() >= 1 && dy.dim(-1) == N, node.context(), "expected dY of shape [..., N=", N, "], got ",
             shape_str(dy.shape()));
    Shape as = dy.shape();
    as.back() = K;
    Tensor& da = ctx.output(0, dy.dtype(), as);
    const int64_t M = dy.numel() / N;
    const T* pg = dy.data<T>();
    T* pd = da.data<T>();
    if (M == 0) return;
    if (M <= 4) {  // each thread owns a range of K (whole blocks): dA[:, k] += dY[:, n] W[n, k]
      const int64_t bs = w.l.block_size, kb = w.l.k_blocks();
      std::fill(pd, pd + M * K, T(0));
      parallel_for(kb, 1, [&](int64_t b0, int64_t b1) {
        std::vector<T> row(static_cast<size_t>(K));
        for (int64_t n = 0; n < N; ++n) {
          w.dequant_row(n, row.data());  // (only blocks b0..b1 are read below)
          for (int64_t m = 0; m < M; ++m) {
            T g = pg[m * N + n];
            T* dr = pd + m * K;
            for (int64_t k = b0 * bs; k < std::min(K, b1 * bs); ++k) dr[k] += g * row[size_t(k)];
          }
        }
      });
      return;
    }
    const int64_t P = panel_rows(N, K, sizeof(T));
    std::vector<T> panel(size_t(P * K)), slab(size_t(M * P));
    for (int64_t n0 = 0; n0 < N; n0 += P) {
      const int64_t np = std::min(P, N - n0);
      parallel_for(np, 4, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) w.dequant_row(n0 + r, panel.data() + r * K);
      });
      parallel_for(M, 64, [&](int64_t m0, int64_t m1) {
        for (int64_t m = m0; m < m1; ++m) std::memcpy(slab.data() + m * np, pg + m * N + n0, size_t(np) * sizeof(T));
      });
      contrib_gemm<T>(M, K, np, /*trans_a=*/false, /*trans_b=*/false, n0 == 0 ? 0.0f : 1.0f, slab.data(), panel.data(), pd);
    }
  });
}

void matmul_nbits_grad_shape(ShapeContext& ctx) {
  const auto& g = ctx.input_shape(0);
  if (!g || g->empty() || !ctx.node().has_attr("K")) {
    ctx.set_output(0, ctx.input_dtype(0));
    return;
  }
  Shape a = *g;
  a.back() = ctx.node().attr_int("K", 0);
  ctx.set_output(0, ctx.input_dtype(0), a);
}

// Y = A W^T + bias, W = (q - zero_point) * scale frozen.  dA = dY W, dbias = sum_to(dY, bias)
void matmul_nbits_gradient(GradientBuilder& g) {
  static const char* names[] = {"A", "B", "scales", "zero_points", "g_idx", "bias"};
  for (size_t i = 1; i <= 3; ++i)
    if (g.has_input(i) && g.needs(i))
      OT_THROW(kNotImplemented, g.context(), "input '", names[i],
               "' is not differentiable: quantized, train adapters instead (LoRA)");
  const Node& n = g.node();
  if (g.needs(0)) {
    GraphBuilder::Attrs attrs;
    for (const char* a : {"K", "N", "bits", "block_size"})
      if (n.has_attr(a)) attrs[a] = *n.attr(a);
    std::vector<std::string> ins{g.dy(0), g.x(1), g.x(2)};
    if (g.has_input(3)) ins.push_back(g.x(3));
    g.set(0, g.emit("MatMulNBitsGrad", ins, attrs, kOnnxTrainDomain));
  }
  if (g.has_input(5) && g.needs(5)) g.set(5, g.sum_to(g.dy(0), g.x(5)));
}

}  // namespace

ONNXTRAIN_OP(MatMulNBits, kMsDomain, 1).inputs(3, 6).outputs(1).shape(matmul_nbits_shape)
    .cpu(matmul_nbits_kernel).gradient(matmul_nbits_gradient);
// dA = MatMulNBitsGrad(dY, B, scales, zero_points?); linear in dY, second derivatives are not needed.
ONNXTRAIN_OP(MatMulNBitsGrad, kOnnxTrainDomain, 1).inputs(3, 4).outputs(1).shape(matmul_nbits_grad_shape)
    .cpu(matmul_nbits_grad_kernel).gradient_not_implemented("second derivatives are not needed for training");

}  // namespace onnxtrain
