// MelWeightMatrix (opset 17): a [dft_length / 2 + 1, num_mel_bins] matrix of triangular filters
// that maps a onesided magnitude spectrum to the mel scale. num_mel_bins + 2 points evenly spaced
// in mel (mel = 2595 log10(1 + hz / 700)) between lower_edge_hertz and upper_edge_hertz (step
// (high - low) / (num_mel_bins + 2), as the ONNX reference) are mapped back to hertz and to
// spectrogram bins floor((dft_length + 1) hz / sample_rate); filter i rises linearly from bin i to
// bin i + 1 and falls to bin i + 2. output_datatype (default float) picks the dtype.
#include <cmath>

#include "ops/common.h"
#include "ops/registry.h"
#include "ops/signal/signal_common.h"

namespace onnxtrain {
namespace {

using namespace signal;

void mel_shape(ShapeContext& ctx) {
  DType dt = signal_output_dtype(ctx.node(), ctx.node().attr_int("output_datatype", 1));
  int64_t bins = -1, rows = -1;
  if (const Tensor* t = ctx.input_value(0); t && t->numel() == 1) bins = t->item_as_int(0);
  if (const Tensor* t = ctx.input_value(1); t && t->numel() == 1) rows = t->item_as_int(0) / 2 + 1;
  ctx.set_output(0, dt, Shape{rows, bins});
}

void mel_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const int64_t num_mel = scalar_int_input(ctx, 0, "num_mel_bins");
  const int64_t dft_length = scalar_int_input(ctx, 1, "dft_length");
  const int64_t sample_rate = scalar_int_input(ctx, 2, "sample_rate");
  const double low = scalar_double_input(ctx, 3, "lower_edge_hertz");
  const double high = scalar_double_input(ctx, 4, "upper_edge_hertz");
  OT_CHECK(num_mel >= 1 && dft_length >= 1 && sample_rate >= 1, node.context(),
           "num_mel_bins, dft_length and sample_rate must be >= 1, got ", num_mel, ", ", dft_length, ", ", sample_rate);
  OT_CHECK(low >= 0 && high > low && high <= double(sample_rate) / 2, node.context(),
           "expected 0 <= lower_edge_hertz < upper_edge_hertz <= sample_rate / 2, got ", low, ", ", high, ", ",
           sample_rate);
  DType dt = signal_output_dtype(node, node.attr_int("output_datatype", 1));
  const int64_t rows = dft_length / 2 + 1;
  auto to_mel = [](double hz) { return 2595.0 * std::log10(1.0 + hz / 700.0); };
  const double low_mel = to_mel(low), step = (to_mel(high) - low_mel) / double(num_mel + 2);
  std::vector<int64_t> edge(static_cast<size_t>(num_mel + 2));
  for (int64_t i = 0; i < num_mel + 2; ++i) {
    double hz = 700.0 * (std::pow(10.0, (double(i) * step + low_mel) / 2595.0) - 1.0);
    edge[size_t(i)] = int64_t(std::floor(double(dft_length + 1) * hz / double(sample_rate)));
    edge[size_t(i)] = std::clamp<int64_t>(edge[size_t(i)], 0, rows - 1);
  }
  std::vector<double> m(static_cast<size_t>(rows * num_mel), 0.0);
  for (int64_t i = 0; i < num_mel; ++i) {
    const int64_t l = edge[size_t(i)], c = edge[size_t(i + 1)], h = edge[size_t(i + 2)];
    if (c == l) {
      m[size_t(c * num_mel + i)] = 1.0;
    } else {
      for (int64_t j = l; j <= c; ++j) m[size_t(j * num_mel + i)] = double(j - l) / double(c - l);
    }
    for (int64_t j = c; j < h; ++j) m[size_t(j * num_mel + i)] = double(h - j) / double(h - c);
  }
  Tensor& y = ctx.output(0, dt, Shape{rows, num_mel});
  dispatch_numeric(dt, [&]<typename T>() {
    T* py = y.data<T>();
    for (size_t i = 0; i < m.size(); ++i) py[i] = cast_value<T>(m[i]);
  });
}

}  // namespace

// A constant filter bank computed from sizes and frequencies: nothing to differentiate.
ONNXTRAIN_OP(MelWeightMatrix, kOnnxDomain, 17).inputs(5).outputs(1).shape(mel_shape).not_differentiable()
    .cpu(mel_kernel);

}  // namespace onnxtrain
