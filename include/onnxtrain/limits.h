// Resource limits: what one model may take before it fails with an error instead of exhausting
// the machine. A model whose declared shapes or external data would need more tensor memory than
// allowed fails with Error(kRuntime) naming the allocation and the limit, not with an
// out-of-memory kill; a Loop that never ends fails once it passes the iteration limit.
//
//   onnxtrain::ResourceLimits l = onnxtrain::resource_limits();
//   l.max_alloc_bytes = 4ull << 30;              // or ONNXTRAIN_MAX_ALLOC=4G in the environment
//   onnxtrain::set_resource_limits(l);
//
// The limits are process-wide (every session, module and checkpoint of the process counts).
#pragma once

#include <cstdint>

namespace onnxtrain {

struct ResourceLimits {
  // Bytes of tensor storage alive at once (parameters, activations, arenas, loaded data).
  // Default: ONNXTRAIN_MAX_ALLOC (bytes, or with a K, M, G or T suffix: powers of 1024), else the
  // machine's physical memory. 0 means no limit.
  uint64_t max_alloc_bytes = 0;
  // Iterations one run of a Loop node may make. Default: ONNXTRAIN_MAX_LOOP_ITERATIONS, else
  // 10,000,000. 0 means no limit; a negative count is Error(kInvalidArgument).
  int64_t max_loop_iterations = 0;
};

// The limits in force (the first call reads the environment; a malformed value throws naming it).
ResourceLimits resource_limits();
void set_resource_limits(const ResourceLimits& limits);
// Bytes of tensor storage alive now, as counted against max_alloc_bytes.
uint64_t live_tensor_bytes();

}  // namespace onnxtrain
