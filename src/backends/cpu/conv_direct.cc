#include "backends/cpu/conv_direct.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/cpu/thread_scratch.h"
#include "backends/cpu/vec.h"
#include "core/parallel.h"

namespace onnxtrain::cpu {
namespace {

using namespace vec;  // NOLINT: the kernels' one SIMD vocabulary (Vec, kLanes, load, store, splat)

// Register budget of a tile: MB output vectors by P positions (or Q weight rows) of accumulators,
// leaving room for the MB weight (or dY) vectors and a broadcast: MB = 4 where there are 32
// vector registers and more than 2 vectors of outputs, else 2 (a tile wider than the outputs
// computes zeros past them: the digits CNN's 32-channel passes ran 1.5-2x slower at MB = 4).
constexpr int kMaxMB = vec::kRegisters == 32 ? 4 : 2;
constexpr int kAccumulators = vec::kRegisters == 32 ? 24 : 12;

int tile_vectors(int64_t outs) { return (outs + kLanes - 1) / kLanes > 2 ? kMaxMB : 2; }

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

float* scratch(int slot, int64_t count) { return thread_scratch<ScratchUser::kConvolution>(slot, count); }

// Row-major strides of dims (for offset tables: never on a kernel's path).
OT_COLD std::vector<int64_t> strides_of(const std::vector<int64_t>& dims) {
  std::vector<int64_t> st(dims.size(), 1);
  for (size_t d = dims.size(); d-- > 1;) st[d - 1] = st[d] * dims[d];
  return st;
}

// Calls fn(index) for every index of dims, row-major.
template <typename Fn>
void for_each_index(const std::vector<int64_t>& dims, Fn&& fn) {
  std::vector<int64_t> idx(dims.size(), 0);
  for (int64_t v : dims)
    if (v <= 0) return;
  while (true) {
    fn(idx);
    size_t d = dims.size();
    while (d-- > 0) {
      if (++idx[d] < dims[d]) break;
      idx[d] = 0;
    }
    if (d == size_t(-1)) return;
  }
}

// A zero-padded copy of [channels, image dims...]: [channels, frame dims...], image element i at
// frame position top + i * spread along each axis (spread > 1: zeros between, the backward-data
// pass of a strided convolution); elements falling outside the frame are dropped (they would only
// meet padding).
struct Frame {
  std::vector<int64_t> dims, top, spread, image;
  int64_t plane = 0;
  // Per image row (every axis but the last, row-major): its offset in the frame, or -1 outside;
  // and the last axis' elements inside the frame, [first, last).
  std::vector<int64_t> row_at;
  int64_t first = 0, last = 0;

  OT_COLD Frame(std::vector<int64_t> frame_dims, std::vector<int64_t> origin, std::vector<int64_t> step,
                std::vector<int64_t> image_dims)
      : dims(std::move(frame_dims)), top(std::move(origin)), spread(std::move(step)), image(std::move(image_dims)) {
    plane = numel(dims);
    const size_t nd = dims.size();
    const std::vector<int64_t> fst = strides_of(dims);
    for_each_index(std::vector<int64_t>(image.begin(), image.end() - 1), [&](const std::vector<int64_t>& idx) {
      int64_t at = 0;
      for (size_t d = 0; d + 1 < nd; ++d) {
        const int64_t f = top[d] + idx[d] * spread[d];
        if (at < 0 || f < 0 || f >= dims[d]) at = -1;
        else at += f * fst[d];
      }
      row_at.push_back(at);
    });
    const int64_t len = image[nd - 1], t = top[nd - 1], sp = spread[nd - 1];
    last = len;
    while (first < len && t + first * sp < 0) ++first;
    while (last > first && t + (last - 1) * sp >= dims[nd - 1]) --last;
  }

