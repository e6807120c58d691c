// com.microsoft.MultiHeadAttention and com.microsoft.GroupQueryAttention: fused scaled-dot-product
// attention with an optional past key/value cache (BNSH, [B, kv_heads, past, head_size]).
//   query [B, S, Hq * D], key [B, L, Hkv * D], value [B, L, Hkv * Dv]; K = concat(past_key, key),
//   V likewise, T = past + L keys. Query i sits at absolute position past + i: with causal masking
//   (MHA unidirectional=1, GQA causal=1, the default) it sees keys j <= past + i. GQA also limits
//   batch b to keys j <= seqlens_k[b]; each group of Hq / Hkv query heads shares one kv head.
//   out = softmax(scale Q K^T + attention_bias) V, scale default 1/sqrt(D); present_key/value = K/V.
//   MHA's bias [Hq D + Hkv D + Hkv Dv] is added to query, key and value first.
// Fused: one task per (batch, head) computes its scores, softmax and output in per-task buffers
// (GEMMs through oneDNN); no B x H x S x T tensor is materialised. The backward
// (onnxtrain.AttentionGrad) recomputes the probabilities the same way (no saved S x T state):
//   dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dP P)), dQ = scale dS K, dK = scale dS^T Q,
// summed over the query heads of a kv group; dK and dV split back into past and new parts.
// Not implemented (named errors): packed QKV, BNSH key/value, key_padding_mask, shared past/present
// buffers, GQA do_rotary (use RotaryEmbedding nodes before it), local windows, softcap, qk outputs.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/cpu/gemm.h"
#include "ops/contrib/contrib.h"
#include "ops/gradient_builder.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

struct Attn {
  int64_t B = 0, S = 0, L = 0, P = 0, T = 0, Hq = 0, Hkv = 0, D = 0, Dv = 0;
  double scale = 1;
  bool causal = false;
  const int32_t* seqlens = nullptr;       // GQA: batch b sees keys j <= seqlens[b]
  const Tensor* attn_bias = nullptr;      // [B or 1, Hq or 1, S, T]
  int64_t limit(int64_t b, int64_t i) const {
    int64_t l = causal ? std::min(T, P + i + 1) : T;
    if (seqlens) l = std::min<int64_t>(l, int64_t(seqlens[b]) + 1);
    return std::max<int64_t>(l, 0);
  }
};


// Reads the shared inputs and attributes; `gqa` selects GroupQueryAttention's names and rules.
Attn configure(const Node& node, bool gqa, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* past_k,
               const Tensor* past_v) {
  Attn a;
  OT_CHECK(node.has_attr("num_heads"), node.context(), "expected attribute num_heads");
  a.Hq = node.attr_int("num_heads", 0);
  a.Hkv = gqa ? node.attr_int("kv_num_heads", 0) : a.Hq;
  OT_CHECK(a.Hq > 0 && a.Hkv > 0 && a.Hq % a.Hkv == 0, node.context(), "expected num_heads a multiple of kv_num_heads, got ",
           a.Hq, " and ", a.Hkv);
  OT_CHECK(q.rank() == 3, node.context(), "expected query [B, S, hidden] (packed QKV is not supported), got ",
           shape_str(q.shape()));
  OT_CHECK(k.rank() == 3 && v.rank() == 3, node.context(),
           "expected key and value [B, L, hidden] (BNSH key/value are not supported), got ", shape_str(k.shape()), " and ",
           shape_str(v.shape()));
  a.B = q.dim(0);
  a.S = q.dim(1);
  a.L = k.dim(1);
  OT_CHECK(q.dim(2) % a.Hq == 0, node.context(), "query hidden size ", q.dim(2), " is not a multiple of num_heads ", a.Hq);
  a.D = q.dim(2) / a.Hq;
  OT_CHECK(k.dim(0) == a.B && v.dim(0) == a.B && v.dim(1) == a.L && k.dim(2) == a.Hkv * a.D && v.dim(2) % a.Hkv == 0,
           node.context(), "expected key [", a.B, ", L, ", a.Hkv * a.D, "] and value [", a.B, ", L, ", a.Hkv,
           " x Dv], got ", shape_str(k.shape()), " and ", shape_str(v.shape()));
  a.Dv = v.dim(2) / a.Hkv;
  OT_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), node.context(), "expected query, key, value of one dtype");
  OT_CHECK((past_k == nullptr) == (past_v == nullptr), node.context(), "expected past_key and past_value together");
  if (past_k) {
    OT_CHECK(past_k->rank() == 4 && past_k->dim(0) == a.B && past_k->dim(1) == a.Hkv && past_k->dim(3) == a.D &&
                 past_v->rank() == 4 && past_v->dim(0) == a.B && past_v->dim(1) == a.Hkv &&
                 past_v->dim(2) == past_k->dim(2) && past_v->dim(3) == a.Dv,
             node.context(), "expected past_key [", a.B, ", ", a.Hkv, ", P, ", a.D, "] and past_value [", a.B, ", ", a.Hkv,
             ", P, ", a.Dv, "], got ", shape_str(past_k->shape()), " and ", shape_str(past_v->shape()));
    a.P = past_k->dim(2);
  }
  a.T = a.P + a.L;
  float s = node.attr_float("scale", 0.0f);
  a.scale = s != 0.0f ? double(s) : 1.0 / std::sqrt(double(a.D));
  a.causal = gqa ? node.attr_int("causal", 1) != 0 : node.attr_int("unidirectional", 0) != 0;
  return a;
}

