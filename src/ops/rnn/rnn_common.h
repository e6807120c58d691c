// Shared pieces of the recurrent ops (RNN, GRU, LSTM): attribute parsing (direction, layout,
// activations with their alpha/beta, clip), input validation, the blocked
// GEMM the gate projections use, and the helpers that read and write the layout-dependent tensors.
//
// Every kernel works the same way, per direction d:
//   1. XW = X · W[d]^T (+ biases) for all time steps at once: one [seq*batch, input] x
//      [input, G*hidden] GEMM, so the recurrence only multiplies the small hidden state.
//   2. The recurrence: for each step, HR = H_{t-1} · R[d]^T ([batch, hidden] x [hidden, G*hidden]),
//      then the cell's elementwise gate math per batch row.
// sequence_lens: batch row b runs steps 0 .. len[b]-1 (a reverse pass starts at len[b]-1); Y is
// zero at the padded steps and Y_h / Y_c hold the state after the row's last valid step (the
// initial state when len[b] is 0).
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/cpu/sgemm_blocked.h"
#include "ops/gradient_builder.h"
#include "ops/common.h"
#include "ops/registry.h"

namespace onnxtrain::rnn {

// ---- activations -------------------------------------------------------------------------------

enum class ActKind {
  kRelu, kTanh, kSigmoid, kAffine, kLeakyRelu, kThresholdedRelu, kScaledTanh, kHardSigmoid, kElu,
  kSoftsign, kSoftplus
};

struct Activation {
  ActKind kind = ActKind::kTanh;
  float alpha = 0, beta = 0;

