// GRU: a one-layer gated recurrent unit (ai.onnx GRU-7, and GRU-14 with `layout`). Gate order in
// W, R and B is z (update), r (reset), h (hidden); f defaults to Sigmoid, g to Tanh.
//
//   zt = f(Xt·Wz^T + Ht-1·Rz^T + Wbz + Rbz)
//   rt = f(Xt·Wr^T + Ht-1·Rr^T + Wbr + Rbr)
//   ht = g(Xt·Wh^T + (rt (.) Ht-1)·Rh^T + Rbh + Wbh)      linear_before_reset = 0
//   ht = g(Xt·Wh^T + rt (.) (Ht-1·Rh^T + Rbh) + Wbh)      linear_before_reset != 0
//   Ht = (1 - zt) (.) ht + zt (.) Ht-1
#include "ops/rnn/rnn_common.h"

namespace onnxtrain {
namespace {

using namespace rnn;

template <typename T>
void run_gru(KernelContext& ctx) {
  using C = compute_t<T>;
  auto [s, acts, x, w, r, b, max_len] = load_operands<T>(ctx, 3, {"Sigmoid", "Tanh"});
  const bool lbr = ctx.node().attr_int("linear_before_reset", 0) != 0;
  const DType dt = ctx.input(0).dtype();
  const int64_t H = s.hidden, G = 3 * H;

  Tensor y = optional_output(ctx, 0, dt, y_shape(s));
  Tensor yh = optional_output(ctx, 1, dt, state_shape(s));
  if (y.defined()) zero_fill<T>(y);

  for (int64_t d = 0; d < s.dirs; ++d) {
    const Activation& f = acts[size_t(2 * d)];
    const Activation& g = acts[size_t(2 * d + 1)];
    // Input-side bias: Wb for all gates, plus Rb for z and r (and for h unless it sits inside r).
    const C* bp = bias_ptr(b, d, G);
    std::vector<C> bias, rbh(size_t(H), C(0));
    if (bp) {
      bias.assign(bp, bp + G);
      for (int64_t j = 0; j < 2 * H; ++j) bias[size_t(j)] += bp[G + j];
      for (int64_t j = 0; j < H; ++j) {
        if (lbr) rbh[size_t(j)] = bp[G + 2 * H + j];
        else bias[size_t(2 * H + j)] += bp[G + 2 * H + j];
      }
    }
    std::vector<C> xw = project_inputs(x, s, w.data() + d * G * s.input, G, bias.empty() ? nullptr : bias.data());
    std::vector<C> rt = transposed(r.data() + d * G * H, G, H);  // R^T: [H, 3H]; Rh^T is columns 2H..3H
    std::vector<C> h = initial_state<T>(ctx, 5, s, d, "initial_h");
    std::vector<C> acc(size_t(s.batch * G), C(0));   // Ht-1·R^T per gate
    std::vector<C> reset_h(size_t(s.batch * H), C(0));  // rt (.) Ht-1 (linear_before_reset = 0)
    for (int64_t step = 0; step < max_len; ++step) {
      // z and r (and h's linear part when linear_before_reset) from Ht-1.
      gemm_nn(h.data(), s.batch, H, H, rt.data(), lbr ? G : 2 * H, G, acc.data(), G);
      for (int64_t bi = 0; bi < s.batch; ++bi) {
        int64_t t = time_index(s, d, step, bi);
        if (t < 0) continue;
        C* a = acc.data() + bi * G;
        const C* xr = xw.data() + (t * s.batch + bi) * G;
        for (int64_t j = 0; j < 2 * H; ++j) a[j] += xr[j];
        f.apply(a, 2 * H, s.clip);  // a[0:H] = zt, a[H:2H] = rt
        const C* rt = a + H;
        const C* hp = h.data() + bi * H;
        if (lbr) {
          C* hh = a + 2 * H;
          for (int64_t j = 0; j < H; ++j) hh[j] = xr[2 * H + j] + rt[j] * (hh[j] + rbh[size_t(j)]);
        } else {
          C* rhp = reset_h.data() + bi * H;
          for (int64_t j = 0; j < H; ++j) rhp[j] = rt[j] * hp[j];
        }
      }
      if (!lbr) gemm_nn(reset_h.data(), s.batch, H, H, rt.data() + 2 * H, H, G, acc.data() + 2 * H, G);  // (rt (.) Ht-1)·Rh^T
      for (int64_t bi = 0; bi < s.batch; ++bi) {
        int64_t t = time_index(s, d, step, bi);
        if (t < 0) continue;
        C* a = acc.data() + bi * G;
        C* hh = a + 2 * H;
        if (!lbr) {
          const C* xr = xw.data() + (t * s.batch + bi) * G;
          for (int64_t j = 0; j < H; ++j) hh[j] += xr[2 * H + j];
        }
        g.apply(hh, H, s.clip);
        C* hp = h.data() + bi * H;
        const C* zt = a;
        for (int64_t j = 0; j < H; ++j) hp[j] = (C(1) - zt[j]) * hh[j] + zt[j] * hp[j];
        if (y.defined()) {
          T* yp = y.data<T>() + y_offset(s, t, d, bi);
          for (int64_t j = 0; j < H; ++j) yp[j] = T(hp[j]);
        }
      }
    }
    if (yh.defined()) store_state<T>(yh, s, d, h);
  }
}

// GRUGrad(X, W, R, B?, sequence_lens?, initial_h?, dY?, dY_h?) -> dX, dW, dR, dB, dinitial_h.
// Recomputes the forward pass keeping, per (t, b) row, the pre-activations (az, ar, ah), the gate
// values (zt, rt, ht), Ht-1 and aux = rt (.) Ht-1 (lbr = 0) or Ht-1·Rh^T + Rbh (lbr != 0). Then,
// steps in reverse (dH = dY_t + dHcarry):
//   dht = dH (.) (1 - zt);  dzt = dH (.) (Ht-1 - ht);  dHt-1 = dH (.) zt + ...;  dah = dht (.) g'(ah)
//   lbr = 0: d(rt (.) Ht-1) = dah·Rh;  drt = d(rt (.) Ht-1) (.) Ht-1;  dHt-1 += d(rt (.) Ht-1) (.) rt;
//            dRh += dah^T·(rt (.) Ht-1);  dRbh = sum dah
//   lbr != 0: drt = dah (.) aux;  dlin = dah (.) rt;  dHt-1 += dlin·Rh;  dRh += dlin^T·Ht-1;  dRbh = sum dlin
//   daz = dzt (.) f'(az);  dar = drt (.) f'(ar);  dHt-1 += [daz, dar]·R[z,r];  dR[z,r] += [daz, dar]^T·Ht-1
// with daW = (daz, dar, dah) the gradient of the input projection: dW = daW^T·X, dX = daW·W,
// dWb = sum daW, and daR = (daz, dar, dah | dlin) the recurrent side: dRb = sum daR.
template <typename T>
void run_gru_grad(KernelContext& ctx) {
  using C = compute_t<T>;
  auto [s, acts, x, w, r, b, max_len] = load_operands<T>(ctx, 3, {"Sigmoid", "Tanh"});
  const bool lbr = ctx.node().attr_int("linear_before_reset", 0) != 0;
  const int64_t H = s.hidden, G = 3 * H, B = s.batch, I = s.input, SB = s.seq * s.batch;
  const Tensor* dy = upstream_y(ctx, 6, s);
  BpttOutputs<T> out(ctx, s, G);

  for (int64_t d = 0; d < s.dirs; ++d) {
    const Activation& f = acts[size_t(2 * d)];
    const Activation& g = acts[size_t(2 * d + 1)];
    const C* wd = w.data() + d * G * I;
    const C* rd = r.data() + d * G * H;
    // ---- forward recompute (as run_gru)
    const C* bp = bias_ptr(b, d, G);
    std::vector<C> bias, rbh(size_t(H), C(0));
    if (bp) {
      bias.assign(bp, bp + G);
      for (int64_t j = 0; j < 2 * H; ++j) bias[size_t(j)] += bp[G + j];
      for (int64_t j = 0; j < H; ++j) {
        if (lbr) rbh[size_t(j)] = bp[G + 2 * H + j];
        else bias[size_t(2 * H + j)] += bp[G + 2 * H + j];
      }
    }
    std::vector<C> xw = project_inputs(x, s, wd, G, bias.empty() ? nullptr : bias.data());
    std::vector<C> rt = transposed(rd, G, H);
    std::vector<C> h = initial_state<T>(ctx, 5, s, d, "initial_h");
    std::vector<C> pre(size_t(SB * G), C(0)), gate(size_t(SB * G), C(0));
    std::vector<C> hprev(size_t(SB * H), C(0)), aux(size_t(SB * H), C(0));
    std::vector<C> acc(size_t(B * G), C(0)), reset_h(size_t(B * H), C(0));
    for (int64_t step = 0; step < max_len; ++step) {
      gemm_nn(h.data(), B, H, H, rt.data(), lbr ? G : 2 * H, G, acc.data(), G);
      for (int64_t bi = 0; bi < B; ++bi) {
        int64_t t = time_index(s, d, step, bi);
        if (t < 0) continue;
        int64_t row = t * B + bi;
        C* a = pre.data() + row * G;
        C* gv = gate.data() + row * G;
        const C* xr = xw.data() + row * G;
        const C* hp = h.data() + bi * H;
        std::copy(hp, hp + H, hprev.data() + row * H);
        for (int64_t j = 0; j < 2 * H; ++j) {
          a[j] = acc[size_t(bi * G + j)] + xr[j];
          gv[j] = f.eval(a[j], s.clip);
        }
        for (int64_t j = 0; j < H; ++j) {
          if (lbr) {
            C lin = acc[size_t(bi * G + 2 * H + j)] + rbh[size_t(j)];
            aux[size_t(row * H + j)] = lin;
            a[2 * H + j] = xr[2 * H + j] + gv[H + j] * lin;
          } else {
            C rh = gv[H + j] * hp[j];
            reset_h[size_t(bi * H + j)] = rh;
            aux[size_t(row * H + j)] = rh;
          }
        }
      }
      if (!lbr) gemm_nn(reset_h.data(), B, H, H, rt.data() + 2 * H, H, G, acc.data() + 2 * H, G);
      for (int64_t bi = 0; bi < B; ++bi) {
        int64_t t = time_index(s, d, step, bi);
        if (t < 0) continue;
        int64_t row = t * B + bi;
        C* a = pre.data() + row * G;
        C* gv = gate.data() + row * G;
        C* hp = h.data() + bi * H;
        for (int64_t j = 0; j < H; ++j) {
          if (!lbr) a[2 * H + j] = acc[size_t(bi * G + 2 * H + j)] + xw[size_t(row * G + 2 * H + j)];
          gv[2 * H + j] = g.eval(a[2 * H + j], s.clip);
          hp[j] = (C(1) - gv[j]) * gv[2 * H + j] + gv[j] * hp[j];
        }
      }
    }
    // ---- backward through time
    std::vector<C> dh = initial_state<T>(ctx, 7, s, d, "dY_h");
    std::vector<C> daw(size_t(SB * G), C(0)), dar(size_t(SB * G), C(0));
    std::vector<C> dstep(size_t(B * G)), dpart(size_t(B * H)), dtmp(size_t(B * H));
    for (int64_t step = max_len - 1; step >= 0; --step) {
      std::fill(dstep.begin(), dstep.end(), C(0));
      for (int64_t bi = 0; bi < B; ++bi) {
        int64_t t = time_index(s, d, step, bi);
        if (t < 0) continue;
        int64_t row = t * B + bi;
        const C* a = pre.data() + row * G;
        const C* gv = gate.data() + row * G;
        const C* hp = hprev.data() + row * H;
        C* dw_row = daw.data() + row * G;
        C* dr_row = dar.data() + row * G;
        C* ds = dstep.data() + bi * G;
        const T* dyp = dy ? dy->data<T>() + y_offset(s, t, d, bi) : nullptr;
        for (int64_t j = 0; j < H; ++j) {
          C dH = dh[size_t(bi * H + j)] + (dyp ? C(dyp[j]) : C(0));
          C z = gv[j], hh = gv[2 * H + j];
          C daz = dH * (hp[j] - hh) * f.derivative(a[j], s.clip);
          C dah = dH * (C(1) - z) * g.derivative(a[2 * H + j], s.clip);
          dpart[size_t(bi * H + j)] = dH * z;
          dw_row[j] = dr_row[j] = ds[j] = daz;
          dw_row[2 * H + j] = dah;
          if (lbr) {
            C lin = aux[size_t(row * H + j)];
            C dr = dah * lin * f.derivative(a[H + j], s.clip);
            dw_row[H + j] = dr_row[H + j] = ds[H + j] = dr;
            dr_row[2 * H + j] = ds[2 * H + j] = dah * gv[H + j];  // dlin
          } else {
            dr_row[2 * H + j] = ds[2 * H + j] = dah;
          }
        }
      }
      if (lbr) {
        gemm_nn(dstep.data(), B, G, G, rd, H, H, dtmp.data(), H);  // [daz, dar, dlin]·R
      } else {
        gemm_nn(dstep.data() + 2 * H, B, H, G, rd + 2 * H * H, H, H, dtmp.data(), H);  // d(rt (.) Ht-1) = dah·Rh
        for (int64_t bi = 0; bi < B; ++bi) {
          int64_t t = time_index(s, d, step, bi);
          if (t < 0) continue;
          int64_t row = t * B + bi;
          const C* a = pre.data() + row * G;
          const C* gv = gate.data() + row * G;
          const C* hp = hprev.data() + row * H;
          for (int64_t j = 0; j < H; ++j) {
            C drh = dtmp[size_t(bi * H + j)];
            C dr = drh * hp[j] * f.derivative(a[H + j], s.clip);
            daw[size_t(row * G + H + j)] = dar[size_t(row * G + H + j)] = dstep[size_t(bi * G + H + j)] = dr;
            dpart[size_t(bi * H + j)] += drh * gv[H + j];
          }
        }
        gemm_nn(dstep.data(), B, 2 * H, G, rd, H, H, dtmp.data(), H);  // [daz, dar]·R[z,r]
      }
      for (int64_t bi = 0; bi < B; ++bi) {
        if (time_index(s, d, step, bi) < 0) continue;
        for (int64_t j = 0; j < H; ++j) dh[size_t(bi * H + j)] = dpart[size_t(bi * H + j)] + dtmp[size_t(bi * H + j)];
      }
    }
    out.input_projection(daw, x, wd, s, d, G);
    // The recurrent side differs from the input side in Rh (it reads rt (.) Ht-1, or Ht-1 inside rt)
    // and in the biases (Rbh apart from Wbh when linear_before_reset).
    if (out.dr.defined()) {
      std::vector<C> drm(size_t(G * H));
      std::vector<C> at = transposed(dar.data(), SB, G);  // [G, SB]
      gemm_nn(at.data(), 2 * H, SB, SB, hprev.data(), H, H, drm.data(), H);
      gemm_nn(at.data() + 2 * H * SB, H, SB, SB, lbr ? hprev.data() : aux.data(), H, H, drm.data() + 2 * H * H, H);
      store_range<T>(out.dr, d * G * H, drm);
    }
    if (out.db.defined()) {
      std::vector<C> db(size_t(2 * G));
      column_sums(daw.data(), SB, G, db.data());
      column_sums(dar.data(), SB, G, db.data() + G);
      store_range<T>(out.db, d * 2 * G, db);
    }
    out.initial_h(s, d, dh);
  }
  out.finish(s);
}

void gru_grad_kernel(KernelContext& ctx) {
  dispatch_float(ctx.input(0).dtype(), [&]<typename T>() { run_gru_grad<T>(ctx); });
}

void gru_gradient(GradientBuilder& g) { emit_rnn_gradient(g, "GRUGrad", 6, 1); }

void gru_kernel(KernelContext& ctx) {
  dispatch_float(ctx.input(0).dtype(), [&]<typename T>() { run_gru<T>(ctx); });
}

void gru_shape(ShapeContext& ctx) { rnn_shape_rule(ctx, 3, 1); }
void gru_grad_shape(ShapeContext& ctx) { rnn_grad_shape_rule(ctx, 3, 1); }

}  // namespace

// Gradient (BPTT, fused into onnxtrain.GRUGrad): walking t backwards with dH_t = dY_t + (carry
// from t+1), starting from dY_h:  dh = dH (.) (1 - zt),  dz = dH (.) (Ht-1 - ht),  dHt-1 = dH (.) zt + ...;
// through the activations: dah = dh (.) g'(ah), daz = dz (.) f'(az); for linear_before_reset = 0,
// d(rt (.) Ht-1) = dah·Rh, dRh += dah^T·(rt (.) Ht-1), dr = d(rt (.) Ht-1) (.) Ht-1 and
// dHt-1 += d(rt (.) Ht-1) (.) rt (with lbr != 0 the same through rt (.) (Ht-1·Rh^T + Rbh));
// dar = dr (.) f'(ar); then dW += da^T·Xt, dR[z,r] += da[z,r]^T·Ht-1, dXt = da·W,
// dHt-1 += da[z,r]·R[z,r], and the bias gradients are the batch sums of the matching da.
ONNXTRAIN_OP(GRU, kOnnxDomain, 7).inputs(3, 6).outputs(0, 2).shape(gru_shape).cpu(gru_kernel).gradient(gru_gradient);
// GRU-14 adds `layout`; same math and gradient.
ONNXTRAIN_OP(GRU, kOnnxDomain, 14).inputs(3, 6).outputs(0, 2).shape(gru_shape).cpu(gru_kernel).gradient(gru_gradient);
// GRUGrad(X, W, R, B?, sequence_lens?, initial_h?, dY?, dY_h?) -> dX, dW, dR, dB, dinitial_h, with
// GRU's attributes; recomputes the forward pass (rnn_common.h, "backpropagation through time").
ONNXTRAIN_OP(GRUGrad, kOnnxTrainDomain, 1).inputs(3, 8).outputs(1, 5).shape(gru_grad_shape).cpu(gru_grad_kernel)
    .gradient_not_implemented("second derivatives are not needed");

}  // namespace onnxtrain