// K or V of all T positions, [B, Hkv, T, d]: the past rows, then the new rows (+ bias) transposed.
template <typename T>
void build_cache(const Attn& a, int64_t d, const T* past, const T* fresh, const T* bias, T* out) {
  parallel_for(a.B * a.Hkv, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      int64_t b = r / a.Hkv, h = r % a.Hkv;
      T* dst = out + r * a.T * d;
      if (a.P) std::memcpy(dst, past + r * a.P * d, size_t(a.P * d) * sizeof(T));
      for (int64_t l = 0; l < a.L; ++l) {
        const T* src = fresh + (b * a.L + l) * a.Hkv * d + h * d;
        T* o = dst + (a.P + l) * d;
        for (int64_t i = 0; i < d; ++i) o[i] = src[i] + (bias ? bias[h * d + i] : T(0));
      }
    }
  });
}

// Query rows of head (b, h), contiguous [S, D] (+ bias).
template <typename T>
void gather_q(const Attn& a, const T* q, const T* bias, int64_t b, int64_t h, T* out) {
  for (int64_t s = 0; s < a.S; ++s) {
    const T* src = q + (b * a.S + s) * a.Hq * a.D + h * a.D;
    for (int64_t i = 0; i < a.D; ++i) out[s * a.D + i] = src[i] + (bias ? bias[h * a.D + i] : T(0));
  }
}

// p [S, T] = softmax(scale q K^T + attention_bias) with the masks; masked entries are 0.
template <typename T>
void probabilities(const Attn& a, int64_t b, int64_t h, const T* qbuf, const T* kbh, T* p) {
  contrib_gemm<T>(a.S, a.T, a.D, false, true, 0.0f, qbuf, kbh, p);
  const T* ab = nullptr;
  if (a.attn_bias) {
    const Tensor& t = *a.attn_bias;
    int64_t bb = t.dim(0) == 1 ? 0 : b, hh = t.dim(1) == 1 ? 0 : h;
    ab = t.data<T>() + (bb * t.dim(1) + hh) * a.S * a.T;
  }
  for (int64_t i = 0; i < a.S; ++i) {
    T* row = p + i * a.T;
    int64_t lim = a.limit(b, i);
    T mx = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < lim; ++j) {
      row[j] = row[j] * T(a.scale) + (ab ? ab[i * a.T + j] : T(0));
      mx = std::max(mx, row[j]);
    }
    T sum = 0;
    for (int64_t j = 0; j < lim; ++j) {
      row[j] = std::exp(row[j] - mx);
      sum += row[j];
    }
    T inv = sum > T(0) ? T(1) / sum : T(0);
    for (int64_t j = 0; j < lim; ++j) row[j] *= inv;
    for (int64_t j = lim; j < a.T; ++j) row[j] = T(0);
  }
}

