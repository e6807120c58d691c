// Max and average pooling (1-d/2-d/3-d; strides, dilations, pads, ceil mode) and their backward
// passes, in the plain ONNX layout; fp32, and bf16 where the backend has kernels for it. The full
// build runs them through oneDNN (pool_dnnl.cc) but for the small fp32 2-d ones portable.h picks;
// the minimal build through the 2-d fp32 loops of pool_loops.h (pool_minimal.cc). One
// PoolPrimitive per shape; PoolPrimitive::make returns none for geometry (or a dtype) the backend
// does not reproduce with ONNX's meaning, and the kernels then take their generic loop.
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
  DType dtype = DType::kFloat32;    // of X, Y, dX, dY: kFloat32 or kBFloat16
  bool channels_last = false;       // X and Y stored [N, spatial..., C] (the minimal build declines)
  Shape x;                          // [N, C, in...]
  // pad_r as the attributes give it; `out` may need more (ceil mode) or less of it.
  std::vector<int64_t> kernel, stride, dilation, pad_l, pad_r, out;
  std::vector<int64_t> key() const;
};

class PoolPrimitive {
 public:
  // Null when oneDNN cannot express the spec: a window wholly inside padding, or count_include_pad
  // averages whose windows reach past the explicit pads (ceil mode), which oneDNN would count.
  static std::optional<PoolPrimitive> make(const PoolSpec& spec, bool backward, const std::string& context);

  // Pointers to data of spec.dtype.
  void forward(const void* x, void* y) const;
  // dX from dY; max pooling recomputes its argmax from X (a forward pass into a workspace), as
  // MaxPoolGrad receives X, not indices.
  void backward(const void* dy, const void* x, void* dx) const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace onnxtrain::cpu
