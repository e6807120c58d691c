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

void GradientAllreducer::reduce_bucket(std::vector<Tensor*>& members, DType dtype, int64_t numel) {
  if (members.empty()) return;
  const double inv = 1.0 / double(comm_.size());
  bucket_sizes_.push_back(int64_t(members.size()));
  ++stats_.calls;
  stats_.bytes += numel * int64_t(dtype_size(dtype));
  if (members.size() == 1) {  // one tensor: reduce in place, no packing
    comm_.allreduce_sum(members[0]->data(), numel, dtype);
    scale_tensor(members[0]->data(), numel, dtype, inv);
    members.clear();
    return;
  }
  const size_t bytes = size_t(numel) * dtype_size(dtype);
  if (buffer_.size() < bytes) buffer_.resize(bytes);
  size_t off = 0;
  for (Tensor* t : members) {
    std::memcpy(buffer_.data() + off, t->data(), t->nbytes());
    off += t->nbytes();
  }
  comm_.allreduce_sum(buffer_.data(), numel, dtype);
  off = 0;
  for (Tensor* t : members) {  // unpack and divide by the rank count in one pass
    if (dtype == DType::kFloat32) scaled_copy(static_cast<float*>(t->data()), buffer_.data() + off, t->numel(), float(inv));
    else scaled_copy(static_cast<double*>(t->data()), buffer_.data() + off, t->numel(), inv);
    off += t->nbytes();
  }
  members.clear();
}

void GradientAllreducer::average(std::vector<Tensor>& grads) {
  const auto start = std::chrono::steady_clock::now();
  bucket_sizes_.clear();
  ++stats_.steps;
  if (comm_.size() > 1) {
    std::vector<Tensor*> members;
    DType dtype = DType::kUndefined;
    int64_t numel = 0;
    for (size_t i = 0; i < grads.size(); ++i) {
      Tensor& g = grads[i];
      OT_CHECK(g.dtype() == DType::kFloat32 || g.dtype() == DType::kFloat64, comm_.label(), ": gradient ", i,
               " is ", dtype_name(g.dtype()), "; data parallelism averages float32 and float64 gradients");
      const int64_t bytes = int64_t(g.nbytes());
      const bool fits = members.empty() || (g.dtype() == dtype && (numel * int64_t(dtype_size(dtype)) + bytes) <= bucket_bytes_);
      if (!fits) {
        reduce_bucket(members, dtype, numel);
        numel = 0;
      }
      dtype = g.dtype();
      members.push_back(&g);
      numel += g.numel();
    }
    reduce_bucket(members, dtype, numel);
  }
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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
