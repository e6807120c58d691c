// onnxtrain.LinearSoftmaxCrossEntropy(A, B, labels [, bias]) -> loss [, dA1, dB1, dbias1]: a
// language model's output layer and its loss in one op, so the [rows, classes] logits never exist
// whole. fuse_linear_cross_entropy (src/passes/fusions.cc) writes it for
//   logits = A op(B) (+ bias)  ->  [Reshape to [rows, C] | Transpose to [N, C, S]]  ->  SoftmaxCrossEntropyLoss
// when nothing else reads the logits.
//
//   A      [..., K]   the rows (every leading dim flattened, row-major: rows r = 0 .. R-1)
//   B      [K, C], or [C, K] with transB = 1 (nn.Linear's weight)
//   labels R integers in A's row order (any shape), ignore_index skipped
//   bias   [C]        optional
//   loss   = sum over kept rows r of (logsumexp(z_r) - z_r[label_r]), z_r = A_r op(B) + bias,
//            divided by the number of kept rows for reduction "mean" (0/0 = NaN when none is kept,
//            as SoftmaxCrossEntropyLoss gives).
//
// The loss is a scalar, so its gradient is a scalar dLoss times the gradient for dLoss = 1; those
// "unit gradients" (outputs 1-3, each computed only when requested) come out of the same pass over
// the rows, a chunk of rows at a time:
//   dz_r   = f (softmax(z_r) - onehot(label_r)),  f = 1 / kept rows (mean) or 1 (sum); 0 for ignored rows
//   dA1_r  = dz_r op(B)^T,   dB1 = sum_r op(A_r^T dz_r) (transposed back for transB),   dbias1 = sum_r dz_r
// and the gradient rule only scales them: dA = dLoss dA1, dB = dLoss dB1, dbias = dLoss dbias1. The
// saved values are dA1 and dB1 (the size of A and B) instead of the logits (rows x classes: 32 MiB
// for 1024 tokens of an 8192-word vocabulary), and ignored rows cost no arithmetic at all (label
// sparsity without a graph rewrite). The FLOPs are the unfused ones: 2 R K C for the logits, 2 R K C
// each for dA1 and dB1.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/gemm.h"
#include "ops/common.h"
#include "ops/gradient_builder.h"
#include "ops/loss/loss_common.h"
#include "ops/registry.h"
#if ONNXTRAIN_CUDA
#include "backends/cuda/kernels.h"
#endif

