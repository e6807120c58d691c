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

void rnn_kernel(KernelContext& ctx) {
  dispatch_float(ctx.input(0).dtype(), [&]<typename T>() { run_rnn<T>(ctx); });
}

void rnn_shape(ShapeContext& ctx) { rnn_shape_rule(ctx, 1, 1); }

}  // namespace

// Gradient (BPTT, not yet a rule): with a_t = Xt·W^T + Ht-1·R^T + Wb + Rb and Ht = f(a_t), walking
// t backwards with dH carried from later steps (dH_T = dY_h + dY_T):
//   da_t = (dY_t + dH_t) * f'(a_t);  dW += da_t^T·Xt;  dR += da_t^T·Ht-1;  dWb = dRb += sum_b da_t;
//   dXt = da_t·W;  dH_{t-1} = da_t·R;  d(initial_h) = dH_0.  Clipped entries pass no gradient.
ONNXTRAIN_OP(RNN, kOnnxDomain, 7).inputs(3, 6).outputs(0, 2).shape(rnn_shape).cpu(rnn_kernel);
// RNN-14 adds `layout` (batch-major X, Y, Y_h); the gradient is the same, in the other layout.
ONNXTRAIN_OP(RNN, kOnnxDomain, 14).inputs(3, 6).outputs(0, 2).shape(rnn_shape).cpu(rnn_kernel);

}  // namespace onnxtrain
