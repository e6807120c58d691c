// Portable fp32 convolution (conv_portable.h). Ungrouped 2-d channels-first convolutions run
// through the direct kernels of conv_direct.h (and their backward data at stride 1); the rest
// through im2col and the blocked GEMM (sgemm_blocked.h), per group over a chunk of images at once
// so each GEMM is wide:
//   forward            Y_g  [M/G, n O] = W_g [M/G, C/G K] x col_g [C/G K, n O]
//   backward weights   dW_g [M/G, C/G K] = dY_g [M/G, n O] x col_g^T   (summed over chunks)
//   backward data      dcol_g = W_g^T x dY_g, then col2im into dX
//   transposed         col_g = W_g^T x X_g, then col2im into Y (the backward data of a conv)
// with K the kernel's taps and O the output positions. The tap table maps every (tap, output
// position) pair to its input offset, or -1 in the padding.
#include "backends/cpu/conv_portable.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "backends/cpu/conv_direct.h"
#include "backends/cpu/sgemm_blocked.h"
#include "backends/cpu/thread_scratch.h"
#include "core/parallel.h"

namespace onnxtrain::cpu {
namespace {

// Offsets of image positions read by each (tap, grid position): the image is what the kernel slides
// over (the conv's input; a transposed conv's output), the grid where its windows sit.
struct TapTable {
  int64_t taps = 0, grid = 0, image = 0;
  std::vector<int64_t> offset;  // [taps][grid]; -1: padding

  TapTable(const std::vector<int64_t>& image_dims, const std::vector<int64_t>& grid_dims, const ConvSpec& s) {
    const size_t nd = image_dims.size();
    taps = numel(s.kernel);
    grid = numel(grid_dims);
    image = numel(image_dims);
    offset.assign(size_t(taps * grid), -1);
    std::vector<int64_t> k(nd, 0), o(nd, 0);
    for (int64_t t = 0; t < taps; ++t) {
      std::fill(o.begin(), o.end(), 0);
      for (int64_t g = 0; g < grid; ++g) {
        int64_t off = 0;
        bool inside = true;
        for (size_t d = 0; d < nd; ++d) {
          const int64_t at = o[d] * s.stride[d] - s.pad_l[d] + k[d] * s.dilation[d];
          inside = inside && at >= 0 && at < image_dims[d];
          off = off * image_dims[d] + at;
        }
        if (inside) offset[size_t(t * grid + g)] = off;
        for (size_t d = nd; d-- > 0;)
          if (++o[d] < grid_dims[d]) break;
          else o[d] = 0;
      }
      for (size_t d = nd; d-- > 0;)
        if (++k[d] < s.kernel[d]) break;
        else k[d] = 0;
    }
    build_runs();
  }

  // The table as runs along the grid: `len` grid positions from `g0` read image offsets off0,
  // off0 + step, ... (off0 < 0: all in the padding). A 3x3 window over an 8x8 image is 1-3 runs
  // per tap instead of 64 lookups and branches, and each run is a loop the compiler vectorises.
  struct Run {
    int64_t g0, len, off0, step;
  };
  std::vector<Run> runs;           // every tap's, in grid order
  std::vector<int64_t> tap_runs;   // tap t's runs are runs[tap_runs[t], tap_runs[t + 1])

  void build_runs() {
    tap_runs.assign(1, 0);
    for (int64_t t = 0; t < taps; ++t) {
      const int64_t* off = offset.data() + t * grid;
      for (int64_t g = 0; g < grid;) {
        Run r{g, 1, off[g], 1};
        if (off[g] < 0) {
          while (g + r.len < grid && off[g + r.len] < 0) ++r.len;
        } else if (g + 1 < grid && off[g + 1] > off[g]) {
          r.step = off[g + 1] - off[g];
          while (g + r.len < grid && off[g + r.len] == r.off0 + r.len * r.step) ++r.len;
        }
        runs.push_back(r);
        g += r.len;
      }
      tap_runs.push_back(int64_t(runs.size()));
    }
  }

