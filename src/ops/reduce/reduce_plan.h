// The reduction family's shared machinery: axis reading, the shape rule, and a blocked reduction
// driver used by the Reduce* ops and by normalisations that reduce over arbitrary axes (MVN).
//
// A reduction first collapses the input into groups of adjacent dims that are all kept or all
// reduced (size-1 dims dropped), then runs one of two loops:
//   - last group reduced: each output is a sum of contiguous runs (rows) -> lane-split, vectorised;
//   - last group kept:    each block of `run` outputs accumulates contiguous input rows of `run`
//                         elements -> vectorised over the kept inner dim.
// Rows with more reduced groups are reached through a precomputed offset list, never through
// per-element index arithmetic. Work is split over outputs, or over the reduced range when there
// are fewer outputs than threads.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/common.h"

namespace onnxtrain {

struct ReducePlan {
  bool last_reduced = false;        // case A (true) or case B (false), see above
  int64_t run = 1;                  // contiguous length of the last group
  int64_t count = 1;                // input elements folded into each output
  int64_t blocks = 1;               // A: outputs;  B: output rows of `run` elements
  std::vector<int64_t> offsets;     // start offset of every reduced run, relative to a block base
  std::vector<int64_t> kept_dims;   // kept groups addressing blocks (B: excluding the last group)
  std::vector<int64_t> kept_strides;

  int64_t base(int64_t block) const {
    int64_t off = 0;
    for (size_t d = kept_dims.size(); d-- > 0;) {
      off += (block % kept_dims[d]) * kept_strides[d];
      block /= kept_dims[d];
    }
    return off;
  }
};

// reduce[d] says whether dim d is folded. The input must not be empty.
inline ReducePlan make_reduce_plan(const Shape& shape, const std::vector<bool>& reduce) {
  std::vector<int64_t> dims, strides;
  std::vector<bool> flags;
  std::vector<int64_t> st = strides_of(shape);
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!dims.empty() && flags.back() == reduce[d]) {
      dims.back() *= shape[d];
      strides.back() = st[d];
    } else {
      dims.push_back(shape[d]);
      strides.push_back(st[d]);
      flags.push_back(reduce[d]);
    }
  }
  ReducePlan p;
  size_t g = dims.size();
  p.last_reduced = g > 0 && flags.back();
  p.run = g > 0 ? dims.back() : 1;
  std::vector<int64_t> rdims, rstrides;
  size_t upto = g > 0 ? g - 1 : 0;  // groups other than the last
  for (size_t i = 0; i < upto; ++i) {
    if (flags[i]) {
      rdims.push_back(dims[i]);
      rstrides.push_back(strides[i]);
    } else {
      p.kept_dims.push_back(dims[i]);
      p.kept_strides.push_back(strides[i]);
    }
  }
  p.blocks = numel(p.kept_dims);
  int64_t n_off = numel(rdims);
  p.count = n_off * (p.last_reduced ? p.run : 1);
  p.offsets.resize(size_t(n_off));
  std::vector<int64_t> idx(rdims.size(), 0);
  int64_t off = 0;
  for (int64_t k = 0; k < n_off; ++k) {
    p.offsets[size_t(k)] = off;
    for (size_t d = rdims.size(); d-- > 0;) {  // odometer step
      off += rstrides[d];
      if (++idx[d] < rdims[d]) break;
      off -= rstrides[d] * rdims[d];
      idx[d] = 0;
    }
  }
  return p;
}