  void fill(const float* img, int64_t channels, float* out) const {
    const int64_t len = image.back(), t = top.back(), sp = spread.back(), rows = int64_t(row_at.size());
    for (int64_t c = 0; c < channels; ++c) {
      float* dst = out + c * plane;
      std::memset(dst, 0, sizeof(float) * size_t(plane));
      if (last <= first) continue;
      const float* src = img + c * rows * len;
      for (int64_t r = 0; r < rows; ++r) {
        if (row_at[size_t(r)] < 0) continue;
        const float* in = src + r * len;
        float* o = dst + row_at[size_t(r)] + t;
        if (sp == 1) std::memcpy(o + first, in + first, sizeof(float) * size_t(last - first));
        else
          for (int64_t i = first; i < last; ++i) o[i * sp] = in[i];
      }
    }
  }
};

// What the register-tiled kernel computes for one image (conv_direct.h):
//   out[o][p] = sum over i < ins, then t < taps of wt[(i * taps + t) * ldw + o] * src[i * plane + pos[p] + tap[t]]
// plus bias[o]; out is [outs][positions].
struct DirectPlan {
  int64_t ins = 0, outs = 0, taps = 0, plane = 0, positions = 0;
  int mb = 2;       // output vectors per tile (tile_vectors); positions per tile: kAccumulators / mb
  int64_t ldw = 0;  // outs rounded up to whole tiles (wt's extra columns are zeros)
  std::vector<int64_t> tap, pos;  // pos: rounded up to whole tiles, repeating a valid offset

