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

template <typename T>
void run_lstm(KernelContext& ctx) {
  using C = compute_t<T>;
  const Node& node = ctx.node();
  RnnSetup s = parse_setup(ctx, 4);
  std::vector<Activation> acts = parse_activations(node, {"Sigmoid", "Tanh", "Tanh"}, s.dirs);
  const bool input_forget = node.attr_int("input_forget", 0) != 0;
  const DType dt = ctx.input(0).dtype();
  const int64_t H = s.hidden, G = 4 * H;

  std::vector<C> x = time_major_input<T>(ctx.input(0), s);
  std::vector<C> w = to_compute<T>(ctx.input(1));
  std::vector<C> r = to_compute<T>(ctx.input(2));
  std::vector<C> b = ctx.has_input(3) ? to_compute<T>(ctx.input(3)) : std::vector<C>();
  std::vector<C> p;
  if (ctx.has_input(7)) {
    const Tensor& pt = ctx.input(7);
    OT_CHECK(pt.dtype() == dt && pt.shape() == (Shape{s.dirs, 3 * H}), node.context(), "expected P of shape ",
             shape_str({s.dirs, 3 * H}), " and dtype ", dtype_name(dt), ", got ", shape_str(pt.shape()), " ",
             dtype_name(pt.dtype()));
    p = to_compute<T>(pt);
  }

  Tensor y = optional_output(ctx, 0, dt, y_shape(s));
  Tensor yh = optional_output(ctx, 1, dt, state_shape(s));
  Tensor yc = optional_output(ctx, 2, dt, state_shape(s));
  if (y.defined()) zero_fill<T>(y);

  int64_t max_len = s.batch ? *std::max_element(s.lens.begin(), s.lens.end()) : 0;
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
    std::vector<C> rt = transposed(r.data() + d * G * H, G, H);  // R^T: [H, 4H]
    const C* pi = p.empty() ? nullptr : p.data() + d * 3 * H;
    const C* po = pi ? pi + H : nullptr;
    const C* pf = pi ? pi + 2 * H : nullptr;
    std::vector<C> h = initial_state<T>(ctx, 5, s, d, "initial_h");
    std::vector<C> c = initial_state<T>(ctx, 6, s, d, "initial_c");
    std::vector<C> acc(size_t(s.batch * G));
    for (int64_t step = 0; step < max_len; ++step) {
      gemm_nn(h.data(), s.batch, H, H, rt.data(), G, G, acc.data(), G);  // Ht-1 · R^T, all four gates
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

void lstm_kernel(KernelContext& ctx) {
  dispatch_float(ctx.input(0).dtype(), [&]<typename T>() { run_lstm<T>(ctx); });
}

void lstm_shape(ShapeContext& ctx) { rnn_shape_rule(ctx, 4, 2); }

}  // namespace

// Gradient (BPTT, not yet a rule): walking t backwards with dH = dY_t + (carry from t+1) and dC
// carried likewise (starting from dY_h, dY_c):
//   do = dH (.) h(Ct);  dC += dH (.) ot (.) h'(Ct);  (peephole: dC += dao (.) Po after dao)
//   dao = do (.) f'(ao);  di = dC (.) ct;  dc = dC (.) it;  df = dC (.) Ct-1;
//   dai = di (.) f'(ai);  daf = df (.) f'(af);  dac = dc (.) g'(ac);
//   dCt-1 = dC (.) ft + dai (.) Pi + daf (.) Pf;  dP[i,o,f] += batch sums of da[i,o,f] (.) C;
//   dW += da^T·Xt;  dR += da^T·Ht-1;  dXt = da·W;  dHt-1 = da·R;  dWb = dRb = batch sums of da.
// With input_forget, df flows into it as -df. Clipped pre-activations pass no gradient.
ONNXTRAIN_OP(LSTM, kOnnxDomain, 7).inputs(3, 8).outputs(0, 3).shape(lstm_shape).cpu(lstm_kernel);
// LSTM-14 adds `layout`; same math and gradient.
ONNXTRAIN_OP(LSTM, kOnnxDomain, 14).inputs(3, 8).outputs(0, 3).shape(lstm_shape).cpu(lstm_kernel);

}  // namespace onnxtrain
