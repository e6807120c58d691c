// Liveness-based arena planning.
//
// The planner gets one Buffer per group of values that share memory (a value, the views that
// alias it, and the outputs computed in place over it) with its byte size and the step range in
// which it is live. It places buffers at offsets in one arena so that buffers whose lifetimes
// overlap never overlap in memory: greedy by size, largest first, each at the lowest offset
// that fits (the "greedy by size" scheme of TFLite's planner).
//
//   std::vector<Buffer> bufs = {{4096, 0, 3}, {4096, 2, 5}, {4096, 4, 6}};
//   ArenaLayout layout = plan_arena(bufs);   // offsets {0, 4096, 0}: first and third reuse
//   layout.arena_bytes == 8192, layout.naive_bytes == 12288
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace onnxtrain {

struct Buffer {
  size_t bytes = 0;
  int first_step = 0;  // the step that writes it
  int last_step = 0;   // the last step that reads it (inclusive)
  // Buffers of a higher rank are placed first (by size within a rank): TrainModule's step block
  // puts the saved values, alive together from its start, one after the other at its front.
  int rank = 0;
};

struct ArenaLayout {
  std::vector<size_t> offsets;  // one per buffer, 64-byte aligned
  size_t arena_bytes = 0;       // planned
  size_t naive_bytes = 0;       // every buffer on its own
};

ArenaLayout plan_arena(const std::vector<Buffer>& buffers);

}  // namespace onnxtrain