  void finish() {
    mb = tile_vectors(outs);
    ldw = round_up(outs, int64_t(mb) * kLanes);
    pos.resize(size_t(round_up(positions, kAccumulators / mb)), pos.empty() ? 0 : pos[0]);
  }
};

// noclone: one copy per MB, not one more per constant argument (the minimal build's size).
template <int MB>
OT_NOCLONE void direct_tiles(const DirectPlan& d, const float* src, const float* wt, const float* bias,
                             float* out) {
  constexpr int P = kAccumulators / MB;
  alignas(64) float tile[P][MB * kLanes];
  for (int64_t o0 = 0; o0 < d.outs; o0 += MB * kLanes) {
    const int64_t o_valid = std::min<int64_t>(MB * kLanes, d.outs - o0);
    for (int64_t p0 = 0; p0 < d.positions; p0 += P) {
      Vec acc[P][MB];
      for (int r = 0; r < P; ++r)
        for (int v = 0; v < MB; ++v) acc[r][v] = Vec{};
      int64_t at[P];
      for (int r = 0; r < P; ++r) at[r] = d.pos[size_t(p0 + r)];
      const float* w = wt + o0;
      for (int64_t i = 0; i < d.ins; ++i) {
        const float* s = src + i * d.plane;
        for (int64_t t = 0; t < d.taps; ++t, w += d.ldw) {
          const float* st = s + d.tap[size_t(t)];
          Vec wv[MB];
          for (int v = 0; v < MB; ++v) wv[v] = load(w + v * kLanes);
          for (int r = 0; r < P; ++r) {
            const Vec x = splat(st[at[r]]);
            for (int v = 0; v < MB; ++v) acc[r][v] += x * wv[v];
          }
        }
      }
      for (int r = 0; r < P; ++r)
        for (int v = 0; v < MB; ++v) store(&tile[r][v * kLanes], acc[r][v]);
      const int64_t p_valid = std::min<int64_t>(P, d.positions - p0);
      for (int64_t o = 0; o < o_valid; ++o) {
        float* dst = out + (o0 + o) * d.positions + p0;
        const float b = bias ? bias[o0 + o] : 0.0f;
        for (int64_t r = 0; r < p_valid; ++r) dst[r] = tile[r][o] + b;
      }
    }
  }
}

void run_tiles(const DirectPlan& d, const float* src, const float* wt, const float* bias, float* out) {
  if (d.mb == kMaxMB) return direct_tiles<kMaxMB>(d, src, wt, bias, out);
  if constexpr (kMaxMB != 2) direct_tiles<2>(d, src, wt, bias, out);
}

// Offsets of every tap in a frame of dims `fdims`: tap k at sum over axes of k * dilation (or,
// mirrored, (kernel - 1 - k) * dilation for the backward-data pass) times the frame's stride.
OT_COLD std::vector<int64_t> tap_offsets(const ConvSpec& s, const std::vector<int64_t>& fdims, bool mirrored) {
  const std::vector<int64_t> fst = strides_of(fdims);
  std::vector<int64_t> taps;
  for_each_index(s.kernel, [&](const std::vector<int64_t>& k) {
    int64_t off = 0;
    for (size_t d = 0; d < k.size(); ++d) off += (mirrored ? s.kernel[d] - 1 - k[d] : k[d]) * s.dilation[d] * fst[d];
    taps.push_back(off);
  });
  return taps;
}

// Offsets of the grid `grid` in a frame of dims `fdims`, `step` apart along each axis.
OT_COLD std::vector<int64_t> grid_offsets(const std::vector<int64_t>& grid, const std::vector<int64_t>& step,
                                  const std::vector<int64_t>& fdims) {
  const std::vector<int64_t> fst = strides_of(fdims);
  std::vector<int64_t> pos;
  for_each_index(grid, [&](const std::vector<int64_t>& o) {
    int64_t off = 0;
    for (size_t d = 0; d < o.size(); ++d) off += o[d] * step[d] * fst[d];
    pos.push_back(off);
  });
  return pos;
}

std::vector<int64_t> spatial(const Shape& x) { return std::vector<int64_t>(x.begin() + 2, x.end()); }

// The forward pass's frame of X: every window inside it.
OT_COLD Frame input_frame(const ConvSpec& s) {
  std::vector<int64_t> dims;
  for (size_t d = 0; d < s.kernel.size(); ++d)
    dims.push_back((s.out[d] - 1) * s.stride[d] + (s.kernel[d] - 1) * s.dilation[d] + 1);
  return Frame(dims, s.pad_l, std::vector<int64_t>(s.kernel.size(), 1), spatial(s.x));
}

// dX[i][y] = sum over o, k of W[o][i][k] * dY[o][(y + pad - k dilation) / stride] where that divides:
// dY spread out by the stride at (kernel - 1) dilation - pad of a frame the kernel's reach larger
// than X, read at y + the mirrored tap.
OT_COLD Frame output_frame(const ConvSpec& s) {
  std::vector<int64_t> dims, top;
  for (size_t d = 0; d < s.kernel.size(); ++d) {
    const int64_t reach = (s.kernel[d] - 1) * s.dilation[d];
    dims.push_back(s.x[d + 2] + reach);
    top.push_back(reach - s.pad_l[d]);
  }
  return Frame(dims, top, s.stride, s.out);
}

}  // namespace

struct DirectConv::Impl {
  int64_t n = 0, groups = 1, c = 0, m = 0;  // c, m: per group
  Frame frame;
  DirectPlan plan;
  explicit Impl(const ConvSpec& s) : frame(input_frame(s)) {}
};

OT_COLD DirectConv::DirectConv(const ConvSpec& s) {
  auto* impl = new Impl(s);
  impl_.reset(impl);
  Impl& p = *impl;
  p.n = s.x[0], p.groups = s.group, p.c = s.x[1] / s.group, p.m = s.out_channels / s.group;
  p.plan.ins = p.c;
  p.plan.outs = p.m;
  p.plan.taps = numel(s.kernel);
  p.plan.plane = p.frame.plane;
  p.plan.positions = numel(s.out);
  p.plan.tap = tap_offsets(s, p.frame.dims, false);
  p.plan.pos = grid_offsets(s.out, s.stride, p.frame.dims);
  p.plan.finish();
}

DirectConv::DirectConv(DirectConv&&) noexcept = default;
DirectConv& DirectConv::operator=(DirectConv&&) noexcept = default;
DirectConv::~DirectConv() = default;


namespace {

// Per group g: wt[g][(i * taps + t) * ldw + o] = W[g * outs + o][i][t] (`transposed_io`: W[g * ins
// + i][o][t], the backward-data pass's reading of a conv's weights), zeros past outs.
float* pack_weights(const DirectPlan& d, int64_t groups, const float* w, bool transposed_io) {
  const int64_t per_group = d.ins * d.taps * d.ldw;
  float* wt = scratch(0, groups * per_group);
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t i = 0; i < d.ins; ++i)
      for (int64_t t = 0; t < d.taps; ++t) {
        float* row = wt + g * per_group + (i * d.taps + t) * d.ldw;
        for (int64_t o = 0; o < d.outs; ++o)
          row[o] = transposed_io ? w[((g * d.ins + i) * d.outs + o) * d.taps + t]
                                 : w[((g * d.outs + o) * d.ins + i) * d.taps + t];
        std::fill(row + d.outs, row + d.ldw, 0.0f);
      }
  return wt;
}

// Every image's frame, then each group's tiles, images split over the threads.
void run_images(const DirectPlan& d, const Frame& frame, int64_t n, int64_t groups, const float* src_images,
                int64_t src_image, const float* wt, const float* bias, float* out, int64_t out_image) {
  parallel_for(n, 1, [&](int64_t begin, int64_t end) {
    float* src = scratch(1, groups * d.ins * d.plane);
    for (int64_t j = begin; j < end; ++j) {
      frame.fill(src_images + j * src_image, groups * d.ins, src);
      for (int64_t g = 0; g < groups; ++g)
        run_tiles(d, src + g * d.ins * d.plane, wt + g * d.ins * d.taps * d.ldw, bias ? bias + g * d.outs : nullptr,
                     out + j * out_image + g * d.outs * d.positions);
    }
  });
}

}  // namespace