  template <typename C>
  C operator()(C x) const {
    switch (kind) {
      case ActKind::kRelu: return x > C(0) ? x : C(0);
      case ActKind::kTanh: return std::tanh(x);
      case ActKind::kSigmoid:
        return x >= C(0) ? C(1) / (C(1) + std::exp(-x)) : std::exp(x) / (C(1) + std::exp(x));
      case ActKind::kAffine: return C(alpha) * x + C(beta);
      case ActKind::kLeakyRelu: return x >= C(0) ? x : C(alpha) * x;
      case ActKind::kThresholdedRelu: return x > C(alpha) ? x : C(0);
      case ActKind::kScaledTanh: return C(alpha) * std::tanh(C(beta) * x);
      case ActKind::kHardSigmoid: return std::min(C(1), std::max(C(0), C(alpha) * x + C(beta)));
      case ActKind::kElu: return x >= C(0) ? x : C(alpha) * (std::exp(x) - C(1));
      case ActKind::kSoftsign: return x / (C(1) + std::abs(x));
      case ActKind::kSoftplus:  // log(1 + e^x), without overflow for large x
        return x > C(0) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
    }
    return x;
  }
  // clip-then-activate of one pre-activation (clip <= 0: no clipping), as apply() does.
  template <typename C>
  C eval(C x, float clip) const {
    if (clip > 0) x = std::min(C(clip), std::max(-C(clip), x));
    return (*this)(x);
  }
  // d eval(x) / dx at the pre-activation x: act'(clip(x)), and 0 where the clip bounds x (the
  // clamped value does not move). At kinks (Relu at 0, ...) the right-hand/else branch is taken.
  template <typename C>
  C derivative(C x, float clip) const {
    if (clip > 0 && (x > C(clip) || x < -C(clip))) return C(0);
    switch (kind) {
      case ActKind::kRelu: return x > C(0) ? C(1) : C(0);
      case ActKind::kTanh: { C t = std::tanh(x); return C(1) - t * t; }
      case ActKind::kSigmoid: { C y = (*this)(x); return y * (C(1) - y); }
      case ActKind::kAffine: return C(alpha);
      case ActKind::kLeakyRelu: return x >= C(0) ? C(1) : C(alpha);
      case ActKind::kThresholdedRelu: return x > C(alpha) ? C(1) : C(0);
      case ActKind::kScaledTanh: { C t = std::tanh(C(beta) * x); return C(alpha) * C(beta) * (C(1) - t * t); }
      case ActKind::kHardSigmoid: { C v = C(alpha) * x + C(beta); return v > C(0) && v < C(1) ? C(alpha) : C(0); }
      case ActKind::kElu: return x >= C(0) ? C(1) : C(alpha) * std::exp(x);
      case ActKind::kSoftsign: { C q = C(1) + std::abs(x); return C(1) / (q * q); }
      case ActKind::kSoftplus:  // sigmoid(x)
        return x >= C(0) ? C(1) / (C(1) + std::exp(-x)) : std::exp(x) / (C(1) + std::exp(x));
    }
    return C(1);
  }
  // Applies in place over a contiguous run, clipping the input first when clip > 0.
  template <typename C>
  void apply(C* v, int64_t n, float clip) const {
    if (clip > 0) {
      C c = C(clip);
      for (int64_t i = 0; i < n; ++i) v[i] = std::min(c, std::max(-c, v[i]));
    }
    for (int64_t i = 0; i < n; ++i) v[i] = (*this)(v[i]);
  }
};

// Parses `activations` / `activation_alpha` / `activation_beta`. `defaults` is one direction's
// list (e.g. {Sigmoid, Tanh, Tanh} for LSTM). Returns num_directions * defaults.size() entries,
// direction-major. A list of one direction's length for a bidirectional node is used for both.
// Alphas and betas are consumed in order, only by the functions that take them; the rest get the
// defaults of the corresponding ONNX operators.
inline std::vector<Activation> parse_activations(const Node& node, const std::vector<std::string>& defaults,
                                                 int64_t num_directions) {
  std::vector<std::string> names;
  if (const Attribute* a = node.attr("activations")) {
    OT_CHECK(a->kind == Attribute::Kind::kStrings, node.context(), "attribute 'activations' must be a list of strings");
    names = a->strings;
  }
  size_t per_dir = defaults.size();
  if (names.empty()) {
    for (int64_t d = 0; d < num_directions; ++d) names.insert(names.end(), defaults.begin(), defaults.end());
  } else if (names.size() == per_dir && num_directions == 2) {
    std::vector<std::string> twice = names;
    twice.insert(twice.end(), names.begin(), names.end());
    names = std::move(twice);
  }
  OT_CHECK(names.size() == per_dir * size_t(num_directions), node.context(), "expected ",
           per_dir * size_t(num_directions), " activations (", per_dir, " per direction), got ", names.size());
  std::vector<float> alphas = node.attr_floats("activation_alpha");
  std::vector<float> betas = node.attr_floats("activation_beta");
  size_t ai = 0, bi = 0;
  auto take = [](const std::vector<float>& list, size_t& i, float dflt) { return i < list.size() ? list[i++] : dflt; };
  std::vector<Activation> out;
  for (const auto& raw : names) {
    std::string n = raw;
    std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    Activation act;
    if (n == "relu") act.kind = ActKind::kRelu;
    else if (n == "tanh") act.kind = ActKind::kTanh;
    else if (n == "sigmoid") act.kind = ActKind::kSigmoid;
    else if (n == "affine") { act.kind = ActKind::kAffine; act.alpha = take(alphas, ai, 1.0f); act.beta = take(betas, bi, 0.0f); }
    else if (n == "leakyrelu") { act.kind = ActKind::kLeakyRelu; act.alpha = take(alphas, ai, 0.01f); }
    else if (n == "thresholdedrelu") { act.kind = ActKind::kThresholdedRelu; act.alpha = take(alphas, ai, 1.0f); }
    else if (n == "scaledtanh") { act.kind = ActKind::kScaledTanh; act.alpha = take(alphas, ai, 1.0f); act.beta = take(betas, bi, 1.0f); }
    else if (n == "hardsigmoid") { act.kind = ActKind::kHardSigmoid; act.alpha = take(alphas, ai, 0.2f); act.beta = take(betas, bi, 0.5f); }
    else if (n == "elu") { act.kind = ActKind::kElu; act.alpha = take(alphas, ai, 1.0f); }
    else if (n == "softsign") act.kind = ActKind::kSoftsign;
    else if (n == "softplus") act.kind = ActKind::kSoftplus;
    else OT_THROW(kNotImplemented, node.context(), "unsupported activation '", raw, "'");
    out.push_back(act);
  }
  return out;
}

// ---- attributes and shapes ---------------------------------------------------------------------

enum class Direction { kForward, kReverse, kBidirectional };

inline Direction parse_direction(const Node& node) {
  std::string d = node.attr_string("direction", "forward");
  if (d == "forward") return Direction::kForward;
  if (d == "reverse") return Direction::kReverse;
  if (d == "bidirectional") return Direction::kBidirectional;
  OT_THROW(kInvalidArgument, node.context(), "direction must be forward, reverse or bidirectional, got '", d, "'");
}

inline int64_t num_directions_of(const Node& node) {
  return parse_direction(node) == Direction::kBidirectional ? 2 : 1;
}

inline int64_t parse_layout(const Node& node) {
  int64_t layout = node.attr_int("layout", 0);
  OT_CHECK(layout == 0 || layout == 1, node.context(), "layout must be 0 or 1, got ", layout);
  return layout;
}

// Static output shapes: Y, Y_h (and Y_c for LSTM, same as Y_h). gates = 1 (RNN), 3 (GRU), 4 (LSTM).
inline void rnn_shape_rule(ShapeContext& ctx, int64_t gates, size_t state_outputs) {
  const Node& node = ctx.node();
  DType dt = ctx.input_dtype(0);
  int64_t dirs = num_directions_of(node);
  int64_t layout = parse_layout(node);
  int64_t hidden = node.attr_int("hidden_size", -1);
  if (hidden < 0) {
    const auto& r = ctx.input_shape(2);
    if (r && r->size() == 3) hidden = (*r)[2];
    if (hidden < 0 && ctx.input_shape(1) && ctx.input_shape(1)->size() == 3 && (*ctx.input_shape(1))[1] >= 0)
      hidden = (*ctx.input_shape(1))[1] / gates;
  }
  const auto& x = ctx.input_shape(0);
  std::optional<Shape> y, yh;
  if (x && x->size() == 3) {
    int64_t seq = layout == 0 ? (*x)[0] : (*x)[1];
    int64_t batch = layout == 0 ? (*x)[1] : (*x)[0];
    y = layout == 0 ? Shape{seq, dirs, batch, hidden} : Shape{batch, seq, dirs, hidden};
    yh = layout == 0 ? Shape{dirs, batch, hidden} : Shape{batch, dirs, hidden};
  }
  ctx.set_output(0, dt, y);
  for (size_t i = 1; i <= state_outputs; ++i) ctx.set_output(i, dt, yh);
}

// Everything about one node's run that does not depend on the cell type.
struct RnnSetup {
  int64_t seq = 0, batch = 0, input = 0, hidden = 0, dirs = 1, layout = 0;
  Direction direction = Direction::kForward;
  float clip = 0;                      // 0: no clipping
  std::vector<int64_t> lens;           // per batch row, in [0, seq]
};

inline RnnSetup parse_setup(KernelContext& ctx, int64_t gates) {
  const Node& node = ctx.node();
  RnnSetup s;
  s.direction = parse_direction(node);
  s.dirs = s.direction == Direction::kBidirectional ? 2 : 1;
  s.layout = parse_layout(node);
  const Tensor& x = ctx.input(0);
  const Tensor& w = ctx.input(1);
  const Tensor& r = ctx.input(2);
  OT_CHECK(is_floating(x.dtype()), node.context(), "expected a floating-point X, got ", dtype_name(x.dtype()));
  OT_CHECK(w.dtype() == x.dtype() && r.dtype() == x.dtype(), node.context(), "expected W and R of X's dtype ",
           dtype_name(x.dtype()), ", got ", dtype_name(w.dtype()), " and ", dtype_name(r.dtype()));
  OT_CHECK(x.rank() == 3, node.context(), "expected a rank-3 X, got shape ", shape_str(x.shape()));
  s.seq = s.layout == 0 ? x.dim(0) : x.dim(1);
  s.batch = s.layout == 0 ? x.dim(1) : x.dim(0);
  s.input = x.dim(2);
  OT_CHECK(r.rank() == 3, node.context(), "expected a rank-3 R, got shape ", shape_str(r.shape()));
  s.hidden = node.attr_int("hidden_size", r.dim(2));
  int64_t gh = gates * s.hidden;
  OT_CHECK(w.shape() == (Shape{s.dirs, gh, s.input}), node.context(), "expected W of shape ",
           shape_str({s.dirs, gh, s.input}), ", got ", shape_str(w.shape()));
  OT_CHECK(r.shape() == (Shape{s.dirs, gh, s.hidden}), node.context(), "expected R of shape ",
           shape_str({s.dirs, gh, s.hidden}), ", got ", shape_str(r.shape()));
  if (ctx.has_input(3)) {
    const Tensor& b = ctx.input(3);
    OT_CHECK(b.dtype() == x.dtype() && b.shape() == (Shape{s.dirs, 2 * gh}), node.context(), "expected B of shape ",
             shape_str({s.dirs, 2 * gh}), " and dtype ", dtype_name(x.dtype()), ", got ", shape_str(b.shape()), " ",
             dtype_name(b.dtype()));
  }
  s.lens.assign(size_t(s.batch), s.seq);
  if (ctx.has_input(4)) {
    const Tensor& sl = ctx.input(4);
    OT_CHECK((sl.dtype() == DType::kInt32 || sl.dtype() == DType::kInt64) && sl.shape() == (Shape{s.batch}),
             node.context(), "expected sequence_lens of int32 shape ", shape_str({s.batch}), ", got ",
             dtype_name(sl.dtype()), " ", shape_str(sl.shape()));
    for (int64_t b = 0; b < s.batch; ++b) {
      int64_t len = sl.item_as_int(b);
      OT_CHECK(len >= 0 && len <= s.seq, node.context(), "sequence_lens[", b, "] = ", len,
               " is outside [0, seq_length = ", s.seq, "]");
      s.lens[size_t(b)] = len;
    }
  }
  if (node.has_attr("clip")) {
    s.clip = node.attr_float("clip", 0);
    OT_CHECK(s.clip > 0, node.context(), "clip must be positive, got ", s.clip);
  }
  return s;
}

// The expected shape of initial_h / initial_c (and Y_h / Y_c).
inline Shape state_shape(const RnnSetup& s) {
  return s.layout == 0 ? Shape{s.dirs, s.batch, s.hidden} : Shape{s.batch, s.dirs, s.hidden};
}
inline Shape y_shape(const RnnSetup& s) {
  return s.layout == 0 ? Shape{s.seq, s.dirs, s.batch, s.hidden} : Shape{s.batch, s.seq, s.dirs, s.hidden};
}
// Offsets (in elements) of row (d, b) of a state tensor and of Y at step t.
inline int64_t state_offset(const RnnSetup& s, int64_t d, int64_t b) {
  return (s.layout == 0 ? d * s.batch + b : b * s.dirs + d) * s.hidden;
}
inline int64_t y_offset(const RnnSetup& s, int64_t t, int64_t d, int64_t b) {
  return (s.layout == 0 ? (t * s.dirs + d) * s.batch + b : (b * s.seq + t) * s.dirs + d) * s.hidden;
}

// Copies an input tensor of dtype T into a compute-type buffer.
template <typename T, typename C = compute_t<T>>
std::vector<C> to_compute(const Tensor& t) {
  std::vector<C> v(size_t(t.numel()));
  const T* p = t.data<T>();
  for (size_t i = 0; i < v.size(); ++i) v[i] = C(p[i]);
  return v;
}

// X in time-major [seq, batch, input] order, in the compute type.
template <typename T, typename C = compute_t<T>>
std::vector<C> time_major_input(const Tensor& x, const RnnSetup& s) {
  if (s.layout == 0) return to_compute<T>(x);
  std::vector<C> v(size_t(x.numel()));
  const T* p = x.data<T>();
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t t = 0; t < s.seq; ++t)
      for (int64_t i = 0; i < s.input; ++i)
        v[size_t((t * s.batch + b) * s.input + i)] = C(p[(b * s.seq + t) * s.input + i]);
  return v;
}

