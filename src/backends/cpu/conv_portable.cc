// Portable fp32 convolution (conv_portable.h): every spec through the direct kernels of
// conv_direct.h (a transposed convolution's forward is the backward-data pass of the convolution
// it reverses), with channels-last copies, the summand and the activation around them.
#include "backends/cpu/conv_portable.h"

#include <cmath>
#include <memory>
#include <optional>
#include <vector>

#include "backends/cpu/conv_direct.h"
#include "core/parallel.h"

namespace onnxtrain::cpu {
namespace {

// [N, C, S] <-> [N, S, C] (channels-last X or Y of FusedConv chains). FusedConv is an inference
// fusion the training graphs the portable kernels exist for never have: compiled for size.
OT_COLD void to_channels_first(const float* src, float* dst, int64_t n, int64_t c, int64_t s) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t p = 0; p < s; ++p)
      for (int64_t ch = 0; ch < c; ++ch) dst[(i * c + ch) * s + p] = src[(i * s + p) * c + ch];
}
OT_COLD void to_channels_last(const float* src, float* dst, int64_t n, int64_t c, int64_t s) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < s; ++p) dst[(i * s + p) * c + ch] = src[(i * c + ch) * s + p];
}

// A FusedConv's activation (see above: compiled for size, on the calling thread: the portable
// kernels' convolutions are small).
OT_COLD void apply_activation(const ConvSpec& s, float* y, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    float v = y[i];
    switch (s.activation) {
      case ConvActivation::kRelu: v = v > 0.0f ? v : 0.0f; break;
      case ConvActivation::kLeakyRelu: v = v > 0.0f ? v : s.act_alpha * v; break;
      case ConvActivation::kSigmoid: v = 1.0f / (1.0f + std::exp(-v)); break;
      case ConvActivation::kTanh: v = std::tanh(v); break;
      case ConvActivation::kClip: v = std::min(std::max(v, s.act_alpha), s.act_beta); break;
      case ConvActivation::kHardSwish: v = v * std::min(std::max(v + 3.0f, 0.0f), 6.0f) / 6.0f; break;
      case ConvActivation::kNone: break;
    }
    y[i] = v;
  }
}

std::vector<int64_t> spatial(const Shape& x) { return std::vector<int64_t>(x.begin() + 2, x.end()); }

// The convolution a transposed one reverses: X' = Y [N, M, out], Y' = X [N, C, in], M' = C; W's
// [C, M/G, k] is that convolution's [M', C'/G, k] as it is.
OT_COLD ConvSpec reversed(const ConvSpec& s) {
  ConvSpec r = s;
  r.transposed = false;
  r.x = {s.x[0], s.out_channels};
  r.x.insert(r.x.end(), s.out.begin(), s.out.end());
  r.out_channels = s.x[1];
  r.out = spatial(s.x);
  return r;
}

// `backward`: also plain (not transposed) and channels first, as ConvGrad's convolutions are.
OT_COLD void check_spec(const ConvSpec& s, const std::string& context, const char* what, bool backward) {
  OT_CHECK(s.dtype == DType::kFloat32 && s.x.size() >= 3 && s.x.size() <= 5 && s.kernel.size() == s.x.size() - 2 &&
               s.group >= 1 && s.x[1] % s.group == 0 && s.out_channels % s.group == 0 &&
               (!backward || (!s.transposed && !s.x_channels_last && !s.y_channels_last)),
           context, what, ": the portable kernels take a float32 1-d, 2-d or 3-d convolution",
           backward ? " (plain, channels first)" : "", ", got ", dtype_name(s.dtype), " X ", shape_str(s.x), " with ",
           s.out_channels, " output channels, group ", s.group, " and a ", s.kernel.size(), "-d kernel");
}

}  // namespace

struct PortableConv::Impl {
  ConvSpec spec;
  std::optional<DirectConv> conv;               // a convolution
  std::optional<DirectConvBackward> transposed;  // a transposed one: dX of the one it reverses
};

