// Per-thread float scratch of the portable kernels (conv_direct.cc, sgemm_blocked.cc):
// it outlives a call, so a step's products and convolutions reuse it instead of allocating, and it
// only grows. Never zero-filled: every user writes what it reads (zero-filling cost the first step
// of the digits CNN ~20%, and a std::vector resized between a small and a large product 6% of
// every step).
#pragma once

#include <cstdint>
#include <memory>

namespace onnxtrain::cpu {

enum class ScratchUser { kConvolution, kGemm };

// Slot `slot` of `User`'s buffers on this thread, at least `count` floats.
template <ScratchUser User>
float* thread_scratch(int slot, int64_t count) {
  struct Buffer {
    std::unique_ptr<float[]> data;
    int64_t size = 0;
  };
  thread_local Buffer buffers[3];
  Buffer& b = buffers[slot];
  if (b.size < count) {
    b.data = std::make_unique_for_overwrite<float[]>(size_t(count));
    b.size = count;
  }
  return b.data.get();
}

}  // namespace onnxtrain::cpu
