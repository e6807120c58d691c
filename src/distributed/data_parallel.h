// Data-parallel helpers over a Communicator: gradient averaging in buckets, and checks that all
// ranks hold the same thing (artifacts at start, parameters every N steps in debug mode).
//
//   GradientAllreducer reducer(world(), 25 << 20);
//   reducer.set_order(ready_order);   // gradient indices in the order the backward finishes them
//   reducer.average(grads);           // blocking: grads[i] = mean over ranks, a few large allreduces
//
//   reducer.begin(params);            // overlapped: during the backward,
//   reducer.ready(i, grad_i);         //   as each gradient is final; a full bucket is reduced on the
//   reducer.finish();                 //   communication thread while the backward goes on
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "distributed/communicator.h"

namespace onnxtrain::distributed {

// Packs gradients into buckets of about bucket_bytes (tensors of one dtype, consecutive in the
// ready order; a tensor larger than a bucket is reduced in place on its own), allreduces each
// bucket, and writes back sum / size. The blocking and the overlapped path cut the same buckets
// and run the same pack, allreduce and unpack on them, so their results are bit-identical. The
// bucket buffer is kept between steps: no allocation after the first.
class GradientAllreducer {
 public:
  GradientAllreducer(Communicator& comm, int64_t bucket_bytes);
  ~GradientAllreducer();  // waits for buckets still running
  GradientAllreducer(const GradientAllreducer&) = delete;
  GradientAllreducer& operator=(const GradientAllreducer&) = delete;
  // The order the gradients become final in (a permutation of their indices); buckets are cut
  // along it, so the first bucket fills first. Index order until set.
  void set_order(std::vector<size_t> order);
  void average(std::vector<Tensor>& grads);

  // Overlapped averaging of one step's gradients. `like` has the gradients' dtypes and shapes
  // (the parameters). ready(i, grad) hands over gradient i once no one writes it any more; it
  // must keep its storage until finish(), which waits for every bucket and rethrows the first
  // error. A bucket starts once all its gradients and all earlier buckets are handed over: every
  // rank issues the same allreduces in the same order. abandon() ends a failed step without
  // waiting (the job is ending: a bucket may wait on ranks that will not come).
  void begin(const std::vector<Tensor>& like);
  void ready(size_t i, const Tensor& grad);
  void finish();
  void abandon();
  bool in_step() const { return in_step_; }

  const DataParallelStats& stats() const { return stats_; }
  // How the last step cut the gradients: the number of tensors in each bucket.
  std::vector<int64_t> last_bucket_sizes() const;

 private:
  struct Bucket {
    std::vector<size_t> members;  // gradient indices, in ready order
    DType dtype = DType::kUndefined;
    int64_t numel = 0;
  };
  void plan_buckets(const std::vector<Tensor>& like);
  // Pack, allreduce, unpack with 1/size; runs on the communication thread when overlapped.
  void reduce_bucket(const Bucket& b, std::vector<Tensor>& grads);
  void settle_abandoned();

  Communicator& comm_;
  int64_t bucket_bytes_;
  std::vector<size_t> order_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;                     // per gradient
  std::vector<std::pair<DType, int64_t>> planned_for_; // the (dtype, numel) per gradient the buckets were cut for
  std::vector<char> buffer_;
  // The overlapped step in flight.
  bool in_step_ = false, abandoned_ = false;
  std::vector<Tensor> step_grads_;
  std::vector<size_t> missing_;  // per bucket: gradients not yet handed over
  size_t next_bucket_ = 0;       // the first bucket not yet started
  double busy_seconds_ = 0;      // communication-thread time of this step's buckets
  std::mutex busy_mutex_;
  DataParallelStats stats_;
};

// FNV-1a over the bytes of the tensors (and their shapes and dtypes).
uint64_t checksum(const std::vector<Tensor>& tensors, uint64_t seed = 1469598103934665603ull);
uint64_t checksum_bytes(const void* data, size_t bytes, uint64_t seed = 1469598103934665603ull);

// Every rank passes its value of `what`; throws on every rank when they differ, naming the ranks
// whose value differs from rank 0's.
void check_same_on_all_ranks(Communicator& comm, uint64_t value, const std::string& what);

}  // namespace onnxtrain::distributed