void DirectConv::run(const float* x, const float* w, const float* bias, float* y) const {
  const Impl& p = *impl_;
  const DirectPlan& d = p.plan;
  const float* wt = pack_weights(d, p.groups, w, false);
  run_images(d, p.frame, p.n, p.groups, x, p.groups * p.c * numel(p.frame.image), wt, bias, y,
             p.groups * p.m * d.positions);
}

namespace {

// dw_acc[q][o] (rows ldo apart) += sum over positions p of dyt[p][o] * src[qoff[q] + pos[p]], q < Q,
// o < MB vectors, for one image (src: its frame, dyt: its dY transposed to [p][o]).
template <int MB>
OT_NOCLONE void weight_tile(const float* src, const float* dyt, int64_t ldo, const int64_t* pos, int64_t positions,
                            const int64_t* qoff, float* dw_acc) {
  constexpr int Q = kAccumulators / MB;
  Vec acc[Q][MB];
  int64_t off[Q];
  for (int q = 0; q < Q; ++q) {
    off[q] = qoff[q];
    for (int v = 0; v < MB; ++v) acc[q][v] = load(dw_acc + q * ldo + v * kLanes);
  }
  for (int64_t p = 0; p < positions; ++p) {
    const float* s = src + pos[p];
    Vec dv[MB];
    for (int v = 0; v < MB; ++v) dv[v] = load(dyt + p * ldo + v * kLanes);
    for (int q = 0; q < Q; ++q) {
      const Vec x = splat(s[off[q]]);
      for (int v = 0; v < MB; ++v) acc[q][v] += x * dv[v];
    }
  }
  for (int q = 0; q < Q; ++q)
    for (int v = 0; v < MB; ++v) store(dw_acc + q * ldo + v * kLanes, acc[q][v]);
}

}  // namespace

struct DirectConvBackward::Impl {
  bool need_dx = false, need_dw = false;
  int64_t n = 0, groups = 1, c = 0, m = 0, taps = 0, x_size = 0, y_size = 0;  // c, m: per group
  // dW: X's frame, the window origins and, per (i, t) row q (rounded up to whole tiles), its offset.
  Frame x_frame;
  std::vector<int64_t> pos, qoff;
  int mb = 2;                 // output vectors per tile (tile_vectors)
  int64_t ldo = 0, rows = 0;  // M / G rounded up to whole tiles; C / G * taps rounded up to whole tiles
  // dX: the stride-1 convolution of dY's spread frame with mirrored taps.
  Frame dy_frame;
  DirectPlan dx_plan;
  explicit Impl(const ConvSpec& s) : x_frame(input_frame(s)), dy_frame(output_frame(s)) {}
};

OT_COLD DirectConvBackward::DirectConvBackward(const ConvSpec& s, bool need_dx, bool need_dw) {
  auto* impl = new Impl(s);
  impl_.reset(impl);
  Impl& p = *impl;
  p.need_dx = need_dx, p.need_dw = need_dw;
  p.n = s.x[0], p.groups = s.group, p.c = s.x[1] / s.group, p.m = s.out_channels / s.group;
  p.taps = numel(s.kernel);
  p.x_size = numel(spatial(s.x));
  p.y_size = numel(s.out);
  if (need_dw) {
    p.pos = grid_offsets(s.out, s.stride, p.x_frame.dims);
    p.mb = tile_vectors(p.m);
    p.ldo = round_up(p.m, int64_t(p.mb) * kLanes);
    p.rows = round_up(p.c * p.taps, kAccumulators / p.mb);
    const std::vector<int64_t> tap = tap_offsets(s, p.x_frame.dims, false);
    p.qoff.assign(size_t(p.rows), 0);  // rows past C/G * taps read offset 0 and are dropped
    for (int64_t q = 0; q < p.c * p.taps; ++q) p.qoff[size_t(q)] = (q / p.taps) * p.x_frame.plane + tap[size_t(q % p.taps)];
  }
  if (need_dx) {
    DirectPlan& d = p.dx_plan;
    d.ins = p.m;
    d.outs = p.c;
    d.taps = p.taps;
    d.plane = p.dy_frame.plane;
    d.positions = p.x_size;
    d.tap = tap_offsets(s, p.dy_frame.dims, true);
    d.pos = grid_offsets(spatial(s.x), std::vector<int64_t>(s.kernel.size(), 1), p.dy_frame.dims);
    d.finish();
  }
}

