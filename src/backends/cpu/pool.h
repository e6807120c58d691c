// fp32 max and average pooling (1-d/2-d/3-d; strides, dilations, pads, ceil mode) and their
// backward passes, in the plain ONNX layout. The full build runs them through oneDNN
// (pool_dnnl.cc); the minimal build has no pooling library (pool_minimal.cc declines every spec).
// One PoolPrimitive per shape; PoolPrimitive::make returns none for geometry the library does not
// reproduce with ONNX's meaning, and the kernels then take their generic loop.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "onnxtrain/tensor.h"

namespace onnxtrain::cpu {

struct PoolSpec {
  bool max = true;                  // else average
  bool count_include_pad = false;   // average only: divide by the taps inside input + explicit pads
  Shape x;                          // [N, C, in...]
  // pad_r as the attributes give it; `out` may need more (ceil mode) or less of it.
  std::vector<int64_t> kernel, stride, dilation, pad_l, pad_r, out;
  std::vector<int64_t> key() const;
};

class PoolPrimitive {
 public:
  // Null when no library runs the spec; for oneDNN, when it cannot express it: a window wholly inside padding, or count_include_pad
  // averages whose windows reach past the explicit pads (ceil mode), which oneDNN would count.
  static std::optional<PoolPrimitive> make(const PoolSpec& spec, bool backward, const std::string& context);

  void forward(const float* x, float* y) const;
  // dX from dY; max pooling recomputes its argmax from X (a forward pass into a workspace), as
  // MaxPoolGrad receives X, not indices.
  void backward(const float* dy, const float* x, float* dx) const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace onnxtrain::cpu
