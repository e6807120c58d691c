// Threads: one OpenMP pool shared with oneDNN (DESIGN.md), so nothing oversubscribes.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace onnxtrain {

void set_num_threads(int n);  // <= 0 keeps OpenMP's default
int num_threads();

// Calls fn(begin, end) over [0, n) in chunks of at least `grain` items, in parallel when the
// work is large enough to pay for waking the pool.
template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& fn) {
  if (n <= 0) return;
  int threads = omp_get_max_threads();
  if (threads <= 1 || n <= grain || omp_in_parallel()) {
    fn(int64_t(0), n);
    return;
  }
  int64_t chunks = std::min<int64_t>(threads, (n + grain - 1) / grain);
#pragma omp parallel for num_threads(int(chunks)) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t begin = n * c / chunks, end = n * (c + 1) / chunks;
    fn(begin, end);
  }
}

// Elementwise loops move about this many elements per thread before splitting pays.
inline constexpr int64_t kElementwiseGrain = 32768;

}  // namespace onnxtrain
