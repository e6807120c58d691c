// Direct fp32 2-d convolution for small images, with no im2col: the portable convolution's fast
// path (conv_portable.cc) for ungrouped, channels-first convolutions, in both builds.
//
// One register-tiled kernel computes, for one image,
//   out[o][p] = sum over input channels i, then taps t of  wt[i][t][o] * src[i][pos[p] + tap[t]]
// with `src` a zero-padded copy of the image (so no window needs a bounds check), a tile of
// MB vectors of outputs o by P positions p held in registers, and the weights repacked once per
// call so the o of one (i, t) are contiguous. It serves the forward pass (src = X padded, outputs
// = M) and, at stride 1, the backward-data pass (src = dY padded by the kernel's reach, outputs = C,
// taps mirrored: dX is the stride-1 convolution of dY with W's taps flipped). The backward-weights
// pass tiles (o, (i, t)) the same way over every (image, position).
//
// Summation order: every output sums its (i, t) products in that order (forward, backward data),
// every weight gradient its (image, position) products in that order, whatever the thread count.
#pragma once

#include <memory>

#include "backends/cpu/internal.h"
#include "backends/cpu/conv.h"

namespace onnxtrain::cpu {

class DirectConv {
 public:
  // fp32, 2-d, not transposed, one group, channels-first X and Y.
  OT_INTERNAL static bool takes(const ConvSpec& spec);
  OT_INTERNAL explicit DirectConv(const ConvSpec& spec);
  // y = conv(x, w) + bias (per output channel; null: none). No activation or summand.
  OT_INTERNAL void run(const float* x, const float* w, const float* bias, float* y) const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

class DirectConvBackward {
 public:
  // As DirectConv::takes; with need_dx also stride 1.
  OT_INTERNAL static bool takes(const ConvSpec& spec, bool need_dx);
  OT_INTERNAL DirectConvBackward(const ConvSpec& spec, bool need_dx, bool need_dw);
  // dx: null unless need_dx; dw (and db, when not null) null unless need_dw.
  OT_INTERNAL void run(const float* dy, const float* x, const float* w, float* dx, float* dw, float* db) const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace onnxtrain::cpu
