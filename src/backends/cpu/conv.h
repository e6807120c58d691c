// Convolution and transposed convolution (1-d/2-d/3-d, groups, dilations, asymmetric pads),
// forward and backward, one primitive per input/weight shape; fp32, and bf16 where the backend has
// kernels for it. The full build runs them through oneDNN (conv_dnnl.cc: the primitive picks its
// own blocked layouts, with reorders to and from the plain ONNX layouts built with it), except the
// small fp32 ones portable.h picks; the minimal build every one through the portable direct kernels
// (conv_portable.h, conv_minimal.cc, fp32 only).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "onnxtrain/tensor.h"

namespace onnxtrain::cpu {

// An activation applied to a convolution's output inside the primitive (a oneDNN post-op).
// kHardSwish: x * clip(x + 3, 0, 6) / 6.
enum class ConvActivation : int64_t { kNone, kRelu, kLeakyRelu, kSigmoid, kTanh, kClip, kHardSwish };

struct ConvSpec {
  bool transposed = false;    // ConvTranspose
  // Of every tensor argument (X, W, B, Y and their gradients): kFloat32, or kBFloat16 where the
  // CPU has bf16 kernels (oneDNN accumulates in fp32 inside the primitive).
  DType dtype = DType::kFloat32;
  ConvActivation activation = ConvActivation::kNone;
  float act_alpha = 0, act_beta = 0;  // LeakyRelu: alpha; Clip: [alpha, beta]
  Shape x;                    // [N, C, in...]
  int64_t out_channels = 0;   // M
  int64_t group = 1;
  bool bias = false;
  std::vector<int64_t> kernel, stride, dilation, pad_l, pad_r, out;  // pads >= 0; dilation 1 = dense
  // X / Y stored channels last instead of ONNX's [N, C, spatial...] order (FusedConv chains, see
  // FusedConv in src/ops/conv/conv.cc): the convolution reads or writes them without a reorder.
  bool x_channels_last = false, y_channels_last = false;
  // Y = act(conv(X, W) + B + Z): Z (Y's shape and layout) added before the activation (a oneDNN
  // sum post-op; forward only).
  bool sum = false;
  // Built and run on the calling thread alone (reorders included): for convolutions too small to
  // pay for a region of the pool (serial_work(), core/parallel.h).
  bool serial = false;
  std::vector<int64_t> key() const;
};

class ConvPrimitive {
 public:
  ConvPrimitive(const ConvSpec& spec, const std::string& context);
  // w in ONNX layout: Conv [M, C/G, k...], ConvTranspose [C, M/G, k...]. `w_constant`: w's
  // contents never change for this pointer (an initializer), so its reorder is done once.
  // Pointers to data of spec.dtype.
  // `z`: the summand when spec.sum (may be y itself), else null. One caller at a time (a kernel's
  // primitive: the executor runs a plan on one thread at a time); its reorder buffers and memory
  // objects are reused from call to call.
  void run(const void* x, const void* w, const void* bias, void* y, bool w_constant = false,
           const void* z = nullptr) const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// Convolution backward (spec.transposed must be false; the full build beyond portable.h's small
// shapes): dX through oneDNN's backward-data
// primitive, dW (and dB when spec.bias) through backward-weights, both built with a
// forward-training primitive_desc as their hint. The primitives choose their (blocked) layouts and
// reorders to and from the plain ONNX layouts are built with them, as for ConvPrimitive.
class ConvBackwardPrimitive {
 public:
  ConvBackwardPrimitive(const ConvSpec& spec, bool need_dx, bool need_dw, const std::string& context);
  // dx may be null when !need_dx; dw and db null when !need_dw (db also when !spec.bias).
  void run(const void* dy, const void* x, const void* w, void* dx, void* dw, void* db) const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace onnxtrain::cpu
