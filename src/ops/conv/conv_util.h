// Window geometry shared by Conv, ConvTranspose and the pools: kernel/stride/dilation/pads from
// attributes and auto_pad, and output sizes (floor or ceil mode). Dims of -1 (unknown, in shape
// rules) give -1 outputs.
#pragma once

#include <vector>

#include "backends/cpu/conv.h"
#include "ir/graph.h"

namespace onnxtrain {

struct WindowGeometry {
  std::vector<int64_t> kernel, stride, dilation, pad_l, pad_r, out;
  int64_t effective(size_t i) const { return (kernel[i] - 1) * dilation[i] + 1; }
};

// Conv and pools: `in` is the spatial input shape, `kernel` the window (from W or kernel_shape).
// Rules: NOTSET: out = floor_or_ceil((in + pl + pr - ek) / s) + 1; VALID: pads 0;
// SAME_*: out = ceil(in / s), total pad = max(0, (out-1)*s + ek - in), the odd one at the end
// (SAME_UPPER) or the start (SAME_LOWER).
WindowGeometry window_geometry(const Node& node, const std::vector<int64_t>& in, std::vector<int64_t> kernel,
                               bool ceil_mode);

// ConvTranspose: out = s*(in-1) + output_padding + ek - pl - pr, or pads derived from output_shape
// (or from out = in*s for SAME_*): total = s*(in-1) + output_padding + ek - out, SAME_UPPER puts
// floor(total/2) first, the others put it last. pad_r here already has output_padding subtracted,
// so out = s*(in-1) + ek - pad_l - pad_r; pads may be negative when output_shape asks for more.
WindowGeometry transpose_geometry(const Node& node, const std::vector<int64_t>& in, std::vector<int64_t> kernel);

// The oneDNN convolution spec of X (its dtype and shape), M output channels and a geometry;
// callers add what only they know (activation, layouts, transposed).
cpu::ConvSpec conv_spec(const Tensor& x, int64_t out_channels, int64_t group, bool bias, const WindowGeometry& g);

}  // namespace onnxtrain