// Runs a reduction. The policy provides:
//   A init() const;                      the identity
//   A map(A v, int64_t out) const;       transform of one input element for output `out`
//   A combine(A a, A b) const;           associative fold
//   void store(int64_t out, A acc);      finishes and writes output `out`
// Outputs are numbered in row-major order of the kept dims (the keepdims=0 output layout).
template <typename T, typename A, typename P>
void run_reduction(const T* x, const Shape& shape, const std::vector<bool>& reduce, P& pol) {
  int64_t total = numel(shape);
  if (total == 0) {  // empty input: every output (if any) is the reduction of the empty set
    int64_t outs = 1;
    for (size_t d = 0; d < shape.size(); ++d) if (!reduce[d]) outs *= shape[d];
    for (int64_t o = 0; o < outs; ++o) pol.store(o, pol.init());
    return;
  }
  const ReducePlan p = make_reduce_plan(shape, reduce);
  const int threads = omp_get_max_threads();
  const int64_t n_off = int64_t(p.offsets.size());
  constexpr int L = 16;

  if (p.last_reduced) {
    const int64_t run = p.run, nred = n_off * run;
    // Folds reduced elements [e0, e1) (linear over offsets x run) of output o.
    auto fold = [&](int64_t o, int64_t e0, int64_t e1) -> A {
      const T* xb = x + p.base(o);
      A lanes[L];
      for (int l = 0; l < L; ++l) lanes[l] = pol.init();
      A tail = pol.init();
      int64_t r = e0 / run, j = e0 % run;
      while (e0 < e1) {
        const T* row = xb + p.offsets[size_t(r)];
        int64_t end = std::min<int64_t>(run, j + (e1 - e0));
        int64_t len = end - j;
        int64_t k = j;
        for (; k + L <= end; k += L)
          for (int l = 0; l < L; ++l) lanes[l] = pol.combine(lanes[l], pol.map(cast_value<A>(row[k + l]), o));
        for (; k < end; ++k) tail = pol.combine(tail, pol.map(cast_value<A>(row[k]), o));
        e0 += len;
        ++r;
        j = 0;
      }
      for (int w = L / 2; w > 0; w /= 2)
        for (int l = 0; l < w; ++l) lanes[l] = pol.combine(lanes[l], lanes[l + w]);
      return pol.combine(lanes[0], tail);
    };
    const int64_t outs = p.blocks;
    if (outs >= threads || nred * outs < 2 * kElementwiseGrain) {
      int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(nred, 1));
      parallel_for(outs, grain, [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) pol.store(o, fold(o, 0, nred));
      });
    } else {  // few outputs, long reductions: split the reduced range and fold the partials
      int64_t parts = std::min<int64_t>(threads, std::max<int64_t>(1, nred / kElementwiseGrain + 1));
      std::vector<A> partial(size_t(parts * outs));
      parallel_for(parts, 1, [&](int64_t b, int64_t e) {
        for (int64_t c = b; c < e; ++c)
          for (int64_t o = 0; o < outs; ++o)
            partial[size_t(c * outs + o)] = fold(o, nred * c / parts, nred * (c + 1) / parts);
      });
      for (int64_t o = 0; o < outs; ++o) {
        A acc = partial[size_t(o)];
        for (int64_t c = 1; c < parts; ++c) acc = pol.combine(acc, partial[size_t(c * outs + o)]);
        pol.store(o, acc);
      }
    }
    return;
  }

  // Case B: blocks of `run` consecutive outputs, each accumulating rows of `run` inputs.
  const int64_t run = p.run;
  constexpr int64_t CH = 512;
  const int64_t chunks = (run + CH - 1) / CH;
  const int64_t tasks = p.blocks * chunks;
  // Folds offsets [r0, r1) into acc for the outputs [c0, c0+len) of block k.
  auto fold_rows = [&](int64_t k, int64_t c0, int64_t len, int64_t r0, int64_t r1, A* acc) {
    const T* xb = x + p.base(k) + c0;
    int64_t o0 = k * run + c0;
    for (int64_t i = 0; i < len; ++i) acc[i] = pol.init();
    for (int64_t r = r0; r < r1; ++r) {
      const T* row = xb + p.offsets[size_t(r)];
      for (int64_t i = 0; i < len; ++i) acc[i] = pol.combine(acc[i], pol.map(cast_value<A>(row[i]), o0 + i));
    }
  };
  if (tasks >= threads || n_off * run * p.blocks < 2 * kElementwiseGrain || n_off < 2) {
    int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(n_off * std::min(run, CH), 1));
    parallel_for(tasks, grain, [&](int64_t b, int64_t e) {
      A acc[CH];
      for (int64_t t = b; t < e; ++t) {
        int64_t k = t / chunks, c0 = (t % chunks) * CH, len = std::min(CH, run - c0);
        fold_rows(k, c0, len, 0, n_off, acc);
        for (int64_t i = 0; i < len; ++i) pol.store(k * run + c0 + i, acc[i]);
      }
    });
  } else {  // few outputs, many rows: split the rows and fold the partials
    int64_t parts = std::min<int64_t>({int64_t(threads), n_off});
    int64_t outs = p.blocks * run;
    std::vector<A> partial(size_t(parts * outs));
    parallel_for(parts, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c)
        for (int64_t t = 0; t < tasks; ++t) {
          int64_t k = t / chunks, c0 = (t % chunks) * CH, len = std::min(CH, run - c0);
          fold_rows(k, c0, len, n_off * c / parts, n_off * (c + 1) / parts,
                    partial.data() + c * outs + k * run + c0);
        }
    });
    for (int64_t o = 0; o < outs; ++o) {
      A acc = partial[size_t(o)];
      for (int64_t c = 1; c < parts; ++c) acc = pol.combine(acc, partial[size_t(c * outs + o)]);
      pol.store(o, acc);
    }
  }
}

