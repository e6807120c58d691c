// Data-parallel helpers over a Communicator: gradient averaging in buckets, and checks that all
// ranks hold the same thing (artifacts at start, parameters every N steps in debug mode).
//
//   GradientAllreducer reducer(world(), 25 << 20);
//   reducer.average(grads);     // grads[i] = mean over ranks, a few large allreduces
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distributed/communicator.h"

namespace onnxtrain::distributed {

// Packs gradients into buckets of about bucket_bytes (consecutive tensors of one dtype; a tensor
// larger than a bucket is reduced in place on its own), allreduces each bucket, and writes back
// sum / size. The bucket buffers are kept between steps: no allocation after the first.
class GradientAllreducer {
 public:
  GradientAllreducer(Communicator& comm, int64_t bucket_bytes);
  void average(std::vector<Tensor>& grads);
  const DataParallelStats& stats() const { return stats_; }
  // How the last average() cut the gradients: the number of tensors in each bucket.
  const std::vector<int64_t>& last_bucket_sizes() const { return bucket_sizes_; }

 private:
  void reduce_bucket(std::vector<Tensor*>& members, DType dtype, int64_t numel);

  Communicator& comm_;
  int64_t bucket_bytes_;
  std::vector<char> buffer_;
  std::vector<int64_t> bucket_sizes_;
  DataParallelStats stats_;
};

// FNV-1a over the bytes of the tensors (and their shapes and dtypes).
uint64_t checksum(const std::vector<Tensor>& tensors, uint64_t seed = 1469598103934665603ull);
uint64_t checksum_bytes(const void* data, size_t bytes, uint64_t seed = 1469598103934665603ull);

// Every rank passes its value of `what`; throws on every rank when they differ, naming the ranks
// whose value differs from rank 0's.
void check_same_on_all_ranks(Communicator& comm, uint64_t value, const std::string& what);

}  // namespace onnxtrain::distributed
