// Portable fp32 2-d max and average pooling and their backward passes: direct loops, no library.
// One source for both builds: the minimal build runs every 2-d fp32 pooling through it
// (pool_minimal.cc), the full build the small ones portable.h picks (pool_dnnl.cc). Max pooling
// picks the first maximum in window order, as the generic N-d loops of src/ops/conv/pool.cc do,
// and its backward recomputes it from X.
#pragma once

#include <memory>
#include <optional>

#include "backends/cpu/internal.h"
#include "backends/cpu/pool.h"

namespace onnxtrain::cpu {

class LoopPool {
 public:
  // None for what the loops do not take (not fp32 2-d) or a window wholly in the padding (the
  // generic loop says what that means).
  OT_INTERNAL static std::optional<LoopPool> make(const PoolSpec& spec);
  OT_INTERNAL void forward(const float* x, float* y) const;
  OT_INTERNAL void backward(const float* dy, const float* x, float* dx) const;

  OT_INTERNAL LoopPool(LoopPool&&) noexcept;
  OT_INTERNAL LoopPool& operator=(LoopPool&&) noexcept;
  OT_INTERNAL ~LoopPool();

 private:
  OT_INTERNAL LoopPool();
  struct Impl;
  std::unique_ptr<const Impl> impl_;  // unique: no shared_ptr control-block symbols (minimal size)
};

}  // namespace onnxtrain::cpu
