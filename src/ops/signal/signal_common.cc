#include "ops/signal/signal_common.h"

#include <cmath>
#include <numbers>

namespace onnxtrain::signal {

int64_t scalar_int_input(const KernelContext& ctx, size_t i, const char* what) {
  const Node& node = ctx.node();
  OT_CHECK(ctx.has_input(i), node.context(), "input ", what, " is required");
  const Tensor& t = ctx.input(i);
  OT_CHECK(t.numel() == 1 && is_integer(t.dtype()), node.context(), what, " must be one integer, got ",
           dtype_name(t.dtype()), " of shape ", shape_str(t.shape()));
  return t.item_as_int(0);
}

double scalar_double_input(const KernelContext& ctx, size_t i, const char* what) {
  const Node& node = ctx.node();
  OT_CHECK(ctx.has_input(i), node.context(), "input ", what, " is required");
  const Tensor& t = ctx.input(i);
  OT_CHECK(t.numel() == 1 && (is_integer(t.dtype()) || is_floating(t.dtype())), node.context(), what,
           " must be one number, got ", dtype_name(t.dtype()), " of shape ", shape_str(t.shape()));
  return t.item_as_double(0);
}

DType signal_output_dtype(const Node& node, int64_t onnx_dtype) {
  DType dt = DType(int32_t(onnx_dtype));
  bool ok = onnx_dtype > 0 && onnx_dtype <= 16 && dt != DType::kString && dt != DType::kBool &&
            (is_floating(dt) || is_integer(dt)) && dtype_supported(dt);
  OT_CHECK(ok, node.context(), "output_datatype ", onnx_dtype, " is not a supported numeric type");
  return dt;
}

DftPlan::DftPlan(int64_t n, bool inverse) : n_(n), inverse_(inverse), pow2_(n > 0 && (n & (n - 1)) == 0) {
  twiddle_.resize(size_t(n));
  const double sign = inverse ? 1.0 : -1.0;
  for (int64_t j = 0; j < n; ++j) {
    double a = 2 * std::numbers::pi * double(j) / double(n);
    twiddle_[size_t(j)] = {std::cos(a), sign * std::sin(a)};
  }
}

void DftPlan::run(std::vector<std::complex<double>>& x, std::complex<double>* out, int64_t out_len) const {
  const int64_t n = n_;
  const double scale = inverse_ ? 1.0 / double(n) : 1.0;
  if (pow2_ && n >= 8) {
    // In-place iterative radix-2: bit-reversal permutation, then butterflies.
    for (int64_t i = 1, j = 0; i < n; ++i) {
      int64_t bit = n >> 1;
      for (; j & bit; bit >>= 1) j ^= bit;
      j ^= bit;
      if (i < j) std::swap(x[size_t(i)], x[size_t(j)]);
    }
    for (int64_t len = 2; len <= n; len <<= 1) {
      const int64_t step = n / len;
      for (int64_t i = 0; i < n; i += len)
        for (int64_t k = 0; k < len / 2; ++k) {
          std::complex<double> u = x[size_t(i + k)], v = x[size_t(i + k + len / 2)] * twiddle_[size_t(k * step)];
          x[size_t(i + k)] = u + v;
          x[size_t(i + k + len / 2)] = u - v;
        }
    }
    for (int64_t k = 0; k < out_len; ++k) out[k] = x[size_t(k)] * scale;
    return;
  }
  for (int64_t k = 0; k < out_len; ++k) {
    std::complex<double> acc = 0;
    int64_t idx = 0;  // j * k mod n, kept exact
    for (int64_t j = 0; j < n; ++j) {
      acc += x[size_t(j)] * twiddle_[size_t(idx)];
      idx += k;
      if (idx >= n) idx %= n;
    }
    out[k] = acc * scale;
  }
}

}  // namespace onnxtrain::signal
