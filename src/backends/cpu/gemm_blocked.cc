// Matmul through the blocked kernels of sgemm_blocked.h (gemm_blocked.h).
#include "backends/cpu/gemm_blocked.h"

#include "backends/cpu/sgemm_blocked.h"

namespace onnxtrain::cpu {

struct BlockedMatmul::Impl {
  MatmulDims dims;
  int64_t m = 0;  // rows per product: dims.m, or batch * m when the batch folds into M
  // Element offsets of A, B and C per product of the batch (one entry when folded or unbatched).
  std::vector<int64_t> a_off, b_off, c_off;
  std::string context;
};

OT_COLD BlockedMatmul::BlockedMatmul(const MatmulDims& dims, const std::string& context) {
  auto* impl = new Impl();
  impl_.reset(impl);
  Impl& p = *impl;
  p.dims = dims;
  p.context = context;
  OT_CHECK(dims.dtype == DType::kFloat32 && dims.c_dtype() == DType::kFloat32, context,
           "the blocked matmul computes fp32, got ", dtype_name(dims.dtype), " into ",
           dtype_name(dims.c_dtype()));
  p.m = dims.m;
  bool b_broadcast = true;
  for (auto v : dims.b_batch) b_broadcast = b_broadcast && v == 1;
  // [..., M, K] x [K, N]: one product with M' = batch * M (A and C are contiguous over it).
  if (b_broadcast && !dims.trans_a) {
    p.m *= numel(dims.a_batch);
    p.a_off = p.b_off = p.c_off = {0};
    return;
  }
  BatchOffsets offsets = batch_offsets(dims.a_batch, dims.b_batch, dims.m, dims.n, dims.k);
  p.a_off = std::move(offsets.a);
  p.b_off = std::move(offsets.b);
  p.c_off = std::move(offsets.c);
}

BlockedMatmul::BlockedMatmul(BlockedMatmul&&) noexcept = default;
BlockedMatmul& BlockedMatmul::operator=(BlockedMatmul&&) noexcept = default;
BlockedMatmul::~BlockedMatmul() = default;

const MatmulDims& BlockedMatmul::dims() const { return impl_->dims; }

void BlockedMatmul::run(const void* a, const void* b, void* c, const void* bias) const {
  const Impl& p = *impl_;
  const MatmulDims& d = p.dims;
  SgemmArgs g;
  g.m = p.m;
  g.n = d.n;
  g.k = d.k;
  g.a_row = d.trans_a ? 1 : d.k;
  g.a_col = d.trans_a ? d.m : 1;
  g.b_row = d.trans_b ? 1 : d.n;
  g.b_col = d.trans_b ? d.k : 1;
  g.ldc = d.n;
  g.alpha = d.alpha;
  g.beta = d.beta;
  g.bias = d.bias ? static_cast<const float*>(bias) : nullptr;
  const auto* af = static_cast<const float*>(a);
  const auto* bf = static_cast<const float*>(b);
  auto* cf = static_cast<float*>(c);
  const int64_t products = int64_t(p.a_off.size());
  auto run_range = [&](int64_t begin, int64_t end, bool parallel) {
    SgemmArgs one = g;
    for (int64_t i = begin; i < end; ++i) {
      one.a = af + p.a_off[size_t(i)];
      one.b = bf + p.b_off[size_t(i)];
      one.c = cf + p.c_off[size_t(i)];
      sgemm_blocked(one, parallel);
    }
  };
  // Many products (attention heads): one thread each; few: the threads split each product.
  if (products >= 2 * int64_t(num_threads())) parallel_for(products, 1, [&](int64_t b, int64_t e) { run_range(b, e, false); });
  else run_range(0, products, true);
}

}  // namespace onnxtrain::cpu