  // col[(c, tap), j * grid + g] for image j of a chunk of `images` (ld = images * grid).
  void im2col(const float* img, int64_t channels, int64_t images, int64_t img_stride, float* col) const {
    const int64_t ld = images * grid;
    parallel_for(channels * taps, std::max<int64_t>(1, 4096 / std::max<int64_t>(ld, 1)), [&](int64_t b, int64_t e) {
      for (int64_t row = b; row < e; ++row) {
        const int64_t c = row / taps, t = row % taps;
        for (int64_t j = 0; j < images; ++j) {
          const float* src = img + j * img_stride + c * image;
          float* dst = col + row * ld + j * grid;
          for (int64_t ri = tap_runs[size_t(t)]; ri < tap_runs[size_t(t) + 1]; ++ri) {
            const Run& r = runs[size_t(ri)];
            float* out = dst + r.g0;
            if (r.off0 < 0) {
              std::fill(out, out + r.len, 0.0f);
            } else if (r.step == 1) {
              const float* in = src + r.off0;
              for (int64_t i = 0; i < r.len; ++i) out[i] = in[i];
            } else {
              const float* in = src + r.off0;
              for (int64_t i = 0; i < r.len; ++i) out[i] = in[i * r.step];
            }
          }
        }
      }
    });
  }

  // The adjoint of im2col: img (zeroed here) receives the sum of every col entry that reads it,
  // taps in order and grid positions in order within a tap.
  void col2im(const float* col, int64_t channels, int64_t images, int64_t img_stride, float* img) const {
    const int64_t ld = images * grid;
    parallel_for(channels * images, 1, [&](int64_t b, int64_t e) {
      for (int64_t ci = b; ci < e; ++ci) {
        const int64_t c = ci / images, j = ci % images;
        float* dst = img + j * img_stride + c * image;
        std::fill(dst, dst + image, 0.0f);
        for (int64_t t = 0; t < taps; ++t) {
          const float* src = col + (c * taps + t) * ld + j * grid;
          for (int64_t ri = tap_runs[size_t(t)]; ri < tap_runs[size_t(t) + 1]; ++ri) {
            const Run& r = runs[size_t(ri)];
            if (r.off0 < 0) continue;
            const float* in = src + r.g0;
            float* out = dst + r.off0;
            if (r.step == 1) {
              for (int64_t i = 0; i < r.len; ++i) out[i] += in[i];
            } else {
              for (int64_t i = 0; i < r.len; ++i) out[i * r.step] += in[i];
            }
          }
        }
      }
    });
  }
};

// Images per chunk: the column matrix stays near 4 MB (its scratch lives as long as the thread,
// so this bounds the memory the convolutions keep).
int64_t chunk_images(int64_t rows, int64_t grid, int64_t images) {
  return std::clamp<int64_t>((int64_t(1) << 20) / std::max<int64_t>(1, rows * grid), 1, std::max<int64_t>(images, 1));
}

// [N, C, S] <-> [N, S, C] (channels-last X or Y of FusedConv chains).
void to_channels_first(const float* src, float* dst, int64_t n, int64_t c, int64_t s) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t p = 0; p < s; ++p)
      for (int64_t ch = 0; ch < c; ++ch) dst[(i * c + ch) * s + p] = src[(i * s + p) * c + ch];
}
void to_channels_last(const float* src, float* dst, int64_t n, int64_t c, int64_t s) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < s; ++p) dst[(i * s + p) * c + ch] = src[(i * c + ch) * s + p];
}

