// The cache keys of the convolution and pooling specs, shared by every backend (conv.h, pool.h).
#include <bit>
#include <cstdint>

#include "backends/cpu/conv.h"
#include "backends/cpu/pool.h"

namespace onnxtrain::cpu {

std::vector<int64_t> ConvSpec::key() const {
  std::vector<int64_t> k{transposed, int64_t(dtype), out_channels, group, bias, x_channels_last, y_channels_last, sum, serial,
                        int64_t(x.size()), int64_t(activation),
                        int64_t(std::bit_cast<uint32_t>(act_alpha)), int64_t(std::bit_cast<uint32_t>(act_beta))};
  for (const auto* v : {&x, &kernel, &stride, &dilation, &pad_l, &pad_r, &out}) k.insert(k.end(), v->begin(), v->end());
  return k;
}

std::vector<int64_t> PoolSpec::key() const {
  std::vector<int64_t> k{max, count_include_pad, channels_last, int64_t(dtype), int64_t(x.size())};
  for (const auto* v : {&x, &kernel, &stride, &dilation, &pad_l, &pad_r, &out}) k.insert(k.end(), v->begin(), v->end());
  return k;
}

}  // namespace onnxtrain::cpu