template <typename T>
void forward(const Attn& a, const T* q, const T* qbias, const T* kall, const T* vall, T* out) {
  parallel_for(a.B * a.Hq, 1, [&](int64_t r0, int64_t r1) {
    std::vector<T> qbuf(size_t(a.S * a.D)), p(size_t(a.S * a.T)), o(size_t(a.S * a.Dv));
    for (int64_t r = r0; r < r1; ++r) {
      int64_t b = r / a.Hq, h = r % a.Hq, kvh = h / (a.Hq / a.Hkv);
      gather_q(a, q, qbias, b, h, qbuf.data());
      probabilities(a, b, h, qbuf.data(), kall + (b * a.Hkv + kvh) * a.T * a.D, p.data());
      contrib_gemm<T>(a.S, a.Dv, a.T, false, false, 0.0f, p.data(), vall + (b * a.Hkv + kvh) * a.T * a.Dv, o.data());
      for (int64_t s = 0; s < a.S; ++s)
        std::memcpy(out + (b * a.S + s) * a.Hq * a.Dv + h * a.Dv, o.data() + s * a.Dv, size_t(a.Dv) * sizeof(T));
    }
  });
}

struct Inputs {  // input slots of one attention op
  size_t q = 0, k = 1, v = 2, bias = 99, past_k, past_v, attn_bias, seqlens = 99;
};
const Inputs kMha{0, 1, 2, 3, 6, 7, 5, 99};
const Inputs kGqa{0, 1, 2, 99, 3, 4, 10, 5};

const Tensor* optional_input(const KernelContext& ctx, size_t i) { return ctx.has_input(i) ? &ctx.input(i) : nullptr; }

void check_attn_bias(const Node& node, const Attn& a, const Tensor* t, DType dt) {
  if (!t) return;
  OT_CHECK(t->dtype() == dt && t->rank() == 4 && (t->dim(0) == 1 || t->dim(0) == a.B) &&
               (t->dim(1) == 1 || t->dim(1) == a.Hq) && t->dim(2) == a.S && t->dim(3) == a.T,
           node.context(), "expected attention_bias [", a.B, " or 1, ", a.Hq, " or 1, ", a.S, ", ", a.T, "], got ",
           shape_str(t->shape()));
}

const int32_t* read_seqlens(const Node& node, const Attn& a, const Tensor* t) {
  if (!t) return nullptr;
  OT_CHECK(t->dtype() == DType::kInt32 && t->numel() == a.B, node.context(), "expected seqlens_k int32 [", a.B, "], got ",
           dtype_name(t->dtype()), " ", shape_str(t->shape()));
  return t->data<int32_t>();
}

const void* qkv_bias(const Node& node, const Attn& a, const Tensor* t, DType dt) {
  if (!t) return nullptr;
  int64_t want = a.Hq * a.D + a.Hkv * a.D + a.Hkv * a.Dv;
  OT_CHECK(t->dtype() == dt && t->numel() == want, node.context(), "expected bias of ", want, " values, got ",
           shape_str(t->shape()));
  return t->data();
}

