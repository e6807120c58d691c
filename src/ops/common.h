// Helpers shared by op files: axis handling, broadcasting (shapes and iteration), common shape
// rules and the elementwise loop drivers.
#pragma once

#include <array>
#include <optional>

#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/kernel.h"
#include "ops/shape_context.h"

namespace onnxtrain {

// Maps a possibly negative axis into [0, rank), or throws naming the node.
int64_t normalize_axis(const Node& node, int64_t axis, int64_t rank);
std::vector<int64_t> normalize_axes(const Node& node, std::vector<int64_t> axes, int64_t rank);

// Numpy broadcasting of concrete shapes; throws with both shapes on mismatch.
Shape broadcast_shapes(const Node& node, const Shape& a, const Shape& b);
// Static version for shape rules: -1 dims stay unknown where they cannot be resolved.
std::optional<Shape> broadcast_static(const std::optional<Shape>& a, const std::optional<Shape>& b);

// Row-major strides of a shape, in elements.
std::vector<int64_t> strides_of(const Shape& shape);

// Shape rules used by many ops.
void shape_same_as_input(ShapeContext& ctx);      // output 0 = input 0 (dtype and shape)
void shape_broadcast_inputs(ShapeContext& ctx);   // output 0 = broadcast of all inputs, dtype of input 0
void shape_broadcast_to_bool(ShapeContext& ctx);  // comparisons: broadcast shape, bool dtype

// Reads an int64 list input (axes, shape, repeats, ...) as a vector; empty when absent.
std::vector<int64_t> int_list_input(const KernelContext& ctx, size_t i);

// Half-precision kernels on CPUs without native ones (no AVX512-BF16/AMX for bf16, no
// AVX512-FP16/AMX-FP16 for fp16) compute through fp32: widen the operands (exact), run the fp32
// kernel, round each result once. Said once per process, kernel family and dtype, on stderr.
Tensor widen_to_fp32(const Tensor& half);
void narrow_from_fp32(const Tensor& fp32, Tensor& half);  // same shape; rounds to half's dtype
void note_half_through_fp32(const char* kernel, DType dtype);  // kernel: "matmul", "convolution"

// Walks the broadcast of up to three operands over an output shape. After collapsing dimensions
// the innermost loop has stride 0 (broadcast) or 1 (contiguous) per operand, so the callback gets
// contiguous runs: fn(out_offset, {in_offsets...}, {in_inner_strides...}, count).
template <size_t N>
struct BroadcastPlan {
  Shape out_shape;                                 // collapsed
  std::array<std::vector<int64_t>, N> in_strides;  // collapsed, 0 on broadcast dims
  int64_t inner = 1;                               // innermost collapsed extent
  std::array<int64_t, N> inner_stride{};           // 0 or 1
};

template <size_t N>
BroadcastPlan<N> make_broadcast_plan(const Shape& out, const std::array<const Shape*, N>& ins) {
  size_t rank = out.size();
  std::array<std::vector<int64_t>, N> st;
  for (size_t k = 0; k < N; ++k) {
    const Shape& s = *ins[k];
    std::vector<int64_t> full(rank, 0);
    int64_t acc = 1;
    for (size_t j = 0; j < s.size(); ++j) {
      size_t d = s.size() - 1 - j;        // dim in input
      size_t od = rank - 1 - j;           // aligned dim in output
      full[od] = s[d] == 1 && out[od] != 1 ? 0 : acc;
      acc *= s[d];
    }
    st[k] = std::move(full);
  }
  // Collapse adjacent dims when every operand is contiguous across them.
  BroadcastPlan<N> plan;
  std::vector<int64_t> dims;
  std::array<std::vector<int64_t>, N> cst;
  for (size_t d = 0; d < rank; ++d) {
    if (out[d] == 1) continue;  // size-1 dims do not affect addressing
    bool merge = !dims.empty();
    for (size_t k = 0; k < N && merge; ++k)
      merge = cst[k].back() == st[k][d] * out[d];
    if (merge) {
      dims.back() *= out[d];
      for (size_t k = 0; k < N; ++k) cst[k].back() = st[k][d];
    } else {
      dims.push_back(out[d]);
      for (size_t k = 0; k < N; ++k) cst[k].push_back(st[k][d]);
    }
  }
  if (dims.empty()) {
    dims.push_back(1);
    for (size_t k = 0; k < N; ++k) cst[k].push_back(1);
  }
  plan.inner = dims.back();
  for (size_t k = 0; k < N; ++k) plan.inner_stride[k] = cst[k].back() ? 1 : 0;
  plan.out_shape = dims;
  plan.in_strides = cst;
  return plan;
}

// Calls fn(out_offset, in_offsets, count) for each contiguous inner run, in parallel over runs.
template <size_t N, typename F>
void for_each_broadcast_run(const BroadcastPlan<N>& plan, F&& fn) {
  const Shape& dims = plan.out_shape;
  int64_t outer = numel(dims) / plan.inner;
  int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(plan.inner, 1));
  size_t rank = dims.size();
  parallel_for(outer, grain, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> idx(rank, 0);
    for (int64_t r = begin; r < end; ++r) {
      // decompose r over dims[0 .. rank-2]
      int64_t rem = r;
      std::array<int64_t, N> off{};
      for (size_t d = rank - 1; d-- > 0;) {
        int64_t i = rem % dims[d];
        rem /= dims[d];
        for (size_t k = 0; k < N; ++k) off[k] += i * plan.in_strides[k][d];
      }
      fn(r * plan.inner, off, plan.inner);
    }
  });
}

// out[i] = fn(a[i]) over any dtype pair; parallel and vectorisable. Pass a lambda or function object:
// a function pointer (`gelu<T>`) is not inlined into the loop, which then stays scalar (12x slower).
template <typename TIn, typename TOut, typename F>
void unary_map(const TIn* x, TOut* y, int64_t n, F fn) {
  parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = fn(x[i]);
  });
}

// out = fn(a, b) with numpy broadcasting. Contiguous runs get a tight loop per stride pattern so
// the compiler vectorises the common cases (same shape, scalar, bias row).
template <typename TA, typename TB, typename TOut, typename F>
void binary_broadcast(const Tensor& a, const Tensor& b, Tensor& out, F fn) {
  const TA* pa = static_cast<const TA*>(a.data());
  const TB* pb = static_cast<const TB*>(b.data());
  TOut* po = static_cast<TOut*>(out.data());
  if (out.numel() == 0) return;
  if (a.shape() == b.shape()) {
    parallel_for(out.numel(), kElementwiseGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) po[i] = fn(pa[i], pb[i]);
    });
    return;
  }
  auto plan = make_broadcast_plan<2>(out.shape(), {&a.shape(), &b.shape()});
  int sa = int(plan.inner_stride[0]), sb = int(plan.inner_stride[1]);
  for_each_broadcast_run(plan, [&](int64_t o, const std::array<int64_t, 2>& in, int64_t n) {
    const TA* x = pa + in[0];
    const TB* y = pb + in[1];
    TOut* z = po + o;
    if (sa && sb) for (int64_t i = 0; i < n; ++i) z[i] = fn(x[i], y[i]);
    else if (sa) { TB yv = y[0]; for (int64_t i = 0; i < n; ++i) z[i] = fn(x[i], yv); }
    else if (sb) { TA xv = x[0]; for (int64_t i = 0; i < n; ++i) z[i] = fn(xv, y[i]); }
    else { TOut v = fn(x[0], y[0]); for (int64_t i = 0; i < n; ++i) z[i] = v; }
  });
}

}  // namespace onnxtrain
