// Softmax and log-softmax over one axis of an (outer, n, inner) view, shared by Softmax,
// LogSoftmax and SoftmaxCrossEntropyLoss.
//
// inner == 1 (the last axis, attention and classifier heads): each row is three vectorised sweeps
// over data in cache (max, exp-and-sum, scale), with the branch-free exp of core/fast_math.h.
// inner > 1: the same sweeps run over whole inner rows, vectorised along inner.
// Rows (or row-chunks) are spread over threads with parallel_for. y may alias x: every sweep
// reads x[i] before it writes y[i], and no sweep reads x after writing y at the same index.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "core/fast_math.h"
#include "ops/common.h"
#include "ops/half_round.h"

namespace onnxtrain {

template <typename C>
ONNXTRAIN_FAST_MATH_INLINE C exp_shifted(C v) {  // exp of (value - row max); inlined: see fast_math.h
  if constexpr (std::is_same_v<C, float>) return exp_fast(v);
  else return std::exp(v);
}

// One contiguous row of n elements. kLog selects log-softmax.
template <bool kLog, typename T>
inline void softmax_contiguous_row(const T* x, T* y, int64_t n) {
  using C = compute_t<T>;
  C m = -std::numeric_limits<C>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) {
    C v = C(x[i]);
    m = v > m ? v : m;
  }
  C s = 0;
  if constexpr (!kLog && std::is_same_v<T, C>) {  // store exp once, then scale
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) {
      C e = exp_shifted<C>(x[i] - m);
      y[i] = e;
      s += e;
    }
    const C inv = C(1) / s;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = y[i] * inv;
    return;
  }
  constexpr int64_t kBuffered = 4096;  // half rows up to this long keep exp in C on the stack
  if constexpr (!kLog) {
    if (n <= kBuffered) {
      C e[kBuffered];
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < n; ++i) {
        e[i] = exp_shifted<C>(C(x[i]) - m);
        s += e[i];
      }
      const C inv = C(1) / s;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) y[i] = round_to<T>(e[i] * inv);
      return;
    }
  }
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += exp_shifted<C>(C(x[i]) - m);
  if constexpr (kLog) {
    const C lse = m + std::log(s);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = round_to<T>(C(x[i]) - lse);
  } else {  // long half rows: recompute exp rather than round it twice
    const C inv = C(1) / s;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = round_to<T>(exp_shifted<C>(C(x[i]) - m) * inv);
  }
}

// One block of n rows of `len` elements with row stride `stride` (elements): softmax down the
// rows for each of the len columns.
template <bool kLog, typename T>
inline void softmax_strided_block(const T* x, T* y, int64_t n, int64_t stride, int64_t len) {
  using C = compute_t<T>;
  constexpr int64_t kMaxLen = 256;
  C m[kMaxLen], s[kMaxLen];
  for (int64_t j = 0; j < len; ++j) { m[j] = -std::numeric_limits<C>::infinity(); s[j] = 0; }
  for (int64_t i = 0; i < n; ++i) {
    const T* row = x + i * stride;
    for (int64_t j = 0; j < len; ++j) { C v = C(row[j]); m[j] = v > m[j] ? v : m[j]; }
  }
  for (int64_t i = 0; i < n; ++i) {
    const T* row = x + i * stride;
    for (int64_t j = 0; j < len; ++j) s[j] += exp_shifted<C>(C(row[j]) - m[j]);
  }
  if constexpr (kLog) {
    for (int64_t j = 0; j < len; ++j) s[j] = m[j] + std::log(s[j]);
    for (int64_t i = 0; i < n; ++i) {
      const T* row = x + i * stride;
      T* out = y + i * stride;
      for (int64_t j = 0; j < len; ++j) out[j] = round_to<T>(C(row[j]) - s[j]);
    }
  } else {
    for (int64_t j = 0; j < len; ++j) s[j] = C(1) / s[j];
    for (int64_t i = 0; i < n; ++i) {
      const T* row = x + i * stride;
      T* out = y + i * stride;
      for (int64_t j = 0; j < len; ++j) out[j] = round_to<T>(exp_shifted<C>(C(row[j]) - m[j]) * s[j]);
    }
  }
}

