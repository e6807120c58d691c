// Shared helpers for the tensor-manipulation family (src/ops/tensor/): reading int lists that
// moved from attributes to inputs, index checks, and the data-movement loops (strided copies and
// permutations) that Slice, Expand, Tile, Transpose, DepthToSpace, ... are built from.
#pragma once

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "ops/common.h"
#include "ops/registry.h"
#if ONNXTRAIN_CUDA
#include "backends/cuda/kernels.h"
#endif

namespace onnxtrain {
class GradientBuilder;
}

namespace onnxtrain::tensor_ops {

// Kernel side: the int list from attribute `attr` when the node has it, else from input `input`
// when present, else nullopt. `attr` may be nullptr (input only); `input` < 0 means attribute only.
std::optional<std::vector<int64_t>> attr_or_input_ints(const KernelContext& ctx, const char* attr, int input);

// Shape-rule side of the same: `known` is false when the list comes from an input whose value is
// not a constant (the rule then cannot decide); `value` is nullopt when the list is absent.
struct StaticInts {
  bool known = true;
  std::optional<std::vector<int64_t>> value;
};
StaticInts static_ints(const ShapeContext& ctx, const char* attr, int input);

// An int64 scalar (or 1-element) input as a value; throws with context otherwise.
int64_t scalar_int_input(const KernelContext& ctx, size_t i, const char* what);

// Maps an index in [-dim, dim) to [0, dim), or throws naming the node, what was indexed and the range.
inline int64_t checked_index(const Node& node, int64_t idx, int64_t dim, const char* what) {
  int64_t j = idx < 0 ? idx + dim : idx;
  if (j < 0 || j >= dim)
    OT_THROW(kInvalidArgument, node.context(), what, " index ", idx, " is out of range for a dimension of size ",
             dim, " (expected [", -dim, ", ", dim - 1, "])");
  return j;
}

// Checks that an index tensor is int32 or int64.
void check_index_dtype(const KernelContext& ctx, const Tensor& t, const char* what);

// Calls f.template operator()<I>() with I = int32_t or int64_t for an index tensor.
template <typename F>
decltype(auto) dispatch_index(DType dt, F&& f) {
  if (dt == DType::kInt32) return f.template operator()<int32_t>();
  return f.template operator()<int64_t>();
}

// out (contiguous, shape out_shape) = in[base + sum_k idx_k * in_strides[k]] for element type T.
// Strides are in elements and may be 0 (broadcast) or negative (reversed slices). Dims are
// collapsed where possible; inner runs are memcpy (stride 1), fill (stride 0) or a strided loop,
// and the outer loop runs in parallel.
template <typename T>
void strided_copy(const T* in, T* out, const Shape& out_shape, const std::vector<int64_t>& in_strides,
                  int64_t base);
// The same dispatched by element size over tensors.
void strided_copy(const Tensor& in, Tensor& out, const Shape& out_shape, const std::vector<int64_t>& in_strides,
                  int64_t base);

#if ONNXTRAIN_CUDA
// The CUDA form of the copies above, on the step's stream (backends/cuda/copy.cu): dst's elements
// from src's as `c` walks them (dst_strides empty: dst is contiguous over c.shape).
inline void strided_copy_cuda(const KernelContext& ctx, const Tensor& src, Tensor& dst, cuda::StridedCopy c) {
  if (c.dst_strides.empty()) c.dst_strides = strides_of(c.shape);
  cuda::strided_copy(dtype_size(src.dtype()), src.data(), dst.data(), c, ctx.stream());
}
// Whether a walk of this rank fits the CUDA copy; the reason to run on the host where not.
inline bool copy_rank_fits(size_t rank) { return rank <= size_t(cuda::kCopyMaxRank); }
inline std::string rank_too_high() { return "rank above " + std::to_string(cuda::kCopyMaxRank); }
#endif

// out = transpose(in viewed as in_shape, perm): out dim k is in dim perm[k]. `out` must hold
// numel(in_shape) elements of in's dtype; the output is written row-major.
void permute(const Tensor& in, const Shape& in_shape, const std::vector<int64_t>& perm, Tensor& out);

// Copies n elements of `bytes` size each.
inline void copy_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

// Concatenates `inputs` along axis `axis_attr` (negative counts from the back) into output
// `output` of ctx, checking dtypes and the other dims (Concat, ConcatFromSequence).
Tensor& concat_tensors(KernelContext& ctx, const std::vector<const Tensor*>& inputs, int64_t axis_attr,
                       size_t output);
// Copies consecutive slices of x along `axis` (in range) into outs, each already shaped like x but
// for its length on the axis; the lengths sum to x's (Split, SplitToSequence).
void split_tensor(const Tensor& x, int64_t axis, const std::vector<Tensor*>& outs);

// ---- Gradient-rule helpers ----

// Shape rule of the backward ops that take the forward input's shape as input 1: output 0 has that
// shape and input 0's dtype.
void shape_from_input1(ShapeContext& ctx);

// reshape(a, shape(like)) with allowzero=1, so that empty dims of `like` are kept as 0 rather than
// read as "copy the input dim".
std::string reshape_like(GradientBuilder& g, const std::string& a, const std::string& like);
// The forward node's int list as a value name: attribute `attr` as a new constant when the node has
// it, else forward input `input` when present, else "" (an omitted optional input).
std::string ints_attr_or_input(GradientBuilder& g, const char* attr, int input);
// Shape(like) restricted to dim `axis` (negative counts from the back): a 1-element int64 value.
std::string dim_of(GradientBuilder& g, const std::string& like, int64_t axis);

}  // namespace onnxtrain::tensor_ops
