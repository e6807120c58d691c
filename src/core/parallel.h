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

// Below this much work (multiply-adds, or kMemoryBoundElementWork per element a memory-bound op
// reads or writes) one kernel call runs on the calling thread, and a plan whose every step is below
// it runs on one thread (Executor::decide_serial). The bar is what a region of the pool costs
// against the work it halves: while a run keeps the pool busy its threads spin between regions and
// a two-thread region forks and joins in about 1 us, where 256 Ki multiply-adds take about 8 us of
// one core; a pool asleep (after about a millisecond idle: OpenMP's spin count) takes 100-150 us to
// wake here, which a plan of only such small steps (an MLP on a few rows) would pay every run
// (2-core Zen 4 VM, 2026-11-27). Until 2026-11-27 the bar was 4 Mi, set when batch-1 convolutions
// of 1-4 M multiply-adds ran 1.5-3x faster on one thread (2026-11-24, a VM state whose page faults
// cost 5-10x today's, and a wake-up on the loaded machine milliseconds); today the batch-1 ResNet
// and MobileNetV2 run 1.5-2x faster with the pool (docs/DESIGN.md "Small plans run on one thread").
inline constexpr int64_t kSerialWork = int64_t(1) << 18;
// kSerialWork, or ONNXTRAIN_SERIAL_WORK (read once; 0: no serial steps) to measure the choice (DESIGN.md).
int64_t serial_work();
// Whether OpenMP's threads sleep between parallel regions (OMP_WAIT_POLICY=passive, as on a shared
// machine): then every region starts by waking them, which costs 100-150 us here whether the step
// before ran on the pool or not, so the executor runs each step below kPassiveSerialWork on the
// calling thread (Executor::decide_serial), not only plans whose every step is small.
bool pool_sleeps_between_regions();
// About a wake-up's worth of one core's work: 4 Mi multiply-adds take 130 us at 30 G/s.
inline constexpr int64_t kPassiveSerialWork = int64_t(1) << 22;
// The bar for one step while the pool sleeps between regions: kPassiveSerialWork, or
// ONNXTRAIN_SERIAL_WORK when set; 0 (no serial steps) while the pool spins.
int64_t serial_step_work();
// A memory-bound element (read or written) counted as this many multiply-adds: one core streams
// about 4 G elements/s through an elementwise loop and multiply-adds 30 G/s in a JIT convolution.
inline constexpr int64_t kMemoryBoundElementWork = 8;

// Elementwise loops move about this many elements per thread before splitting pays.
inline constexpr int64_t kElementwiseGrain = 32768;

}  // namespace onnxtrain