// Initial state rows for direction d as a [batch, hidden] buffer (zeros when absent).
template <typename T, typename C = compute_t<T>>
std::vector<C> initial_state(KernelContext& ctx, size_t input, const RnnSetup& s, int64_t d, const char* what) {
  std::vector<C> h(size_t(s.batch * s.hidden), C(0));
  if (!ctx.has_input(input)) return h;
  const Tensor& t = ctx.input(input);
  OT_CHECK(t.dtype() == ctx.input(0).dtype() && t.shape() == state_shape(s), ctx.node().context(), "expected ", what,
           " of shape ", shape_str(state_shape(s)), " and dtype ", dtype_name(ctx.input(0).dtype()), ", got ",
           shape_str(t.shape()), " ", dtype_name(t.dtype()));
  const T* p = t.data<T>();
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t j = 0; j < s.hidden; ++j) h[size_t(b * s.hidden + j)] = C(p[state_offset(s, d, b) + j]);
  return h;
}

// The operands every kernel and grad kernel reads, in the compute type: the setup, the activations
// (num_directions * one direction's count, direction-major), X time-major, W, R and B (empty when
// absent), and the number of steps the recurrence runs (the longest sequence).
// A read-only operand in the compute type: the tensor's own memory when its dtype is the compute
// type (float, double: W and R are read where they lie, a streaming step copies nothing), a
// converted copy otherwise (half types).
template <typename C>
class ComputeView {
 public:
  ComputeView() = default;
  template <typename T>
  static ComputeView of(const Tensor& t) {
    ComputeView v;
    v.size_ = size_t(t.numel());
    if constexpr (std::is_same_v<T, C>) {
      v.ptr_ = t.data<T>();
    } else {
      const T* p = t.data<T>();
      v.owned_.resize(v.size_);
      for (size_t i = 0; i < v.size_; ++i) v.owned_[i] = C(p[i]);
      v.ptr_ = v.owned_.data();
    }
    return v;
  }
  const C* data() const { return ptr_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  std::vector<C> owned_;
  const C* ptr_ = nullptr;
  size_t size_ = 0;
};

template <typename T, typename C = compute_t<T>>
struct Operands {
  RnnSetup s;
  std::vector<Activation> acts;
  std::vector<C> x;
  ComputeView<C> w, r, b;
  int64_t max_len = 0;
};

template <typename T, typename C = compute_t<T>>
Operands<T, C> load_operands(KernelContext& ctx, int64_t gates, const std::vector<std::string>& default_activations) {
  Operands<T, C> op;
  op.s = parse_setup(ctx, gates);
  op.acts = parse_activations(ctx.node(), default_activations, op.s.dirs);
  op.x = time_major_input<T>(ctx.input(0), op.s);
  op.w = ComputeView<C>::template of<T>(ctx.input(1));
  op.r = ComputeView<C>::template of<T>(ctx.input(2));
  if (ctx.has_input(3)) op.b = ComputeView<C>::template of<T>(ctx.input(3));
  op.max_len = op.s.batch ? *std::max_element(op.s.lens.begin(), op.s.lens.end()) : 0;
  return op;
}

// ---- GEMM --------------------------------------------------------------------------------------

// out[m, n] = sum_k a[m, k] * b[k, n] for m < M, n < N; rows of a, b and out are lda, ldb and ldo
// apart. Blocked over 4 rows of out and 128 columns so the accumulators stay in registers/L1 and
// the inner loop runs along contiguous n, which the compiler vectorises (a dot-product form would
// need reassociation). Parallel over (row block, column block).
template <typename C>
void gemm_nn(const C* a, int64_t M, int64_t K, int64_t lda, const C* b, int64_t N, int64_t ldb, C* out, int64_t ldo) {
  if (M <= 0 || N <= 0) return;
  constexpr int64_t kMB = 4, kNB = 128;
  int64_t mblocks = (M + kMB - 1) / kMB, nblocks = (N + kNB - 1) / kNB;
  int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, K * kMB * kNB / 8));
  parallel_for(mblocks * nblocks, grain, [&](int64_t begin, int64_t end) {
    C acc[kMB][kNB];
    for (int64_t task = begin; task < end; ++task) {
      int64_t m0 = (task / nblocks) * kMB, n0 = (task % nblocks) * kNB;
      int64_t mr = std::min(kMB, M - m0), nc = std::min(kNB, N - n0);
      for (int64_t r = 0; r < kMB; ++r)
        for (int64_t j = 0; j < kNB; ++j) acc[r][j] = C(0);
      if (mr == kMB) {
        for (int64_t k = 0; k < K; ++k) {
          const C* br = b + k * ldb + n0;
          C a0 = a[m0 * lda + k], a1 = a[(m0 + 1) * lda + k], a2 = a[(m0 + 2) * lda + k], a3 = a[(m0 + 3) * lda + k];
          for (int64_t j = 0; j < nc; ++j) {
            C bv = br[j];
            acc[0][j] += a0 * bv;
            acc[1][j] += a1 * bv;
            acc[2][j] += a2 * bv;
            acc[3][j] += a3 * bv;
          }
        }
      } else {
        for (int64_t k = 0; k < K; ++k) {
          const C* br = b + k * ldb + n0;
          for (int64_t r = 0; r < mr; ++r) {
            C av = a[(m0 + r) * lda + k];
            for (int64_t j = 0; j < nc; ++j) acc[r][j] += av * br[j];
          }
        }
      }
      for (int64_t r = 0; r < mr; ++r) std::copy(acc[r], acc[r] + nc, out + (m0 + r) * ldo + n0);
    }
  });
}

