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
  auto [s, acts, x, w, r, b, max_len] = load_operands<T>(ctx, 1, {"Tanh"});
  const DType dt = ctx.input(0).dtype();
  const int64_t H = s.hidden;

  Tensor y = optional_output(ctx, 0, dt, y_shape(s));
  Tensor yh = optional_output(ctx, 1, dt, state_shape(s));
  if (y.defined()) zero_fill<T>(y);

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
  auto [s, acts, x, w, r, b, max_len] = load_operands<T>(ctx, 1, {"Tanh"});
  const int64_t H = s.hidden, B = s.batch, I = s.input, SB = s.seq * s.batch;
  const Tensor* dy = upstream_y(ctx, 6, s);
  BpttOutputs<T> out(ctx, s, H);

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
    out.input_projection(da, x, wd, s, d, H);
    out.plain_recurrence(da, hprev, s, d, H);
    out.initial_h(s, d, dh);
  }
  out.finish(s);
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
