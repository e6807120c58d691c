// Counter-based random numbers: the value for (key, i) is a pure function, so any element can be
// drawn on any thread in any order, and a run is reproduced from its key alone (a resumed training
// run redraws exactly the masks an uninterrupted one would). SplitMix64's finaliser (Steele, Lea
// and Flood 2014) is the mixing function; it passes BigCrush in this counter mode.
#pragma once

#include <cstdint>
#include <string_view>

namespace onnxtrain {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// FNV-1a: a stable 64-bit name hash (node names key their random streams).
inline uint64_t hash_name(std::string_view s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

// The key of one random stream: a seed, a stream id (e.g. a node's name hash) and a run index.
inline uint64_t stream_key(uint64_t seed, uint64_t stream, uint64_t run) {
  return splitmix64(splitmix64(seed ^ splitmix64(stream)) + run);
}

// Uniform double in [0, 1) with 53 random bits: element i of the stream `key`.
inline double uniform_at(uint64_t key, uint64_t i) {
  return double(splitmix64(key + i * 0xD1B54A32D192ED03ull) >> 11) * 0x1.0p-53;
}

}  // namespace onnxtrain
