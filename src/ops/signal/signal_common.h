// Helpers shared by the signal ops (windows, DFT, STFT, MelWeightMatrix).
#pragma once

#include <complex>
#include <vector>

#include "ops/common.h"

namespace onnxtrain::signal {

// Reads input i as one integer (a scalar or a 1-element tensor of an integer dtype).
int64_t scalar_int_input(const KernelContext& ctx, size_t i, const char* what);
// Reads input i as one floating-point or integer value.
double scalar_double_input(const KernelContext& ctx, size_t i, const char* what);

// The dtype named by an output_datatype attribute value; throws naming the node when the runtime
// cannot store it or it is not numeric.
DType signal_output_dtype(const Node& node, int64_t onnx_dtype);

// The complex DFT of x (length n) at bins [0, out_len): X[k] = sum_j x[j] e^{-+2 pi i jk / n}
// (sign + when inverse, which also scales by 1 / n). Radix-2 FFT for powers of two, a direct sum
// with an exact twiddle table otherwise.
class DftPlan {
 public:
  DftPlan(int64_t n, bool inverse);
  int64_t size() const { return n_; }
  // x: n values (overwritten as scratch), out: the first out_len bins.
  void run(std::vector<std::complex<double>>& x, std::complex<double>* out, int64_t out_len) const;

 private:
  int64_t n_;
  bool inverse_;
  bool pow2_;
  std::vector<std::complex<double>> twiddle_;  // e^{-+2 pi i j / n}, j in [0, n)
};

}  // namespace onnxtrain::signal