void unsupported(const KernelContext& ctx, bool gqa) {
  const Node& n = ctx.node();
  if (gqa) {
    OT_CHECK(n.attr_int("do_rotary", 0) == 0, n.context(),
             "do_rotary=1 is not supported: apply com.microsoft.RotaryEmbedding to query and key first");
    OT_CHECK(n.attr_int("local_window_size", -1) == -1, n.context(), "local_window_size is not supported");
    OT_CHECK(n.attr_float("softcap", 0.0f) == 0.0f, n.context(), "softcap is not supported");
    OT_CHECK(n.attr_int("smooth_softmax", 0) == 0 && n.attr_int("qk_output", 0) == 0, n.context(),
             "smooth_softmax and qk_output are not supported");
    for (size_t i = 7; i < n.inputs.size(); ++i)
      OT_CHECK(i == 10 || !n.has_input(i), n.context(), "input ", i, " (rotary caches, position_ids, head_sink, "
               "KV-cache quantization, QK norms) is not supported");
    OT_CHECK(!n.has_output(3), n.context(), "output_qk is not supported");
  } else {
    OT_CHECK(!n.has_input(4), n.context(), "key_padding_mask is not supported (use attention_bias)");
    OT_CHECK(!n.has_input(8) && !n.has_input(9), n.context(),
             "past_sequence_length / cache_indirection (shared KV buffers) are not supported");
    OT_CHECK(!n.has_output(3), n.context(), "the qk output is not supported");
  }
  OT_CHECK(ctx.has_input(1) && ctx.has_input(2), n.context(), "expected key and value inputs (packed QKV is not supported)");
}

template <bool kGqaOp>
void attention_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Inputs& in = kGqaOp ? kGqa : kMha;
  unsupported(ctx, kGqaOp);
  const Tensor &q = ctx.input(in.q), &k = ctx.input(in.k), &v = ctx.input(in.v);
  const Tensor *pk = optional_input(ctx, in.past_k), *pv = optional_input(ctx, in.past_v);
  Attn a = configure(node, kGqaOp, q, k, v, pk, pv);
  a.attn_bias = optional_input(ctx, in.attn_bias);
  check_attn_bias(node, a, a.attn_bias, q.dtype());
  a.seqlens = read_seqlens(node, a, optional_input(ctx, in.seqlens));
  dispatch_f32_f64(node, q.dtype(), [&]<typename T>() {
    const T* bias = static_cast<const T*>(qkv_bias(node, a, optional_input(ctx, in.bias), q.dtype()));
    Tensor& out = ctx.output(0, q.dtype(), {a.B, a.S, a.Hq * a.Dv});
    std::vector<T> kbuf, vbuf;
    T *kall, *vall;
    if (ctx.output_requested(1)) kall = ctx.output(1, q.dtype(), {a.B, a.Hkv, a.T, a.D}).template data<T>();
    else kbuf.resize(size_t(a.B * a.Hkv * a.T * a.D)), kall = kbuf.data();
    if (ctx.output_requested(2)) vall = ctx.output(2, q.dtype(), {a.B, a.Hkv, a.T, a.Dv}).template data<T>();
    else vbuf.resize(size_t(a.B * a.Hkv * a.T * a.Dv)), vall = vbuf.data();
    build_cache<T>(a, a.D, pk ? pk->data<T>() : nullptr, k.data<T>(), bias ? bias + a.Hq * a.D : nullptr, kall);
    build_cache<T>(a, a.Dv, pv ? pv->data<T>() : nullptr, v.data<T>(),
                   bias ? bias + a.Hq * a.D + a.Hkv * a.D : nullptr, vall);
    forward<T>(a, q.data<T>(), bias, kall, vall, out.data<T>());
  });
}

