#include "backends/cpu/conv_direct.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/cpu/thread_scratch.h"
#include "backends/cpu/vec.h"
#include "core/parallel.h"

namespace onnxtrain::cpu {
namespace {

using vec::kLanes;
using vec::load;
using vec::splat;
using vec::store;
using vec::Vec;

// Register budget of a tile: MB output vectors by P positions (or Q weight rows) of accumulators,
// leaving room for the MB weight (or dY) vectors and a broadcast: MB = 4 where there are 32
// vector registers, 2 where there are 16. One MB per target (one instantiation per kernel keeps
// the minimal build small); a tile wider than the outputs computes zeros past them.
constexpr int kMB = vec::kRegisters == 32 ? 4 : 2;
constexpr int kAccumulators = vec::kRegisters == 32 ? 24 : 12;

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

float* scratch(int slot, int64_t count) { return thread_scratch<ScratchUser::kDirectConvolution>(slot, count); }

// A zero-padded copy of a [channels, h, w] image: [channels, fh, fw] with the image's (0, 0) at
// (top, left) (negative: the image's first rows/columns fall outside and are dropped).
struct Frame {
  int64_t h = 0, w = 0, top = 0, left = 0;
  int64_t plane() const { return h * w; }

  void fill(const float* img, int64_t channels, int64_t ih, int64_t iw, float* out) const {
    const int64_t c0 = std::max<int64_t>(0, -left), c1 = std::min<int64_t>(iw, w - left);
    const int64_t r0 = std::max<int64_t>(0, -top), r1 = std::min<int64_t>(ih, h - top);
    for (int64_t c = 0; c < channels; ++c) {
      float* dst = out + c * plane();
      std::memset(dst, 0, sizeof(float) * size_t(plane()));
      if (c1 <= c0) continue;
      for (int64_t r = r0; r < r1; ++r)
        std::memcpy(dst + (r + top) * w + c0 + left, img + (c * ih + r) * iw + c0, sizeof(float) * size_t(c1 - c0));
    }
  }
};

// What the register-tiled kernel computes for one image (conv_direct.h):
//   out[o][p] = sum over i < ins, then t < taps of wt[(i * taps + t) * ldw + o] * src[i * plane + pos[p] + tap[t]]
// plus bias[o]; out is [outs][positions].
struct DirectPlan {
  int64_t ins = 0, outs = 0, taps = 0, plane = 0, positions = 0;
  int64_t ldw = 0;  // outs rounded up to whole tiles (wt's extra columns are zeros)
  std::vector<int64_t> tap, pos;  // pos: rounded up to whole tiles, repeating a valid offset

