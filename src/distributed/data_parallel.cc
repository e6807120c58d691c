#include "distributed/data_parallel.h"

#include <chrono>
#include <cstring>

namespace onnxtrain::distributed {

GradientAllreducer::GradientAllreducer(Communicator& comm, int64_t bucket_bytes)
    : comm_(comm), bucket_bytes_(bucket_bytes) {
  OT_CHECK(bucket_bytes > 0, "data parallel: bucket_bytes must be > 0, got ", bucket_bytes);
}

namespace {

template <typename T>
void scale(T* p, int64_t n, T s) {
  for (int64_t i = 0; i < n; ++i) p[i] *= s;
}

template <typename T>
void scaled_copy(T* dst, const char* src, int64_t n, T s) {
  const T* from = reinterpret_cast<const T*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = from[i] * s;
}

void scale_tensor(void* data, int64_t n, DType dtype, double s) {
  if (dtype == DType::kFloat32) scale(static_cast<float*>(data), n, float(s));
  else scale(static_cast<double*>(data), n, s);
}

}  // namespace

void GradientAllreducer::set_order(std::vector<size_t> order) {
  std::vector<char> seen(order.size(), 0);
  for (size_t i : order) {
    OT_CHECK(i < order.size() && !seen[i], comm_.label(), ": the gradient ready order is not a permutation of 0..",
             order.size() - 1);
    seen[i] = 1;
  }
  OT_CHECK(!in_step_, comm_.label(), ": set_order during an overlapped step");
  order_ = std::move(order);
  planned_for_.clear();  // cut again on next use
}

void GradientAllreducer::plan_buckets(const std::vector<Tensor>& like) {
  std::vector<std::pair<DType, int64_t>> key;
  for (size_t i = 0; i < like.size(); ++i) {
    const Tensor& g = like[i];
    OT_CHECK(g.dtype() == DType::kFloat32 || g.dtype() == DType::kFloat64, comm_.label(), ": gradient ", i, " is ",
             dtype_name(g.dtype()), "; data parallelism averages float32 and float64 gradients");
    key.emplace_back(g.dtype(), g.numel());
  }
  if (key == planned_for_) return;
  std::vector<size_t> order = order_;
  if (order.size() != like.size()) {
    OT_CHECK(order.empty(), comm_.label(), ": the ready order has ", order.size(), " gradients, the step ", like.size());
    for (size_t i = 0; i < like.size(); ++i) order.push_back(i);
  }
  buckets_.clear();
  bucket_of_.assign(like.size(), 0);
  for (size_t i : order) {
    const int64_t bytes = int64_t(like[i].nbytes());
    Bucket* b = buckets_.empty() ? nullptr : &buckets_.back();
    const bool fits = b && like[i].dtype() == b->dtype && b->numel * int64_t(dtype_size(b->dtype)) + bytes <= bucket_bytes_;
    if (!fits) {
      buckets_.emplace_back();
      b = &buckets_.back();
      b->dtype = like[i].dtype();
    }
    b->members.push_back(i);
    b->numel += like[i].numel();
    bucket_of_[i] = buckets_.size() - 1;
  }
  planned_for_ = std::move(key);
}

std::vector<int64_t> GradientAllreducer::last_bucket_sizes() const {
  std::vector<int64_t> sizes;
  for (const Bucket& b : buckets_) sizes.push_back(int64_t(b.members.size()));
  return sizes;
}

void GradientAllreducer::reduce_bucket(const Bucket& b, std::vector<Tensor>& grads) {
  const double inv = 1.0 / double(comm_.size());
  if (b.members.size() == 1) {  // one tensor: reduce in place, no packing
    Tensor& t = grads[b.members[0]];
    comm_.allreduce_sum(t.data(), b.numel, b.dtype);
    scale_tensor(t.data(), b.numel, b.dtype, inv);
    return;
  }
  const size_t bytes = size_t(b.numel) * dtype_size(b.dtype);
  if (buffer_.size() < bytes) buffer_.resize(bytes);
  size_t off = 0;
  for (size_t i : b.members) {
    std::memcpy(buffer_.data() + off, grads[i].data(), grads[i].nbytes());
    off += grads[i].nbytes();
  }
  comm_.allreduce_sum(buffer_.data(), b.numel, b.dtype);
  off = 0;
  for (size_t i : b.members) {  // unpack and divide by the rank count in one pass
    Tensor& t = grads[i];
    if (b.dtype == DType::kFloat32) scaled_copy(static_cast<float*>(t.data()), buffer_.data() + off, t.numel(), float(inv));
    else scaled_copy(static_cast<double*>(t.data()), buffer_.data() + off, t.numel(), inv);
    off += t.nbytes();
  }
}

void GradientAllreducer::average(std::vector<Tensor>& grads) {
  const auto start = std::chrono::steady_clock::now();
  OT_CHECK(!in_step_, comm_.label(), ": average() during an overlapped step");
  settle_abandoned();
  ++stats_.steps;
  if (comm_.size() > 1) {
    plan_buckets(grads);
    for (const Bucket& b : buckets_) {
      reduce_bucket(b, grads);
      ++stats_.calls;
      stats_.bytes += b.numel * int64_t(dtype_size(b.dtype));
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats_.seconds += seconds;
  stats_.wait_seconds += seconds;
}

void GradientAllreducer::begin(const std::vector<Tensor>& like) {
  OT_CHECK(!in_step_, comm_.label(), ": an overlapped gradient step began before the last one finished");
  settle_abandoned();
  plan_buckets(like);
  step_grads_.assign(like.size(), Tensor());
  missing_.clear();
  for (const Bucket& b : buckets_) missing_.push_back(b.members.size());
  next_bucket_ = 0;
  busy_seconds_ = 0;
  in_step_ = true;
}

void GradientAllreducer::ready(size_t i, const Tensor& grad) {
  OT_CHECK(in_step_, comm_.label(), ": gradient ", i, " handed over outside an overlapped step");
  OT_CHECK(i < step_grads_.size(), comm_.label(), ": gradient ", i, " of ", step_grads_.size());
  OT_CHECK(!step_grads_[i].defined(), comm_.label(), ": gradient ", i, " handed over twice");
  OT_CHECK(grad.dtype() == planned_for_[i].first && grad.numel() == planned_for_[i].second, comm_.label(),
           ": gradient ", i, " is ", dtype_name(grad.dtype()), " with ", grad.numel(), " elements, its parameter ",
           dtype_name(planned_for_[i].first), " with ", planned_for_[i].second);
  step_grads_[i] = grad;
  --missing_[bucket_of_[i]];
  // Start buckets strictly in order: every rank then issues the same allreduces in the same order.
  for (; next_bucket_ < buckets_.size() && missing_[next_bucket_] == 0; ++next_bucket_) {
    const Bucket* b = &buckets_[next_bucket_];
    ++stats_.calls;
    stats_.bytes += b->numel * int64_t(dtype_size(b->dtype));
    comm_.post([this, b] {
      const auto start = std::chrono::steady_clock::now();
      reduce_bucket(*b, step_grads_);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::lock_guard<std::mutex> lock(busy_mutex_);
      busy_seconds_ += s;
    });
  }
}

void GradientAllreducer::finish() {
  OT_CHECK(in_step_, comm_.label(), ": finish() outside an overlapped step");
  for (size_t b = 0; b < missing_.size(); ++b)
    if (missing_[b] != 0) {
      abandon();
      OT_THROW(kRuntime, comm_.label(), ": ", missing_[b], " gradient(s) of bucket ", b,
               " were never handed over during the backward");
    }
  const auto start = std::chrono::steady_clock::now();
  struct End {  // the step is over even when a bucket failed
    GradientAllreducer& r;
    ~End() {
      r.in_step_ = false;
      r.step_grads_.clear();
    }
  } end{*this};
  comm_.drain();
  ++stats_.steps;
  ++stats_.overlapped_steps;
  stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::lock_guard<std::mutex> lock(busy_mutex_);
  stats_.seconds += busy_seconds_;
}

void GradientAllreducer::abandon() {
  // Posted buckets still read step_grads_: it is reset only once they are drained.
  if (in_step_) abandoned_ = true;
  in_step_ = false;
}

void GradientAllreducer::settle_abandoned() {
  if (!abandoned_) return;
  abandoned_ = false;
  step_grads_.clear();
  comm_.drain();  // rethrows the abandoned step's error, if a bucket failed
}

GradientAllreducer::~GradientAllreducer() {
  if (!abandoned_ && !in_step_) return;
  try {
    comm_.drain();
  } catch (...) {  // the step's error was reported when it was abandoned
  }
}

uint64_t checksum_bytes(const void* data, size_t bytes, uint64_t h) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

uint64_t checksum(const std::vector<Tensor>& tensors, uint64_t h) {
  for (const Tensor& t : tensors) {
    const int32_t dt = int32_t(t.dtype());
    h = checksum_bytes(&dt, sizeof dt, h);
    for (int64_t d : t.shape()) h = checksum_bytes(&d, sizeof d, h);
    h = checksum_bytes(t.data(), t.nbytes(), h);
  }
  return h;
}

void check_same_on_all_ranks(Communicator& comm, uint64_t value, const std::string& what) {
  if (comm.size() == 1) return;
  std::vector<uint64_t> all(size_t(comm.size()));
  comm.allgather(&value, sizeof value, all.data());
  std::string differ;
  for (size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  if (!differ.empty())
    OT_THROW(kInvalidArgument, comm.label(), ": ranks disagree on ", what, ": rank(s) ", differ,
             " differ from rank 0", (all[size_t(comm.rank())] != all[0] ? " (this rank among them)" : ""),
             "; every rank must load the same artifacts and checkpoint");
}

}  // namespace onnxtrain::distributed