// The [cols, rows] transpose of a row-major [rows, cols] matrix (W and R are stored
// [gates*hidden, in]; the GEMMs want them [in, gates*hidden]). In square tiles, so reads and
// writes both stay within a few cache lines: element by element, the writes strode a whole row
// apart and the transposes of a streaming LSTM step's W and R ([512, 128] each) took about
// 450 us of Silero VAD's 580 us call.
template <typename C>
std::vector<C> transposed(const C* m, int64_t rows, int64_t cols) {
  constexpr int64_t kTile = 32;
  std::vector<C> t(size_t(rows * cols));
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t r = r0; r < r1; ++r) t[size_t(c * rows + r)] = m[r * cols + c];
    }
  return t;
}

// A · W^T for a weight stored as the recurrent ops store it, [n, k] (gates*hidden rows of `in`
// values). float reads W where it lies through the blocked sgemm (dot products for a few rows, as
// one streaming step has; packed tiles for many); other compute types (double: the gradient
// checks) multiply a transposed copy made once, by gemm_nn.
template <typename C>
class TransposedProduct {
 public:
  TransposedProduct(const C* w, int64_t n, int64_t k) : w_(w), n_(n), k_(k) {
    if constexpr (!std::is_same_v<C, float>) wt_ = transposed(w, n, k);
  }
  // out[i, :] = a[i, :] · W^T for i < m; rows of a are lda apart, rows of out ldo apart.
  void apply(const C* a, int64_t m, int64_t lda, C* out, int64_t ldo) const {
    if constexpr (std::is_same_v<C, float>) {
      cpu::SgemmArgs g;
      g.m = m;
      g.n = n_;
      g.k = k_;
      g.a = a;
      g.a_row = lda;
      g.b = w_;
      g.b_row = 1;
      g.b_col = k_;
      g.c = out;
      g.ldc = ldo;
      cpu::sgemm_blocked(g);
    } else {
      gemm_nn(a, m, k_, lda, wt_.data(), n_, n_, out, ldo);
    }
  }

