// Helpers shared by the normalisation ops: per-channel or broadcast parameter vectors read once
// per call in the compute type.
#pragma once

#include <vector>

#include "ops/common.h"

namespace onnxtrain {

// The values of t broadcast (unidirectionally, numpy rules) to `target`, flattened, as C.
template <typename C>
std::vector<C> broadcast_param(const Node& node, const Tensor& t, const Shape& target, const char* what) {
  OT_CHECK(is_floating(t.dtype()), node.context(), what, " must be a floating-point tensor, got ",
           dtype_name(t.dtype()));
  OT_CHECK(t.rank() <= int(target.size()), node.context(), what, " of shape ", shape_str(t.shape()),
           " cannot broadcast to ", shape_str(target));
  size_t off = target.size() - size_t(t.rank());
  for (int d = 0; d < t.rank(); ++d)
    OT_CHECK(t.dim(d) == 1 || t.dim(d) == target[off + size_t(d)], node.context(), what, " of shape ",
             shape_str(t.shape()), " cannot broadcast to ", shape_str(target));
  int64_t n = numel(target);
  std::vector<C> out(static_cast<size_t>(n));
  dispatch_float(t.dtype(), [&]<typename P>() {
    const P* p = t.data<P>();
    if (t.numel() == n) {
      for (int64_t i = 0; i < n; ++i) out[size_t(i)] = C(compute_t<P>(p[i]));
      return;
    }
    std::vector<int64_t> st(target.size(), 0);
    int64_t acc = 1;
    for (int d = t.rank() - 1; d >= 0; --d) {
      st[off + size_t(d)] = t.dim(d) == 1 ? 0 : acc;
      acc *= t.dim(d);
    }
    for (int64_t i = 0; i < n; ++i) {
      int64_t rem = i, src = 0;
      for (size_t d = target.size(); d-- > 0;) {
        src += (rem % target[d]) * st[d];
        rem /= target[d];
      }
      out[size_t(i)] = C(compute_t<P>(p[src]));
    }
  });
  return out;
}

// A per-channel parameter of exactly `c` elements, as C.
template <typename C>
std::vector<C> channel_param(const Node& node, const Tensor& t, int64_t c, const char* what) {
  OT_CHECK(t.numel() == c && t.rank() <= 1, node.context(), what, " must have shape [", c, "], got ",
           shape_str(t.shape()));
  return broadcast_param<C>(node, t, Shape{c}, what);
}

}  // namespace onnxtrain