// onnxtrain.AttentionGrad(dO, query, key, value, past_key?, past_value?, attention_bias?, seqlens_k?, bias?)
//   -> dquery, dkey, dvalue, dpast_key, dpast_value, dbias; attributes: num_heads, kv_num_heads, scale,
//   causal (resolved by the rule). Recomputes the probabilities per (batch, head).
void attention_grad_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor &dout = ctx.input(0), &q = ctx.input(1), &k = ctx.input(2), &v = ctx.input(3);
  const Tensor *pk = optional_input(ctx, 4), *pv = optional_input(ctx, 5);
  Attn a = configure(node, true, q, k, v, pk, pv);
  a.causal = node.attr_int("causal", 0) != 0;
  a.attn_bias = optional_input(ctx, 6);
  check_attn_bias(node, a, a.attn_bias, q.dtype());
  a.seqlens = read_seqlens(node, a, optional_input(ctx, 7));
  OT_CHECK(dout.dtype() == q.dtype() && dout.rank() == 3 && dout.dim(0) == a.B && dout.dim(1) == a.S &&
               dout.dim(2) == a.Hq * a.Dv,
           node.context(), "expected dO [", a.B, ", ", a.S, ", ", a.Hq * a.Dv, "], got ", shape_str(dout.shape()));
  dispatch_f32_f64(node, q.dtype(), [&]<typename T>() {
    const T* bias = static_cast<const T*>(qkv_bias(node, a, optional_input(ctx, 8), q.dtype()));
    const int64_t kd = a.Hkv * a.T * a.D, vd = a.Hkv * a.T * a.Dv;
    std::vector<T> kall(size_t(a.B * kd)), vall(size_t(a.B * vd)), dk(size_t(a.B * kd)), dv(size_t(a.B * vd));
    build_cache<T>(a, a.D, pk ? pk->data<T>() : nullptr, k.data<T>(), bias ? bias + a.Hq * a.D : nullptr, kall.data());
    build_cache<T>(a, a.Dv, pv ? pv->data<T>() : nullptr, v.data<T>(),
                   bias ? bias + a.Hq * a.D + a.Hkv * a.D : nullptr, vall.data());
    Tensor& dq = ctx.output(0, q.dtype(), q.shape());
    T* pdq = dq.data<T>();
    const T* po = dout.data<T>();
    const int64_t group = a.Hq / a.Hkv;
    parallel_for(a.B * a.Hkv, 1, [&](int64_t r0, int64_t r1) {
      std::vector<T> qbuf(size_t(a.S * a.D)), p(size_t(a.S * a.T)), dp(size_t(a.S * a.T)), go(size_t(a.S * a.Dv)),
          gq(size_t(a.S * a.D));
      for (int64_t r = r0; r < r1; ++r) {
        int64_t b = r / a.Hkv, kvh = r % a.Hkv;
        const T* kbh = kall.data() + r * a.T * a.D;
        const T* vbh = vall.data() + r * a.T * a.Dv;
        T* dkbh = dk.data() + r * a.T * a.D;
        T* dvbh = dv.data() + r * a.T * a.Dv;
        for (int64_t gi = 0; gi < group; ++gi) {
          int64_t h = kvh * group + gi;
          float beta = gi == 0 ? 0.0f : 1.0f;
          gather_q(a, q.data<T>(), bias, b, h, qbuf.data());
          probabilities(a, b, h, qbuf.data(), kbh, p.data());
          for (int64_t s = 0; s < a.S; ++s)
            std::memcpy(go.data() + s * a.Dv, po + (b * a.S + s) * a.Hq * a.Dv + h * a.Dv, size_t(a.Dv) * sizeof(T));
          contrib_gemm<T>(a.T, a.Dv, a.S, true, false, beta, p.data(), go.data(), dvbh);       // dV += P^T dO
          contrib_gemm<T>(a.S, a.T, a.Dv, false, true, 0.0f, go.data(), vbh, dp.data());      // dP = dO V^T
          for (int64_t i = 0; i < a.S; ++i) {                                           // dS = P (dP - <dP, P>) scale
            T* pr = p.data() + i * a.T;
            T* dr = dp.data() + i * a.T;
            T dot = 0;
            for (int64_t j = 0; j < a.T; ++j) dot += pr[j] * dr[j];
            for (int64_t j = 0; j < a.T; ++j) dr[j] = pr[j] * (dr[j] - dot) * T(a.scale);
          }
          contrib_gemm<T>(a.S, a.D, a.T, false, false, 0.0f, dp.data(), kbh, gq.data());       // dQ = dS K
          contrib_gemm<T>(a.T, a.D, a.S, true, false, beta, dp.data(), qbuf.data(), dkbh);     // dK += dS^T Q
          for (int64_t s = 0; s < a.S; ++s)
            std::memcpy(pdq + (b * a.S + s) * a.Hq * a.D + h * a.D, gq.data() + s * a.D, size_t(a.D) * sizeof(T));
        }
      }
    });
    // Split [B, Hkv, T, d] into the past part (BNSH) and the new part ([B, L, Hkv * d]).
    auto split = [&](const std::vector<T>& all, int64_t d, size_t out_new, size_t out_past, const Tensor& like) {
      if (ctx.output_requested(out_new)) {
        T* dst = ctx.output(out_new, q.dtype(), like.shape()).template data<T>();
        for (int64_t b = 0; b < a.B; ++b)
          for (int64_t h = 0; h < a.Hkv; ++h)
            for (int64_t l = 0; l < a.L; ++l)
              std::memcpy(dst + (b * a.L + l) * a.Hkv * d + h * d, all.data() + ((b * a.Hkv + h) * a.T + a.P + l) * d,
                          size_t(d) * sizeof(T));
      }
      if (ctx.output_requested(out_past)) {
        T* dst = ctx.output(out_past, q.dtype(), {a.B, a.Hkv, a.P, d}).template data<T>();
        for (int64_t r = 0; r < a.B * a.Hkv; ++r)
          std::memcpy(dst + r * a.P * d, all.data() + r * a.T * d, size_t(a.P * d) * sizeof(T));
      }
    };
    split(dk, a.D, 1, 3, k);
    split(dv, a.Dv, 2, 4, v);
    if (ctx.output_requested(5)) {  // dbias = [sum dQ, sum dK, sum dV] over batch and positions
      const int64_t nq = a.Hq * a.D, nk = a.Hkv * a.D, nv = a.Hkv * a.Dv;
      T* db = ctx.output(5, q.dtype(), {nq + nk + nv}).template data<T>();
      std::fill(db, db + nq + nk + nv, T(0));
      for (int64_t r = 0; r < a.B * a.S; ++r)
        for (int64_t i = 0; i < nq; ++i) db[i] += pdq[r * nq + i];
      for (int64_t b = 0; b < a.B; ++b)
        for (int64_t h = 0; h < a.Hkv; ++h)
          for (int64_t l = 0; l < a.L; ++l) {
            const T* kr = dk.data() + ((b * a.Hkv + h) * a.T + a.P + l) * a.D;
            const T* vr = dv.data() + ((b * a.Hkv + h) * a.T + a.P + l) * a.Dv;
            for (int64_t i = 0; i < a.D; ++i) db[nq + h * a.D + i] += kr[i];
            for (int64_t i = 0; i < a.Dv; ++i) db[nq + nk + h * a.Dv + i] += vr[i];
          }
    }
  });
}

