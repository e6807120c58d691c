// The CUDA device's training update (core/device_update.h), from kernels this backend has already
// checked against the CPU: the multi-tensor AdamW of adamw.cu, the elementwise family's Add and Mul
// for accumulating and scaling gradients, and ReduceSum for the overflow check and the norm.
#include <algorithm>
#include <array>
#include <cmath>
#include <mutex>

#include "backends/cuda/kernels.h"
#include "core/device_update.h"
#include "core/dispatch.h"

namespace onnxtrain::cuda {
namespace {

// `value` as a one-element device tensor of `dtype` (rounded as the CPU rounds a factor).
Tensor device_scalar(DType dtype, double value, const Stream& stream) {
  Tensor host = Tensor::empty(dtype, {});
  dispatch_float(dtype, [&]<typename T>() { *host.data<T>() = T(compute_t<T>(value)); });
  return to_device(host, Device::kCuda, stream);
}

void check_floating(const Tensor& t, const char* what) {
  OT_CHECK(t.device() == Device::kCuda, "CUDA training update: ", what, " expected a cuda tensor, got a ",
           device_name(t.device()), " one");
  OT_CHECK(t.dtype() == DType::kFloat32 || t.dtype() == DType::kFloat16 || t.dtype() == DType::kBFloat16,
           "CUDA training update: ", what, " takes float32, float16 or bfloat16 tensors, got ", dtype_name(t.dtype()));
}

// Per tensor, sum_i f(x_i) into one float of a device vector, read back on the host: f(x) = x * x
// for the norm; f(x) = x * 0 (0 when finite, NaN for an infinity or a NaN) for the overflow check.
std::vector<float> per_tensor_sums(const std::vector<Tensor>& tensors, bool squares, const char* what,
                                   const Stream& stream) {
  std::vector<float> sums(tensors.size(), 0.0f);
  int64_t largest = 0;
  for (const Tensor& t : tensors) {
    check_floating(t, what);
    if (t.dtype() != DType::kFloat32)
      OT_THROW(kNotImplemented, "CUDA training update: ", what, " of ", dtype_name(t.dtype()), " gradients (float32 only)");
    largest = std::max(largest, t.numel());
  }
  if (largest == 0) return sums;
  // Each tensor as rows of kRow terms (the last padded with zeros), a block per row, then the
  // rows' sums: one block alone over a 38M-element embedding would take milliseconds.
  constexpr int64_t kRow = 4096;
  const int64_t max_rows = (largest + kRow - 1) / kRow;
  Tensor out = empty_on(Device::kCuda, DType::kFloat32, {int64_t(tensors.size())});
  memset_zero(out.data(), out.nbytes(), stream.get());
  // One scratch for every tensor: the stream runs each product after the last sum read it.
  Tensor terms = empty_on(Device::kCuda, DType::kFloat32, {max_rows * kRow});
  Tensor row_sums = empty_on(Device::kCuda, DType::kFloat32, {max_rows});
  const Tensor zero = device_scalar(DType::kFloat32, 0.0, stream);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& x = tensors[i];
    const int64_t n = x.numel(), rows = (n + kRow - 1) / kRow;
    if (n == 0) continue;
    const Shape flat{n};
    binary(Binary::kMul, DType::kFloat32, x.data(), flat, squares ? x.data() : zero.data(), squares ? flat : Shape{},
           terms.data(), flat, stream.get());
    if (rows * kRow > n) memset_zero(terms.data<float>() + n, size_t(rows * kRow - n) * sizeof(float), stream.get());
    reduce_sum(DType::kFloat32, terms.data(), row_sums.data(), rows, kRow, 1, 1.0f, stream.get());
    reduce_sum(DType::kFloat32, row_sums.data(), out.data<float>() + i, 1, rows, 1, 1.0f, stream.get());
  }
  const Tensor host = to_device(out, Device::kCpu, stream);  // waits for the stream
  for (size_t i = 0; i < sums.size(); ++i) sums[i] = host.data<float>()[i];
  return sums;
}

class CudaUpdate final : public DeviceUpdate {
 public:
  void add(Tensor& dst, const Tensor& src, const Stream& stream) override {
    check_floating(dst, "add");
    OT_CHECK(src.dtype() == dst.dtype() && src.shape() == dst.shape() && src.device() == Device::kCuda,
             "CUDA training update: add expected a cuda ", dtype_name(dst.dtype()), " ", shape_str(dst.shape()),
             " tensor, got a ", device_name(src.device()), " ", dtype_name(src.dtype()), " ", shape_str(src.shape()));
    if (dst.numel() == 0) return;
    binary(Binary::kAdd, dst.dtype(), dst.data(), dst.shape(), src.data(), src.shape(), dst.data(), dst.shape(),
           stream.get());
  }
  void scale(Tensor& t, double factor, const Stream& stream) override {
    check_floating(t, "scale");
    if (t.numel() == 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    // Every gradient of a step is scaled by one factor: uploaded once, not once per gradient.
    if (!factor_.defined() || factor_.dtype() != t.dtype() || factor_value_ != factor) {
      factor_ = device_scalar(t.dtype(), factor, stream);
      factor_value_ = factor;
    }
    binary(Binary::kMul, t.dtype(), t.data(), t.shape(), factor_.data(), {}, t.data(), t.shape(), stream.get());
  }
  bool all_finite(const std::vector<Tensor>& tensors, const Stream& stream) override {
    for (float s : per_tensor_sums(tensors, false, "the overflow check", stream))
      if (!std::isfinite(s)) return false;
    return true;
  }
  double l2_norm(const std::vector<Tensor>& tensors, const Stream& stream) override {
    double sum = 0;
    for (float s : per_tensor_sums(tensors, true, "the gradient norm", stream)) sum += double(s);
    return std::sqrt(sum);
  }
  bool adamw_supports(DType dtype) const override { return dtype == DType::kFloat32; }
  void adamw(const DeviceAdamW& c, std::vector<Tensor>& params, const std::vector<Tensor>& grads,
             std::vector<Tensor>& exp_avg, std::vector<Tensor>& exp_avg_sq, const Stream& stream) override {
    OT_CHECK(grads.size() == params.size() && exp_avg.size() == params.size() && exp_avg_sq.size() == params.size(),
             "CUDA AdamW: ", params.size(), " parameters, ", grads.size(), " gradients, ", exp_avg.size(), " and ",
             exp_avg_sq.size(), " moments");
    std::vector<float*> p, m, v;
    std::vector<const float*> g;
    std::vector<int64_t> sizes;
    for (size_t i = 0; i < params.size(); ++i) {
      const std::array<const Tensor*, 4> tensors{&params[i], &grads[i], &exp_avg[i], &exp_avg_sq[i]};
      for (const Tensor* t : tensors)
        OT_CHECK(t->device() == Device::kCuda && t->dtype() == DType::kFloat32 && t->shape() == params[i].shape(),
                 "CUDA AdamW: tensor ", i, " expected a cuda float32 ", shape_str(params[i].shape()), ", got a ",
                 device_name(t->device()), " ", dtype_name(t->dtype()), " ", shape_str(t->shape()));
      p.push_back(params[i].data<float>());
      g.push_back(grads[i].data<float>());
      m.push_back(exp_avg[i].data<float>());
      v.push_back(exp_avg_sq[i].data<float>());
      sizes.push_back(params[i].numel());
    }
    cuda::adamw(c, p, g, m, v, sizes, stream.get());
  }

 private:
  std::mutex mutex_;
  Tensor factor_;  // the last factor scale() uploaded
  double factor_value_ = 0;
};

CudaUpdate update;
[[maybe_unused]] DeviceUpdate* const registered = register_device_update(Device::kCuda, &update);

}  // namespace
}  // namespace onnxtrain::cuda