OT_COLD PortableConv::PortableConv(const ConvSpec& spec, const std::string& context) {
  check_spec(spec, context, "convolution", false);
  auto* impl = new Impl();
  impl_.reset(impl);
  impl->spec = spec;
  if (spec.transposed) impl->transposed.emplace(reversed(spec), true, false);
  else impl->conv.emplace(spec);
}

PortableConv::PortableConv(PortableConv&&) noexcept = default;
PortableConv& PortableConv::operator=(PortableConv&&) noexcept = default;
PortableConv::~PortableConv() = default;


void PortableConv::run(const void* x_data, const void* w_data, const void* bias_data, void* y_data,
                       const void* z_data) const {
  const auto* x = static_cast<const float*>(x_data);
  const auto* w = static_cast<const float*>(w_data);
  const auto* bias = static_cast<const float*>(bias_data);
  auto* y = static_cast<float*>(y_data);
  const ConvSpec& s = impl_->spec;
  const int64_t n = s.x[0], c = s.x[1], m = s.out_channels;
  const int64_t x_size = numel(spatial(s.x)), y_size = numel(s.out);
  if (n == 0 || m == 0 || y_size == 0) return;
  std::vector<float> x_cf, y_cf;  // channels-first copies (FusedConv chains only)
  std::vector<float> z_copy;      // Z when it is Y's own buffer (the sum adds it after Y is written)
  if (s.sum) OT_CHECK(z_data != nullptr, "convolution: the summand is missing");
  if (s.sum && z_data == y_data) {
    const auto* z = static_cast<const float*>(z_data);
    z_copy.assign(z, z + n * m * y_size);
    z_data = z_copy.data();
  }
  if (s.x_channels_last) {
    x_cf.resize(size_t(n * c * x_size));
    to_channels_first(x, x_cf.data(), n, c, x_size);
    x = x_cf.data();
  }
  float* y_out = y;
  if (s.y_channels_last) {
    y_cf.resize(size_t(n * m * y_size));
    y = y_cf.data();
  }
  if (impl_->conv) {
    impl_->conv->run(x, w, bias, y);
  } else {
    impl_->transposed->run(x, nullptr, w, y, nullptr, nullptr);
    if (bias)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t oc = 0; oc < m; ++oc) {
          float* dst = y + (j * m + oc) * y_size;
          for (int64_t p = 0; p < y_size; ++p) dst[p] += bias[oc];
        }
  }
  if (s.sum) {  // Z has Y's layout; y is channels first here
    const auto* z = static_cast<const float*>(z_data);
    std::vector<float> z_cf;
    if (s.y_channels_last) {
      z_cf.resize(size_t(n * m * y_size));
      to_channels_first(z, z_cf.data(), n, m, y_size);
      z = z_cf.data();
    }
    for (int64_t i = 0; i < n * m * y_size; ++i) y[i] += z[i];
  }
  if (s.activation != ConvActivation::kNone) apply_activation(s, y, n * m * y_size);
  if (s.y_channels_last) to_channels_last(y, y_out, n, m, y_size);
}

struct PortableConvBackward::Impl {
  bool bias = false;
  DirectConvBackward conv;
};

OT_COLD PortableConvBackward::PortableConvBackward(const ConvSpec& spec, bool need_dx, bool need_dw,
                                                   const std::string& context) {
  check_spec(spec, context, "convolution backward", true);
  impl_.reset(new Impl{spec.bias, DirectConvBackward(spec, need_dx, need_dw)});
}

PortableConvBackward::PortableConvBackward(PortableConvBackward&&) noexcept = default;
PortableConvBackward& PortableConvBackward::operator=(PortableConvBackward&&) noexcept = default;
PortableConvBackward::~PortableConvBackward() = default;


void PortableConvBackward::run(const void* dy, const void* x, const void* w, void* dx, void* dw, void* db) const {
  impl_->conv.run(static_cast<const float*>(dy), static_cast<const float*>(x), static_cast<const float*>(w),
                  static_cast<float*>(dx), static_cast<float*>(dw), impl_->bias ? static_cast<float*>(db) : nullptr);
}

}  // namespace onnxtrain::cpu
