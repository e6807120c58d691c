// LSTM: a one-layer long short-term memory network (ai.onnx LSTM-7, and LSTM-14 with `layout`).
// Gate order in W, R and B is i, o, f, c; peepholes P are i, o, f. f defaults to Sigmoid, g and h
// to Tanh.
//
//   it = f(Xt·Wi^T + Ht-1·Ri^T + Pi (.) Ct-1 + Wbi + Rbi)
//   ft = f(Xt·Wf^T + Ht-1·Rf^T + Pf (.) Ct-1 + Wbf + Rbf)     (ft = 1 - it when input_forget)
//   ct = g(Xt·Wc^T + Ht-1·Rc^T + Wbc + Rbc)
//   Ct = ft (.) Ct-1 + it (.) ct
//   ot = f(Xt·Wo^T + Ht-1·Ro^T + Po (.) Ct + Wbo + Rbo)
//   Ht = ot (.) h(Ct)
//
// Inputs X, W, R, B?, sequence_lens?, initial_h?, initial_c?, P?; outputs Y?, Y_h?, Y_c?. `clip`
// bounds the gate pre-activations (the inputs of f and g).
#include "ops/rnn/rnn_common.h"

namespace onnxtrain {
namespace {

using namespace rnn;

// The peepholes P [num_directions, 3 * hidden] (i, o, f) in the compute type; empty when absent.
template <typename T, typename C = compute_t<T>>
std::vector<C> peepholes(KernelContext& ctx, const RnnSetup& s) {
  if (!ctx.has_input(7)) return {};
  const Tensor& pt = ctx.input(7);
  const DType dt = ctx.input(0).dtype();
  const Shape want{s.dirs, 3 * s.hidden};
  OT_CHECK(pt.dtype() == dt && pt.shape() == want, ctx.node().context(), "expected P of shape ", shape_str(want),
           " and dtype ", dtype_name(dt), ", got ", shape_str(pt.shape()), " ", dtype_name(pt.dtype()));
  return to_compute<T>(pt);
}

template <typename T>
void run_lstm(KernelContext& ctx) {
  using C = compute_t<T>;
  auto [s, acts, x, w, r, b, max_len] = load_operands<T>(ctx, 4, {"Sigmoid", "Tanh", "Tanh"});
  const bool input_forget = ctx.node().attr_int("input_forget", 0) != 0;
  const DType dt = ctx.input(0).dtype();
  const int64_t H = s.hidden, G = 4 * H;
  const std::vector<C> p = peepholes<T>(ctx, s);

  Tensor y = optional_output(ctx, 0, dt, y_shape(s));
  Tensor yh = optional_output(ctx, 1, dt, state_shape(s));
  Tensor yc = optional_output(ctx, 2, dt, state_shape(s));
  if (y.defined()) zero_fill<T>(y);

  for (int64_t d = 0; d < s.dirs; ++d) {
    const Activation& f = acts[size_t(3 * d)];
    const Activation& g = acts[size_t(3 * d + 1)];
    const Activation& hf = acts[size_t(3 * d + 2)];
    std::vector<C> bias;
    if (const C* bp = bias_ptr(b, d, G)) {
      bias.resize(size_t(G));
      for (int64_t j = 0; j < G; ++j) bias[size_t(j)] = bp[j] + bp[G + j];  // Wb + Rb
    }
    std::vector<C> xw = project_inputs(x, s, w.data() + d * G * s.input, G, bias.empty() ? nullptr : bias.data());
    const TransposedProduct<C> recurrent(r.data() + d * G * H, G, H);  // H · R^T, R as stored [4H, H]
    const C* pi = p.empty() ? nullptr : p.data() + d * 3 * H;
    const C* po = pi ? pi + H : nullptr;
    const C* pf = pi ? pi + 2 * H : nullptr;
    std::vector<C> h = initial_state<T>(ctx, 5, s, d, "initial_h");
    std::vector<C> c = initial_state<T>(ctx, 6, s, d, "initial_c");
    std::vector<C> acc(size_t(s.batch * G));
    for (int64_t step = 0; step < max_len; ++step) {
      recurrent.apply(h.data(), s.batch, H, acc.data(), G);  // Ht-1 · R^T, all four gates
      for (int64_t bi = 0; bi < s.batch; ++bi) {
        int64_t t = time_index(s, d, step, bi);
        if (t < 0) continue;
        C* a = acc.data() + bi * G;
        const C* xr = xw.data() + (t * s.batch + bi) * G;
        for (int64_t j = 0; j < G; ++j) a[j] += xr[j];
        C* gi = a;
        C* go = a + H;
        C* gf = a + 2 * H;
        C* gc = a + 3 * H;
        C* cp = c.data() + bi * H;
        C* hp = h.data() + bi * H;
        if (pi) {
          for (int64_t j = 0; j < H; ++j) {
            gi[j] += pi[j] * cp[j];
            gf[j] += pf[j] * cp[j];
          }
        }
        f.apply(gi, H, s.clip);
        if (input_forget) {
          for (int64_t j = 0; j < H; ++j) gf[j] = C(1) - gi[j];
        } else {
          f.apply(gf, H, s.clip);
        }
        g.apply(gc, H, s.clip);
        for (int64_t j = 0; j < H; ++j) cp[j] = gf[j] * cp[j] + gi[j] * gc[j];
        if (po) for (int64_t j = 0; j < H; ++j) go[j] += po[j] * cp[j];
        f.apply(go, H, s.clip);
        for (int64_t j = 0; j < H; ++j) hp[j] = go[j] * hf(cp[j]);
        if (y.defined()) {
          T* yp = y.data<T>() + y_offset(s, t, d, bi);
          for (int64_t j = 0; j < H; ++j) yp[j] = T(hp[j]);
        }
      }
    }
    if (yh.defined()) store_state<T>(yh, s, d, h);
    if (yc.defined()) store_state<T>(yc, s, d, c);
  }
}

// LSTMGrad(X, W, R, B?, sequence_lens?, initial_h?, initial_c?, P?, dY?, dY_h?, dY_c?)
//   -> dX, dW, dR, dB, dinitial_h, dinitial_c, dP.
// Recomputes the forward pass keeping, per (t, b) row, the gate pre-activations (peepholes
// included), the gate values, Ht-1, Ct-1 and Ct; then walks the steps in reverse with the carries
// dH (from dY_h) and dC (from dY_c), as in the gradient comment above the LSTM registration.
template <typename T>
void run_lstm_grad(KernelContext& ctx) {
  using C = compute_t<T>;
  auto [s, acts, x, w, r, b, max_len] = load_operands<T>(ctx, 4, {"Sigmoid", "Tanh", "Tanh"});
  const bool input_forget = ctx.node().attr_int("input_forget", 0) != 0;
  const DType dt = ctx.input(0).dtype();
  const int64_t H = s.hidden, G = 4 * H, B = s.batch, I = s.input, SB = s.seq * s.batch;
  const std::vector<C> p = peepholes<T>(ctx, s);
  const Tensor* dy = upstream_y(ctx, 8, s);
  BpttOutputs<T> out(ctx, s, G);
  Tensor dc0_t = optional_output(ctx, 5, dt, state_shape(s));
  Tensor dp_t = optional_output(ctx, 6, dt, {s.dirs, 3 * H});

  for (int64_t d = 0; d < s.dirs; ++d) {
    const Activation& f = acts[size_t(3 * d)];
    const Activation& g = acts[size_t(3 * d + 1)];
    const Activation& hf = acts[size_t(3 * d + 2)];
    const C* wd = w.data() + d * G * I;
    const C* rd = r.data() + d * G * H;
    const C* pi = p.empty() ? nullptr : p.data() + d * 3 * H;
    const C* po = pi ? pi + H : nullptr;
    const C* pf = pi ? pi + 2 * H : nullptr;
    // ---- forward recompute (as run_lstm); gate blocks are i, o, f, c at offsets 0, H, 2H, 3H
    std::vector<C> bias;
    if (const C* bp = bias_ptr(b, d, G)) {
      bias.resize(size_t(G));
      for (int64_t j = 0; j < G; ++j) bias[size_t(j)] = bp[j] + bp[G + j];
    }
    std::vector<C> xw = project_inputs(x, s, wd, G, bias.empty() ? nullptr : bias.data());
    std::vector<C> rt = transposed(rd, G, H);
    std::vector<C> h = initial_state<T>(ctx, 5, s, d, "initial_h");
    std::vector<C> c = initial_state<T>(ctx, 6, s, d, "initial_c");
    std::vector<C> pre(size_t(SB * G), C(0)), gate(size_t(SB * G), C(0));
    std::vector<C> hprev(size_t(SB * H), C(0)), cprev(size_t(SB * H), C(0)), cnew(size_t(SB * H), C(0));
    std::vector<C> acc(size_t(B * G));
    for (int64_t step = 0; step < max_len; ++step) {
      gemm_nn(h.data(), B, H, H, rt.data(), G, G, acc.data(), G);
      for (int64_t bi = 0; bi < B; ++bi) {
        int64_t t = time_index(s, d, step, bi);
        if (t < 0) continue;
        int64_t row = t * B + bi;
        C* a = pre.data() + row * G;
        C* gv = gate.data() + row * G;
        const C* xr = xw.data() + row * G;
        C* cp = c.data() + bi * H;
        C* hp = h.data() + bi * H;
        std::copy(hp, hp + H, hprev.data() + row * H);
        std::copy(cp, cp + H, cprev.data() + row * H);
        for (int64_t j = 0; j < G; ++j) a[j] = acc[size_t(bi * G + j)] + xr[j];
        for (int64_t j = 0; j < H; ++j) {
          if (pi) {
            a[j] += pi[j] * cp[j];
            a[2 * H + j] += pf[j] * cp[j];
          }
          C it = f.eval(a[j], s.clip);
          C ft = input_forget ? C(1) - it : f.eval(a[2 * H + j], s.clip);
          C ct = g.eval(a[3 * H + j], s.clip);
          cp[j] = ft * cp[j] + it * ct;
          if (po) a[H + j] += po[j] * cp[j];
          C ot = f.eval(a[H + j], s.clip);
          hp[j] = ot * hf(cp[j]);
          gv[j] = it;
          gv[H + j] = ot;
          gv[2 * H + j] = ft;
          gv[3 * H + j] = ct;
          cnew[size_t(row * H + j)] = cp[j];
        }
      }
    }
    // ---- backward through time
    std::vector<C> dh = initial_state<T>(ctx, 9, s, d, "dY_h");
    std::vector<C> dc = initial_state<T>(ctx, 10, s, d, "dY_c");
    std::vector<C> da(size_t(SB * G), C(0)), dstep(size_t(B * G)), dhp(size_t(B * H)), dp(size_t(3 * H), C(0));
    for (int64_t step = max_len - 1; step >= 0; --step) {
      std::fill(dstep.begin(), dstep.end(), C(0));
      for (int64_t bi = 0; bi < B; ++bi) {
        int64_t t = time_index(s, d, step, bi);
        if (t < 0) continue;
        int64_t row = t * B + bi;
        const C* a = pre.data() + row * G;
        const C* gv = gate.data() + row * G;
        C* dar = da.data() + row * G;
        C* ds = dstep.data() + bi * G;
        const T* dyp = dy ? dy->data<T>() + y_offset(s, t, d, bi) : nullptr;
        for (int64_t j = 0; j < H; ++j) {
          C dH = dh[size_t(bi * H + j)] + (dyp ? C(dyp[j]) : C(0));
          C ct = cnew[size_t(row * H + j)], cpv = cprev[size_t(row * H + j)];
          C it = gv[j], ot = gv[H + j], ft = gv[2 * H + j], gt = gv[3 * H + j];
          // Ht = ot (.) h(Ct)
          C dao = dH * hf(ct) * f.derivative(a[H + j], s.clip);
          C dC = dc[size_t(bi * H + j)] + dH * ot * hf.derivative(ct, 0.0f);
          if (po) {  // ao includes Po (.) Ct
            dC += dao * po[j];
            dp[size_t(H + j)] += dao * ct;
          }
          // Ct = ft (.) Ct-1 + it (.) ct
          C di = dC * gt, df = dC * cpv;
          C dac = dC * it * g.derivative(a[3 * H + j], s.clip);
          C daf = C(0);
          if (input_forget) di -= df;  // ft = 1 - it
          else daf = df * f.derivative(a[2 * H + j], s.clip);
          C dai = di * f.derivative(a[j], s.clip);
          C dcp = dC * ft;
          if (pi) {  // ai, af include Pi (.) Ct-1, Pf (.) Ct-1
            dcp += dai * pi[j] + daf * pf[j];
            dp[size_t(j)] += dai * cpv;
            dp[size_t(2 * H + j)] += daf * cpv;
          }
          dc[size_t(bi * H + j)] = dcp;
          dar[j] = ds[j] = dai;
          dar[H + j] = ds[H + j] = dao;
          dar[2 * H + j] = ds[2 * H + j] = daf;
          dar[3 * H + j] = ds[3 * H + j] = dac;
        }
      }
      gemm_nn(dstep.data(), B, G, G, rd, H, H, dhp.data(), H);  // dHt-1 = da_t · R
      for (int64_t bi = 0; bi < B; ++bi)
        if (time_index(s, d, step, bi) >= 0) std::copy(dhp.begin() + bi * H, dhp.begin() + (bi + 1) * H, dh.begin() + bi * H);
    }
    out.input_projection(da, x, wd, s, d, G);
    out.plain_recurrence(da, hprev, s, d, G);
    out.initial_h(s, d, dh);
    if (dc0_t.defined()) store_state<T>(dc0_t, s, d, dc);
    if (dp_t.defined()) store_range<T>(dp_t, d * 3 * H, dp);
  }
  out.finish(s);
}

void lstm_grad_kernel(KernelContext& ctx) {
  dispatch_float(ctx.input(0).dtype(), [&]<typename T>() { run_lstm_grad<T>(ctx); });
}

void lstm_gradient(GradientBuilder& g) { emit_rnn_gradient(g, "LSTMGrad", 8, 2); }

void lstm_kernel(KernelContext& ctx) {
  dispatch_float(ctx.input(0).dtype(), [&]<typename T>() { run_lstm<T>(ctx); });
}

void lstm_shape(ShapeContext& ctx) { rnn_shape_rule(ctx, 4, 2); }
void lstm_grad_shape(ShapeContext& ctx) { rnn_grad_shape_rule(ctx, 4, 2); }

}  // namespace

// Gradient (BPTT, fused into onnxtrain.LSTMGrad): walking t backwards with dH = dY_t + (carry from t+1) and dC
// carried likewise (starting from dY_h, dY_c):
//   do = dH (.) h(Ct);  dC += dH (.) ot (.) h'(Ct);  (peephole: dC += dao (.) Po after dao)
//   dao = do (.) f'(ao);  di = dC (.) ct;  dc = dC (.) it;  df = dC (.) Ct-1;
//   dai = di (.) f'(ai);  daf = df (.) f'(af);  dac = dc (.) g'(ac);
//   dCt-1 = dC (.) ft + dai (.) Pi + daf (.) Pf;  dP[i,o,f] += batch sums of da[i,o,f] (.) C;
//   dW += da^T·Xt;  dR += da^T·Ht-1;  dXt = da·W;  dHt-1 = da·R;  dWb = dRb = batch sums of da.
// With input_forget, df flows into it as -df. Clipped pre-activations pass no gradient.
ONNXTRAIN_OP(LSTM, kOnnxDomain, 7).inputs(3, 8).outputs(0, 3).shape(lstm_shape).cpu(lstm_kernel).gradient(lstm_gradient);
// LSTM-14 adds `layout`; same math and gradient.
ONNXTRAIN_OP(LSTM, kOnnxDomain, 14).inputs(3, 8).outputs(0, 3).shape(lstm_shape).cpu(lstm_kernel).gradient(lstm_gradient);

// LSTMGrad(X, W, R, B?, sequence_lens?, initial_h?, initial_c?, P?, dY?, dY_h?, dY_c?) -> dX, dW,
// dR, dB, dinitial_h, dinitial_c, dP, with LSTM's attributes; recomputes the forward pass
// (rnn_common.h, "backpropagation through time").
ONNXTRAIN_OP(LSTMGrad, kOnnxTrainDomain, 1).inputs(3, 11).outputs(1, 7).shape(lstm_grad_shape).cpu(lstm_grad_kernel)
    .gradient_not_implemented("second derivatives are not needed");

}  // namespace onnxtrain
