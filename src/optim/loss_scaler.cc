#include "optim/loss_scaler.h"

#include <atomic>
#include <algorithm>

#include "core/parallel.h"

namespace onnxtrain::optim {

bool LossScaler::update(bool gradients_finite) {
  if (!gradients_finite) {
    scale *= kBackoffFactor;
    good_steps = 0;
    ++skipped_steps;
    return false;
  }
  if (++good_steps == kGrowthInterval) {
    scale *= kGrowthFactor;
    good_steps = 0;
  }
  return true;
}

namespace {

// inf and NaN are the values whose exponent bits are all ones: an integer OR over the elements,
// which the compiler vectorises (a float reduction it may not reorder, std::isfinite it does not).
template <typename Bits, Bits kExponent>
bool span_finite(const void* data, int64_t n) {
  const Bits* p = static_cast<const Bits*>(data);
  Bits bad = 0;
  for (int64_t i = 0; i < n; ++i) bad |= Bits((p[i] & kExponent) == kExponent);
  return bad == 0;
}

}  // namespace

bool all_finite(const std::vector<Tensor>& tensors) {
  std::atomic<bool> finite{true};
  for (const Tensor& t : tensors) {
    OT_CHECK(t.dtype() == DType::kFloat32 || t.dtype() == DType::kFloat64, "all_finite: dtype ",
             dtype_name(t.dtype()), " is not supported (float32, float64)");
    constexpr int64_t kBlock = 1 << 16;
    const int64_t blocks = (t.numel() + kBlock - 1) / kBlock;
    parallel_for(blocks, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t b = lo; b < hi && finite.load(std::memory_order_relaxed); ++b) {
        const int64_t begin = b * kBlock, n = std::min(t.numel(), begin + kBlock) - begin;
        const bool ok = t.dtype() == DType::kFloat32
                            ? span_finite<uint32_t, 0x7f800000u>(t.data<float>() + begin, n)
                            : span_finite<uint64_t, 0x7ff0000000000000ull>(t.data<double>() + begin, n);
        if (!ok) finite.store(false, std::memory_order_relaxed);
      }
    });
    if (!finite) return false;
  }
  return true;
}

}  // namespace onnxtrain::optim
