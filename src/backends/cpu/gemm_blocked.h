// fp32 Matmul through the blocked kernels of sgemm_blocked.h, with no library. One source for both
// builds: the minimal build runs every matmul through it (gemm_minimal.cc), the full build the
// small ones portable.h picks (gemm_dnnl.cc), so both compute them in the same order.
#pragma once

#include <memory>
#include <string>

#include "backends/cpu/internal.h"
#include "backends/cpu/gemm.h"

namespace onnxtrain::cpu {

class BlockedMatmul {
 public:
  // dims.dtype and dims.c_dtype() must be kFloat32.
  OT_INTERNAL BlockedMatmul(const MatmulDims& dims, const std::string& context);
  OT_INTERNAL void run(const void* a, const void* b, void* c, const void* bias) const;
  OT_INTERNAL const MatmulDims& dims() const;

  OT_INTERNAL BlockedMatmul(BlockedMatmul&&) noexcept;
  OT_INTERNAL BlockedMatmul& operator=(BlockedMatmul&&) noexcept;
  OT_INTERNAL ~BlockedMatmul();

 private:
  struct Impl;
  std::unique_ptr<const Impl> impl_;  // unique: no shared_ptr control-block symbols (minimal size)
};

}  // namespace onnxtrain::cpu
