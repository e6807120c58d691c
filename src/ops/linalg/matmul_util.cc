#include "ops/linalg/matmul_util.h"

#include "ops/common.h"

namespace onnxtrain {

MatmulPlan plan_matmul(const Node& node, const Shape& a_in, const Shape& b_in) {
  OT_CHECK(!a_in.empty() && !b_in.empty(), node.context(), "operands must have rank >= 1, got ",
           shape_str(a_in), " and ", shape_str(b_in));
  Shape a = a_in, b = b_in;
  bool a_vec = a.size() == 1, b_vec = b.size() == 1;
  if (a_vec) a.insert(a.begin(), 1);
  if (b_vec) b.push_back(1);
  OT_CHECK(a.back() == b[b.size() - 2], node.context(), "inner dims must agree, got ", shape_str(a_in),
           " x ", shape_str(b_in));
  size_t rank = std::max(a.size(), b.size()) - 2;
  MatmulPlan p;
  p.dims.a_batch.assign(rank, 1);
  p.dims.b_batch.assign(rank, 1);
  std::copy(a.begin(), a.end() - 2, p.dims.a_batch.begin() + (rank - (a.size() - 2)));
  std::copy(b.begin(), b.end() - 2, p.dims.b_batch.begin() + (rank - (b.size() - 2)));
  for (size_t i = 0; i < rank; ++i) {
    int64_t x = p.dims.a_batch[i], y = p.dims.b_batch[i];
    OT_CHECK(x == y || x == 1 || y == 1, node.context(), "batch dims cannot be broadcast: ", shape_str(a_in),
             " x ", shape_str(b_in));
  }
  p.dims.m = a[a.size() - 2];
  p.dims.k = a.back();
  p.dims.n = b.back();
  p.out_shape = p.dims.out_batch();
  if (!a_vec) p.out_shape.push_back(p.dims.m);
  if (!b_vec) p.out_shape.push_back(p.dims.n);
  return p;
}

Shape matmul_static_shape(const Shape& a_in, const Shape& b_in) {
  Shape a = a_in, b = b_in;
  bool a_vec = a.size() == 1, b_vec = b.size() == 1;
  if (a_vec) a.insert(a.begin(), 1);
  if (b_vec) b.push_back(1);
  auto batch = broadcast_static(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2));
  Shape out = *batch;
  if (!a_vec) out.push_back(a[a.size() - 2]);
  if (!b_vec) out.push_back(b.back());
  return out;
}

void run_matmul(const Node& node, const cpu::MatmulDims& d, const Tensor& a, const Tensor& b, Tensor& y,
                cpu::MatmulCache& cache, const Tensor* bias) {
  if (y.numel() == 0) return;
  if (d.k == 0) {  // empty contraction: alpha * 0 + beta * y + bias
    dispatch_numeric(y.dtype(), [&]<typename T>() {
      using C = compute_t<T>;
      T* py = y.data<T>();
      const T* pb = bias ? bias->data<T>() : nullptr;
      for (int64_t i = 0; i < y.numel(); ++i) {
        C v = d.beta != 0.0f ? C(C(d.beta) * C(py[i])) : C(0);
        if (pb) v = C(v + C(pb[i % d.n]));
        py[i] = T(v);
      }
    });
    return;
  }
  if (y.dtype() == DType::kFloat32) {
    cache.get(d, node.context())
        .run(a.data<float>(), b.data<float>(), y.data<float>(), bias ? bias->data<float>() : nullptr);
    return;
  }
  dispatch_numeric(y.dtype(), [&]<typename T>() {
    cpu::matmul_reference<T>(d, a.data<T>(), b.data<T>(), y.data<T>(), bias ? bias->data<T>() : nullptr);
  });
}

}  // namespace onnxtrain
