// Shared by MatMul, Gemm and Einsum: numpy-matmul shape planning and one entry point that runs a
// planned product on tensors of any numeric dtype (fp32 through oneDNN, the rest by reference).
#pragma once

#include "backends/cpu/gemm.h"
#include "ops/gradient_builder.h"
#include "ir/graph.h"

namespace onnxtrain {

struct MatmulPlan {
  cpu::MatmulDims dims;
  Shape out_shape;
};

// numpy.matmul of shapes a and b (1-D operands promoted, batch dims broadcast); throws naming the
// node on a mismatch. trans_a / trans_b read an operand of rank >= 2 with its last two dims
// swapped (through strides, never copied); they are ignored for 1-D operands.
MatmulPlan plan_matmul(const Node& node, const Shape& a, const Shape& b, bool trans_a = false, bool trans_b = false);
// The same rule for shape inference: dims may be -1; never throws.
Shape matmul_static_shape(const Shape& a, const Shape& b, bool trans_a = false, bool trans_b = false);

// The gradient of Y = alpha * op(A) op(B) (+ bias) for MatMul, Gemm and onnxtrain.FusedMatMul:
// inputs ia and ib of the node are A and B (any rank >= 1, numpy matmul promotion), dY is output
// 0's gradient, or `dy` when given. Emits FusedMatMul nodes (transposes folded into strides) and
// sum_to for broadcast batch dims; when B is a 2-D weight and A batched, dB is one GEMM over the
// flattened batch.
void matmul_gradient(GradientBuilder& g, size_t ia, size_t ib, bool trans_a, bool trans_b, float alpha,
                     const std::string& dy = "");

// y = alpha * op(a) op(b) + beta * y (+ bias): y must already have the planned shape; handles
// empty operands (K = 0 gives zeros, or beta * y + bias).
void run_matmul(const Node& node, const cpu::MatmulDims& dims, const Tensor& a, const Tensor& b, Tensor& y,
                cpu::MatmulCache& cache, const Tensor* bias = nullptr, bool b_constant = false);

#if ONNXTRAIN_CUDA
// run_matmul on CUDA tensors, through cuBLASLt (backends/cuda/gemm.cc) on `stream`: batches that
// match or are shared are one strided-batched call, other broadcasts one call per product. y has
// A's dtype (float32, float16 or bfloat16).
void run_matmul_cuda(const Node& node, const cpu::MatmulDims& dims, const Tensor& a, const Tensor& b, Tensor& y,
                     const Tensor* bias, void* stream);
#endif

}  // namespace onnxtrain
