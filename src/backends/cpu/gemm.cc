// What every matmul backend shares: MatmulDims, the per-shape cache and the cached fp32 entry
// point. The full build computes through oneDNN (gemm_dnnl.cc) but for the small fp32 products
// portable.h picks, the minimal build all through the blocked kernels (gemm_blocked.h,
// gemm_minimal.cc).
#include "backends/cpu/gemm.h"

#include <cstring>

namespace onnxtrain::cpu {

Shape MatmulDims::out_batch() const {
  Shape o(a_batch.size());
  for (size_t i = 0; i < o.size(); ++i) o[i] = a_batch[i] == 1 ? b_batch[i] : a_batch[i];
  return o;
}

int64_t MatmulDims::batch_count() const { return numel(out_batch()); }

std::vector<int64_t> MatmulDims::key() const {
  std::vector<int64_t> key{m, n, k, trans_a, trans_b, bias, b_constant, int64_t(dtype), int64_t(c_dtype()), int64_t(a_batch.size())};
  key.insert(key.end(), a_batch.begin(), a_batch.end());
  key.insert(key.end(), b_batch.begin(), b_batch.end());
  uint32_t bits[2];
  std::memcpy(&bits[0], &alpha, 4);
  std::memcpy(&bits[1], &beta, 4);
  key.push_back(bits[0]);
  key.push_back(bits[1]);
  return key;
}

BatchOffsets batch_offsets(const Shape& a_batch, const Shape& b_batch, int64_t m, int64_t n, int64_t k) {
  const size_t rank = a_batch.size();
  Shape ob(rank);
  for (size_t i = 0; i < rank; ++i) ob[i] = a_batch[i] == 1 ? b_batch[i] : a_batch[i];
  std::vector<int64_t> as(rank), bs(rank);
  int64_t sa = m * k, sb = k * n;
  for (size_t i = rank; i-- > 0;) {
    as[i] = a_batch[i] == 1 ? 0 : sa;
    bs[i] = b_batch[i] == 1 ? 0 : sb;
    sa *= a_batch[i];
    sb *= b_batch[i];
  }
  BatchOffsets out;
  const int64_t batches = numel(ob);
  for (int64_t bi = 0; bi < batches; ++bi) {
    int64_t ao = 0, bo = 0, rem = bi;
    for (size_t x = rank; x-- > 0;) {
      const int64_t idx = rem % ob[x];
      rem /= ob[x];
      ao += idx * as[x];
      bo += idx * bs[x];
    }
    out.a.push_back(ao);
    out.b.push_back(bo);
    out.c.push_back(bi * m * n);
  }
  return out;
}

const Matmul& MatmulCache::get(const MatmulDims& dims, const std::string& context) {
  auto key = dims.key();
  if (Matmul* m = cache_.find(key)) return *m;
  return cache_.insert(std::move(key), Matmul(dims, context));
}

void matmul(const MatmulDims& dims, const float* a, const float* b, float* c, const float* bias,
            const std::string& context) {
  thread_local MatmulCache cache(64);
  cache.get(dims, context).run(a, b, c, bias);
}

}  // namespace onnxtrain::cpu