 private:
  const C* w_;
  int64_t n_, k_;
  std::vector<C> wt_;
};

// XW[t*batch + b, :] = X_t[b] · W_d^T + bias (bias may be null): every step's input projection.
// w is W_d as stored, [gh, input].
template <typename C>
std::vector<C> project_inputs(const std::vector<C>& x, const RnnSetup& s, const C* w, int64_t gh, const C* bias) {
  int64_t rows = s.seq * s.batch;
  std::vector<C> xw(size_t(rows * gh));
  TransposedProduct<C>(w, gh, s.input).apply(x.data(), rows, s.input, xw.data(), gh);
  if (bias) {
    parallel_for(rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(gh, 1)), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        C* row = xw.data() + r * gh;
        for (int64_t j = 0; j < gh; ++j) row[j] += bias[j];
      }
    });
  }
  return xw;
}

// The time index batch row b reads at step `step` of direction d (forward: step; reverse: counted
// back from the row's last valid step), or -1 when the row has finished.
inline int64_t time_index(const RnnSetup& s, int64_t d, int64_t step, int64_t b) {
  int64_t len = s.lens[size_t(b)];
  if (step >= len) return -1;
  bool reverse = s.direction == Direction::kReverse || (s.direction == Direction::kBidirectional && d == 1);
  return reverse ? len - 1 - step : step;
}