void activate(const ConvSpec& s, float* y, int64_t count) {
  if (s.activation == ConvActivation::kNone) return;
  parallel_for(count, kElementwiseGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float v = y[i];
      switch (s.activation) {
        case ConvActivation::kRelu: v = v > 0.0f ? v : 0.0f; break;
        case ConvActivation::kLeakyRelu: v = v > 0.0f ? v : s.act_alpha * v; break;
        case ConvActivation::kSigmoid: v = 1.0f / (1.0f + std::exp(-v)); break;
        case ConvActivation::kTanh: v = std::tanh(v); break;
        case ConvActivation::kClip: v = std::min(std::max(v, s.act_alpha), s.act_beta); break;
        case ConvActivation::kHardSwish: v = v * std::min(std::max(v + 3.0f, 0.0f), 6.0f) / 6.0f; break;
        case ConvActivation::kNone: break;
      }
      y[i] = v;
    }
  });
}

float* scratch(int which, int64_t count) { return thread_scratch<ScratchUser::kConvolution>(which, count); }

std::vector<int64_t> spatial(const Shape& x) { return std::vector<int64_t>(x.begin() + 2, x.end()); }

}  // namespace

struct PortableConv::Impl {
  ConvSpec spec;
  TapTable table;
  std::optional<DirectConv> direct;  // what conv_direct.h takes: instead of im2col
  Impl(const ConvSpec& s)
      : spec(s), table(s.transposed ? s.out : spatial(s.x), s.transposed ? spatial(s.x) : s.out, s) {}
};

PortableConv::PortableConv(const ConvSpec& spec, const std::string& context) {
  OT_CHECK(spec.dtype == DType::kFloat32, context, "convolution: the portable kernels take float32, got ",
           dtype_name(spec.dtype));
  OT_CHECK(spec.x.size() >= 3 && spec.group >= 1 && spec.x[1] % spec.group == 0 && spec.out_channels % spec.group == 0,
           context, "convolution: X ", shape_str(spec.x), " with ", spec.out_channels, " output channels and group ",
           spec.group, " is not a valid convolution");
  auto impl = std::make_shared<Impl>(spec);
  if (DirectConv::takes(spec)) impl->direct.emplace(spec);
  impl_ = std::move(impl);
}

