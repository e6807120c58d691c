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
  const Node& node = ctx.node();
  RnnSetup s = parse_setup(ctx, 3);
  std::vector<Activation> acts = parse_activations(node, {"Sigmoid", "Tanh"}, s.dirs);
  const bool lbr = node.attr_int("linear_before_reset", 0) != 0;
  const DType dt = ctx.input(0).dtype();
  const int64_t H = s.hidden, G = 3 * H;

  std::vector<C> x = time_major_input<T>(ctx.input(0), s);
  std::vector<C> w = to_compute<T>(ctx.input(1));
  std::vector<C> r = to_compute<T>(ctx.input(2));
  std::vector<C> b = ctx.has_input(3) ? to_compute<T>(ctx.input(3)) : std::vector<C>();

  Tensor y = optional_output(ctx, 0, dt, y_shape(s));
  Tensor yh = optional_output(ctx, 1, dt, state_shape(s));
  if (y.defined()) zero_fill<T>(y);

  int64_t max_len = s.batch ? *std::max_element(s.lens.begin(), s.lens.end()) : 0;
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

void gru_kernel(KernelContext& ctx) {
  dispatch_float(ctx.input(0).dtype(), [&]<typename T>() { run_gru<T>(ctx); });
}

void gru_shape(ShapeContext& ctx) { rnn_shape_rule(ctx, 3, 1); }

}  // namespace

// Gradient (BPTT, not yet a rule): walking t backwards with dH_t = dY_t + (carry from t+1),
// starting from dY_h:  dh = dH (.) (1 - zt),  dz = dH (.) (Ht-1 - ht),  dHt-1 = dH (.) zt + ...;
// through the activations: dah = dh (.) g'(ah), daz = dz (.) f'(az); for linear_before_reset = 0,
// d(rt (.) Ht-1) = dah·Rh, dRh += dah^T·(rt (.) Ht-1), dr = d(rt (.) Ht-1) (.) Ht-1 and
// dHt-1 += d(rt (.) Ht-1) (.) rt (with lbr != 0 the same through rt (.) (Ht-1·Rh^T + Rbh));
// dar = dr (.) f'(ar); then dW += da^T·Xt, dR[z,r] += da[z,r]^T·Ht-1, dXt = da·W,
// dHt-1 += da[z,r]·R[z,r], and the bias gradients are the batch sums of the matching da.
ONNXTRAIN_OP(GRU, kOnnxDomain, 7).inputs(3, 6).outputs(0, 2).shape(gru_shape).cpu(gru_kernel);
// GRU-14 adds `layout`; same math and gradient.
ONNXTRAIN_OP(GRU, kOnnxDomain, 14).inputs(3, 6).outputs(0, 2).shape(gru_shape).cpu(gru_kernel);

}  // namespace onnxtrain
