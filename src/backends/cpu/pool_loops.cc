// Portable fp32 2-d pooling (pool_loops.h). Per output position the window's valid range is computed once per axis,
// so the inner loops carry no bounds checks. Max pooling picks the first maximum in window order,
// as the generic loop does, and its backward recomputes it from X.
#include <algorithm>
#include <limits>

#include "backends/cpu/pool_loops.h"
#include "core/parallel.h"

namespace onnxtrain::cpu {
namespace {

// For one axis: the first and last+1 tap index inside the input of every output position, and
// the taps inside the explicitly padded extent (count_include_pad's divisor).
struct AxisTaps {
  std::vector<int64_t> begin, end, padded;
};

OT_COLD AxisTaps axis_taps(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t dilation, int64_t pad_l,
                   int64_t pad_r) {
  AxisTaps a;
  for (int64_t o = 0; o < out; ++o) {
    int64_t b = kernel, e = 0, padded = 0;
    for (int64_t k = 0; k < kernel; ++k) {
      const int64_t at = o * stride - pad_l + k * dilation;
      if (at >= 0 && at < in) b = std::min(b, k), e = k + 1;
      padded += at >= -pad_l && at < in + pad_r;
    }
    a.begin.push_back(b);
    a.end.push_back(std::max(b, e));
    a.padded.push_back(padded);
  }
  return a;
}

}  // namespace

struct LoopPool::Impl {
  PoolSpec spec;
  AxisTaps h, w;
  // Max pooling whose every window lies inside the input, undilated (the 2x2 / stride 2 pooling
  // of most CNNs): loops without per-window tap ranges.
  bool dense_max = false;
  // An average's divisor at output (i, j): the taps inside the input, or inside the explicit pads.
  float count(int64_t i, int64_t j) const {
    return float(spec.count_include_pad ? h.padded[size_t(i)] * w.padded[size_t(j)]
                                        : (h.end[size_t(i)] - h.begin[size_t(i)]) * (w.end[size_t(j)] - w.begin[size_t(j)]));
  }
};

LoopPool::LoopPool() = default;
LoopPool::LoopPool(LoopPool&&) noexcept = default;
LoopPool& LoopPool::operator=(LoopPool&&) noexcept = default;
LoopPool::~LoopPool() = default;

OT_COLD std::optional<LoopPool> LoopPool::make(const PoolSpec& spec) {
  // Channels-last pools (ChannelsLastPool) are declined: its kernel then pools a reordered copy.
  if (spec.dtype != DType::kFloat32 || spec.x.size() != 4 || spec.kernel.size() != 2 || spec.channels_last)
    return std::nullopt;
  auto impl = std::make_unique<Impl>();
  Impl& s = *impl;
  s.spec = spec;
  s.h = axis_taps(spec.x[2], spec.out[0], spec.kernel[0], spec.stride[0], spec.dilation[0], spec.pad_l[0], spec.pad_r[0]);
  s.w = axis_taps(spec.x[3], spec.out[1], spec.kernel[1], spec.stride[1], spec.dilation[1], spec.pad_l[1], spec.pad_r[1]);
  // A window wholly in the padding has no value to take: the generic loop says what it means.
  for (const AxisTaps* a : {&s.h, &s.w})
    for (size_t o = 0; o < a->begin.size(); ++o)
      if (a->begin[o] >= a->end[o]) return std::nullopt;
  s.dense_max = spec.max && spec.dilation[0] == 1 && spec.dilation[1] == 1;
  for (const auto& [a, k] : {std::pair{&s.h, spec.kernel[0]}, std::pair{&s.w, spec.kernel[1]}})
    for (size_t o = 0; o < a->begin.size(); ++o) s.dense_max = s.dense_max && a->begin[o] == 0 && a->end[o] == k;
  LoopPool p;
  p.impl_ = std::move(impl);
  return p;
}

namespace {

// One plane's forward of 2x2 windows at stride 2 (most CNNs' pooling), a row at a time: the
// compares as dense_max_pool makes them (window order, strict >), in a loop over the row the
// compiler vectorises (4x faster than the per-window loop on the digits CNN's pool). The
// backward stays with the per-window loop: a branch-free four-way write per window ran 2-7x slower.
inline void max_pool_2x2_plane(const float* x, float* y, int64_t iw, int64_t oh, int64_t ow) {
  for (int64_t i = 0; i < oh; ++i) {
    const float* r0 = x + 2 * i * iw;
    const float* r1 = r0 + iw;
    float* yr = y + i * ow;
    for (int64_t j = 0; j < ow; ++j) {
      float best = r0[2 * j];
      best = r0[2 * j + 1] > best ? r0[2 * j + 1] : best;
      best = r1[2 * j] > best ? r1[2 * j] : best;
      best = r1[2 * j + 1] > best ? r1[2 * j + 1] : best;
      yr[j] = best;
    }
  }
}

// Dense max pooling (Impl::dense_max): y = the window's maximum, or with `dx` the window's first
// maximum (window order) receives dy; the same choices as the general loops.
void dense_max_pool(const PoolSpec& p, const float* x, float* y, const float* dy, float* dx) {
  const int64_t planes = p.x[0] * p.x[1], ih = p.x[2], iw = p.x[3], oh = p.out[0], ow = p.out[1];
  const int64_t kh = p.kernel[0], kw = p.kernel[1], sh = p.stride[0], sw = p.stride[1];
  const bool two_by_two = !dx && kh == 2 && kw == 2 && sh == 2 && sw == 2;
  if (dx) std::fill(dx, dx + planes * ih * iw, 0.0f);
  parallel_for(planes, 1, [&](int64_t b, int64_t e) {
    for (int64_t plane = b; plane < e; ++plane) {
      const float* xp = x + plane * ih * iw;
      if (two_by_two) {
        max_pool_2x2_plane(xp, y + plane * oh * ow, iw, oh, ow);
        continue;
      }
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          const float* win = xp + i * sh * iw + j * sw;
          int64_t best = 0;
          float best_v = win[0];
          for (int64_t r = 0; r < kh; ++r)
            for (int64_t c = 0; c < kw; ++c) {
              const float v = win[r * iw + c];
              const bool better = v > best_v;  // a select: which tap wins is data
              best = better ? r * iw + c : best;
              best_v = better ? v : best_v;
            }
          const int64_t out = (plane * oh + i) * ow + j;
          if (dx) dx[plane * ih * iw + i * sh * iw + j * sw + best] += dy[out];
          else y[out] = best_v;
        }
    }
  });
}

// Calls fn(plane, i, j, top, left) for every output (i, j) of every (n, c) plane, planes in
// parallel; (top, left) is the window's first tap in the unpadded input (negative in the padding).
template <typename Fn>
void for_each_window(const PoolSpec& p, Fn&& fn) {
  const int64_t planes = p.x[0] * p.x[1], oh = p.out[0], ow = p.out[1];
  parallel_for(planes, 1, [&](int64_t b, int64_t e) {
    for (int64_t plane = b; plane < e; ++plane)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) fn(plane, i, j, i * p.stride[0] - p.pad_l[0], j * p.stride[1] - p.pad_l[1]);
  });
}

}  // namespace

