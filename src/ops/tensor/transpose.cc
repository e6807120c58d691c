// Transpose and the ops that are a transpose of a reshaped view: DepthToSpace, SpaceToDepth.
//
// permute() first simplifies the problem: size-1 dims are dropped and input dims that stay
// adjacent in the output are merged, so e.g. [B, S, H, D] -> [B, H, S, D] becomes a 3-D permute
// with a contiguous inner run of D elements (memcpy per run). When the innermost input dim moves,
// the copy is tiled over (that dim, the output's last dim) so both reads and writes stay in cache.
#include <algorithm>
#include <numeric>

#include "ops/gradient_builder.h"
#include "ops/tensor/tensor_ops.h"

namespace onnxtrain {
namespace tensor_ops {
namespace {

constexpr int64_t kTile = 32;

template <typename T>
void tiled_permute(const T* in, T* out, const Shape& out_shape, const std::vector<int64_t>& in_str_of_out) {
  const size_t m = out_shape.size();
  std::vector<int64_t> os = strides_of(out_shape);
  const size_t L = m - 1;
  size_t q = 0;
  for (size_t k = 0; k < m; ++k)
    if (in_str_of_out[k] == 1) q = k;
  const int64_t nL = out_shape[L], nq = out_shape[q], isL = in_str_of_out[L], osq = os[q];
  std::vector<size_t> outer_dims;
  for (size_t k = 0; k < m; ++k)
    if (k != L && k != q) outer_dims.push_back(k);
  const int64_t outer = numel(out_shape) / (nL * nq);
  const int64_t qblocks = (nq + kTile - 1) / kTile;
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / (kTile * nL));
  parallel_for(outer * qblocks, grain, [&](int64_t b, int64_t e) {
    for (int64_t item = b; item < e; ++item) {
      int64_t o = item / qblocks, qb = item % qblocks;
      int64_t in_off = 0, out_off = 0, rem = o;
      for (size_t j = outer_dims.size(); j-- > 0;) {
        size_t k = outer_dims[j];
        int64_t i = rem % out_shape[k];
        rem /= out_shape[k];
        in_off += i * in_str_of_out[k];
        out_off += i * os[k];
      }
      const int64_t q0 = qb * kTile, q1 = std::min(nq, q0 + kTile);
      for (int64_t l0 = 0; l0 < nL; l0 += kTile) {
        const int64_t l1 = std::min(nL, l0 + kTile);
        for (int64_t i = q0; i < q1; ++i) {
          T* dst = out + out_off + i * osq;
          const T* src = in + in_off + i;
          for (int64_t j = l0; j < l1; ++j) dst[j] = src[j * isL];
        }
      }
    }
  });
}

}  // namespace

void permute(const Tensor& in, const Shape& in_shape, const std::vector<int64_t>& perm, Tensor& out) {
  const size_t r = in_shape.size();
  if (numel(in_shape) == 0) return;
  // Drop size-1 dims.
  std::vector<int64_t> keep(r, -1);
  Shape s1;
  for (size_t d = 0; d < r; ++d)
    if (in_shape[d] != 1) { keep[d] = int64_t(s1.size()); s1.push_back(in_shape[d]); }
  std::vector<int64_t> p1;
  for (size_t k = 0; k < r; ++k)
    if (keep[size_t(perm[k])] >= 0) p1.push_back(keep[size_t(perm[k])]);
  // Merge runs of input dims that stay adjacent and in order.
  std::vector<std::pair<int64_t, int64_t>> groups;  // [first, last] input dims, in output order
  for (int64_t d : p1) {
    if (!groups.empty() && d == groups.back().second + 1) groups.back().second = d;
    else groups.push_back({d, d});
  }
  const size_t m = groups.size();
  if (m <= 1) {
    copy_bytes(out.data(), in.data(), in.nbytes());
    return;
  }
  std::vector<size_t> order(m);
  std::iota(order.begin(), order.end(), size_t(0));
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return groups[a].first < groups[b].first; });
  std::vector<int64_t> in_dim_of_group(m);
  Shape in2(m);
  for (size_t j = 0; j < m; ++j) {
    auto [f, l] = groups[order[j]];
    int64_t n = 1;
    for (int64_t d = f; d <= l; ++d) n *= s1[size_t(d)];
    in2[j] = n;
    in_dim_of_group[order[j]] = int64_t(j);
  }
  std::vector<int64_t> is = strides_of(in2);
  Shape out_shape(m);
  std::vector<int64_t> st(m);
  for (size_t k = 0; k < m; ++k) {
    out_shape[k] = in2[size_t(in_dim_of_group[k])];
    st[k] = is[size_t(in_dim_of_group[k])];
  }
  if (st[m - 1] == 1) {  // the innermost input dim stays innermost: contiguous runs
    strided_copy(in, out, out_shape, st, 0);
    return;
  }
  dispatch_by_size(in.dtype(), [&]<typename T>() {
    tiled_permute<T>(static_cast<const T*>(in.data()), static_cast<T*>(out.data()), out_shape, st);
  });
}

}  // namespace tensor_ops