DirectConvBackward::DirectConvBackward(DirectConvBackward&&) noexcept = default;
DirectConvBackward& DirectConvBackward::operator=(DirectConvBackward&&) noexcept = default;
DirectConvBackward::~DirectConvBackward() = default;


void DirectConvBackward::run(const float* dy, const float* x, const float* w, float* dx, float* dw, float* db) const {
  const Impl& p = *impl_;
  const int64_t x_image = p.groups * p.c * p.x_size, y_image = p.groups * p.m * p.y_size;
  if (p.need_dx) {
    const DirectPlan& d = p.dx_plan;
    const float* wt = pack_weights(d, p.groups, w, true);
    run_images(d, p.dy_frame, p.n, p.groups, dy, y_image, wt, nullptr, dx, x_image);
  }
  if (!p.need_dw) return;
  // Accumulated as [g][q][o] over images, then transposed into dW [g o][q]. Tiles (a group, a
  // block of M/G, a block of q) are split over the threads; each thread walks every image for its
  // tiles, so a gradient's sum runs over (image, position) in order whatever the thread count.
  const int64_t q_tile = kAccumulators / p.mb, o_tile = int64_t(p.mb) * kLanes;
  const int64_t q_tiles = p.rows / q_tile, o_tiles = p.ldo / o_tile, group_acc = p.rows * p.ldo;
  float* acc = scratch(2, p.groups * group_acc);
  std::fill(acc, acc + p.groups * group_acc, 0.0f);
  const int64_t tiles = p.groups * q_tiles * o_tiles;
  parallel_for(tiles, std::max<int64_t>(1, tiles / std::max(1, num_threads())), [&](int64_t begin, int64_t end) {
    float* src = scratch(1, p.groups * p.c * p.x_frame.plane);
    float* dyt = scratch(0, p.y_size * p.ldo);
    for (int64_t j = 0; j < p.n; ++j) {
      p.x_frame.fill(x + j * x_image, p.groups * p.c, src);
      int64_t dyt_group = -1;  // the group dyt holds
      for (int64_t t = begin; t < end; ++t) {
        const int64_t g = t / (q_tiles * o_tiles), r = t % (q_tiles * o_tiles);
        const int64_t q0 = (r / o_tiles) * q_tile, o0 = (r % o_tiles) * o_tile;
        if (g != dyt_group) {  // dY of image j, group g, as [p][o]
          const float* dyg = dy + j * y_image + g * p.m * p.y_size;
          for (int64_t q = 0; q < p.y_size; ++q) {
            float* row = dyt + q * p.ldo;
            for (int64_t o = 0; o < p.m; ++o) row[o] = dyg[o * p.y_size + q];
            std::fill(row + p.m, row + p.ldo, 0.0f);
          }
          dyt_group = g;
        }
        const float* frame = src + g * p.c * p.x_frame.plane;
        float* tile_acc = acc + g * group_acc + q0 * p.ldo + o0;
        if (p.mb == kMaxMB) weight_tile<kMaxMB>(frame, dyt + o0, p.ldo, p.pos.data(), p.y_size, p.qoff.data() + q0, tile_acc);
        else weight_tile<2>(frame, dyt + o0, p.ldo, p.pos.data(), p.y_size, p.qoff.data() + q0, tile_acc);
      }
    }
  });
  const int64_t q_count = p.c * p.taps;
  for (int64_t g = 0; g < p.groups; ++g)
    for (int64_t o = 0; o < p.m; ++o)
      for (int64_t q = 0; q < q_count; ++q) dw[(g * p.m + o) * q_count + q] = acc[g * group_acc + q * p.ldo + o];
  if (db) {
    for (int64_t o = 0; o < p.groups * p.m; ++o) {
      double sum = 0;
      for (int64_t j = 0; j < p.n; ++j) {
        const float* src = dy + j * y_image + o * p.y_size;
        for (int64_t q = 0; q < p.y_size; ++q) sum += src[q];
      }
      db[o] = float(sum);
    }
  }
}

}  // namespace onnxtrain::cpu
