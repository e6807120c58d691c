// Direct N-d convolution and transposed convolution for any float dtype (and the fp32 cases
// oneDNN cannot express, such as negative pads). Parallel over (batch, output channel).
#pragma once

#include <vector>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/conv/conv_util.h"

namespace onnxtrain {

// x: [N, C, in...], w: [M, C/G, k...], y: [N, M, out...].
template <typename T>
void conv_reference(const T* x, const T* w, const T* bias, T* y, int64_t n, int64_t c, int64_t m, int64_t group,
                    const std::vector<int64_t>& in, const WindowGeometry& g) {
  using C = compute_t<T>;
  size_t nd = in.size();
  int64_t in_sz = numel(in), out_sz = numel(g.out), k_sz = numel(g.kernel);
  int64_t cg = c / group, mg = m / group;
  parallel_for(n * m, 1, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> o(nd), kk(nd);
    for (int64_t nm = begin; nm < end; ++nm) {
      int64_t b = nm / m, oc = nm % m, gi = oc / mg;
      T* yp = y + nm * out_sz;
      for (int64_t op = 0; op < out_sz; ++op) {
        int64_t rem = op;
        for (size_t d = nd; d-- > 0;) { o[d] = rem % g.out[d]; rem /= g.out[d]; }
        C acc = bias ? C(bias[oc]) : C(0);
        for (int64_t kp = 0; kp < k_sz; ++kp) {
          int64_t r = kp, off = 0;
          bool inside = true;
          for (size_t d = nd; d-- > 0;) { kk[d] = r % g.kernel[d]; r /= g.kernel[d]; }
          for (size_t d = 0; d < nd && inside; ++d) {
            int64_t i = o[d] * g.stride[d] - g.pad_l[d] + kk[d] * g.dilation[d];
            inside = i >= 0 && i < in[d];
            off = off * in[d] + i;
          }
          if (!inside) continue;
          for (int64_t ic = 0; ic < cg; ++ic)
            acc += C(x[(b * c + gi * cg + ic) * in_sz + off]) * C(w[(oc * cg + ic) * k_sz + kp]);
        }
        yp[op] = T(acc);
      }
    }
  });
}

// x: [N, C, in...], w: [C, M/G, k...], y: [N, M, out...]; g from transpose_geometry.
template <typename T>
void conv_transpose_reference(const T* x, const T* w, const T* bias, T* y, int64_t n, int64_t c, int64_t m,
                              int64_t group, const std::vector<int64_t>& in, const WindowGeometry& g) {
  using C = compute_t<T>;
  size_t nd = in.size();
  int64_t in_sz = numel(in), out_sz = numel(g.out), k_sz = numel(g.kernel);
  int64_t cg = c / group, mg = m / group;
  parallel_for(n * m, 1, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> ii(nd), kk(nd);
    std::vector<C> acc(static_cast<size_t>(out_sz));
    for (int64_t nm = begin; nm < end; ++nm) {
      int64_t b = nm / m, oc = nm % m, gi = oc / mg, ocg = oc % mg;
      std::fill(acc.begin(), acc.end(), bias ? C(bias[oc]) : C(0));
      for (int64_t ic = 0; ic < cg; ++ic) {
        const T* xp = x + (b * c + gi * cg + ic) * in_sz;
        const T* wp = w + ((gi * cg + ic) * mg + ocg) * k_sz;
        for (int64_t ip = 0; ip < in_sz; ++ip) {
          int64_t rem = ip;
          for (size_t d = nd; d-- > 0;) { ii[d] = rem % in[d]; rem /= in[d]; }
          C xv = C(xp[ip]);
          for (int64_t kp = 0; kp < k_sz; ++kp) {
            int64_t r = kp, off = 0;
            bool inside = true;
            for (size_t d = nd; d-- > 0;) { kk[d] = r % g.kernel[d]; r /= g.kernel[d]; }
            for (size_t d = 0; d < nd && inside; ++d) {
              int64_t o = ii[d] * g.stride[d] - g.pad_l[d] + kk[d] * g.dilation[d];
              inside = o >= 0 && o < g.out[d];
              off = off * g.out[d] + o;
            }
            if (inside) acc[size_t(off)] += xv * C(wp[kp]);
          }
        }
      }
      T* yp = y + nm * out_sz;
      for (int64_t i = 0; i < out_sz; ++i) yp[i] = T(acc[size_t(i)]);
    }
  });
}

}  // namespace onnxtrain