  void finish() {
    ldw = round_up(outs, int64_t(kMB) * kLanes);
    pos.resize(size_t(round_up(positions, kAccumulators / kMB)), pos.empty() ? 0 : pos[0]);
  }
};

// noclone: one copy, not one more per constant argument (the minimal build's size).
__attribute__((noinline, noclone)) void direct_tiles(const DirectPlan& d, const float* src, const float* wt,
                                                     const float* bias, float* out) {
  constexpr int MB = kMB, P = kAccumulators / MB;
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

// Offsets of every tap in a frame `fw` wide: (a, b) at (a * dh) * fw + b * dw, or mirrored
// ((kh - 1 - a), (kw - 1 - b)) for the backward-data pass.
std::vector<int64_t> tap_offsets(const ConvSpec& s, int64_t fw, bool mirrored) {
  std::vector<int64_t> taps;
  for (int64_t a = 0; a < s.kernel[0]; ++a)
    for (int64_t b = 0; b < s.kernel[1]; ++b) {
      const int64_t ra = mirrored ? s.kernel[0] - 1 - a : a, rb = mirrored ? s.kernel[1] - 1 - b : b;
      taps.push_back(ra * s.dilation[0] * fw + rb * s.dilation[1]);
    }
  return taps;
}

// The forward pass's frame of X: every window inside it.
Frame input_frame(const ConvSpec& s) {
  Frame f;
  f.h = (s.out[0] - 1) * s.stride[0] + (s.kernel[0] - 1) * s.dilation[0] + 1;
  f.w = (s.out[1] - 1) * s.stride[1] + (s.kernel[1] - 1) * s.dilation[1] + 1;
  f.top = s.pad_l[0];
  f.left = s.pad_l[1];
  return f;
}

// Window origins of the output positions in X's frame.
std::vector<int64_t> window_offsets(const ConvSpec& s, const Frame& f) {
  std::vector<int64_t> pos;
  for (int64_t y = 0; y < s.out[0]; ++y)
    for (int64_t x = 0; x < s.out[1]; ++x) pos.push_back(y * s.stride[0] * f.w + x * s.stride[1]);
  return pos;
}

bool plain_2d(const ConvSpec& s) {
  return s.dtype == DType::kFloat32 && !s.transposed && s.group == 1 && s.x.size() == 4 && !s.x_channels_last &&
         !s.y_channels_last && s.x[1] > 0 && s.out[0] > 0 && s.out[1] > 0;
}

}  // namespace

struct DirectConv::Impl {
  int64_t n = 0, c = 0, m = 0, ih = 0, iw = 0;
  Frame frame;
  DirectPlan plan;
};

bool DirectConv::takes(const ConvSpec& s) { return plain_2d(s); }

DirectConv::DirectConv(const ConvSpec& s) {
  auto impl = std::make_shared<Impl>();
  Impl& p = *impl;
  p.n = s.x[0], p.c = s.x[1], p.m = s.out_channels, p.ih = s.x[2], p.iw = s.x[3];
  p.frame = input_frame(s);
  p.plan.ins = p.c;
  p.plan.outs = p.m;
  p.plan.taps = s.kernel[0] * s.kernel[1];
  p.plan.plane = p.frame.plane();
  p.plan.positions = s.out[0] * s.out[1];
  p.plan.tap = tap_offsets(s, p.frame.w, false);
  p.plan.pos = window_offsets(s, p.frame);
  p.plan.finish();
  impl_ = std::move(impl);
}

void DirectConv::run(const float* x, const float* w, const float* bias, float* y) const {
  const Impl& p = *impl_;
  const DirectPlan& d = p.plan;
  // wt[(i * taps + t) * ldw + o] = W[o][i][t], zeros past M.
  float* wt = scratch(0, d.ins * d.taps * d.ldw);
  for (int64_t it = 0; it < d.ins * d.taps; ++it) {
    float* row = wt + it * d.ldw;
    for (int64_t o = 0; o < p.m; ++o) row[o] = w[o * d.ins * d.taps + it];
    std::fill(row + p.m, row + d.ldw, 0.0f);
  }
  parallel_for(p.n, 1, [&](int64_t begin, int64_t end) {
    float* src = scratch(1, p.c * d.plane);
    for (int64_t j = begin; j < end; ++j) {
      p.frame.fill(x + j * p.c * p.ih * p.iw, p.c, p.ih, p.iw, src);
      direct_tiles(d, src, wt, bias, y + j * p.m * d.positions);
    }
  });
}

namespace {

// dw_acc[q][o] (rows ldo apart) += sum over positions p of dyt[p][o] * src[qoff[q] + pos[p]], q < Q,
// o < MB vectors, for one image (src: its frame, dyt: its dY transposed to [p][o]).
__attribute__((noinline, noclone)) void weight_tile(const float* src, const float* dyt, int64_t ldo,
                                                    const int64_t* pos, int64_t positions, const int64_t* qoff,
                                                    float* dw_acc) {
  constexpr int MB = kMB, Q = kAccumulators / MB;
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
  int64_t n = 0, c = 0, m = 0, ih = 0, iw = 0, oh = 0, ow = 0, taps = 0;
  // dW: X's frame, the window origins and, per (i, t) row q (rounded up to whole tiles), its offset.
  Frame x_frame;
  std::vector<int64_t> pos, qoff;
  int64_t ldo = 0, rows = 0;  // M rounded up to whole tiles; C * taps rounded up to whole tiles
  // dX: the stride-1 convolution of dY's frame with mirrored taps.
  Frame dy_frame;
  DirectPlan dx_plan;
};

bool DirectConvBackward::takes(const ConvSpec& s, bool need_dx) {
  return plain_2d(s) && (!need_dx || (s.stride[0] == 1 && s.stride[1] == 1));
}

DirectConvBackward::DirectConvBackward(const ConvSpec& s, bool need_dx, bool need_dw) {
  auto impl = std::make_shared<Impl>();
  Impl& p = *impl;
  p.need_dx = need_dx, p.need_dw = need_dw;
  p.n = s.x[0], p.c = s.x[1], p.m = s.out_channels, p.ih = s.x[2], p.iw = s.x[3], p.oh = s.out[0], p.ow = s.out[1];
  p.taps = s.kernel[0] * s.kernel[1];
  if (need_dw) {
    p.x_frame = input_frame(s);
    p.pos = window_offsets(s, p.x_frame);
    p.ldo = round_up(p.m, int64_t(kMB) * kLanes);
    p.rows = round_up(p.c * p.taps, kAccumulators / kMB);
    const std::vector<int64_t> tap = tap_offsets(s, p.x_frame.w, false);
    p.qoff.assign(size_t(p.rows), 0);  // rows past C * taps read offset 0 and are dropped
    for (int64_t q = 0; q < p.c * p.taps; ++q) p.qoff[size_t(q)] = (q / p.taps) * p.x_frame.plane() + tap[size_t(q % p.taps)];
  }
  if (need_dx) {
    // dX[i][y][x] = sum over o, (a, b) of W[o][i][a][b] * dY[o][y + pad_t - a dh][x + pad_l - b dw]:
    // dY placed at ((kh - 1) dh - pad_t, (kw - 1) dw - pad_l) of a frame (kh - 1) dh rows and
    // (kw - 1) dw columns larger than X, read at (y, x) + the mirrored tap.
    Frame& f = p.dy_frame;
    f.h = p.ih + (s.kernel[0] - 1) * s.dilation[0];
    f.w = p.iw + (s.kernel[1] - 1) * s.dilation[1];
    f.top = (s.kernel[0] - 1) * s.dilation[0] - s.pad_l[0];
    f.left = (s.kernel[1] - 1) * s.dilation[1] - s.pad_l[1];
    DirectPlan& d = p.dx_plan;
    d.ins = p.m;
    d.outs = p.c;
    d.taps = p.taps;
    d.plane = f.plane();
    d.positions = p.ih * p.iw;
    d.tap = tap_offsets(s, f.w, true);
    for (int64_t y = 0; y < p.ih; ++y)
      for (int64_t x = 0; x < p.iw; ++x) d.pos.push_back(y * f.w + x);
    d.finish();
  }
  impl_ = std::move(impl);
}

void DirectConvBackward::run(const float* dy, const float* x, const float* w, float* dx, float* dw, float* db) const {
  const Impl& p = *impl_;
  const int64_t x_image = p.c * p.ih * p.iw, y_size = p.oh * p.ow, y_image = p.m * y_size;
  if (p.need_dx) {
    const DirectPlan& d = p.dx_plan;
    // wt[(o * taps + t) * ldw + i] = W[o][i][t], zeros past C.
    float* wt = scratch(0, d.ins * d.taps * d.ldw);
    for (int64_t o = 0; o < p.m; ++o)
      for (int64_t t = 0; t < p.taps; ++t) {
        float* row = wt + (o * p.taps + t) * d.ldw;
        for (int64_t i = 0; i < p.c; ++i) row[i] = w[(o * p.c + i) * p.taps + t];
        std::fill(row + p.c, row + d.ldw, 0.0f);
      }
    parallel_for(p.n, 1, [&](int64_t begin, int64_t end) {
      float* src = scratch(1, p.m * d.plane);
      for (int64_t j = begin; j < end; ++j) {
        p.dy_frame.fill(dy + j * y_image, p.m, p.oh, p.ow, src);
        direct_tiles(d, src, wt, nullptr, dx + j * x_image);
      }
    });
  }
  if (!p.need_dw) return;
  // Accumulated as [q][o] over images, then transposed into dW [o][q]. Tiles (an M block by a
  // block of q) are split over the threads; each thread walks every image for its tiles, so a
  // gradient's sum runs over (image, position) in order whatever the thread count.
  const int64_t q_tile = kAccumulators / kMB, o_tile = int64_t(kMB) * kLanes;
  const int64_t q_tiles = p.rows / q_tile, o_tiles = p.ldo / o_tile;
  float* acc = scratch(2, p.rows * p.ldo);
  std::fill(acc, acc + p.rows * p.ldo, 0.0f);
  const int64_t tiles = q_tiles * o_tiles;
  parallel_for(tiles, std::max<int64_t>(1, tiles / std::max(1, num_threads())), [&](int64_t begin, int64_t end) {
    float* src = scratch(1, p.c * p.x_frame.plane());
    float* dyt = scratch(0, y_size * p.ldo);
    for (int64_t j = 0; j < p.n; ++j) {
      p.x_frame.fill(x + j * x_image, p.c, p.ih, p.iw, src);
      const float* dyj = dy + j * y_image;
      for (int64_t q = 0; q < y_size; ++q) {
        float* row = dyt + q * p.ldo;
        for (int64_t o = 0; o < p.m; ++o) row[o] = dyj[o * y_size + q];
        std::fill(row + p.m, row + p.ldo, 0.0f);
      }
      for (int64_t t = begin; t < end; ++t) {
        const int64_t q0 = (t / o_tiles) * q_tile, o0 = (t % o_tiles) * o_tile;
        weight_tile(src, dyt + o0, p.ldo, p.pos.data(), y_size, p.qoff.data() + q0, acc + q0 * p.ldo + o0);
      }
    }
  });
  const int64_t q_count = p.c * p.taps;
  for (int64_t o = 0; o < p.m; ++o)
    for (int64_t q = 0; q < q_count; ++q) dw[o * q_count + q] = acc[q * p.ldo + o];
  if (db) {
    for (int64_t o = 0; o < p.m; ++o) {
      double sum = 0;
      for (int64_t j = 0; j < p.n; ++j) {
        const float* src = dy + j * y_image + o * y_size;
        for (int64_t q = 0; q < y_size; ++q) sum += src[q];
      }
      db[o] = float(sum);
    }
  }
}

}  // namespace onnxtrain::cpu