// Zeroes Y everywhere (padded steps stay zero; valid steps are overwritten).
template <typename T>
void zero_fill(Tensor& t) {
  T* p = t.data<T>();
  std::fill(p, p + t.numel(), T(0.0f));
}

// Writes a [batch, hidden] state buffer for direction d into a Y_h / Y_c tensor.
template <typename T, typename C>
void store_state(Tensor& out, const RnnSetup& s, int64_t d, const std::vector<C>& h) {
  T* p = out.data<T>();
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t j = 0; j < s.hidden; ++j) p[state_offset(s, d, b) + j] = T(h[size_t(b * s.hidden + j)]);
}

// Output i when the node asks for it, else an undefined tensor. Returned by value (tensors share
// storage), so later ctx.output calls cannot invalidate it.
inline Tensor optional_output(KernelContext& ctx, size_t i, DType dtype, const Shape& shape) {
  if (i >= ctx.num_outputs() || !ctx.output_requested(i)) return Tensor();
  return ctx.output(i, dtype, shape);
}

// Bias rows of direction d: Wb and Rb, each gates*hidden long, or null when B is absent.
template <typename C>
const C* bias_ptr(const ComputeView<C>& b, int64_t d, int64_t gh) {
  return b.empty() ? nullptr : b.data() + d * 2 * gh;
}

