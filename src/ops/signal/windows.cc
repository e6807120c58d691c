// HannWindow, HammingWindow, BlackmanWindow (opset 17): y[n] = sum_k (-1)^k a_k cos(2 pi k n / N)
// for n in [0, size), N = size (periodic = 1, the default) or size - 1 (periodic = 0, symmetric).
// Hann: a = (0.5, 0.5); Hamming: a = (25/46, 21/46); Blackman: a = (0.42, 0.5, 0.08).
// output_datatype (default float) picks the output dtype. A window of size 1 is [1].
#include <cmath>
#include <numbers>

#include "ops/common.h"
#include "ops/registry.h"
#include "ops/signal/signal_common.h"

namespace onnxtrain {
namespace {

using namespace signal;

// a0, a1, a2 of Hann (0), Hamming (1), Blackman (2).
const double kWindowCoeffs[3][3] = {{0.5, 0.5, 0.0}, {25.0 / 46.0, 21.0 / 46.0, 0.0}, {0.42, 0.5, 0.08}};

void window_shape(ShapeContext& ctx) {
  DType dt = signal_output_dtype(ctx.node(), ctx.node().attr_int("output_datatype", 1));
  std::optional<Shape> out = Shape{-1};
  if (const Tensor* s = ctx.input_value(0); s && s->numel() == 1) out = Shape{std::max<int64_t>(s->item_as_int(0), 0)};
  ctx.set_output(0, dt, out);
}

template <int Kind>
void window_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  int64_t size = scalar_int_input(ctx, 0, "size");
  OT_CHECK(size >= 0, node.context(), "size must be >= 0, got ", size);
  DType dt = signal_output_dtype(node, node.attr_int("output_datatype", 1));
  const bool periodic = node.attr_int("periodic", 1) != 0;
  const double a0 = kWindowCoeffs[Kind][0], a1 = kWindowCoeffs[Kind][1], a2 = kWindowCoeffs[Kind][2];
  Tensor& y = ctx.output(0, dt, Shape{size});
  const double N = double(periodic ? size : size - 1);
  std::vector<double> w(static_cast<size_t>(size));
  for (int64_t n = 0; n < size; ++n) {
    // A one-point window is 1 (as numpy, SciPy and PyTorch; the formula would give 0 or 0/0).
    double t = 2 * std::numbers::pi * double(n) / std::max(N, 1.0);
    w[size_t(n)] = size == 1 ? 1.0 : a0 - a1 * std::cos(t) + a2 * std::cos(2 * t);
  }
  dispatch_numeric(dt, [&]<typename T>() {
    T* py = y.data<T>();
    for (int64_t n = 0; n < size; ++n) py[n] = cast_value<T>(w[size_t(n)]);
  });
}

}  // namespace

// Windows depend only on a size: nothing to differentiate.
ONNXTRAIN_OP(HannWindow, kOnnxDomain, 17).inputs(1).outputs(1).shape(window_shape).not_differentiable()
    .cpu(window_kernel<0>);
ONNXTRAIN_OP(HammingWindow, kOnnxDomain, 17).inputs(1).outputs(1).shape(window_shape).not_differentiable()
    .cpu(window_kernel<1>);
ONNXTRAIN_OP(BlackmanWindow, kOnnxDomain, 17).inputs(1).outputs(1).shape(window_shape).not_differentiable()
    .cpu(window_kernel<2>);

}  // namespace onnxtrain
