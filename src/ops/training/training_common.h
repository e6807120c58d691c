// Shared pieces of the ai.onnx.preview.training update ops (Adam, Adagrad, Momentum): each takes
// inputs R (learning rate, float scalar), T (update count, int64 scalar), then `groups` lists of n
// tensors (X..., G..., and the optimizer states), and returns X_new... followed by the new states.
// The same update is applied to each of the n tensors independently.
#pragma once

#include <string>
#include <vector>

#include "ops/common.h"
#include "ops/registry.h"

namespace onnxtrain::training {

// n, the number of optimized tensors, from the input count; throws when it does not divide.
inline int64_t tensor_count(const Node& node, size_t num_inputs, int64_t groups) {
  int64_t rest = int64_t(num_inputs) - 2;
  OT_CHECK(rest > 0 && rest % groups == 0, node.context(), "expected R, T and ", groups,
           " equally long lists of tensors, got ", num_inputs, " inputs");
  return rest / groups;
}

// Output j of the update op holds input `2 + source_group[j / n] * n + j % n` in a new value.
inline void update_shape_rule(ShapeContext& ctx, int64_t groups, const std::vector<int64_t>& source_group) {
  int64_t rest = int64_t(ctx.num_inputs()) - 2;
  if (rest <= 0 || rest % groups != 0) return;  // the kernel reports the bad arity
  int64_t n = rest / groups;
  for (size_t j = 0; j < ctx.num_outputs(); ++j) {
    size_t g = size_t(int64_t(j) / n);
    if (g >= source_group.size()) break;
    size_t in = size_t(2 + source_group[g] * n + int64_t(j) % n);
    ctx.set_output(j, ctx.input_dtype(in), ctx.input_shape(in));
  }
}

// The scalar inputs R and T.
inline double learning_rate(const KernelContext& ctx) {
  const Tensor& r = ctx.input(0);
  OT_CHECK(is_floating(r.dtype()) && r.numel() == 1, ctx.node().context(),
           "expected a floating-point scalar R (learning rate), got ", dtype_name(r.dtype()), " ",
           shape_str(r.shape()));
  return r.item_as_double(0);
}
inline int64_t update_count(const KernelContext& ctx) {
  const Tensor& t = ctx.input(1);
  OT_CHECK(is_integer(t.dtype()) && t.numel() == 1, ctx.node().context(),
           "expected an int64 scalar T (update count), got ", dtype_name(t.dtype()), " ", shape_str(t.shape()));
  return t.item_as_int(0);
}

inline float required_float(const Node& node, const std::string& name) {
  OT_CHECK(node.has_attr(name), node.context(), "missing required attribute '", name, "'");
  return node.attr_float(name, 0.0f);
}

// For tensor i of n: checks that every group's tensor matches X's dtype and shape, allocates the
// requested outputs (out_groups of them, X_new first) and hands the typed pointers to
// fn(count, in_ptrs, out_ptrs) with null for outputs the node omits.
template <size_t kIn, size_t kOut, typename F>
void for_each_update(KernelContext& ctx, int64_t n, F&& fn) {
  const Node& node = ctx.node();
  for (int64_t i = 0; i < n; ++i) {
    const Tensor& x = ctx.input(size_t(2 + i));
    std::array<const Tensor*, kIn> ins{};
    for (size_t g = 0; g < kIn; ++g) {
      ins[g] = &ctx.input(size_t(2 + int64_t(g) * n + i));
      OT_CHECK(ins[g]->dtype() == x.dtype() && ins[g]->shape() == x.shape(), node.context(), "input ",
               2 + int64_t(g) * n + i, " has dtype ", dtype_name(ins[g]->dtype()), " and shape ",
               shape_str(ins[g]->shape()), ", expected ", dtype_name(x.dtype()), " ", shape_str(x.shape()),
               " like the tensor it belongs to (input ", 2 + i, ")");
    }
    std::array<Tensor, kOut> outs;
    for (size_t g = 0; g < kOut; ++g) {
      size_t o = size_t(int64_t(g) * n + i);
      if (o < ctx.num_outputs() && ctx.output_requested(o)) outs[g] = ctx.output(o, x.dtype(), x.shape());
    }
    dispatch_float(x.dtype(), [&]<typename T>() {
      std::array<const T*, kIn> ip{};
      std::array<T*, kOut> op{};
      for (size_t g = 0; g < kIn; ++g) ip[g] = ins[g]->template data<T>();
      for (size_t g = 0; g < kOut; ++g) op[g] = outs[g].defined() ? outs[g].template data<T>() : nullptr;
      fn.template operator()<T>(x.numel(), ip, op);
    });
  }
}

}  // namespace onnxtrain::training