template <bool kGqaOp>
void attention_shape(ShapeContext& ctx) {
  const Node& node = ctx.node();
  const Inputs& in = kGqaOp ? kGqa : kMha;
  DType dt = ctx.input_dtype(0);
  const auto &q = ctx.input_shape(in.q), &v = ctx.input_shape(in.v), &k = ctx.input_shape(in.k);
  const auto& pk = ctx.input_shape(in.past_k);
  int64_t hq = node.attr_int("num_heads", 0), hkv = kGqaOp ? node.attr_int("kv_num_heads", 0) : hq;
  std::optional<Shape> out, pres_k, pres_v;
  if (q && q->size() == 3 && v && v->size() == 3 && hq > 0 && hkv > 0 && (*v)[2] >= 0) {
    int64_t dv = (*v)[2] / hkv;
    out = Shape{(*q)[0], (*q)[1], hq * dv};
    if (k && k->size() == 3 && (*q)[2] >= 0) {
      int64_t past = ctx.has_input(in.past_k) ? (pk && pk->size() == 4 ? (*pk)[2] : -1) : 0;
      int64_t t = past >= 0 && (*k)[1] >= 0 ? past + (*k)[1] : -1;
      pres_k = Shape{(*q)[0], hkv, t, (*q)[2] / hq};
      pres_v = Shape{(*q)[0], hkv, t, dv};
    }
  }
  ctx.set_output(0, dt, out);
  if (ctx.num_outputs() > 1) ctx.set_output(1, dt, pres_k);
  if (ctx.num_outputs() > 2) ctx.set_output(2, dt, pres_v);
  if (ctx.num_outputs() > 3) ctx.set_output(3, dt);
}