// ---- backpropagation through time (the fused onnxtrain.RNNGrad / GRUGrad / LSTMGrad ops) --------
//
// Each grad op takes the forward op's inputs at the same positions (X, W, R, B?, sequence_lens?,
// initial_h?[, initial_c?, P?]) followed by the upstream gradients (dY?, dY_h?[, dY_c?]; "" for
// none), and returns (dX, dW, dR, dB, dinitial_h[, dinitial_c, dP]). It takes none of the forward
// outputs: the kernel re-runs the forward recurrence per direction, keeping every step's gate
// pre-activations, gate values and previous states (O(seq * batch * gates * hidden), freed when
// the op returns), then walks the steps backwards carrying dH (and dC) per batch row. The weight
// gradients are summed over all (t, b) at the end with one GEMM each, dW = dA^T·X, dR = dA^T·Hprev,
// dX = dA·W, where dA[t, b] holds the gate pre-activation gradients (zero at padded steps).
// Recomputation costs one extra forward pass but keeps the forward op and its memory unchanged.

// Emits `op` for the forward node the builder differentiates and sets the input gradients.
// n_inputs: the forward op's input count (6 or 8); n_states: its state outputs (1 or 2).
// The grad op's outputs follow the forward inputs minus sequence_lens: dX, dW, dR, dB, dinitial_h,
// [dinitial_c, dP], i.e. output k is the gradient of forward input k (k < 4) or k + 1 (k >= 4).
inline void emit_rnn_gradient(GradientBuilder& g, const std::string& op, size_t n_inputs, size_t n_states) {
  std::vector<std::string> ins;
  for (size_t i = 0; i < n_inputs; ++i) ins.push_back(g.has_input(i) ? g.x(i) : "");
  for (size_t i = 0; i <= n_states; ++i) ins.push_back(g.dy(i));
  while (!ins.empty() && ins.back().empty()) ins.pop_back();
  std::vector<std::string> outs = g.emit_n(op, ins, n_inputs - 1, g.node().attributes, kOnnxTrainDomain);
  for (size_t k = 0; k < outs.size(); ++k) g.set(k < 4 ? k : k + 1, outs[k]);
}

// Shape rule of the grad ops: every gradient has its forward input's shape; dB, dinitial_h/c and dP
// are known from W, R and X even when the forward input was absent.
inline void rnn_grad_shape_rule(ShapeContext& ctx, int64_t gates, size_t n_states) {
  const Node& node = ctx.node();
  DType dt = ctx.input_dtype(0);
  int64_t dirs = num_directions_of(node);
  int64_t layout = parse_layout(node);
  int64_t hidden = node.attr_int("hidden_size", -1);
  const auto& r = ctx.input_shape(2);
  if (hidden < 0 && r && r->size() == 3) hidden = (*r)[2];
  auto set = [&](size_t i, std::optional<Shape> shape) {
    if (i < ctx.num_outputs()) ctx.set_output(i, dt, std::move(shape));
  };
  set(0, ctx.input_shape(0));
  set(1, ctx.input_shape(1));
  set(2, ctx.input_shape(2));
  std::optional<Shape> state, b, p;
  if (hidden >= 0) {
    b = Shape{dirs, 2 * gates * hidden};
    p = Shape{dirs, 3 * hidden};
    const auto& x = ctx.input_shape(0);
    if (x && x->size() == 3) {
      int64_t batch = layout == 0 ? (*x)[1] : (*x)[0];
      state = layout == 0 ? Shape{dirs, batch, hidden} : Shape{batch, dirs, hidden};
    }
  }
  set(3, b);
  for (size_t i = 0; i < n_states; ++i) set(4 + i, state);
  if (n_states == 2) set(6, p);
}

// The upstream dY when present (checked against Y's shape), else null.
inline const Tensor* upstream_y(KernelContext& ctx, size_t i, const RnnSetup& s) {
  if (!ctx.has_input(i)) return nullptr;
  const Tensor& t = ctx.input(i);
  OT_CHECK(t.dtype() == ctx.input(0).dtype() && t.shape() == y_shape(s), ctx.node().context(), "expected dY of shape ",
           shape_str(y_shape(s)), " and dtype ", dtype_name(ctx.input(0).dtype()), ", got ", shape_str(t.shape()),
           " ", dtype_name(t.dtype()));
  return &t;
}

// out[G, K] = A^T · M for row-major A [rows, G] and M [rows, K]: a sum over every (t, b) row.
template <typename C>
void gemm_tn(const C* a, int64_t rows, int64_t G, const C* m, int64_t K, C* out) {
  std::vector<C> at = transposed(a, rows, G);
  gemm_nn(at.data(), G, rows, rows, m, K, K, out, K);
}

// Column sums of a row-major [rows, cols] matrix, written to out[0 .. cols).
template <typename C>
void column_sums(const C* a, int64_t rows, int64_t cols, C* out) {
  std::fill(out, out + cols, C(0));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) out[j] += a[r * cols + j];
}

