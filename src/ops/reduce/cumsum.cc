// CumSum along the axis given as a scalar input, with the exclusive and reverse attributes. The
// input is viewed as (outer, n, inner); for inner > 1 whole inner rows are added at a time.
#include "ops/gradient_builder.h"
#include "ops/common.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

template <typename T>
void cumsum_rows(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool exclusive, bool reverse) {
  using C = compute_t<T>;
  int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(n * inner, 1));
  parallel_for(outer, grain, [&](int64_t b, int64_t e) {
    std::vector<C> acc(static_cast<size_t>(inner));
    for (int64_t o = b; o < e; ++o) {
      const T* xo = x + o * n * inner;
      T* yo = y + o * n * inner;
      std::fill(acc.begin(), acc.end(), C(0));
      for (int64_t s = 0; s < n; ++s) {
        int64_t i = reverse ? n - 1 - s : s;
        const T* xr = xo + i * inner;
        T* yr = yo + i * inner;
        // Reads xr[j] before writing yr[j], so y may alias x.
        if (exclusive) {
          for (int64_t j = 0; j < inner; ++j) {
            C v = C(xr[j]);
            yr[j] = T(acc[size_t(j)]);
            acc[size_t(j)] += v;
          }
        } else {
          for (int64_t j = 0; j < inner; ++j) {
            acc[size_t(j)] += C(xr[j]);
            yr[j] = T(acc[size_t(j)]);
          }
        }
      }
    }
  });
}

void cumsum_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& a = ctx.input(1);
  const Node& node = ctx.node();
  OT_CHECK(a.numel() == 1 && (a.dtype() == DType::kInt64 || a.dtype() == DType::kInt32), node.context(),
           "expected a scalar int32/int64 axis, got ", dtype_name(a.dtype()), " of shape ", shape_str(a.shape()));
  OT_CHECK(x.rank() > 0, node.context(), "expected an input of rank >= 1, got a scalar");
  int64_t axis = normalize_axis(node, a.item_as_int(0), x.rank());
  bool exclusive = node.attr_int("exclusive", 0) != 0, reverse = node.attr_int("reverse", 0) != 0;
  Tensor& y = ctx.output(0, x.dtype(), x.shape());
  if (x.numel() == 0) return;
  int64_t outer = 1, inner = 1, n = x.dim(int(axis));
  for (int64_t d = 0; d < axis; ++d) outer *= x.dim(int(d));
  for (int64_t d = axis + 1; d < x.rank(); ++d) inner *= x.dim(int(d));
  dispatch_numeric(x.dtype(), [&]<typename T>() {
    cumsum_rows<T>(x.data<T>(), y.data<T>(), outer, n, inner, exclusive, reverse);
  });
}

}  // namespace

// y = cumsum(x, axis).  dx = cumsum(dy, axis, reverse = !reverse) (same exclusive)
ONNXTRAIN_OP(CumSum, kOnnxDomain, 11).inputs(2).outputs(1).shape(shape_same_as_input).inplace(0, 0)
    .cpu(cumsum_kernel).gradient([](GradientBuilder& g) {
      const Node& n = g.node();
      GraphBuilder::Attrs attrs{{"exclusive", Attribute::of(n.attr_int("exclusive", 0) != 0 ? int64_t(1) : int64_t(0))},
                                {"reverse", Attribute::of(n.attr_int("reverse", 0) != 0 ? int64_t(0) : int64_t(1))}};
      g.set(0, g.emit("CumSum", {g.dy(0), g.x(1)}, attrs));
    });

}  // namespace onnxtrain
