// A small most-recently-used cache keyed by integer vectors (shapes, flags): kernels keep their
// per-shape state (oneDNN primitives, reorder buffers, parsed plans) here.
#pragma once

#include <cstdint>
#include <list>
#include <utility>
#include <vector>

namespace onnxtrain::cpu {

// A small most-recently-used cache: keys are integer vectors (shapes, flags), values are whatever
// a kernel builds per shape (primitives, reordered buffers). Entries beyond `capacity` are dropped
// oldest first, so a model fed many shapes does not grow without bound.
template <typename V>
class ShapeCache {
 public:
  explicit ShapeCache(size_t capacity = 16) : capacity_(capacity) {}
  V* find(const std::vector<int64_t>& key) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->first == key) {
        if (it != entries_.begin()) entries_.splice(entries_.begin(), entries_, it);
        return &entries_.front().second;
      }
    }
    return nullptr;
  }
  V& insert(std::vector<int64_t> key, V value) {
    entries_.emplace_front(std::move(key), std::move(value));
    while (entries_.size() > capacity_) entries_.pop_back();
    return entries_.front().second;
  }
  size_t size() const { return entries_.size(); }

 private:
  size_t capacity_;
  std::list<std::pair<std::vector<int64_t>, V>> entries_;
};

}  // namespace onnxtrain::cpu
