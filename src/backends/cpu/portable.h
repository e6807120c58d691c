// Which shapes the full build runs through the portable kernels (conv_portable.h, gemm_blocked.h,
// pool_loops.h) instead of oneDNN: the small convolutions, matmuls and pools where the portable
// kernels are at least as fast (measured: bench/small_kernels.cc, docs/DESIGN.md "Portable
// kernels"). The minimal build runs everything through them, so on these shapes both builds use the
// same kernels in the same summation order and train to bit-identical parameters.
#pragma once

#include "backends/cpu/conv.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/pool.h"

namespace onnxtrain::cpu {

// kBySize: the rules below (the default); kLibrary / kPortable: every shape the portable kernels
// take through oneDNN / through them (benchmarks and tests compare the two). The process starts
// with ONNXTRAIN_KERNELS=by-size|library|portable (unset: by-size); no effect on the minimal build.
enum class KernelChoice { kBySize, kLibrary, kPortable };
void set_kernel_choice(KernelChoice choice);
KernelChoice kernel_choice();

// Whether the full build runs this fp32 spec through the portable kernels. Decided when a
// primitive is built (a primitive keeps its choice).
bool portable_conv(const ConvSpec& spec);
bool portable_pool(const PoolSpec& spec);
bool portable_matmul(const MatmulDims& dims);

}  // namespace onnxtrain::cpu
