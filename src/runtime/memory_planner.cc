#include "runtime/memory_planner.h"

#include <algorithm>
#include <numeric>

namespace onnxtrain {

namespace {
size_t align64(size_t n) { return (n + 63) / 64 * 64; }
}  // namespace

ArenaLayout plan_arena(const std::vector<Buffer>& buffers) {
  ArenaLayout layout;
  layout.offsets.assign(buffers.size(), 0);
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) {
                     if (buffers[a].rank != buffers[b].rank) return buffers[a].rank > buffers[b].rank;
                     return buffers[a].bytes > buffers[b].bytes;
                   });

  struct Placed { size_t offset, bytes; int first, last; };
  std::vector<Placed> placed;
  placed.reserve(buffers.size());
  for (size_t idx : order) {
    const Buffer& buf = buffers[idx];
    size_t bytes = align64(buf.bytes);
    layout.naive_bytes += bytes;
    // Intervals already taken by buffers alive at the same time, by offset.
    std::vector<std::pair<size_t, size_t>> busy;
    for (const auto& p : placed)
      if (p.first <= buf.last_step && buf.first_step <= p.last)
        busy.emplace_back(p.offset, p.offset + p.bytes);
    std::sort(busy.begin(), busy.end());
    // Best fit: the smallest gap that holds the buffer, else the end.
    size_t best = SIZE_MAX, best_gap = SIZE_MAX, cursor = 0;
    for (const auto& [begin, end] : busy) {
      if (begin >= cursor + bytes && begin - cursor < best_gap) {
        best = cursor;
        best_gap = begin - cursor;
      }
      cursor = std::max(cursor, end);
    }
    if (best == SIZE_MAX) best = cursor;
    layout.offsets[idx] = best;
    layout.arena_bytes = std::max(layout.arena_bytes, best + bytes);
    placed.push_back({best, bytes, buf.first_step, buf.last_step});
  }
  return layout;
}

}  // namespace onnxtrain
