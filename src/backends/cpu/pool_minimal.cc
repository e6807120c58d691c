// Pooling in the minimal build (no oneDNN): fp32 2-d pooling, the case CNNs train with, through
// the portable loops (pool_loops.h); every other spec is declined and the kernels run their
// generic N-d loops (src/ops/conv/pool.cc).
#include "backends/cpu/pool.h"
#include "backends/cpu/pool_loops.h"

namespace onnxtrain::cpu {

struct PoolPrimitive::Impl {
  LoopPool pool;
};

std::optional<PoolPrimitive> PoolPrimitive::make(const PoolSpec& spec, bool, const std::string&) {
  std::optional<LoopPool> loops = LoopPool::make(spec);
  if (!loops) return std::nullopt;
  PoolPrimitive p;
  p.impl_ = std::make_shared<Impl>(Impl{std::move(*loops)});
  return p;
}

void PoolPrimitive::forward(const void* x, void* y) const {
  impl_->pool.forward(static_cast<const float*>(x), static_cast<float*>(y));
}

void PoolPrimitive::backward(const void* dy, const void* x, void* dx) const {
  impl_->pool.backward(static_cast<const float*>(dy), static_cast<const float*>(x), static_cast<float*>(dx));
}

}  // namespace onnxtrain::cpu
