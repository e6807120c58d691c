#include "ops/quant_linear/quant_linear_common.h"

#include "ops/linalg/matmul_util.h"

namespace onnxtrain::quant_linear {

QuantParam read_param(const KernelContext& ctx, size_t i, const char* what, int64_t channels, double dflt) {
  QuantParam p;
  if (!ctx.has_input(i)) {
    p.values = {dflt};
    return p;
  }
  const Tensor& t = ctx.input(i);
  OT_CHECK(t.numel() == 1 || (t.numel() == channels && t.rank() <= 1), ctx.node().context(), what,
           " must be a scalar or hold ", channels, " values, got shape ", shape_str(t.shape()));
  p.values.resize(size_t(t.numel()));
  for (int64_t j = 0; j < t.numel(); ++j) p.values[size_t(j)] = t.item_as_double(j);
  return p;
}

void check_quant_input(const KernelContext& ctx, const Tensor& x, const char* what, size_t zp) {
  const Node& node = ctx.node();
  OT_CHECK(x.dtype() == DType::kUint8 || x.dtype() == DType::kInt8, node.context(), what,
           " must be uint8 or int8, got ", dtype_name(x.dtype()));
  if (ctx.has_input(zp))
    OT_CHECK(ctx.input(zp).dtype() == x.dtype(), node.context(), "the zero point of ", what, " must be ",
             dtype_name(x.dtype()), ", got ", dtype_name(ctx.input(zp).dtype()));
}

namespace {

std::vector<int32_t> as_int32(const Tensor& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[size_t(i)] = int32_t(t.item_as_int(i));
  return v;
}

}  // namespace

std::optional<Shape> conv_integer_shape(const Node& node, const std::optional<Shape>& x, const std::optional<Shape>& w) {
  if (!x || x->size() < 3) return std::nullopt;
  std::vector<int64_t> in(x->begin() + 2, x->end()), kernel(in.size(), -1);
  if (w && w->size() == x->size()) kernel.assign(w->begin() + 2, w->end());
  if (!node.has_attr("kernel_shape") && !(w && w->size() == x->size())) return Shape(x->size(), -1);
  WindowGeometry g = window_geometry(node, in, kernel, false);
  Shape out = {(*x)[0], w && !w->empty() ? (*w)[0] : -1};
  out.insert(out.end(), g.out.begin(), g.out.end());
  return out;
}

std::vector<int32_t> conv_integer(const KernelContext& ctx, const Tensor& x, const QuantParam& x_zp, const Tensor& w,
                                  const QuantParam& w_zp, const Tensor* bias, Shape& out_shape) {
  const Node& node = ctx.node();
  OT_CHECK(x.rank() >= 3 && w.rank() == x.rank(), node.context(), "x must be [N, C, spatial...] and w [M, C/group, ",
           "kernel...] of the same rank, got ", shape_str(x.shape()), " and ", shape_str(w.shape()));
  const int64_t group = node.attr_int("group", 1);
  const int64_t N = x.dim(0), C = x.dim(1), M = w.dim(0), Cg = w.dim(1);
  OT_CHECK(group >= 1 && C % group == 0 && M % group == 0 && Cg == C / group, node.context(), "group ", group,
           " does not fit x channels ", C, " and w ", shape_str(w.shape()));
  OT_CHECK(w_zp.values.size() == 1 || int64_t(w_zp.values.size()) == M, node.context(),
           "w_zero_point must be a scalar or hold ", M, " values");
  if (bias)
    OT_CHECK(bias->dtype() == DType::kInt32 && bias->rank() == 1 && bias->dim(0) == M, node.context(),
             "B must be int32 [", M, "], got ", dtype_name(bias->dtype()), " ", shape_str(bias->shape()));
  const size_t nd = size_t(x.rank() - 2);
  std::vector<int64_t> in(x.shape().begin() + 2, x.shape().end()), kernel(w.shape().begin() + 2, w.shape().end());
  WindowGeometry g = window_geometry(node, in, kernel, false);
  out_shape = {N, M};
  out_shape.insert(out_shape.end(), g.out.begin(), g.out.end());
  const int64_t out_sp = numel(g.out), in_sp = numel(in), k_sp = numel(kernel);
  std::vector<int32_t> xv = as_int32(x), wv = as_int32(w);
  const int32_t xz = int32_t(x_zp.at(0));
  for (auto& v : xv) v -= xz;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < Cg * k_sp; ++j) wv[size_t(m * Cg * k_sp + j)] -= int32_t(w_zp.at(m));
  // Per kernel tap and output position: the input offset, or -1 in the padding.
  std::vector<int64_t> tap_off(size_t(k_sp * out_sp));
  {
    std::vector<int64_t> o(nd, 0), k(nd, 0);
    for (int64_t kt = 0; kt < k_sp; ++kt) {
      std::fill(o.begin(), o.end(), 0);
      for (int64_t op = 0; op < out_sp; ++op) {
        int64_t off = 0;
        bool inside = true;
        for (size_t d = 0; d < nd; ++d) {
          int64_t i = o[d] * g.stride[d] - g.pad_l[d] + k[d] * g.dilation[d];
          inside = inside && i >= 0 && i < in[d];
          off = off * in[d] + i;
        }
        tap_off[size_t(kt * out_sp + op)] = inside ? off : -1;
        for (size_t d = nd; d-- > 0;) {
          if (++o[d] < g.out[d]) break;
          o[d] = 0;
        }
      }
      for (size_t d = nd; d-- > 0;) {
        if (++k[d] < kernel[d]) break;
        k[d] = 0;
      }
    }
  }
  std::vector<int32_t> acc(static_cast<size_t>(N * M * out_sp), 0);
  parallel_for(N * M, 1, [&](int64_t b, int64_t e) {
    for (int64_t nm = b; nm < e; ++nm) {
      const int64_t n = nm / M, m = nm % M, grp = m / (M / group);
      int32_t* dst = acc.data() + nm * out_sp;
      if (bias) std::fill(dst, dst + out_sp, bias->data<int32_t>()[m]);
      for (int64_t c = 0; c < Cg; ++c) {
        const int32_t* src = xv.data() + (n * C + grp * Cg + c) * in_sp;
        const int32_t* wk = wv.data() + (m * Cg + c) * k_sp;
        for (int64_t kt = 0; kt < k_sp; ++kt) {
          const int32_t wt = wk[kt];
          if (wt == 0) continue;
          const int64_t* offs = tap_off.data() + kt * out_sp;
          for (int64_t op = 0; op < out_sp; ++op)
            if (offs[op] >= 0) dst[op] += wt * src[offs[op]];
        }
      }
    }
  });
  return acc;
}