void attention_grad_shape(ShapeContext& ctx) {
  DType dt = ctx.input_dtype(1);
  ctx.set_output(0, dt, ctx.input_shape(1));
  if (ctx.num_outputs() > 1) ctx.set_output(1, dt, ctx.input_shape(2));
  if (ctx.num_outputs() > 2) ctx.set_output(2, dt, ctx.input_shape(3));
  if (ctx.num_outputs() > 3) ctx.set_output(3, dt, ctx.input_shape(4));
  if (ctx.num_outputs() > 4) ctx.set_output(4, dt, ctx.input_shape(5));
  for (size_t i = 5; i < ctx.num_outputs(); ++i) ctx.set_output(i, dt);
}

// out = softmax(scale (Q + bq)(K + bk)^T + attention_bias) (V + bv).
// dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dP P)), dQ = scale dS K, dK = scale dS^T Q; dbias = sums
template <bool kGqaOp>
void attention_gradient(GradientBuilder& g) {
  const Node& n = g.node();
  const Inputs& in = kGqaOp ? kGqa : kMha;
  if (g.has_input(in.attn_bias) && g.needs(in.attn_bias))
    OT_THROW(kNotImplemented, g.context(), "no gradient for attention_bias (a mask): freeze it");
  if (g.has_dy(1) || g.has_dy(2) || g.has_dy(3))
    OT_THROW(kNotImplemented, g.context(), "no gradient flows back through present_key/present_value");
  if (!g.has_dy(0)) return;
  auto opt = [&](size_t i) { return g.has_input(i) ? g.x(i) : std::string(); };
  std::vector<std::string> ins{g.dy(0), g.x(in.q), g.x(in.k), g.x(in.v), opt(in.past_k), opt(in.past_v),
                               opt(in.attn_bias), opt(in.seqlens), opt(in.bias)};
  while (ins.back().empty()) ins.pop_back();
  GraphBuilder::Attrs attrs{{"num_heads", Attribute::of(n.attr_int("num_heads", 0))},
                            {"kv_num_heads", Attribute::of(kGqaOp ? n.attr_int("kv_num_heads", 0) : n.attr_int("num_heads", 0))},
                            {"scale", Attribute::of(n.attr_float("scale", 0.0f))},
                            {"causal", Attribute::of(int64_t(kGqaOp ? n.attr_int("causal", 1) : n.attr_int("unidirectional", 0)))}};
  auto outs = g.emit_n("AttentionGrad", ins, 6, attrs, kOnnxTrainDomain);
  const size_t slots[] = {in.q, in.k, in.v, in.past_k, in.past_v, in.bias};
  for (size_t o = 0; o < 6; ++o)
    if (g.has_input(slots[o]) && g.needs(slots[o])) g.set(slots[o], outs[o]);
}

}  // namespace

ONNXTRAIN_OP(MultiHeadAttention, kMsDomain, 1).inputs(1, 10).outputs(1, 4).shape(attention_shape<false>)
    .cpu(attention_kernel<false>).gradient(attention_gradient<false>);
ONNXTRAIN_OP(GroupQueryAttention, kMsDomain, 1).inputs(7, 16).outputs(1, 4).shape(attention_shape<true>)
    .cpu(attention_kernel<true>).gradient(attention_gradient<true>);
// Linear in dO given the forward inputs; second derivatives are not needed.
ONNXTRAIN_OP(AttentionGrad, kOnnxTrainDomain, 1).inputs(4, 9).outputs(1, 6).shape(attention_grad_shape)
    .cpu(attention_grad_kernel).gradient_not_implemented("second derivatives are not needed for training");

}  // namespace onnxtrain
