// Det (opset 11): the determinant of each [M, M] matrix in the trailing two dims of X ([*, M, M]
// to [*]), by LU decomposition with partial pivoting in double precision.
#include <cmath>

#include "ops/common.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

void det_shape(ShapeContext& ctx) {
  const auto& x = ctx.input_shape(0);
  std::optional<Shape> out;
  if (x && x->size() >= 2) out = Shape(x->begin(), x->end() - 2);
  ctx.set_output(0, ctx.input_dtype(0), out);
}

double determinant(std::vector<double>& a, int64_t m) {
  double det = 1.0;
  for (int64_t k = 0; k < m; ++k) {
    int64_t p = k;
    for (int64_t i = k + 1; i < m; ++i)
      if (std::fabs(a[size_t(i * m + k)]) > std::fabs(a[size_t(p * m + k)])) p = i;
    double piv = a[size_t(p * m + k)];
    if (piv == 0.0) return 0.0;
    if (p != k) {
      for (int64_t j = 0; j < m; ++j) std::swap(a[size_t(k * m + j)], a[size_t(p * m + j)]);
      det = -det;
    }
    det *= piv;
    for (int64_t i = k + 1; i < m; ++i) {
      double f = a[size_t(i * m + k)] / piv;
      if (f == 0.0) continue;
      for (int64_t j = k + 1; j < m; ++j) a[size_t(i * m + j)] -= f * a[size_t(k * m + j)];
    }
  }
  return det;
}

void det_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  OT_CHECK(x.rank() >= 2 && x.dim(-1) == x.dim(-2), node.context(), "X must be [*, M, M], got ",
           shape_str(x.shape()));
  const int64_t m = x.dim(-1);
  Tensor& y = ctx.output(0, x.dtype(), Shape(x.shape().begin(), x.shape().end() - 2));
  const int64_t batch = y.numel();
  dispatch_float(x.dtype(), [&]<typename T>() {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    parallel_for(batch, std::max<int64_t>(1, 4096 / std::max<int64_t>(m * m * m, 1)), [&](int64_t b, int64_t e) {
      std::vector<double> a(static_cast<size_t>(m * m));
      for (int64_t i = b; i < e; ++i) {
        for (int64_t j = 0; j < m * m; ++j) a[size_t(j)] = double(compute_t<T>(px[i * m * m + j]));
        py[i] = T(compute_t<T>(determinant(a, m)));  // an empty 0 x 0 matrix has determinant 1
      }
    });
  });
}

}  // namespace

// y = det(X).  dX = dy * y * X^{-T} (for invertible X; the adjugate transpose in general)
ONNXTRAIN_OP(Det, kOnnxDomain, 11).inputs(1).outputs(1).shape(det_shape)
    .gradient_not_implemented("no rule yet: needs a matrix inverse (or adjugate for singular X)")
    .cpu(det_kernel);

}  // namespace onnxtrain
