#include "ops/linalg/matmul_util.h"

#if ONNXTRAIN_CUDA
#include "backends/cuda/kernels.h"
#endif

#include <cstdio>
#include <mutex>

#include "ops/common.h"
#include "ops/registry.h"  // ONNXTRAIN_GRADIENT_RULES

namespace onnxtrain {

namespace {

// The logical (transposed when asked) shape of an operand of rank >= 2.
Shape logical(const Shape& s, bool trans) {
  Shape r = s;
  if (trans && r.size() >= 2) std::swap(r[r.size() - 1], r[r.size() - 2]);
  return r;
}

}  // namespace

MatmulPlan plan_matmul(const Node& node, const Shape& a_stored, const Shape& b_stored, bool trans_a, bool trans_b) {
  OT_CHECK(!a_stored.empty() && !b_stored.empty(), node.context(), "operands must have rank >= 1, got ",
           shape_str(a_stored), " and ", shape_str(b_stored));
  Shape a_in = logical(a_stored, trans_a), b_in = logical(b_stored, trans_b);
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
  p.dims.trans_a = trans_a && a_stored.size() >= 2;
  p.dims.trans_b = trans_b && b_stored.size() >= 2;
  p.out_shape = p.dims.out_batch();
  if (!a_vec) p.out_shape.push_back(p.dims.m);
  if (!b_vec) p.out_shape.push_back(p.dims.n);
  return p;
}

Shape matmul_static_shape(const Shape& a_in, const Shape& b_in, bool trans_a, bool trans_b) {
  Shape a = logical(a_in, trans_a), b = logical(b_in, trans_b);
  bool a_vec = a.size() == 1, b_vec = b.size() == 1;
  if (a_vec) a.insert(a.begin(), 1);
  if (b_vec) b.push_back(1);
  auto batch = broadcast_static(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2));
  Shape out = *batch;
  if (!a_vec) out.push_back(a[a.size() - 2]);
  if (!b_vec) out.push_back(b.back());
  return out;
}

void run_matmul(const Node& node, const cpu::MatmulDims& dims, const Tensor& a, const Tensor& b, Tensor& y,
                cpu::MatmulCache& cache, const Tensor* bias, bool b_constant) {
  cpu::MatmulDims d = dims;
  d.b_constant = b_constant;
  if (y.numel() == 0) return;
  const DType dt = a.dtype();  // of A, B and bias; y may be fp32 for half A and B
  const bool half = dt == DType::kBFloat16 || dt == DType::kFloat16;
  OT_CHECK(y.dtype() == dt || (half && y.dtype() == DType::kFloat32), node.context(), "a ", dtype_name(dt),
           " product cannot be written as ", dtype_name(y.dtype()));
  if (d.k == 0) {  // empty contraction: alpha * 0 + beta * y + bias
    dispatch_numeric(y.dtype(), [&]<typename T>() {
      using C = compute_t<T>;
      T* py = y.data<T>();
      std::vector<double> pb;  // bias in A's dtype, y maybe wider
      if (bias)
        dispatch_numeric(bias->dtype(), [&]<typename B>() {
          for (int64_t j = 0; j < bias->numel(); ++j) pb.push_back(double(compute_t<B>(bias->data<B>()[j])));
        });
      for (int64_t i = 0; i < y.numel(); ++i) {
        C v = d.beta != 0.0f ? C(C(d.beta) * C(py[i])) : C(0);
        if (bias) v = C(v + C(pb[size_t(i % d.n)]));
        py[i] = T(v);
      }
    });
    return;
  }
  if (y.dtype() != dt) d.out_dtype = y.dtype();
  if (dt == DType::kFloat32 || (half && cpu::matmul_native(dt))) {
    d.dtype = dt;  // half types: fp32 accumulation inside oneDNN's primitive
    cache.get(d, node.context()).run(a.data(), b.data(), y.data(), bias ? bias->data() : nullptr);
    return;
  }
  if (half) {
    // No native kernel on this CPU: up-convert to fp32, multiply there, round the result once
    // (or not at all, for an fp32 y).
    note_half_through_fp32("matmul", dt);
    d.out_dtype = DType::kUndefined;
    Tensor a32 = widen_to_fp32(a), b32 = widen_to_fp32(b);
    const bool direct = y.dtype() == DType::kFloat32;
    Tensor y32 = direct ? y : d.beta != 0.0f ? widen_to_fp32(y) : Tensor::empty(DType::kFloat32, y.shape());
    Tensor bias32 = bias ? widen_to_fp32(*bias) : Tensor();
    cache.get(d, node.context()).run(a32.data(), b32.data(), y32.data(), bias ? bias32.data() : nullptr);
    if (!direct) narrow_from_fp32(y32, y);
    return;
  }
  dispatch_numeric(y.dtype(), [&]<typename T>() {
    cpu::matmul_reference<T>(d, a.data<T>(), b.data<T>(), y.data<T>(), bias ? bias->data<T>() : nullptr);
  });
}

