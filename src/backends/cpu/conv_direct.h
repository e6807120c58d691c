// Direct fp32 convolution (1-d, 2-d, 3-d; groups, strides, dilations, pads), with no im2col: the
// portable convolution (conv_portable.cc) of both builds.
//
// One register-tiled kernel computes, for one image and one group,
//   out[o][p] = sum over input channels i, then taps t of  wt[i][t][o] * src[i][pos[p] + tap[t]]
// with `src` a zero-padded copy of the image (a "frame": no window needs a bounds check), a tile
// of MB vectors of outputs o by P positions p held in registers, and the weights repacked once per
// call so the o of one (i, t) are contiguous. It serves the forward pass (src = X in its frame,
// outputs = M) and the backward-data pass (src = dY spread out by the stride in a frame as large as
// X plus the kernel's reach, outputs = C, taps mirrored: dX is then the stride-1 convolution of
// that frame with W's taps flipped), which is also a transposed convolution's forward. The
// backward-weights pass tiles (o, (i, t)) the same way over every (image, position).
//
// Summation order: every output sums its (i, t) products in that order (forward, backward data),
// every weight gradient its (image, position) products in that order, whatever the thread count.
#pragma once

#include <memory>

#include "backends/cpu/conv.h"
#include "backends/cpu/internal.h"

namespace onnxtrain::cpu {

// A plain (not transposed) convolution, channels-first X and Y: y = conv(x, w) + bias (per output
// channel; null: none), no activation or summand.
class DirectConv {
 public:
  OT_INTERNAL explicit DirectConv(const ConvSpec& spec);
  OT_INTERNAL void run(const float* x, const float* w, const float* bias, float* y) const;

  OT_INTERNAL DirectConv(DirectConv&&) noexcept;
  OT_INTERNAL DirectConv& operator=(DirectConv&&) noexcept;
  OT_INTERNAL ~DirectConv();

 private:
  struct Impl;
  std::unique_ptr<const Impl> impl_;  // unique: no shared_ptr control-block symbols (minimal size)
};

// dX and/or dW (and dB) of a plain channels-first convolution.
class DirectConvBackward {
 public:
  OT_INTERNAL DirectConvBackward(const ConvSpec& spec, bool need_dx, bool need_dw);
  // dx: null unless need_dx; dw (and db, when not null) null unless need_dw. x may be null
  // without need_dw.
  OT_INTERNAL void run(const float* dy, const float* x, const float* w, float* dx, float* dw, float* db) const;

  OT_INTERNAL DirectConvBackward(DirectConvBackward&&) noexcept;
  OT_INTERNAL DirectConvBackward& operator=(DirectConvBackward&&) noexcept;
  OT_INTERNAL ~DirectConvBackward();

 private:
  struct Impl;
  std::unique_ptr<const Impl> impl_;  // unique: no shared_ptr control-block symbols (minimal size)
};

}  // namespace onnxtrain::cpu