// Copies a compute-type buffer into tensor elements [offset, offset + v.size()).
template <typename T, typename C>
void store_range(Tensor& out, int64_t offset, const std::vector<C>& v) {
  T* p = out.data<T>() + offset;
  for (size_t i = 0; i < v.size(); ++i) p[i] = T(v[i]);
}

// Writes a time-major [seq, batch, input] buffer as X's layout.
template <typename T, typename C>
void store_time_major(Tensor& out, const RnnSetup& s, const std::vector<C>& v) {
  T* p = out.data<T>();
  for (int64_t t = 0; t < s.seq; ++t)
    for (int64_t b = 0; b < s.batch; ++b) {
      int64_t dst = s.layout == 0 ? (t * s.batch + b) * s.input : (b * s.seq + t) * s.input;
      for (int64_t i = 0; i < s.input; ++i) p[dst + i] = T(v[size_t((t * s.batch + b) * s.input + i)]);
    }
}

// The outputs every grad op has, dX, dW, dR, dB and dinitial_h (each undefined when the graph does
// not ask for it), and the steps that are the same for every cell once the backward walk has
// produced dA (the gate pre-activation gradients, [seq*batch, G] time-major, zero at padded steps).
template <typename T, typename C = compute_t<T>>
struct BpttOutputs {
  Tensor dx, dw, dr, db, dh0;
  std::vector<C> dx_sum;  // time-major dX, summed over the directions

  BpttOutputs(KernelContext& ctx, const RnnSetup& s, int64_t G) {
    const DType dt = ctx.input(0).dtype();
    dx = optional_output(ctx, 0, dt, ctx.input(0).shape());
    dw = optional_output(ctx, 1, dt, ctx.input(1).shape());
    dr = optional_output(ctx, 2, dt, ctx.input(2).shape());
    db = optional_output(ctx, 3, dt, {s.dirs, 2 * G});
    dh0 = optional_output(ctx, 4, dt, state_shape(s));
    if (dx.defined()) dx_sum.assign(size_t(s.seq * s.batch * s.input), C(0));
  }

  // Direction d's [G, width] block of a weight gradient: dY^T·X over the rows (t, b) of both.
  void store_weight_gradient(Tensor& out, const std::vector<C>& dy, const std::vector<C>& x, int64_t rows,
                             int64_t width, int64_t d, int64_t G) {
    std::vector<C> g(size_t(G * width));
    gemm_tn(dy.data(), rows, G, x.data(), width, g.data());
    store_range<T>(out, d * G * width, g);
  }

  // The input projection XW = X·W[d]^T (+ Wb) with gradient daw: dW[d] = daw^T·X, dX += daw·W[d].
  void input_projection(const std::vector<C>& daw, const std::vector<C>& x, const C* wd, const RnnSetup& s, int64_t d,
                        int64_t G) {
    const int64_t SB = s.seq * s.batch, I = s.input;
    if (dw.defined()) store_weight_gradient(dw, daw, x, SB, I, d, G);
    if (dx.defined()) {
      std::vector<C> part(size_t(SB * I));
      gemm_nn(daw.data(), SB, G, G, wd, I, I, part.data(), I);
      for (size_t i = 0; i < dx_sum.size(); ++i) dx_sum[i] += part[i];
    }
  }

  // For cells whose every gate reads R·Ht-1 and both biases unchanged (RNN, LSTM): dR[d] = dA^T·Ht-1
  // and dWb = dRb = sum over (t, b) of dA.
  void plain_recurrence(const std::vector<C>& da, const std::vector<C>& hprev, const RnnSetup& s, int64_t d,
                        int64_t G) {
    const int64_t SB = s.seq * s.batch, H = s.hidden;
    if (dr.defined()) store_weight_gradient(dr, da, hprev, SB, H, d, G);
    if (db.defined()) {
      std::vector<C> g(size_t(2 * G));
      column_sums(da.data(), SB, G, g.data());
      std::copy(g.begin(), g.begin() + G, g.begin() + G);
      store_range<T>(db, d * 2 * G, g);
    }
  }

  void initial_h(const RnnSetup& s, int64_t d, const std::vector<C>& dh) {
    if (dh0.defined()) store_state<T>(dh0, s, d, dh);
  }

  // Writes dX in X's layout, once every direction has added its part.
  void finish(const RnnSetup& s) {
    if (dx.defined()) store_time_major<T>(dx, s, dx_sum);
  }
};

}  // namespace onnxtrain::rnn