void PortableConv::run(const void* x_data, const void* w_data, const void* bias_data, void* y_data,
                     const void* z_data) const {
  const auto* x = static_cast<const float*>(x_data);
  const auto* w = static_cast<const float*>(w_data);
  const auto* bias = static_cast<const float*>(bias_data);
  auto* y = static_cast<float*>(y_data);
  const ConvSpec& s = impl_->spec;
  const TapTable& tab = impl_->table;
  const int64_t n = s.x[0], c = s.x[1], m = s.out_channels, groups = s.group;
  const int64_t cg = c / groups, mg = m / groups;
  const int64_t x_size = numel(spatial(s.x)), y_size = numel(s.out);
  std::vector<float> x_cf, y_cf;  // channels-first copies (FusedConv chains only)
  std::vector<float> z_copy;      // Z when it is Y's own buffer (the sum adds it after Y is written)
  if (s.sum && z_data == y_data) {
    OT_CHECK(z_data != nullptr, "convolution: the summand is missing");
    const auto* z = static_cast<const float*>(z_data);
    z_copy.assign(z, z + n * m * y_size);
    z_data = z_copy.data();
  }
  if (s.x_channels_last) {
    x_cf.resize(size_t(n * c * x_size));
    to_channels_first(x, x_cf.data(), n, c, x_size);
    x = x_cf.data();
  }
  float* y_out = y;
  if (s.y_channels_last) {
    y_cf.resize(size_t(n * m * y_size));
    y = y_cf.data();
  }
  if (impl_->direct) {
    impl_->direct->run(x, w, bias, y);
  } else if (!s.transposed) {
    const int64_t rows = cg * tab.taps, chunk = chunk_images(rows, tab.grid, n);
    float* col = scratch(0, rows * chunk * tab.grid);
    float* out = scratch(1, mg * chunk * tab.grid);
    for (int64_t j0 = 0; j0 < n; j0 += chunk) {
      const int64_t images = std::min(chunk, n - j0), ld = images * tab.grid;
      for (int64_t g = 0; g < groups; ++g) {
        tab.im2col(x + (j0 * c + g * cg) * x_size, cg, images, c * x_size, col);
        SgemmArgs a;
        a.m = mg, a.n = ld, a.k = rows;
        a.a = w + g * mg * rows, a.a_row = rows, a.a_col = 1;
        a.b = col, a.b_row = ld, a.b_col = 1;
        a.c = out, a.ldc = ld;
        sgemm_blocked(a);
        for (int64_t oc = 0; oc < mg; ++oc)
          for (int64_t j = 0; j < images; ++j) {
            float* dst = y + ((j0 + j) * m + g * mg + oc) * y_size;
            const float* src = out + oc * ld + j * tab.grid;
            const float b = bias ? bias[g * mg + oc] : 0.0f;
            for (int64_t p = 0; p < y_size; ++p) dst[p] = src[p] + b;
          }
      }
    }
  } else {
    // x: [N, C, in], w: [C, M/G, k]; the grid is X's positions, the image Y's.
    const int64_t rows = mg * tab.taps, chunk = chunk_images(rows, tab.grid, n);
    float* xs = scratch(0, cg * chunk * tab.grid);
    float* col = scratch(1, rows * chunk * tab.grid);
    for (int64_t j0 = 0; j0 < n; j0 += chunk) {
      const int64_t images = std::min(chunk, n - j0), ld = images * tab.grid;
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t ic = 0; ic < cg; ++ic)
          for (int64_t j = 0; j < images; ++j)
            std::memcpy(xs + ic * ld + j * tab.grid, x + ((j0 + j) * c + g * cg + ic) * x_size,
                        sizeof(float) * size_t(x_size));
        SgemmArgs a;  // col [M/G K, n O] = W_g^T x X_g, W_g stored [C/G, M/G K]
        a.m = rows, a.n = ld, a.k = cg;
        a.a = w + g * cg * rows, a.a_row = 1, a.a_col = rows;
        a.b = xs, a.b_row = ld, a.b_col = 1;
        a.c = col, a.ldc = ld;
        sgemm_blocked(a);
        tab.col2im(col, mg, images, m * y_size, y + (j0 * m + g * mg) * y_size);
      }
    }
    if (bias)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t oc = 0; oc < m; ++oc) {
          float* dst = y + (j * m + oc) * y_size;
          for (int64_t p = 0; p < y_size; ++p) dst[p] += bias[oc];
        }
  }
  if (s.sum) {  // Z has Y's layout; y is channels first here
    OT_CHECK(z_data != nullptr, "convolution: the summand is missing");
    const auto* z = static_cast<const float*>(z_data);
    std::vector<float> z_cf;
    if (s.y_channels_last) {
      z_cf.resize(size_t(n * m * y_size));
      to_channels_first(z, z_cf.data(), n, m, y_size);
      z = z_cf.data();
    }
    for (int64_t i = 0; i < n * m * y_size; ++i) y[i] += z[i];
  }
  activate(s, y, n * m * y_size);
  if (s.y_channels_last) to_channels_last(y, y_out, n, m, y_size);
}

struct PortableConvBackward::Impl {
  ConvSpec spec;
  bool need_dx, need_dw;
  TapTable table;
  std::optional<DirectConvBackward> direct;  // what conv_direct.h takes: instead of im2col
  Impl(const ConvSpec& s, bool dx, bool dw) : spec(s), need_dx(dx), need_dw(dw), table(spatial(s.x), s.out, s) {}
};

