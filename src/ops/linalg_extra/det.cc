// Det (opset 11): the determinant of each [M, M] matrix in the trailing two dims of X ([*, M, M]
// to [*]), by LU decomposition with partial pivoting in double precision; its gradient is the
// cofactor matrix (DetGrad).
#include <cmath>

#include "ops/common.h"
#include "ops/gradient_builder.h"
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

// a^{-1} by Gauss-Jordan elimination with partial pivoting into `inv`; returns det(a), 0 for a
// singular a (inv is then unspecified).
double invert(std::vector<double> a, int64_t m, std::vector<double>& inv) {
  inv.assign(size_t(m * m), 0.0);
  for (int64_t i = 0; i < m; ++i) inv[size_t(i * m + i)] = 1.0;
  double det = 1.0;
  for (int64_t k = 0; k < m; ++k) {
    int64_t p = k;
    for (int64_t i = k + 1; i < m; ++i)
      if (std::fabs(a[size_t(i * m + k)]) > std::fabs(a[size_t(p * m + k)])) p = i;
    const double piv = a[size_t(p * m + k)];
    if (piv == 0.0) return 0.0;
    if (p != k) {
      for (int64_t j = 0; j < m; ++j) {
        std::swap(a[size_t(k * m + j)], a[size_t(p * m + j)]);
        std::swap(inv[size_t(k * m + j)], inv[size_t(p * m + j)]);
      }
      det = -det;
    }
    det *= piv;
    for (int64_t j = 0; j < m; ++j) {
      a[size_t(k * m + j)] /= piv;
      inv[size_t(k * m + j)] /= piv;
    }
    for (int64_t i = 0; i < m; ++i) {
      const double f = a[size_t(i * m + k)];
      if (i == k || f == 0.0) continue;
      for (int64_t j = 0; j < m; ++j) {
        a[size_t(i * m + j)] -= f * a[size_t(k * m + j)];
        inv[size_t(i * m + j)] -= f * inv[size_t(k * m + j)];
      }
    }
  }
  return det;
}

// The cofactor matrix C = adj(a)^T = d det(a) / da: det(a) * a^{-T} for an invertible a, and each
// signed minor, (-1)^(i+j) det(a without row i and column j), for a singular one (O(m^5), but
// exact where the inverse does not exist: a rank m-1 matrix still has a nonzero gradient).
void cofactors(const std::vector<double>& a, int64_t m, std::vector<double>& c) {
  std::vector<double> inv;
  const double det = invert(a, m, inv);
  c.resize(size_t(m * m));
  if (det != 0.0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j) c[size_t(i * m + j)] = det * inv[size_t(j * m + i)];
    return;
  }
  std::vector<double> minor(size_t((m - 1) * (m - 1)));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      size_t n = 0;
      for (int64_t r = 0; r < m; ++r)
        for (int64_t q = 0; q < m; ++q)
          if (r != i && q != j) minor[n++] = a[size_t(r * m + q)];
      c[size_t(i * m + j)] = ((i + j) % 2 ? -1.0 : 1.0) * determinant(minor, m - 1);
    }
  }
}

// DetGrad(dy, X) -> dX = dy * C(X), per matrix of the batch.
void det_grad_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& dy = ctx.input(0);
  const Tensor& x = ctx.input(1);
  OT_CHECK(x.rank() >= 2 && x.dim(-1) == x.dim(-2) && dy.dtype() == x.dtype() &&
               dy.shape() == Shape(x.shape().begin(), x.shape().end() - 2),
           node.context(), "dy [*] and X [*, M, M] of one dtype expected, got ", shape_str(dy.shape()), " and ",
           shape_str(x.shape()));
  const int64_t m = x.dim(-1), batch = dy.numel();
  Tensor& dx = ctx.output(0, x.dtype(), x.shape());
  dispatch_float(x.dtype(), [&]<typename T>() {
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    parallel_for(batch, std::max<int64_t>(1, 4096 / std::max<int64_t>(m * m * m, 1)), [&](int64_t b, int64_t e) {
      std::vector<double> a(static_cast<size_t>(m * m)), c;
      for (int64_t i = b; i < e; ++i) {
        for (int64_t j = 0; j < m * m; ++j) a[size_t(j)] = double(compute_t<T>(px[i * m * m + j]));
        cofactors(a, m, c);
        const double g = double(compute_t<T>(pdy[i]));
        for (int64_t j = 0; j < m * m; ++j) pdx[i * m * m + j] = T(compute_t<T>(g * c[size_t(j)]));
      }
    });
  });
}

}  // namespace

// y = det(X).  dX = dy * adj(X)^T, which is dy * y * X^{-T} for an invertible X (DetGrad)
ONNXTRAIN_OP(Det, kOnnxDomain, 11).inputs(1).outputs(1).shape(det_shape)
    .gradient([](GradientBuilder& g) { g.set(0, g.emit("DetGrad", {g.dy(0), g.x(0)}, {}, kOnnxTrainDomain)); })
    .cpu(det_kernel);
// DetGrad is linear in dy: second derivatives are not needed.
ONNXTRAIN_OP(DetGrad, kOnnxTrainDomain, 1).inputs(2).outputs(1).shape([](ShapeContext& ctx) {
  ctx.set_output(0, ctx.input_dtype(1), ctx.input_shape(1));
}).cpu(det_grad_kernel).gradient_not_implemented("second derivatives are not needed for training");

}  // namespace onnxtrain
