#include <gtest/gtest.h>

#include <algorithm>

#include "runtime/memory_planner.h"

namespace onnxtrain {

TEST(MemoryPlanner, ReusesBuffersWhoseLifetimesDoNotOverlap) {
  std::vector<Buffer> bufs = {{4096, 0, 3}, {4096, 2, 5}, {4096, 4, 6}};
  ArenaLayout layout = plan_arena(bufs);
  EXPECT_EQ(layout.naive_bytes, 12288u);
  EXPECT_EQ(layout.arena_bytes, 8192u);
  EXPECT_EQ(layout.offsets[0], layout.offsets[2]);
  EXPECT_NE(layout.offsets[0], layout.offsets[1]);
}

TEST(MemoryPlanner, OverlappingLifetimesNeverShareBytes) {
  // Random-ish sizes and lifetimes; check the invariant pairwise.
  std::vector<Buffer> bufs;
  for (int i = 0; i < 60; ++i) bufs.push_back({size_t(64 + (i * 7919) % 5000), i % 17, i % 17 + (i * 31) % 9});
  ArenaLayout layout = plan_arena(bufs);
  for (size_t a = 0; a < bufs.size(); ++a)
    for (size_t b = a + 1; b < bufs.size(); ++b) {
      bool alive_together = bufs[a].first_step <= bufs[b].last_step && bufs[b].first_step <= bufs[a].last_step;
      bool disjoint = layout.offsets[a] + bufs[a].bytes <= layout.offsets[b] ||
                      layout.offsets[b] + bufs[b].bytes <= layout.offsets[a];
      if (alive_together) {
        EXPECT_TRUE(disjoint) << a << " and " << b;
      }
    }
  EXPECT_LE(layout.arena_bytes, layout.naive_bytes);
  for (size_t i = 0; i < bufs.size(); ++i) EXPECT_EQ(layout.offsets[i] % 64, 0u);
}

TEST(MemoryPlanner, HigherRankBuffersArePlacedFirstAtTheFront) {
  // Two small ranked buffers alive together, then a large one alive with them: by size alone the
  // large one would take offset 0; ranked, the small ones lie at [0, 8192) one after the other.
  std::vector<Buffer> bufs = {{4096, 0, 2, 1}, {4096, 0, 5, 1}, {65536, 1, 6}};
  ArenaLayout layout = plan_arena(bufs);
  EXPECT_EQ(std::min(layout.offsets[0], layout.offsets[1]), 0u);
  EXPECT_EQ(std::max(layout.offsets[0], layout.offsets[1]), 4096u);
  EXPECT_EQ(layout.offsets[2], 8192u);
}

}  // namespace onnxtrain
