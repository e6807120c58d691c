#include "backends/cpu/portable.h"

#include <atomic>

namespace onnxtrain::cpu {
namespace {

std::atomic<KernelChoice> g_choice{KernelChoice::kBySize};

// The bounds of "small", from bench/small_kernels.cc (docs/DESIGN.md, "Portable kernels").
// Convolutions: at most this many output positions per image and multiply-adds per call.
constexpr int64_t kPortableConvPositions = 64;
constexpr int64_t kPortableConvMacs = int64_t(64) << 20;
// Matmuls: at most this many multiply-adds over the whole batch.
constexpr int64_t kPortableMatmulMacs = int64_t(1) << 20;
// Pools: at most this many input elements.
constexpr int64_t kPortablePoolElements = int64_t(1) << 20;

bool by_size(bool small) {
  switch (g_choice.load(std::memory_order_relaxed)) {
    case KernelChoice::kLibrary: return false;
    case KernelChoice::kPortable: return true;
    case KernelChoice::kBySize: break;
  }
  return small;
}

}  // namespace

void set_kernel_choice(KernelChoice choice) { g_choice.store(choice, std::memory_order_relaxed); }
KernelChoice kernel_choice() { return g_choice.load(std::memory_order_relaxed); }

bool portable_conv(const ConvSpec& s) {
  if (s.dtype != DType::kFloat32) return false;
  const int64_t positions = numel(s.out);
  const int64_t macs = s.x[0] * s.out_channels * positions * (s.x[1] / s.group) * numel(s.kernel);
  return by_size(!s.transposed && positions <= kPortableConvPositions && macs <= kPortableConvMacs);
}

bool portable_pool(const PoolSpec& s) {
  if (s.dtype != DType::kFloat32 || s.x.size() != 4) return false;
  return by_size(numel(s.x) <= kPortablePoolElements);
}

bool portable_matmul(const MatmulDims& d) {
  if (d.dtype != DType::kFloat32 || d.c_dtype() != DType::kFloat32) return false;
  return by_size(d.batch_count() * d.m * d.n * d.k <= kPortableMatmulMacs);
}

}  // namespace onnxtrain::cpu