// The axes of a Reduce* node: the `axes` input (ReduceSum >= 13, the others >= 18) or attribute.
// Returns nullopt when the node reduces nothing (noop_with_empty_axes with empty axes).
inline std::optional<std::vector<bool>> reduce_mask(const KernelContext& ctx, int64_t rank) {
  std::vector<int64_t> axes = ctx.has_input(1) ? int_list_input(ctx, 1) : ctx.node().attr_ints("axes");
  std::vector<bool> mask(size_t(rank), axes.empty());
  if (axes.empty()) {
    if (ctx.node().attr_int("noop_with_empty_axes", 0)) return std::nullopt;
    return mask;
  }
  for (int64_t a : axes) {
    int64_t d = normalize_axis(ctx.node(), a, rank);
    OT_CHECK(!mask[size_t(d)], ctx.node().context(), "axes must not repeat, got axis ", a, " twice");
    mask[size_t(d)] = true;
  }
  return mask;
}

inline Shape reduced_shape(const Shape& in, const std::vector<bool>& mask, bool keepdims) {
  Shape out;
  for (size_t d = 0; d < in.size(); ++d) {
    if (!mask[d]) out.push_back(in[d]);
    else if (keepdims) out.push_back(1);
  }
  return out;
}

// Shape rule for Reduce*: dtype of the input; the shape when the axes are known. Reducing every
// axis without keepdims gives a scalar even when the input's rank is unknown (a loss over a model
// output whose rank inference lost, as after an If whose branches differ).
inline void shape_reduce(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(0);
  const auto& in = ctx.input_shape(0);
  bool keep = ctx.node().attr_int("keepdims", 1) != 0;
  bool noop = ctx.node().attr_int("noop_with_empty_axes", 0) != 0;
  std::optional<std::vector<int64_t>> axes;
  if (ctx.has_input(1)) {
    if (const Tensor* v = ctx.input_value(1)) axes = v->to_int_vector();
  } else {
    axes = ctx.node().attr_ints("axes");
  }
  if (!in) {
    if (axes && axes->empty() && !noop && !keep) return ctx.set_output(0, dt, Shape{});
    return ctx.set_output(0, dt);
  }
  int64_t rank = int64_t(in->size());
  if (!axes) {  // axes only known at run time
    const auto& as = ctx.input_shape(1);
    if (keep) return ctx.set_output(0, dt, Shape(size_t(rank), -1));
    // More axes than dims is the kernel's error to report; the rank is unknown here then.
    if (as && as->size() == 1 && (*as)[0] > 0 && (*as)[0] <= rank)
      return ctx.set_output(0, dt, Shape(size_t(rank - (*as)[0]), -1));
    return ctx.set_output(0, dt);
  }
  if (axes->empty()) {
    if (noop) return ctx.set_output(0, dt, in);
    return ctx.set_output(0, dt, keep ? Shape(size_t(rank), 1) : Shape{});
  }
  std::vector<bool> mask(size_t(rank), false);
  for (int64_t a : *axes) {
    int64_t d = normalize_axis(ctx.node(), a, rank);
    mask[size_t(d)] = true;
  }
  ctx.set_output(0, dt, reduced_shape(*in, mask, keep));
}

}  // namespace onnxtrain