#if ONNXTRAIN_CUDA
void run_matmul_cuda(const Node& node, const cpu::MatmulDims& dims, const Tensor& a, const Tensor& b, Tensor& y,
                     const Tensor* bias, void* stream) {
  OT_CHECK(y.dtype() == a.dtype() && b.dtype() == a.dtype(), node.context(), "a CUDA product of ", dtype_name(a.dtype()),
           " and ", dtype_name(b.dtype()), " into ", dtype_name(y.dtype()), " is not implemented");
  if (y.numel() == 0) return;
  cuda::GemmDesc g;
  g.dtype = a.dtype();
  g.trans_a = dims.trans_a;
  g.trans_b = dims.trans_b;
  g.m = dims.m;
  g.n = dims.n;
  g.k = dims.k;
  g.alpha = dims.alpha;
  g.beta = dims.beta;
  g.bias = bias ? bias->data() : nullptr;
  const size_t elem = dtype_size(a.dtype());
  if (dims.k == 0) {  // empty contraction: beta * y (+ bias); cuBLASLt takes no k of 0
    if (dims.beta == 0.0f) cuda::memset_zero(y.data(), y.nbytes(), stream);
    else if (dims.beta != 1.0f) OT_THROW(kNotImplemented, node.context(), "an empty CUDA product with beta ", dims.beta);
    if (bias) cuda::binary(cuda::Binary::kAdd, y.dtype(), y.data(), Shape{y.numel() / dims.n, dims.n}, bias->data(),
                           Shape{dims.n}, y.data(), Shape{y.numel() / dims.n, dims.n}, stream);
    return;
  }
  const Shape out_batch = dims.out_batch();
  const int64_t batch = dims.batch_count();
  const bool a_shared = numel(dims.a_batch) == 1, b_shared = numel(dims.b_batch) == 1;
  if (b_shared && !dims.trans_a) {  // A's batch is rows of one product: [batch * m, k] x [k, n]
    g.m = dims.m * batch;
    cuda::gemm(g, a.data(), b.data(), y.data(), stream);
    return;
  }
  if (a_shared || b_shared || dims.a_batch == dims.b_batch) {
    g.batch = batch;
    g.stride_a = a_shared ? 0 : dims.m * dims.k;
    g.stride_b = b_shared ? 0 : dims.k * dims.n;
    g.stride_c = dims.m * dims.n;
    cuda::gemm(g, a.data(), b.data(), y.data(), stream);
    return;
  }
  // Broadcast batch dims on both sides: one product per output batch index.
  const size_t rank = out_batch.size();
  for (int64_t i = 0; i < batch; ++i) {
    int64_t rest = i, ia = 0, ib = 0, sa = 1, sb = 1;
    for (size_t d = rank; d-- > 0;) {
      const int64_t coord = rest % out_batch[d];
      rest /= out_batch[d];
      if (dims.a_batch[d] != 1) ia += coord * sa;
      if (dims.b_batch[d] != 1) ib += coord * sb;
      sa *= dims.a_batch[d];
      sb *= dims.b_batch[d];
    }
    cuda::gemm(g, static_cast<const char*>(a.data()) + size_t(ia * dims.m * dims.k) * elem,
               static_cast<const char*>(b.data()) + size_t(ib * dims.k * dims.n) * elem,
               static_cast<char*>(y.data()) + size_t(i * dims.m * dims.n) * elem, stream);
  }
}
#endif