namespace onnxtrain {
namespace {

// Rows per chunk: the chunk's logits take about this many bytes (a few L2-sized blocks that the
// GEMMs still fill well); at least kMinChunkRows rows, so the products keep a useful M.
constexpr int64_t kChunkBytes = int64_t(4) << 20;
constexpr int64_t kMinChunkRows = 32;

void shape_linear_ce(ShapeContext& ctx) {
  OT_CHECK(loss_reduction(ctx.node()) != LossReduction::kNone, ctx.node().context(),
           "reduction must be mean or sum (the fused loss is a scalar)");
  ctx.set_output(0, ctx.input_dtype(0), Shape{});
  ctx.set_output(1, ctx.input_dtype(0), ctx.input_shape(0));
  ctx.set_output(2, ctx.input_dtype(1), ctx.input_shape(1));
  if (ctx.node().has_input(3)) ctx.set_output(3, ctx.input_dtype(3), ctx.input_shape(3));
}

struct LinearCeDims {
  int64_t rows = 0, k = 0, c = 0;
};
// A [rows, K] (leading dims flattened), B [K, C] or [C, K], labels (rows of them) and bias [C]
// checked against each other.
LinearCeDims check_linear_ce(const KernelContext& ctx, bool trans_b) {
  const Node& node = ctx.node();
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  const Tensor& labels = ctx.input(2);
  OT_CHECK(a.dtype() == b.dtype() && is_floating(a.dtype()), node.context(),
           "A and B must share a floating-point dtype, got ", dtype_name(a.dtype()), " and ", dtype_name(b.dtype()));
  if (a.dtype() != DType::kFloat32 && a.dtype() != DType::kFloat64)  // the fusion runs in fp32 graphs only
    OT_THROW(kNotImplemented, node.context(), "no ", dtype_name(a.dtype()), " kernel (float and double only)");
  OT_CHECK(a.rank() >= 1 && b.rank() == 2, node.context(), "expected A [..., K] and a 2-D B, got ",
           shape_str(a.shape()), " and ", shape_str(b.shape()));
  LinearCeDims d;
  d.k = a.dim(-1);
  d.c = trans_b ? b.dim(0) : b.dim(1);
  OT_CHECK((trans_b ? b.dim(1) : b.dim(0)) == d.k, node.context(), "B of shape ", shape_str(b.shape()),
           trans_b ? " (transB: [C, K])" : " ([K, C])", " does not match A's last dim ", d.k);
  d.rows = d.k == 0 ? 0 : a.numel() / d.k;
  OT_CHECK(labels.dtype() == DType::kInt64 || labels.dtype() == DType::kInt32, node.context(),
           "expected int32 or int64 labels, got ", dtype_name(labels.dtype()));
  OT_CHECK(labels.numel() == d.rows, node.context(), "labels of shape ", shape_str(labels.shape()), " hold ",
           labels.numel(), " values for ", d.rows, " rows of A ", shape_str(a.shape()));
  if (ctx.has_input(3)) {
    const Tensor& bias = ctx.input(3);
    OT_CHECK(bias.dtype() == a.dtype() && bias.numel() == d.c, node.context(), "bias must be a [", d.c, "] tensor of ",
             dtype_name(a.dtype()), ", got ", dtype_name(bias.dtype()), " ", shape_str(bias.shape()));
  }
  return d;
}

int64_t label_at(const Tensor& labels, int64_t i) {
  return labels.dtype() == DType::kInt64 ? labels.data<int64_t>()[i] : int64_t(labels.data<int32_t>()[i]);
}

// The kept rows, in order (labels on the host); a label outside [0, C) that is not ignore_index is
// an error.
std::vector<int64_t> kept_rows(const KernelContext& ctx, int64_t rows, int64_t c) {
  const Node& node = ctx.node();
  const bool has_ignore = node.has_attr("ignore_index");
  const int64_t ignore = node.attr_int("ignore_index", 0);
  const Tensor& labels = ctx.input(2);
  std::vector<int64_t> kept;
  kept.reserve(size_t(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t l = label_at(labels, r);
    if (has_ignore && l == ignore) continue;
    OT_CHECK(l >= 0 && l < c, node.context(), "label ", l, " at row ", r, " is out of range [0, ", c, ")",
             has_ignore ? " and is not ignore_index" : "");
    kept.push_back(r);
  }
  return kept;
}

class LinearCrossEntropyKernel final : public Kernel {
 public:
  explicit LinearCrossEntropyKernel(const Node& node)
      : trans_b_(node.attr_int("transB", 0) != 0), reduction_(loss_reduction(node)) {
    OT_CHECK(reduction_ != LossReduction::kNone, node.context(), "reduction must be mean or sum (the fused loss is a scalar)");
  }

  void compute(KernelContext& ctx) override {
    const LinearCeDims dims = check_linear_ce(ctx, trans_b_);
    const Tensor* bias = ctx.has_input(3) ? &ctx.input(3) : nullptr;
    dispatch_float(ctx.input(0).dtype(), [&]<typename T>() {
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) run<T>(ctx, dims.rows, dims.k, dims.c, bias);
    });
  }

 private:
  // C = alpha op(A) op(B) + beta C, row-major, no batch: oneDNN (through the cache) for fp32,
  // the reference product for the float64 gradient checks.
  template <typename T>
  void gemm(int64_t m, int64_t n, int64_t kk, bool ta, bool tb, float beta, const T* pa, const T* pb, T* pc,
            const std::string& where) {
    cpu::MatmulDims d;
    d.m = m, d.n = n, d.k = kk, d.trans_a = ta, d.trans_b = tb, d.beta = beta;
    if constexpr (std::is_same_v<T, float>) {
      cache_.get(d, where).run(pa, pb, pc);
    } else {
      d.dtype = DType::kFloat64;
      cpu::matmul_reference<T>(d, pa, pb, pc);
    }
  }

  template <typename T>
  void run(KernelContext& ctx, int64_t rows, int64_t k, int64_t c, const Tensor* bias) {
    const Node& node = ctx.node();
    const std::string where = node.context();
    const Tensor& labels = ctx.input(2);
    const std::vector<int64_t> kept = kept_rows(ctx, rows, c);
    const int64_t n_kept = int64_t(kept.size());
    const double f = reduction_ == LossReduction::kMean ? 1.0 / double(n_kept) : 1.0;

    const Tensor& a = ctx.input(0);
    const Tensor& b = ctx.input(1);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    const T* pbias = bias ? bias->data<T>() : nullptr;
    const bool want_da = ctx.output_requested(1), want_db = ctx.output_requested(2),
               want_dbias = bias && ctx.output_requested(3);
    const bool want_dz = want_da || want_db || want_dbias;
    T* da = want_da ? ctx.output(1, a.dtype(), a.shape()).template data<T>() : nullptr;
    T* db = want_db ? ctx.output(2, b.dtype(), b.shape()).template data<T>() : nullptr;
    T* dbias = want_dbias ? ctx.output(3, bias->dtype(), bias->shape()).template data<T>() : nullptr;
    if (da) std::fill(da, da + a.numel(), T(0));  // ignored rows have no gradient
    if (db) std::fill(db, db + b.numel(), T(0));
    if (dbias) std::fill(dbias, dbias + c, T(0));

    const int64_t chunk = std::min(n_kept, std::max(kMinChunkRows, kChunkBytes / std::max<int64_t>(1, c * int64_t(sizeof(T)))));
    std::vector<T> a_rows(size_t(chunk * k)), z(size_t(chunk * c)), da_rows(want_da ? size_t(chunk * k) : 0);
    std::vector<double> row_loss(static_cast<size_t>(chunk));
    double loss_sum = 0;
    bool first_chunk = true;
    for (int64_t start = 0; start < n_kept; start += chunk) {
      const int64_t m = std::min(chunk, n_kept - start);
      for (int64_t i = 0; i < m; ++i) std::copy_n(pa + kept[size_t(start + i)] * k, k, a_rows.data() + i * k);
      // z = A_rows op(B) + bias: [m, C]
      if (pbias)
        for (int64_t i = 0; i < m; ++i) std::copy_n(pbias, c, z.data() + i * c);
      gemm<T>(m, c, k, false, trans_b_, pbias ? 1.0f : 0.0f, a_rows.data(), pb, z.data(), where);
      // Per row: its loss, and z overwritten with dz = f (softmax(z) - onehot(label)).
      parallel_for(m, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(c, 1)), [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          T* zi = z.data() + i * c;
          const int64_t l = label_at(labels, kept[size_t(start + i)]);
          T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
          for (int64_t j = 0; j < c; ++j) mx = zi[j] > mx ? zi[j] : mx;
          T s = 0;
#pragma omp simd reduction(+ : s)
          for (int64_t j = 0; j < c; ++j) s += exp_shifted<T>(zi[j] - mx);
          const T lse = mx + std::log(s);
          row_loss[size_t(i)] = double(lse - zi[l]);
          if (!want_dz) continue;
          const T scale = T(f) / s;
#pragma omp simd
          for (int64_t j = 0; j < c; ++j) zi[j] = exp_shifted<T>(zi[j] - mx) * scale;
          zi[l] -= T(f);
        }
      });
      for (int64_t i = 0; i < m; ++i) loss_sum += row_loss[size_t(i)];
      if (!want_dz) continue;
      if (da) {  // dA1 rows = dz op(B)^T: [m, K]
        gemm<T>(m, k, c, false, !trans_b_, 0.0f, z.data(), pb, da_rows.data(), where);
        for (int64_t i = 0; i < m; ++i) std::copy_n(da_rows.data() + i * k, k, da + kept[size_t(start + i)] * k);
      }
      if (db) {  // transB: dB1 [C, K] += dz^T A_rows; else dB1 [K, C] += A_rows^T dz
        if (trans_b_) gemm<T>(c, k, m, true, false, first_chunk ? 0.0f : 1.0f, z.data(), a_rows.data(), db, where);
        else gemm<T>(k, c, m, true, false, first_chunk ? 0.0f : 1.0f, a_rows.data(), z.data(), db, where);
      }
      if (dbias)
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < c; ++j) dbias[j] += z[size_t(i * c + j)];
      first_chunk = false;
    }
    T* loss = ctx.output(0, a.dtype(), Shape{}).template data<T>();
    loss[0] = T(reduction_ == LossReduction::kMean ? loss_sum / double(n_kept) : loss_sum);
  }

  bool trans_b_;
  LossReduction reduction_;
  cpu::MatmulCache cache_;
};

