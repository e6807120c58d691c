// Trilu (keep the upper or lower triangle of the last two dims) and ReverseSequence.
#include <algorithm>

#include "ops/gradient_builder.h"
#include "ops/tensor/tensor_ops.h"

namespace onnxtrain {
namespace {
using namespace tensor_ops;

// y = triu/tril(x, k): row i keeps columns j >= i + k (upper) or j <= i + k (lower); the rest is 0
// (all-zero bytes are zero for every dtype).
void trilu_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  OT_CHECK(x.rank() >= 2, node.context(), "input should have rank >= 2, got shape ", shape_str(x.shape()));
  int64_t k = ctx.has_input(1) ? scalar_int_input(ctx, 1, "k") : 0;
  bool upper = node.attr_int("upper", 1) != 0;
  Tensor& out = ctx.output(0, x.dtype(), x.shape());
  if (out.numel() == 0) return;
  const int64_t n = x.dim(-2), m = x.dim(-1), rows = x.numel() / m;
  const size_t es = dtype_size(x.dtype());
  const char* src = static_cast<const char*>(x.data());
  char* dst = static_cast<char*>(out.data());
  int64_t grain = std::max<int64_t>(1, kElementwiseGrain / m);
  parallel_for(rows, grain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      int64_t i = r % n;
      // Columns [lo, hi) are kept.
      int64_t lo = upper ? std::clamp<int64_t>(i + k, 0, m) : 0;
      int64_t hi = upper ? m : std::clamp<int64_t>(i + k + 1, 0, m);
      char* o = dst + size_t(r * m) * es;
      const char* s = src + size_t(r * m) * es;
      if (lo > 0) std::memset(o, 0, size_t(lo) * es);
      if (hi > lo) copy_bytes(o + size_t(lo) * es, s + size_t(lo) * es, size_t(hi - lo) * es);
      if (hi < m) std::memset(o + size_t(std::max(hi, lo)) * es, 0, size_t(m - std::max(hi, lo)) * es);
    }
  });
}

void reverse_sequence_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  const Tensor& lens = ctx.input(1);
  OT_CHECK(x.rank() >= 2, node.context(), "input should have rank >= 2, got shape ", shape_str(x.shape()));
  int64_t time_axis = node.attr_int("time_axis", 0), batch_axis = node.attr_int("batch_axis", 1);
  OT_CHECK((time_axis == 0 && batch_axis == 1) || (time_axis == 1 && batch_axis == 0), node.context(),
           "time_axis and batch_axis should be 0 and 1 in some order, got ", time_axis, " and ", batch_axis);
  check_index_dtype(ctx, lens, "sequence_lens");
  const int64_t T = x.dim(int(time_axis)), B = x.dim(int(batch_axis)), inner = x.numel() / std::max<int64_t>(T * B, 1);
  OT_CHECK(lens.rank() == 1 && lens.dim(0) == B, node.context(), "sequence_lens should have shape [", B, "], got ",
           shape_str(lens.shape()));
  std::vector<int64_t> len = lens.to_int_vector();
  for (int64_t b = 0; b < B; ++b)
    OT_CHECK(len[size_t(b)] >= 0 && len[size_t(b)] <= T, node.context(), "sequence_lens[", b, "] = ", len[size_t(b)],
             " should be in [0, ", T, "]");
  Tensor& out = ctx.output(0, x.dtype(), x.shape());
  if (out.numel() == 0) return;
  const size_t es = dtype_size(x.dtype());
  const char* src = static_cast<const char*>(x.data());
  char* dst = static_cast<char*>(out.data());
  auto offset = [&](int64_t t, int64_t b) { return size_t((time_axis == 0 ? t * B + b : b * T + t) * inner) * es; };
  int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(inner, 1));
  parallel_for(T * B, grain, [&](int64_t s, int64_t e) {
    for (int64_t item = s; item < e; ++item) {
      int64_t t = item / B, b = item % B, l = len[size_t(b)];
      int64_t from = t < l ? l - 1 - t : t;
      copy_bytes(dst + offset(t, b), src + offset(from, b), size_t(inner) * es);
    }
  });
}

}  // namespace

// y = trilu(x, k).  dx = trilu(dy, k) (the same triangle)
ONNXTRAIN_OP(Trilu, kOnnxDomain, 14).inputs(1, 2).outputs(1).shape(shape_same_as_input).cpu(trilu_kernel)
    .gradient([](GradientBuilder& g) {
      std::vector<std::string> in{g.dy(0)};
      if (g.has_input(1)) in.push_back(g.x(1));
      g.set(0, g.emit("Trilu", in, g.node().attributes));
    });
// y = reverse_sequence(x, lens).  dx = reverse_sequence(dy, lens) (a permutation that is its own inverse)
ONNXTRAIN_OP(ReverseSequence, kOnnxDomain, 10).inputs(2).outputs(1).shape(shape_same_as_input)
    .cpu(reverse_sequence_kernel).gradient([](GradientBuilder& g) {
      g.set(0, g.emit("ReverseSequence", {g.dy(0), g.x(1)}, g.node().attributes));
    });

}  // namespace onnxtrain
