// Shared by MatMul, Gemm and Einsum: numpy-matmul shape planning and one entry point that runs a
// planned product on tensors of any numeric dtype (fp32 through oneDNN, the rest by reference).
#pragma once

#include "backends/cpu/gemm.h"
#include "ir/graph.h"

namespace onnxtrain {

struct MatmulPlan {
  cpu::MatmulDims dims;
  Shape out_shape;
};

// numpy.matmul of shapes a and b (1-D operands promoted, batch dims broadcast); throws naming the
// node on a mismatch.
MatmulPlan plan_matmul(const Node& node, const Shape& a, const Shape& b);
// The same rule for shape inference: dims may be -1; never throws.
Shape matmul_static_shape(const Shape& a, const Shape& b);

// y = alpha * op(a) op(b) + beta * y (+ bias): y must already have the planned shape; handles
// empty operands (K = 0 gives zeros, or beta * y + bias).
void run_matmul(const Node& node, const cpu::MatmulDims& dims, const Tensor& a, const Tensor& b, Tensor& y,
                cpu::MatmulCache& cache, const Tensor* bias = nullptr);

}  // namespace onnxtrain
