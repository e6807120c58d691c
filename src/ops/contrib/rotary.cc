// com.microsoft.RotaryEmbedding(input, position_ids, cos_cache, sin_cache): rotary position embedding.
// input is [B, S, num_heads * head_size] or [B, num_heads, S, head_size]; position_ids is [B, S] or
// [1] (an offset: position = offset + s); the caches are [max_pos, rotary_dim / 2]. For each head,
// the first rotary_dim channels (default: head_size, read as 2 * cos_cache's width) rotate in pairs,
// (i, i + rotary_dim/2) or, with interleaved=1, (2i, 2i + 1):
//   x1' = x1 cos - x2 sin,  x2' = x2 cos + x1 sin;  the remaining channels pass through.
// The rotation is orthogonal, so the gradient is the inverse rotation: the same op with -sin.
#include "ops/contrib/contrib.h"
#include "ops/gradient_builder.h"
#include "ops/registry.h"

namespace onnxtrain {
namespace {

void rotary_kernel(KernelContext& ctx) {
  const Node& node = ctx.node();
  const Tensor& x = ctx.input(0);
  const Tensor& pos = ctx.input(1);
  const Tensor& cosc = ctx.input(2);
  const Tensor& sinc = ctx.input(3);
  OT_CHECK(node.attr_int("is_packed_batching", 0) == 0, node.context(), "is_packed_batching=1 is not supported");
  OT_CHECK(x.rank() == 3 || x.rank() == 4, node.context(), "expected input of rank 3 or 4, got ", shape_str(x.shape()));
  OT_CHECK(cosc.rank() == 2 && sinc.shape() == cosc.shape(), node.context(),
           "expected cos_cache and sin_cache of one shape [max_pos, rotary_dim / 2], got ", shape_str(cosc.shape()),
           " and ", shape_str(sinc.shape()));
  OT_CHECK(pos.dtype() == DType::kInt64, node.context(), "expected int64 position_ids, got ", dtype_name(pos.dtype()));
  const bool bnsh = x.rank() == 4;
  const int64_t B = x.dim(0), S = bnsh ? x.dim(2) : x.dim(1);
  const int64_t half = cosc.dim(1), max_pos = cosc.dim(0);
  int64_t rot = node.attr_int("rotary_embedding_dim", 0);
  int64_t heads = node.attr_int("num_heads", 0), head_size;
  if (bnsh) {
    heads = x.dim(1);
    head_size = x.dim(3);
  } else {
    if (heads <= 0) heads = x.dim(2) / std::max<int64_t>(rot > 0 ? rot : 2 * half, 1);
    OT_CHECK(heads > 0 && x.dim(2) % heads == 0, node.context(), "hidden size ", x.dim(2), " is not num_heads ", heads,
             " x head_size");
    head_size = x.dim(2) / heads;
  }
  if (rot <= 0) rot = head_size;
  OT_CHECK(rot == 2 * half && rot <= head_size, node.context(), "expected rotary_dim ", rot,
           " = 2 x cos_cache width ", half, " and <= head_size ", head_size);
  OT_CHECK(pos.numel() == 1 || (pos.rank() == 2 && pos.dim(0) == B && pos.dim(1) == S), node.context(),
           "expected position_ids of shape [1] or [", B, ", ", S, "], got ", shape_str(pos.shape()));
  const bool interleaved = node.attr_int("interleaved", 0) != 0;
  const int64_t* pp = pos.data<int64_t>();
  for (int64_t i = 0; i < (pos.numel() == 1 ? 1 : pos.numel()); ++i) {
    int64_t last = pp[i] + (pos.numel() == 1 ? S - 1 : 0);
    OT_CHECK(pp[i] >= 0 && last < max_pos, node.context(), "position ", last, " outside the caches' ", max_pos, " rows");
  }
  dispatch_f32_f64(node, x.dtype(), [&]<typename T>() {
    OT_CHECK(cosc.dtype() == x.dtype() && sinc.dtype() == x.dtype(), node.context(), "expected caches of the input's dtype");
    Tensor& y = ctx.output(0, x.dtype(), x.shape());
    const T *px = x.data<T>(), *pc = cosc.data<T>(), *ps = sinc.data<T>();
    T* py = y.data<T>();
    parallel_for(B * S * heads, 64, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        int64_t b = r / (S * heads), s = (r / heads) % S, h = r % heads;
        int64_t off = bnsh ? ((b * heads + h) * S + s) * head_size : (b * S + s) * heads * head_size + h * head_size;
        int64_t p = pos.numel() == 1 ? pp[0] + s : pp[b * S + s];
        const T *c = pc + p * half, *sn = ps + p * half, *xi = px + off;
        T* yo = py + off;
        for (int64_t i = 0; i < half; ++i) {
          int64_t i1 = interleaved ? 2 * i : i, i2 = interleaved ? 2 * i + 1 : i + half;
          T x1 = xi[i1], x2 = xi[i2];
          yo[i1] = x1 * c[i] - x2 * sn[i];
          yo[i2] = x2 * c[i] + x1 * sn[i];
        }
        for (int64_t i = rot; i < head_size; ++i) yo[i] = xi[i];
      }
    });
  });
}

// y = R(theta) x per pair.  dx = R(-theta) dy: the same op with sin negated
void rotary_gradient(GradientBuilder& g) {
  for (size_t i = 2; i <= 3; ++i)
    if (g.needs(i))
      OT_THROW(kNotImplemented, g.context(), "cos_cache/sin_cache are positional tables: no gradient (freeze them)");
  if (!g.needs(0)) return;
  g.set(0, g.emit("RotaryEmbedding", {g.dy(0), g.x(1), g.x(2), g.neg(g.x(3))}, g.node().attributes, kMsDomain));
}

}  // namespace

ONNXTRAIN_OP(RotaryEmbedding, kMsDomain, 1).inputs(4).outputs(1).shape(shape_same_as_input).cpu(rotary_kernel)
    .gradient(rotary_gradient);

}  // namespace onnxtrain
