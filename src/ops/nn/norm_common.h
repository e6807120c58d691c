// Helpers shared by the normalisation ops: per-channel or broadcast parameter vectors read once
// per call in the compute type.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/common.h"

namespace onnxtrain {

// Whether a BatchNormalization node normalises with batch statistics: opset 14+ says so with
// training_mode=1; before 14, asking for any statistics output (running mean/var, saved mean/var)
// is what makes it a training node.
inline bool batch_norm_training(const Node& node, int64_t opset) {
  if (opset >= 14) return node.attr_int("training_mode", 0) != 0;
  for (size_t i = 1; i < node.outputs.size(); ++i)
    if (node.has_output(i)) return true;
  return false;
}

// The values of t broadcast (unidirectionally, numpy rules) to `target`, flattened, as C.
template <typename C>
std::vector<C> broadcast_param(const Node& node, const Tensor& t, const Shape& target, const char* what) {
  OT_CHECK(is_floating(t.dtype()), node.context(), what, " must be a floating-point tensor, got ",
           dtype_name(t.dtype()));
  OT_CHECK(t.rank() <= int(target.size()), node.context(), what, " of shape ", shape_str(t.shape()),
           " cannot broadcast to ", shape_str(target));
  size_t off = target.size() - size_t(t.rank());
  for (int d = 0; d < t.rank(); ++d)
    OT_CHECK(t.dim(d) == 1 || t.dim(d) == target[off + size_t(d)], node.context(), what, " of shape ",
             shape_str(t.shape()), " cannot broadcast to ", shape_str(target));
  int64_t n = numel(target);
  std::vector<C> out(static_cast<size_t>(n));
  dispatch_float(t.dtype(), [&]<typename P>() {
    const P* p = t.data<P>();
    if (t.numel() == n) {
      for (int64_t i = 0; i < n; ++i) out[size_t(i)] = C(compute_t<P>(p[i]));
      return;
    }
    std::vector<int64_t> st(target.size(), 0);
    int64_t acc = 1;
    for (int d = t.rank() - 1; d >= 0; --d) {
      st[off + size_t(d)] = t.dim(d) == 1 ? 0 : acc;
      acc *= t.dim(d);
    }
    for (int64_t i = 0; i < n; ++i) {
      int64_t rem = i, src = 0;
      for (size_t d = target.size(); d-- > 0;) {
        src += (rem % target[d]) * st[d];
        rem /= target[d];
      }
      out[size_t(i)] = C(compute_t<P>(p[src]));
    }
  });
  return out;
}

// A per-channel parameter of exactly `c` elements, as C.
template <typename C>
std::vector<C> channel_param(const Node& node, const Tensor& t, int64_t c, const char* what) {
  OT_CHECK(t.numel() == c && t.rank() <= 1, node.context(), what, " must have shape [", c, "], got ",
           shape_str(t.shape()));
  return broadcast_param<C>(node, t, Shape{c}, what);
}

// Backward of y = gamma * xh + beta over one normalisation group: m rows of s contiguous elements,
// row k starting at offset off(k) in x, dy and dx; xh = (x - mu) * r.
//   batch = true:  mu and r = 1 / sqrt(var + eps) are the group's own statistics (population
//                  variance), recomputed here and returned; dx = gamma r (dy - mean(dy) - xh mean(dy xh)).
//   batch = false: mu and r are given constants; dx = gamma r dy.
// Returns sum(dy) and sum(dy * xh) over the group (the parameter gradients). dx may alias dy.
template <typename T, typename C, typename Off>
void norm_group_backward(const T* dy, const T* x, T* dx, int64_t m, int64_t s, Off off, C gamma, bool batch, C eps,
                         C& mu, C& r, C& sum_dy, C& sum_dyxh) {
  const C inv_count = C(1) / C(std::max<int64_t>(m * s, 1));
  if (batch) {
    C sum = 0;
    for (int64_t k = 0; k < m; ++k) {
      const T* xr = x + off(k);
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < s; ++j) sum += C(xr[j]);
    }
    mu = sum * inv_count;
    C sq = 0;
    for (int64_t k = 0; k < m; ++k) {
      const T* xr = x + off(k);
#pragma omp simd reduction(+ : sq)
      for (int64_t j = 0; j < s; ++j) {
        C dd = C(xr[j]) - mu;
        sq += dd * dd;
      }
    }
    r = C(1) / std::sqrt(sq * inv_count + eps);
  }
  const C mean = mu, inv = r;
  C a = 0, b = 0;
  for (int64_t k = 0; k < m; ++k) {
    const T* xr = x + off(k);
    const T* dr = dy + off(k);
#pragma omp simd reduction(+ : a, b)
    for (int64_t j = 0; j < s; ++j) {
      C g = C(dr[j]);
      a += g;
      b += g * (C(xr[j]) - mean) * inv;
    }
  }
  sum_dy = a;
  sum_dyxh = b;
  const C gr = gamma * inv;
  if (batch) {
    const C ma = a * inv_count, mb = b * inv_count;
    for (int64_t k = 0; k < m; ++k) {
      const T* xr = x + off(k);
      const T* dr = dy + off(k);
      T* out = dx + off(k);
#pragma omp simd
      for (int64_t j = 0; j < s; ++j) out[j] = T(gr * (C(dr[j]) - ma - (C(xr[j]) - mean) * inv * mb));
    }
  } else {
    for (int64_t k = 0; k < m; ++k) {
      const T* dr = dy + off(k);
      T* out = dx + off(k);
#pragma omp simd
      for (int64_t j = 0; j < s; ++j) out[j] = T(gr * C(dr[j]));
    }
  }
}

// Writes a per-channel vector of C into an output tensor of the dtype and shape of `like`.
template <typename C>
void write_channel_output(KernelContext& ctx, size_t i, const Tensor& like, const std::vector<C>& v) {
  if (!ctx.output_requested(i)) return;
  Tensor& out = ctx.output(i, like.dtype(), like.shape());
  dispatch_float(like.dtype(), [&]<typename U>() {
    U* p = out.data<U>();
    for (size_t k = 0; k < v.size(); ++k) p[k] = cast_value<U>(v[k]);
  });
}

}  // namespace onnxtrain