void matmul_param_counts(const Shape& a, const Shape& b, int64_t& a_rows, int64_t& a_rows_batched, int64_t& b_cols,
                         int64_t& b_cols_batched) {
  a_rows = a.size() >= 2 ? a[a.size() - 2] : 1;
  a_rows_batched = a.size() >= 2 ? numel(a) / std::max<int64_t>(a.back(), 1) : 1;
  b_cols = b.size() >= 2 ? b.back() : 1;
  b_cols_batched = b.size() >= 2 ? numel(b) / std::max<int64_t>(b[b.size() - 2], 1) : 1;
}

MatmulIntResult matmul_integer(const KernelContext& ctx, const Tensor& a, size_t a_zp_input, const Tensor& b,
                               size_t b_zp_input) {
  const Node& node = ctx.node();
  MatmulPlan plan = plan_matmul(node, a.shape(), b.shape());
  const cpu::MatmulDims& d = plan.dims;
  OT_CHECK(!d.trans_a && !d.trans_b, node.context(), "unexpected transposed matmul plan");
  int64_t a_rows, a_rows_b, b_cols, b_cols_b;
  matmul_param_counts(a.shape(), b.shape(), a_rows, a_rows_b, b_cols, b_cols_b);
  auto zp = [&](size_t i, const char* what, int64_t per, int64_t per_batched) {
    std::vector<int32_t> v{0};
    if (!ctx.has_input(i)) return v;
    const Tensor& t = ctx.input(i);
    OT_CHECK(t.numel() == 1 || t.numel() == per || t.numel() == per_batched, node.context(), what,
             " must be a scalar or hold ", per, " (or ", per_batched, ") values, got shape ", shape_str(t.shape()));
    return as_int32(t);
  };
  std::vector<int32_t> azp = zp(a_zp_input, "a_zero_point", a_rows, a_rows_b);
  std::vector<int32_t> bzp = zp(b_zp_input, "b_zero_point", b_cols, b_cols_b);
  const int64_t M = d.m, N = d.n, K = d.k;
  const size_t rank = d.a_batch.size();
  Shape ob = d.out_batch();
  const int64_t batches = numel(ob);
  // Batch offsets (in matrices) of a and b for each output batch.
  std::vector<int64_t> ab(static_cast<size_t>(batches)), bb(static_cast<size_t>(batches));
  {
    std::vector<int64_t> idx(rank, 0);
    for (int64_t t = 0; t < batches; ++t) {
      int64_t ao = 0, bo = 0;
      for (size_t j = 0; j < rank; ++j) {
        ao = ao * d.a_batch[j] + (d.a_batch[j] == 1 ? 0 : idx[j]);
        bo = bo * d.b_batch[j] + (d.b_batch[j] == 1 ? 0 : idx[j]);
      }
      ab[size_t(t)] = ao;
      bb[size_t(t)] = bo;
      for (size_t j = rank; j-- > 0;) {
        if (++idx[j] < ob[j]) break;
        idx[j] = 0;
      }
    }
  }
  std::vector<int32_t> av = as_int32(a), bv = as_int32(b);
  MatmulIntResult r;
  r.out_shape = plan.out_shape;
  r.acc.assign(size_t(batches * M * N), 0);
  r.a_row.resize(r.acc.size());
  r.b_col.resize(r.acc.size());
  parallel_for(batches * M, 1, [&](int64_t s, int64_t e) {
    for (int64_t bm = s; bm < e; ++bm) {
      const int64_t t = bm / M, i = bm % M;
      const int64_t arow = ab[size_t(t)] * M + i;
      const int32_t za = azp.size() == 1 ? azp[0] : azp[size_t(int64_t(azp.size()) == M ? i : arow)];
      const int32_t* pa = av.data() + arow * K;
      const int32_t* pb = bv.data() + bb[size_t(t)] * K * N;
      for (int64_t j = 0; j < N; ++j) {
        const int64_t bcol = bb[size_t(t)] * N + j;
        const int32_t zb = bzp.size() == 1 ? bzp[0] : bzp[size_t(int64_t(bzp.size()) == N ? j : bcol)];
        int32_t sum = 0;
        for (int64_t k = 0; k < K; ++k) sum += (pa[k] - za) * (pb[k * N + j] - zb);
        const size_t o = size_t(bm * N + j);
        r.acc[o] = sum;
        r.a_row[o] = arow;
        r.b_col[o] = bcol;
      }
    }
  });
  return r;
}

}  // namespace onnxtrain::quant_linear