namespace {
using namespace tensor_ops;

std::vector<int64_t> transpose_perm(const Node& node, size_t rank) {
  std::vector<int64_t> perm = node.attr_ints("perm");
  if (!node.has_attr("perm")) {
    perm.resize(rank);
    for (size_t i = 0; i < rank; ++i) perm[i] = int64_t(rank - 1 - i);
  }
  OT_CHECK(perm.size() == rank, node.context(), "perm has ", perm.size(), " entries for an input of rank ", rank);
  std::vector<char> seen(rank, 0);
  for (auto& p : perm) {
    if (p < 0) p += int64_t(rank);
    OT_CHECK(p >= 0 && p < int64_t(rank) && !seen[size_t(p)], node.context(), "perm ", shape_str(node.attr_ints("perm")),
             " is not a permutation of 0..", rank - 1);
    seen[size_t(p)] = 1;
  }
  return perm;
}

void transpose_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  auto perm = transpose_perm(ctx.node(), size_t(x.rank()));
  Shape out_shape(perm.size());
  for (size_t k = 0; k < perm.size(); ++k) out_shape[k] = x.shape()[size_t(perm[k])];
  Tensor& out = ctx.output(0, x.dtype(), out_shape);
  permute(x, x.shape(), perm, out);
}

#if ONNXTRAIN_CUDA
// out dim k walks x's dim perm[k]: one strided copy, its reads at x's strides permuted.
void transpose_cuda(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (!copy_rank_fits(size_t(x.rank()))) return run_on_host(ctx, rank_too_high());
  auto perm = transpose_perm(ctx.node(), size_t(x.rank()));
  const std::vector<int64_t> in_strides = strides_of(x.shape());
  cuda::StridedCopy c;
  for (int64_t p : perm) {
    c.shape.push_back(x.shape()[size_t(p)]);
    c.src_strides.push_back(in_strides[size_t(p)]);
  }
  Tensor& out = ctx.output(0, x.dtype(), c.shape);
  strided_copy_cuda(ctx, x, out, std::move(c));
}
#endif

void transpose_rule(ShapeContext& ctx) {
  const auto& in = ctx.input_shape(0);
  if (!in) return ctx.set_output(0, ctx.input_dtype(0));
  auto perm = transpose_perm(ctx.node(), in->size());
  Shape out(perm.size());
  for (size_t k = 0; k < perm.size(); ++k) out[k] = (*in)[size_t(perm[k])];
  ctx.set_output(0, ctx.input_dtype(0), out);
}

// ---- DepthToSpace / SpaceToDepth ----

int64_t blocksize(const Node& node) {
  int64_t b = node.attr_int("blocksize", 0);
  OT_CHECK(b > 0, node.context(), "blocksize should be positive, got ", b);
  return b;
}

bool crd_mode(const Node& node) {
  std::string mode = node.attr_string("mode", "DCR");
  OT_CHECK(mode == "DCR" || mode == "CRD", node.context(), "mode should be DCR or CRD, got '", mode, "'");
  return mode == "CRD";
}

Shape depth_to_space_shape(const Node& node, const Shape& in) {
  OT_CHECK(in.size() == 4, node.context(), "input should be 4-D [N, C, H, W], got ", shape_str(in));
  int64_t b = blocksize(node);
  OT_CHECK(in[1] < 0 || in[1] % (b * b) == 0, node.context(), "channels ", in[1], " are not divisible by blocksize^2 = ", b * b);
  auto mul = [](int64_t v, int64_t f) { return v < 0 ? v : v * f; };
  return {in[0], in[1] < 0 ? -1 : in[1] / (b * b), mul(in[2], b), mul(in[3], b)};
}

void depth_to_space_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Shape out_shape = depth_to_space_shape(ctx.node(), x.shape());
  int64_t b = blocksize(ctx.node()), n = x.dim(0), c = out_shape[1], h = x.dim(2), w = x.dim(3);
  Tensor& out = ctx.output(0, x.dtype(), out_shape);
  if (crd_mode(ctx.node())) permute(x, {n, c, b, b, h, w}, {0, 1, 4, 2, 5, 3}, out);
  else permute(x, {n, b, b, c, h, w}, {0, 3, 4, 1, 5, 2}, out);
}