#if ONNXTRAIN_GRADIENT_RULES
void matmul_gradient(GradientBuilder& g, size_t ia, size_t ib, bool ta, bool tb, float alpha, const std::string& dy) {
  const bool need_a = g.needs(ia), need_b = g.needs(ib);
  if (!need_a && !need_b) return;
  std::string A = g.x(ia), B = g.x(ib), dY = dy.empty() ? g.dy(0) : dy;
  auto sa = g.static_shape(A), sb = g.static_shape(B);
  // Ranks unknown to shape inference are taken as >= 2 (the common case); 1-D operands need them.
  const bool a_vec = sa && sa->size() == 1, b_vec = sb && sb->size() == 1;
  const size_t ra = sa ? sa->size() : 3, rb = sb ? sb->size() : 3;
  if (a_vec) ta = false;
  if (b_vec) tb = false;
  auto unsqueeze = [&](const std::string& v, int64_t axis) { return g.unsqueeze(v, {axis}); };
  auto fmm = [&](const std::string& x, const std::string& y, bool t1, bool t2) {
    GraphBuilder::Attrs at{{"transA", Attribute::of(int64_t(t1))}, {"transB", Attribute::of(int64_t(t2))}};
    if (alpha != 1.0f) at["alpha"] = Attribute::of(alpha);
    return g.emit("FusedMatMul", {x, y}, at, kOnnxTrainDomain);
  };
  // Promote 1-D operands as numpy does: A [K] -> [1, K], B [K] -> [K, 1], and dY to match.
  std::string a2 = a_vec ? unsqueeze(A, 0) : A;
  std::string b2 = b_vec ? unsqueeze(B, 1) : B;
  std::string d2 = dY;
  if (b_vec) d2 = unsqueeze(d2, -1);
  if (a_vec) d2 = unsqueeze(d2, -2);
  // With P = op(A), Q = op(B): dP = alpha dY Q^T, dQ = alpha P^T dY, transposed back where stored
  // transposed. A promoted 1-D A gives [..., 1, K], which sum_to reduces to [K]; a 1-D B is
  // computed as dQ^T ([..., 1, K]) for the same reason.
  if (need_a) {
    std::string da = ta ? fmm(b2, d2, tb, true) : fmm(d2, b2, false, !tb);
    // B without batch dims (rank 2) cannot broadcast A's batch: dA already has A's shape.
    g.set(ia, rb == 2 && !a_vec && ra >= 2 ? da : g.sum_to(da, A));
  }
  if (need_b) {
    std::string db;
    // B a 2-D weight, A batched and not transposed: fold A's batch into rows, one [K, N] GEMM
    // instead of a batch of them summed afterwards.
    bool flatten = rb == 2 && !b_vec && ra > 2 && !ta && sa && sb && sa->back() >= 0 && (*sb)[tb ? 0 : 1] >= 0;
    if (flatten) {
      int64_t k = sa->back(), n = (*sb)[tb ? 0 : 1];
      std::string af = g.reshape(A, g.ints({-1, k})), df = g.reshape(dY, g.ints({-1, n}));
      db = tb ? fmm(df, af, true, false) : fmm(af, df, true, false);
      g.set(ib, db);
    } else {
      db = (tb || b_vec) ? fmm(d2, a2, true, ta) : fmm(a2, d2, !ta, false);
      g.set(ib, g.sum_to(db, B));
    }
  }
}

#endif  // ONNXTRAIN_GRADIENT_RULES

}  // namespace onnxtrain