#if ONNXTRAIN_CUDA
// On CUDA tensors, float32 (float64 runs on the host): cross_entropy.cu runs the CPU kernel's pass
// over chunks of kept rows, with cuBLASLt products. The labels are a host input: the kept rows
// are chosen and checked here, with the CPU kernel's errors.
void linear_ce_cuda(KernelContext& ctx) {
  const Node& node = ctx.node();
  cuda::LinearCrossEntropyDesc d;
  d.trans_b = node.attr_int("transB", 0) != 0;
  const LossReduction reduction = loss_reduction(node);
  OT_CHECK(reduction != LossReduction::kNone, node.context(), "reduction must be mean or sum (the fused loss is a scalar)");
  const LinearCeDims dims = check_linear_ce(ctx, d.trans_b);
  d.rows = dims.rows, d.k = dims.k, d.c = dims.c;
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  if (a.dtype() != DType::kFloat32) return run_on_host(ctx, "dtype " + dtype_name(a.dtype()));
  const Tensor* bias = ctx.has_input(3) ? &ctx.input(3) : nullptr;
  const std::vector<int64_t> kept = kept_rows(ctx, d.rows, d.c);
  std::vector<int64_t> labels(kept.size());
  for (size_t i = 0; i < kept.size(); ++i) labels[i] = label_at(ctx.input(2), kept[i]);
  d.scale = reduction == LossReduction::kMean ? float(1.0 / double(kept.size())) : 1.0f;  // 0 kept: the mean is NaN
  auto out = [&](size_t i, const Shape& shape) {
    return ctx.output_requested(i) ? ctx.output(i, DType::kFloat32, shape).data<float>() : nullptr;
  };
  float* da = out(1, a.shape());
  float* db = out(2, b.shape());
  float* dbias = bias ? out(3, bias->shape()) : nullptr;
  float* loss = ctx.output(0, DType::kFloat32, Shape{}).data<float>();
  cuda::linear_cross_entropy(d, a.data<float>(), b.data<float>(), bias ? bias->data<float>() : nullptr, kept, labels, loss,
                             da, db, dbias, ctx.stream());
}
#endif

}  // namespace

// The loss is a scalar: each input's gradient is dLoss times its unit gradient (output i + 1).
ONNXTRAIN_OP(LinearSoftmaxCrossEntropy, kOnnxTrainDomain, 1).inputs(3, 4).outputs(1, 4).shape(shape_linear_ce)
    .cpu_kernel<LinearCrossEntropyKernel>().cuda(OT_CUDA(linear_ce_cuda)).host_inputs(std::vector<int>{2})
    .gradient([](GradientBuilder& g) {
      if (!g.has_dy(0)) return;  // nothing flows into the loss: no gradients
      for (size_t i : {size_t(0), size_t(1), size_t(3)}) {
        if (!g.needs(i) || !g.has_input(i)) continue;
        const size_t unit = i == 3 ? 3 : i + 1;
        OT_CHECK(g.node().has_output(unit), g.context(), "the unit gradient of input ", i,
                 " (output ", unit, ") is needed but the node does not compute it");
        g.set(i, g.mul(g.dy(0), g.y(unit)));
      }
    });

}  // namespace onnxtrain
