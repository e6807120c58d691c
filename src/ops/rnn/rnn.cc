// RNN: a one-layer simple recurrent network (ai.onnx RNN-7, and RNN-14 with `layout`).
//
//   Ht = f(Xt·Wi^T + Ht-1·Ri^T + Wbi + Rbi)          f defaults to Tanh
//
// Inputs X, W, R, B?, sequence_lens?, initial_h?; outputs Y?, Y_h?. See rnn_common.h for the
// layout of the computation (one GEMM for all input projections, then the recurrence).
#include "ops/rnn/rnn_common.h"

namespace onnxtrain {
namespace {

using namespace rnn;

template <typename T>
void run_rnn(KernelContext& ctx) {
  using C = compute_t<T>;
  const Node& node = ctx.node();
  RnnSetup s = parse_setup(ctx, 1);
  std::vector<Activation> acts = parse_activations(node, {"Tanh"}, s.dirs);
  const DType dt = ctx.input(0).dtype();
  const int64_t H = s.hidden;

  std::vector<C> x = time_major_input<T>(ctx.input(0), s);
  std::vector<C> w = to_compute<T>(ctx.input(1));
  std::vector<C> r = to_compute<T>(ctx.input(2));
  std::vector<C> b = ctx.has_input(3) ? to_compute<T>(ctx.input(3)) : std::vector<C>();

  Tensor y = optional_output(ctx, 0, dt, y_shape(s));
  Tensor yh = optional_output(ctx, 1, dt, state_shape(s));
  if (y.defined()) zero_fill<T>(y);

  int64_t max_len = s.batch ? *std::max_element(s.lens.begin(), s.lens.end()) : 0;
  for (int64_t d = 0; d < s.dirs; ++d) {
    const Activation& f = acts[size_t(d)];
    std::vector<C> bias;
    if (const C* bp = bias_ptr(b, d, H)) {
      bias.resize(size_t(H));
      for (int64_t j = 0; j < H; ++j) bias[size_t(j)] = bp[j] + bp[H + j];  // Wbi + Rbi
    }
    std::vector<C> xw = project_inputs(x, s, w.data() + d * H * s.input, H, bias.empty() ? nullptr : bias.data());
    std::vector<C> rt = transposed(r.data() + d * H * H, H, H);  // Ri^T: [H, H]
    std::vector<C> h = initial_state<T>(ctx, 5, s, d, "initial_h");
    std::vector<C> acc(size_t(s.batch * H));
    for (int64_t step = 0; step < max_len; ++step) {
      gemm_nn(h.data(), s.batch, H, H, rt.data(), H, H, acc.data(), H);  // Ht-1 · Ri^T
      for (int64_t bi = 0; bi < s.batch; ++bi) {
        int64_t t = time_index(s, d, step, bi);
        if (t < 0) continue;
        C* a = acc.data() + bi * H;
        const C* xr = xw.data() + (t * s.batch + bi) * H;
        for (int64_t j = 0; j < H; ++j) a[j] += xr[j];
        f.apply(a, H, s.clip);
        std::copy(a, a + H, h.data() + bi * H);
        if (y.defined()) {
          T* yp = y.data<T>() + y_offset(s, t, d, bi);
          for (int64_t j = 0; j < H; ++j) yp[j] = T(a[j]);
        }
      }
    }
    if (yh.defined()) store_state<T>(yh, s, d, h);
  }
}

// RNNGrad(X, W, R, B?, sequence_lens?, initial_h?, dY?, dY_h?) -> dX, dW, dR, dB, dinitial_h.
// Recomputes the forward pass (see rnn_common.h), then per direction, steps in reverse:
//   dH = dY_t + dHcarry;  da_t = dH (.) f'(a_t);  dHcarry = da_t · R   (rows still running)
// and at the end dW = dA^T·X, dR = dA^T·Hprev, dX += dA·W, dWb = dRb = sum_(t,b) dA,
// dinitial_h = dHcarry. Rows past their sequence length carry dH unchanged.
template <typename T>
void run_rnn_grad(KernelContext& ctx) {
  using C = compute_t<T>;
  const Node& node = ctx.node();
  RnnSetup s = parse_setup(ctx, 1);
  std::vector<Activation> acts = parse_activations(node, {"Tanh"}, s.dirs);
  const DType dt = ctx.input(0).dtype();
  const int64_t H = s.hidden, B = s.batch, I = s.input, SB = s.seq * s.batch;

  std::vector<C> x = time_major_input<T>(ctx.input(0), s);
  std::vector<C> w = to_compute<T>(ctx.input(1));
  std::vector<C> r = to_compute<T>(ctx.input(2));
  std::vector<C> b = ctx.has_input(3) ? to_compute<T>(ctx.input(3)) : std::vector<C>();
  const Tensor* dy = upstream_y(ctx, 6, s);

  Tensor dx_t = optional_output(ctx, 0, dt, ctx.input(0).shape());
  Tensor dw_t = optional_output(ctx, 1, dt, ctx.input(1).shape());
  Tensor dr_t = optional_output(ctx, 2, dt, ctx.input(2).shape());
  Tensor db_t = optional_output(ctx, 3, dt, {s.dirs, 2 * H});
  Tensor dh0_t = optional_output(ctx, 4, dt, state_shape(s));
  std::vector<C> dx(size_t(SB * I), C(0));

  int64_t max_len = B ? *std::max_element(s.lens.begin(), s.lens.end()) : 0;
  for (int64_t d = 0; d < s.dirs; ++d) {
    const Activation& f = acts[size_t(d)];
    const C* wd = w.data() + d * H * I;
    const C* rd = r.data() + d * H * H;
    // Forward recompute: pre-activations a_t and previous states, per (t, b) row.
    std::vector<C> bias;
    if (const C* bp = bias_ptr(b, d, H)) {
      bias.resize(size_t(H));
      for (int64_t j = 0; j < H; ++j) bias[size_t(j)] = bp[j] + bp[H + j];
    }
    std::vector<C> xw = project_inputs(x, s, wd, H, bias.empty() ? nullptr : bias.data());
    std::vector<C> rt = transposed(rd, H, H);
    std::vector<C> h = initial_state<T>(ctx, 5, s, d, "initial_h");
    std::vector<C> pre(size_t(SB * H), C(0)), hprev(size_t(SB * H), C(0)), acc(size_t(B * H));
    for (int64_t step = 0; step < max_len; ++step) {
      gemm_nn(h.data(), B, H, H, rt.data(), H, H, acc.data(), H);
      for (int64_t bi = 0; bi < B; ++bi) {
        int64_t t = time_index(s, d, step, bi);
        if (t < 0) continue;
        int64_t row = t * B + bi;
        C* a = pre.data() + row * H;
        C* hp = h.data() + bi * H;
        std::copy(hp, hp + H, hprev.data() + row * H);
        for (int64_t j = 0; j < H; ++j) {
          a[j] = acc[size_t(bi * H + j)] + xw[size_t(row * H + j)];
          hp[j] = f.eval(a[j], s.clip);
        }
      }
    }
    // Backward through time.
    std::vector<C> dh = initial_state<T>(ctx, 7, s, d, "dY_h");
    std::vector<C> da(size_t(SB * H), C(0)), dstep(size_t(B * H)), dhp(size_t(B * H));
    for (int64_t step = max_len - 1; step >= 0; --step) {
      std::fill(dstep.begin(), dstep.end(), C(0));
      for (int64_t bi = 0; bi < B; ++bi) {
        int64_t t = time_index(s, d, step, bi);
        if (t < 0) continue;
        int64_t row = t * B + bi;
        const T* dyp = dy ? dy->data<T>() + y_offset(s, t, d, bi) : nullptr;
        for (int64_t j = 0; j < H; ++j) {
          C dH = dh[size_t(bi * H + j)] + (dyp ? C(dyp[j]) : C(0));
          C g = dH * f.derivative(pre[size_t(row * H + j)], s.clip);
          da[size_t(row * H + j)] = g;
          dstep[size_t(bi * H + j)] = g;
        }
      }
      gemm_nn(dstep.data(), B, H, H, rd, H, H, dhp.data(), H);  // dHt-1 = da_t · R
      for (int64_t bi = 0; bi < B; ++bi)
        if (time_index(s, d, step, bi) >= 0) std::copy(dhp.begin() + bi * H, dhp.begin() + (bi + 1) * H, dh.begin() + bi * H);
    }
    if (dw_t.defined()) {
      std::vector<C> dw(size_t(H * I));
      gemm_tn(da.data(), SB, H, x.data(), I, dw.data());
      store_range<T>(dw_t, d * H * I, dw);
    }
    if (dr_t.defined()) {
      std::vector<C> dr(size_t(H * H));
      gemm_tn(da.data(), SB, H, hprev.data(), H, dr.data());
      store_range<T>(dr_t, d * H * H, dr);
    }
    if (db_t.defined()) {
      std::vector<C> db(size_t(2 * H));
      column_sums(da.data(), SB, H, db.data());
      std::copy(db.begin(), db.begin() + H, db.begin() + H);  // dRb = dWb
      store_range<T>(db_t, d * 2 * H, db);
    }
    if (dx_t.defined()) {
      std::vector<C> part(size_t(SB * I));
      gemm_nn(da.data(), SB, H, H, wd, I, I, part.data(), I);
      for (size_t i = 0; i < dx.size(); ++i) dx[i] += part[i];
    }
    if (dh0_t.defined()) store_state<T>(dh0_t, s, d, dh);
  }
  if (dx_t.defined()) store_time_major<T>(dx_t, s, dx);
}

void rnn_grad_kernel(KernelContext& ctx) {
  dispatch_float(ctx.input(0).dtype(), [&]<typename T>() { run_rnn_grad<T>(ctx); });
}

void rnn_gradient(GradientBuilder& g) { emit_rnn_gradient(g, "RNNGrad", 6, 1); }

void rnn_kernel(KernelContext& ctx) {
  dispatch_float(ctx.input(0).dtype(), [&]<typename T>() { run_rnn<T>(ctx); });
}

void rnn_shape(ShapeContext& ctx) { rnn_shape_rule(ctx, 1, 1); }
void rnn_grad_shape(ShapeContext& ctx) { rnn_grad_shape_rule(ctx, 1, 1); }

}  // namespace

// Gradient (BPTT, fused into onnxtrain.RNNGrad): with a_t = Xt·W^T + Ht-1·R^T + Wb + Rb and
// Ht = f(a_t), walking t backwards with dH carried from later steps (dH_T = dY_h + dY_T):
//   da_t = (dY_t + dH_t) * f'(a_t);  dW += da_t^T·Xt;  dR += da_t^T·Ht-1;  dWb = dRb += sum_b da_t;
//   dXt = da_t·W;  dH_{t-1} = da_t·R;  d(initial_h) = dH_0.  Clipped entries pass no gradient.
ONNXTRAIN_OP(RNN, kOnnxDomain, 7).inputs(3, 6).outputs(0, 2).shape(rnn_shape).cpu(rnn_kernel).gradient(rnn_gradient);
// RNN-14 adds `layout` (batch-major X, Y, Y_h); the gradient is the same, in the other layout.
ONNXTRAIN_OP(RNN, kOnnxDomain, 14).inputs(3, 6).outputs(0, 2).shape(rnn_shape).cpu(rnn_kernel).gradient(rnn_gradient);
// RNNGrad(X, W, R, B?, sequence_lens?, initial_h?, dY?, dY_h?) -> dX, dW, dR, dB, dinitial_h, with
// RNN's attributes; recomputes the forward pass (rnn_common.h, "backpropagation through time").
ONNXTRAIN_OP(RNNGrad, kOnnxTrainDomain, 1).inputs(3, 8).outputs(1, 5).shape(rnn_grad_shape).cpu(rnn_grad_kernel)
    .gradient_not_implemented("second derivatives are not needed");

}  // namespace onnxtrain