void LoopPool::forward(const float* x, float* y) const {
  const Impl& s = *impl_;
  const PoolSpec& p = s.spec;
  if (s.dense_max) return dense_max_pool(p, x, y, nullptr, nullptr);
  const int64_t ih = p.x[2], iw = p.x[3], oh = p.out[0], ow = p.out[1];
  for_each_window(p, [&](int64_t plane, int64_t i, int64_t j, int64_t r0, int64_t c0) {
    const float* xp = x + plane * ih * iw;
    float acc = p.max ? -std::numeric_limits<float>::infinity() : 0.0f;
    for (int64_t kh = s.h.begin[i]; kh < s.h.end[i]; ++kh) {
      const float* row = xp + (r0 + kh * p.dilation[0]) * iw + c0;
      for (int64_t kw = s.w.begin[j]; kw < s.w.end[j]; ++kw) {
        const float v = row[kw * p.dilation[1]];
        if (p.max) acc = v > acc ? v : acc;
        else acc += v;
      }
    }
    if (!p.max) acc /= s.count(i, j);
    y[(plane * oh + i) * ow + j] = acc;
  });
}

void LoopPool::backward(const float* dy, const float* x, float* dx) const {
  const Impl& s = *impl_;
  const PoolSpec& p = s.spec;
  if (s.dense_max) return dense_max_pool(p, x, nullptr, dy, dx);
  const int64_t ih = p.x[2], iw = p.x[3], oh = p.out[0], ow = p.out[1];
  std::fill(dx, dx + p.x[0] * p.x[1] * ih * iw, 0.0f);
  for_each_window(p, [&](int64_t plane, int64_t i, int64_t j, int64_t r0, int64_t c0) {
    const float* xp = x + plane * ih * iw;
    float* dxp = dx + plane * ih * iw;
    const float g = dy[(plane * oh + i) * ow + j];
    if (p.max) {  // the first maximum in window order takes the gradient
      // Selects, not branches: which tap wins is data, and mispredicted branches made this loop
      // a tenth of the digits CNN's training step.
      int64_t best = (r0 + s.h.begin[i] * p.dilation[0]) * iw + c0 + s.w.begin[j] * p.dilation[1];
      float best_v = xp[best];
      for (int64_t kh = s.h.begin[i]; kh < s.h.end[i]; ++kh)
        for (int64_t kw = s.w.begin[j]; kw < s.w.end[j]; ++kw) {
          const int64_t at = (r0 + kh * p.dilation[0]) * iw + c0 + kw * p.dilation[1];
          const float v = xp[at];
          const bool better = v > best_v;
          best = better ? at : best;
          best_v = better ? v : best_v;
        }
      dxp[best] += g;
    } else {
      const float share = g / s.count(i, j);
      for (int64_t kh = s.h.begin[i]; kh < s.h.end[i]; ++kh)
        for (int64_t kw = s.w.begin[j]; kw < s.w.end[j]; ++kw)
          dxp[(r0 + kh * p.dilation[0]) * iw + c0 + kw * p.dilation[1]] += share;
    }
  });
}

}  // namespace onnxtrain::cpu
