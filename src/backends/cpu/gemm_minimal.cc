// Matmul in the minimal build: every product through the blocked kernels (gemm_blocked.h). fp32
// only: matmul_native() says no for the half types, so their callers compute through fp32.
#include "backends/cpu/gemm.h"
#include "backends/cpu/gemm_blocked.h"
#include "backends/cpu/sgemm_blocked.h"

namespace onnxtrain::cpu {

struct Matmul::Impl {
  BlockedMatmul matmul;
};

Matmul::Matmul(const MatmulDims& dims, const std::string& context)
    : impl_(std::make_shared<Impl>(Impl{BlockedMatmul(dims, context)})) {}

const MatmulDims& Matmul::dims() const { return impl_->matmul.dims(); }

void Matmul::run(const void* a, const void* b, void* c, const void* bias) const { impl_->matmul.run(a, b, c, bias); }

bool matmul_native(DType dtype) { return dtype == DType::kFloat32; }

std::string matmul_isa() { return sgemm_blocked_isa(); }

}  // namespace onnxtrain::cpu