PortableConvBackward::PortableConvBackward(const ConvSpec& spec, bool need_dx, bool need_dw, const std::string& context) {
  OT_CHECK(spec.dtype == DType::kFloat32, context, "convolution backward: the portable kernels take float32, got ",
           dtype_name(spec.dtype));
  OT_CHECK(!spec.transposed && !spec.x_channels_last && !spec.y_channels_last, context,
           "convolution backward: a plain (not transposed, channels-first) convolution was expected");
  OT_CHECK(spec.x.size() >= 3 && spec.group >= 1 && spec.x[1] % spec.group == 0 && spec.out_channels % spec.group == 0,
           context, "convolution backward: X ", shape_str(spec.x), " with ", spec.out_channels,
           " output channels and group ", spec.group, " is not a valid convolution");
  auto impl = std::make_shared<Impl>(spec, need_dx, need_dw);
  if (DirectConvBackward::takes(spec, need_dx)) impl->direct.emplace(spec, need_dx, need_dw);
  impl_ = std::move(impl);
}

void PortableConvBackward::run(const void* dy_data, const void* x_data, const void* w_data, void* dx_data,
                             void* dw_data, void* db_data) const {
  const auto* dy = static_cast<const float*>(dy_data);
  const auto* x = static_cast<const float*>(x_data);
  const auto* w = static_cast<const float*>(w_data);
  auto* dx = static_cast<float*>(dx_data);
  auto* dw = static_cast<float*>(dw_data);
  auto* db = static_cast<float*>(db_data);
  const Impl& p = *impl_;
  const ConvSpec& s = p.spec;
  if (p.direct)
    return p.direct->run(dy, x, w, p.need_dx ? dx : nullptr, p.need_dw ? dw : nullptr,
                         p.need_dw && s.bias ? db : nullptr);
  const TapTable& tab = p.table;
  const int64_t n = s.x[0], c = s.x[1], m = s.out_channels, groups = s.group;
  const int64_t cg = c / groups, mg = m / groups, x_size = tab.image, y_size = tab.grid;
  const int64_t rows = cg * tab.taps, chunk = chunk_images(rows, tab.grid, n);
  float* col = scratch(0, rows * chunk * y_size);
  float* dys = scratch(1, mg * chunk * y_size);
  for (int64_t j0 = 0; j0 < n; j0 += chunk) {
    const int64_t images = std::min(chunk, n - j0), ld = images * y_size;
    for (int64_t g = 0; g < groups; ++g) {
      // dY_g of the chunk as one [M/G, n O] matrix.
      for (int64_t oc = 0; oc < mg; ++oc)
        for (int64_t j = 0; j < images; ++j)
          std::memcpy(dys + oc * ld + j * y_size, dy + ((j0 + j) * m + g * mg + oc) * y_size,
                      sizeof(float) * size_t(y_size));
      if (p.need_dw) {
        tab.im2col(x + (j0 * c + g * cg) * x_size, cg, images, c * x_size, col);
        SgemmArgs a;  // dW_g (+)= dY_g x col^T
        a.m = mg, a.n = rows, a.k = ld;
        a.a = dys, a.a_row = ld, a.a_col = 1;
        a.b = col, a.b_row = 1, a.b_col = ld;
        a.c = dw + g * mg * rows, a.ldc = rows;
        a.beta = j0 == 0 ? 0.0f : 1.0f;
        sgemm_blocked(a);
      }
      if (p.need_dx) {
        SgemmArgs a;  // dcol = W_g^T x dY_g
        a.m = rows, a.n = ld, a.k = mg;
        a.a = w + g * mg * rows, a.a_row = 1, a.a_col = rows;
        a.b = dys, a.b_row = ld, a.b_col = 1;
        a.c = col, a.ldc = ld;
        sgemm_blocked(a);
        tab.col2im(col, cg, images, c * x_size, dx + (j0 * c + g * cg) * x_size);
      }
    }
  }
  if (p.need_dw && s.bias && db) {
    for (int64_t oc = 0; oc < m; ++oc) {
      double sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        const float* src = dy + (j * m + oc) * y_size;
        for (int64_t q = 0; q < y_size; ++q) sum += src[q];
      }
      db[oc] = float(sum);
    }
  }
}

}  // namespace onnxtrain::cpu