// Softmax (or log-softmax) along the middle axis of an (outer, n, inner) tensor.
template <bool kLog, typename T>
void softmax_along(const T* x, T* y, int64_t outer, int64_t n, int64_t inner) {
  if (outer * n * inner == 0) return;
  if (inner == 1) {
    int64_t grain = std::max<int64_t>(1, kElementwiseGrain / (4 * n));
    parallel_for(outer, grain, [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) softmax_contiguous_row<kLog>(x + o * n, y + o * n, n);
    });
    return;
  }
  constexpr int64_t kChunk = 256;
  int64_t chunks = (inner + kChunk - 1) / kChunk;
  int64_t grain = std::max<int64_t>(1, kElementwiseGrain / (4 * n * std::min(inner, kChunk)));
  parallel_for(outer * chunks, grain, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      int64_t o = t / chunks, c0 = (t % chunks) * kChunk;
      int64_t off = o * n * inner + c0;
      softmax_strided_block<kLog>(x + off, y + off, n, inner, std::min(kChunk, inner - c0));
    }
  });
}

// ---- Backward ----
// softmax:     dx = y * (dy - sum(dy * y))
// log-softmax: dx = dy - exp(y) * sum(dy)
// along the middle axis of (outer, n, inner), from the forward output y. Per row one reduction
// sweep and one update sweep over data in cache, both vectorised; rows spread over threads.
// dx may alias dy (each element of dy is read before dx is written at that index).

template <bool kLog, typename T>
inline void softmax_grad_contiguous_row(const T* dy, const T* y, T* dx, int64_t n) {
  using C = compute_t<T>;
  C s = 0;
  if constexpr (kLog) {
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += C(dy[i]);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dx[i] = round_to<T>(C(dy[i]) - exp_shifted<C>(C(y[i])) * s);
  } else {
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += C(dy[i]) * C(y[i]);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dx[i] = round_to<T>(C(y[i]) * (C(dy[i]) - s));
  }
}

template <bool kLog, typename T>
inline void softmax_grad_strided_block(const T* dy, const T* y, T* dx, int64_t n, int64_t stride, int64_t len) {
  using C = compute_t<T>;
  constexpr int64_t kMaxLen = 256;
  C s[kMaxLen];
  for (int64_t j = 0; j < len; ++j) s[j] = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T* dr = dy + i * stride;
    const T* yr = y + i * stride;
    if constexpr (kLog) {
      for (int64_t j = 0; j < len; ++j) s[j] += C(dr[j]);
    } else {
      for (int64_t j = 0; j < len; ++j) s[j] += C(dr[j]) * C(yr[j]);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    const T* dr = dy + i * stride;
    const T* yr = y + i * stride;
    T* out = dx + i * stride;
    if constexpr (kLog) {
      for (int64_t j = 0; j < len; ++j) out[j] = round_to<T>(C(dr[j]) - exp_shifted<C>(C(yr[j])) * s[j]);
    } else {
      for (int64_t j = 0; j < len; ++j) out[j] = round_to<T>(C(yr[j]) * (C(dr[j]) - s[j]));
    }
  }
}

template <bool kLog, typename T>
void softmax_grad_along(const T* dy, const T* y, T* dx, int64_t outer, int64_t n, int64_t inner) {
  if (outer * n * inner == 0) return;
  if (inner == 1) {
    int64_t grain = std::max<int64_t>(1, kElementwiseGrain / (3 * n));
    parallel_for(outer, grain, [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) softmax_grad_contiguous_row<kLog>(dy + o * n, y + o * n, dx + o * n, n);
    });
    return;
  }
  constexpr int64_t kChunk = 256;
  int64_t chunks = (inner + kChunk - 1) / kChunk;
  int64_t grain = std::max<int64_t>(1, kElementwiseGrain / (3 * n * std::min(inner, kChunk)));
  parallel_for(outer * chunks, grain, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      int64_t o = t / chunks, c0 = (t % chunks) * kChunk;
      int64_t off = o * n * inner + c0;
      softmax_grad_strided_block<kLog>(dy + off, y + off, dx + off, n, inner, std::min(kChunk, inner - c0));
    }
  });
}

}  // namespace onnxtrain
