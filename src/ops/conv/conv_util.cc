#include "ops/conv/conv_util.h"

#include "onnxtrain/status.h"

namespace onnxtrain {
namespace {

int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

std::vector<int64_t> ints_or(const Node& node, const char* key, size_t n, int64_t dflt) {
  std::vector<int64_t> v = node.attr_ints(key, std::vector<int64_t>(n, dflt));
  if (v.empty()) v.assign(n, dflt);
  OT_CHECK(v.size() == n, node.context(), "attribute ", key, " should have ", n, " values, got ", v.size());
  return v;
}

void read_common(const Node& node, WindowGeometry& g, size_t nd, std::vector<int64_t> kernel) {
  if (node.has_attr("kernel_shape")) {
    auto ks = node.attr_ints("kernel_shape");
    OT_CHECK(ks.size() == nd, node.context(), "kernel_shape should have ", nd, " values, got ", ks.size());
    for (size_t i = 0; i < nd && i < kernel.size(); ++i)
      OT_CHECK(kernel[i] < 0 || ks[i] == kernel[i], node.context(), "kernel_shape ", ks[i], " disagrees with the weights' ",
               kernel[i]);
    kernel = ks;
  }
  OT_CHECK(kernel.size() == nd, node.context(), "kernel needs ", nd, " spatial dims, got ", kernel.size());
  g.kernel = kernel;
  g.stride = ints_or(node, "strides", nd, 1);
  g.dilation = ints_or(node, "dilations", nd, 1);
  for (size_t i = 0; i < nd; ++i) {
    OT_CHECK(g.stride[i] >= 1 && g.dilation[i] >= 1, node.context(), "strides and dilations must be >= 1");
    OT_CHECK(g.kernel[i] >= 1 || g.kernel[i] == -1, node.context(), "kernel dims must be >= 1, got ", g.kernel[i]);
  }
}

}  // namespace

WindowGeometry window_geometry(const Node& node, const std::vector<int64_t>& in, std::vector<int64_t> kernel,
                               bool ceil_mode) {
  size_t nd = in.size();
  WindowGeometry g;
  read_common(node, g, nd, std::move(kernel));
  std::string auto_pad = node.attr_string("auto_pad", "NOTSET");
  g.pad_l.assign(nd, 0);
  g.pad_r.assign(nd, 0);
  g.out.assign(nd, -1);
  if (auto_pad == "NOTSET" || auto_pad.empty()) {
    auto pads = ints_or(node, "pads", 2 * nd, 0);
    for (size_t i = 0; i < nd; ++i) {
      g.pad_l[i] = pads[i];
      g.pad_r[i] = pads[i + nd];
      OT_CHECK(g.pad_l[i] >= 0 && g.pad_r[i] >= 0, node.context(), "pads must be >= 0");
    }
  } else {
    OT_CHECK(auto_pad == "VALID" || auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER", node.context(),
             "auto_pad must be NOTSET, VALID, SAME_UPPER or SAME_LOWER, got '", auto_pad, "'");
  }
  bool same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
  for (size_t i = 0; i < nd; ++i) {
    if (in[i] < 0 || g.kernel[i] < 0) continue;
    int64_t ek = g.effective(i), s = g.stride[i];
    if (same) {
      g.out[i] = (in[i] + s - 1) / s;
      int64_t total = std::max<int64_t>(0, (g.out[i] - 1) * s + ek - in[i]);
      g.pad_l[i] = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      g.pad_r[i] = total - g.pad_l[i];
      continue;
    }
    int64_t span = in[i] + g.pad_l[i] + g.pad_r[i] - ek;
    OT_CHECK(span >= 0, node.context(), "the window (", ek, " with dilation) is larger than the padded input (",
             in[i] + g.pad_l[i] + g.pad_r[i], ") along spatial axis ", i);
    g.out[i] = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
    if (ceil_mode) {
      // ONNX: windows must start inside the input or the left padding.
      if ((g.out[i] - 1) * s >= in[i] + g.pad_l[i]) --g.out[i];
    }
  }
  return g;
}

WindowGeometry transpose_geometry(const Node& node, const std::vector<int64_t>& in, std::vector<int64_t> kernel) {
  size_t nd = in.size();
  WindowGeometry g;
  read_common(node, g, nd, std::move(kernel));
  auto op = ints_or(node, "output_padding", nd, 0);
  std::string auto_pad = node.attr_string("auto_pad", "NOTSET");
  std::vector<int64_t> out_shape = node.attr_ints("output_shape");
  if (out_shape.size() > nd) out_shape.erase(out_shape.begin(), out_shape.end() - int64_t(nd));
  OT_CHECK(out_shape.empty() || out_shape.size() == nd, node.context(), "output_shape should have ", nd,
           " values, got ", out_shape.size());
  bool same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
  g.pad_l.assign(nd, 0);
  g.pad_r.assign(nd, 0);
  g.out.assign(nd, -1);
  std::vector<int64_t> pads;
  if (out_shape.empty() && !same && auto_pad != "VALID") pads = ints_or(node, "pads", 2 * nd, 0);
  for (size_t i = 0; i < nd; ++i) {
    OT_CHECK(op[i] >= 0 && (op[i] < g.stride[i] || op[i] < g.dilation[i]), node.context(),
             "output_padding must be smaller than the stride or the dilation, got ", op[i]);
    if (in[i] < 0 || g.kernel[i] < 0) continue;
    int64_t full = g.stride[i] * (in[i] - 1) + op[i] + g.effective(i);
    if (!out_shape.empty() || same) {
      int64_t target = out_shape.empty() ? in[i] * g.stride[i] : out_shape[i];
      int64_t total = full - target;
      int64_t half = floor_div(total, 2);
      g.pad_l[i] = auto_pad == "SAME_UPPER" ? half : total - half;
      g.pad_r[i] = total - g.pad_l[i];
    } else if (!pads.empty()) {
      g.pad_l[i] = pads[i];
      g.pad_r[i] = pads[i + nd];
    }
    g.out[i] = full - g.pad_l[i] - g.pad_r[i];
    OT_CHECK(g.out[i] >= 0, node.context(), "output size along spatial axis ", i, " would be ", g.out[i]);
    g.pad_r[i] -= op[i];
  }
  return g;
}

cpu::ConvSpec conv_spec(const Tensor& x, int64_t out_channels, int64_t group, bool bias, const WindowGeometry& g) {
  cpu::ConvSpec s;
  s.dtype = x.dtype();
  s.x = x.shape();
  s.out_channels = out_channels;
  s.group = group;
  s.bias = bias;
  s.kernel = g.kernel;
  s.stride = g.stride;
  s.dilation = g.dilation;
  s.pad_l = g.pad_l;
  s.pad_r = g.pad_r;
  s.out = g.out;
  return s;
}

}  // namespace onnxtrain