Shape space_to_depth_shape(const Node& node, const Shape& in) {
  OT_CHECK(in.size() == 4, node.context(), "input should be 4-D [N, C, H, W], got ", shape_str(in));
  int64_t b = blocksize(node);
  for (int d = 2; d < 4; ++d)
    OT_CHECK(in[size_t(d)] < 0 || in[size_t(d)] % b == 0, node.context(), "spatial dims of ", shape_str(in),
             " are not divisible by blocksize ", b);
  return {in[0], in[1] < 0 ? -1 : in[1] * b * b, in[2] < 0 ? -1 : in[2] / b, in[3] < 0 ? -1 : in[3] / b};
}

void space_to_depth_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Shape out_shape = space_to_depth_shape(ctx.node(), x.shape());
  int64_t b = blocksize(ctx.node()), n = x.dim(0), c = x.dim(1), h = out_shape[2], w = out_shape[3];
  Tensor& out = ctx.output(0, x.dtype(), out_shape);
  permute(x, {n, c, h, b, w, b}, {0, 3, 5, 1, 2, 4}, out);
}

template <Shape (*F)(const Node&, const Shape&)>
void block_rule(ShapeContext& ctx) {
  const auto& in = ctx.input_shape(0);
  if (!in) return ctx.set_output(0, ctx.input_dtype(0));
  ctx.set_output(0, ctx.input_dtype(0), F(ctx.node(), *in));
}

void transpose_gradient(GradientBuilder& g) {
  const Node& node = g.node();
  if (!node.has_attr("perm")) return g.set(0, g.emit("Transpose", {g.dy(0)}));  // reversal is its own inverse
  auto perm = transpose_perm(node, node.attr_ints("perm").size());
  std::vector<int64_t> inverse(perm.size());
  for (size_t k = 0; k < perm.size(); ++k) inverse[size_t(perm[k])] = int64_t(k);
  g.set(0, g.transpose(g.dy(0), inverse));
}

void depth_to_space_gradient(GradientBuilder& g) {
  int64_t b = blocksize(g.node());
  GraphBuilder::Attrs attrs{{"blocksize", Attribute::of(b)}};
  if (!crd_mode(g.node())) return g.set(0, g.emit("SpaceToDepth", {g.dy(0)}, attrs));  // DCR: the exact inverse
  // CRD: view dy [n, c, h*b, w*b] as [n, c, h, b, w, b], undo the permutation, flatten to x's shape.
  std::string view = g.emit("Concat", {dim_of(g, g.x(0), 0), g.ints({-1}), dim_of(g, g.x(0), 2), g.ints({b}),
                                       dim_of(g, g.x(0), 3), g.ints({b})}, {{"axis", Attribute::of(int64_t(0))}});
  std::string t = g.transpose(g.reshape(g.dy(0), view), {0, 1, 3, 5, 2, 4});
  g.set(0, reshape_like(g, t, g.x(0)));
}

}  // namespace

// y = transpose(x, p).  dx = transpose(dy, inverse(p))
ONNXTRAIN_OP(Transpose, kOnnxDomain, 1).inputs(1).outputs(1).shape(transpose_rule).cpu(transpose_kernel).work(memory_bound_work)
    .cuda(OT_CUDA(transpose_cuda)).gradient(transpose_gradient);
// y = depth_to_space(x, b).  DCR: dx = space_to_depth(dy, b); CRD: dx = reshape(transpose(view6(dy), [0,1,3,5,2,4]))
ONNXTRAIN_OP(DepthToSpace, kOnnxDomain, 1).inputs(1).outputs(1).shape(block_rule<depth_to_space_shape>)
    .cpu(depth_to_space_kernel).gradient(depth_to_space_gradient);
// y = space_to_depth(x, b).  dx = depth_to_space(dy, b, DCR) (the exact inverse permutation)
ONNXTRAIN_OP(SpaceToDepth, kOnnxDomain, 1).inputs(1).outputs(1).shape(block_rule<space_to_depth_shape>)
    .cpu(space_to_depth_kernel).gradient([](GradientBuilder& g) {
      g.set(0, g.emit("DepthToSpace", {g.dy(0)},
                      {{"blocksize", Attribute::of(blocksize(g.node()))}, {"mode", Attribute::of(std::string("DCR"))}}));
    });

}  // namespace onnxtrain
