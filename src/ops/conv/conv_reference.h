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

// Convolution backward for any float dtype: dx = conv's adjoint applied to dy (parallel over
// (batch, group): each owns its dx channels), dw = sum over the batch of dy correlated with x
// (parallel over output channels), db = sum of dy over batch and space. Null outputs are skipped.
template <typename T>
void conv_backward_reference(const T* dy, const T* x, const T* w, T* dx, T* dw, T* db, int64_t n, int64_t c,
                             int64_t m, int64_t group, const std::vector<int64_t>& in, const WindowGeometry& g) {
  using C = compute_t<T>;
  size_t nd = in.size();
  int64_t in_sz = numel(in), out_sz = numel(g.out), k_sz = numel(g.kernel);
  int64_t cg = c / group, mg = m / group;
  // For each (output position, kernel tap): the input offset, or -1 in the padding.
  std::vector<int64_t> tap(size_t(out_sz * k_sz), -1);
  {
    std::vector<int64_t> o(nd), kk(nd);
    for (int64_t op = 0; op < out_sz; ++op) {
      int64_t rem = op;
      for (size_t d = nd; d-- > 0;) { o[d] = rem % g.out[d]; rem /= g.out[d]; }
      for (int64_t kp = 0; kp < k_sz; ++kp) {
        int64_t r = kp, off = 0;
        bool inside = true;
        for (size_t d = nd; d-- > 0;) { kk[d] = r % g.kernel[d]; r /= g.kernel[d]; }
        for (size_t d = 0; d < nd && inside; ++d) {
          int64_t i = o[d] * g.stride[d] - g.pad_l[d] + kk[d] * g.dilation[d];
          inside = i >= 0 && i < in[d];
          off = off * in[d] + i;
        }
        if (inside) tap[size_t(op * k_sz + kp)] = off;
      }
    }
  }
  if (dx) {
    parallel_for(n * group, 1, [&](int64_t begin, int64_t end) {
      std::vector<C> acc(size_t(cg * in_sz));
      for (int64_t bg = begin; bg < end; ++bg) {
        int64_t b = bg / group, gi = bg % group;
        std::fill(acc.begin(), acc.end(), C(0));
        for (int64_t ocg = 0; ocg < mg; ++ocg) {
          int64_t oc = gi * mg + ocg;
          const T* dyp = dy + (b * m + oc) * out_sz;
          for (int64_t op = 0; op < out_sz; ++op) {
            C gv = C(dyp[op]);
            for (int64_t kp = 0; kp < k_sz; ++kp) {
              int64_t off = tap[size_t(op * k_sz + kp)];
              if (off < 0) continue;
              for (int64_t ic = 0; ic < cg; ++ic) acc[size_t(ic * in_sz + off)] += gv * C(w[(oc * cg + ic) * k_sz + kp]);
            }
          }
        }
        T* dxp = dx + (b * c + gi * cg) * in_sz;
        for (int64_t i = 0; i < cg * in_sz; ++i) dxp[i] = T(acc[size_t(i)]);
      }
    });
  }
  if (dw || db) {
    parallel_for(m, 1, [&](int64_t begin, int64_t end) {
      std::vector<C> acc(size_t(cg * k_sz));
      for (int64_t oc = begin; oc < end; ++oc) {
        int64_t gi = oc / mg;
        std::fill(acc.begin(), acc.end(), C(0));
        C bias_acc = C(0);
        for (int64_t b = 0; b < n; ++b) {
          const T* dyp = dy + (b * m + oc) * out_sz;
          for (int64_t op = 0; op < out_sz; ++op) {
            C gv = C(dyp[op]);
            bias_acc += gv;
            if (!dw) continue;
            for (int64_t kp = 0; kp < k_sz; ++kp) {
              int64_t off = tap[size_t(op * k_sz + kp)];
              if (off < 0) continue;
              for (int64_t ic = 0; ic < cg; ++ic)
                acc[size_t(ic * k_sz + kp)] += gv * C(x[(b * c + gi * cg + ic) * in_sz + off]);
            }
          }
        }
        if (dw)
          for (int64_t i = 0; i < cg * k_sz; ++i) dw[oc * cg * k_sz + i] = T(acc[size_t(i)]);
        if (db) db[oc] = T(bias_acc);
      }
    });
  }
}

}  // namespace onnxtrain
