// One multi-tensor AdamW step (apex's multi_tensor_apply in spirit): the tensors' pointers travel
// as a kernel parameter, kTensorsPerLaunch at a time, and each block walks its share of every
// tensor. The gradient norm for clipping is summed on the device (double atomics) and read by
// the update kernels there: no copy to the host inside a step. The math is src/optim's:
//   torch:        p *= 1 - lr wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//                 p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)
//   transformers: p -= step_size * m / (sqrt(v) + eps), then p += -lr wd p
// with g scaled by the clip coefficient min(1, max_norm / (norm + 1e-6)) (negated to maximize).
#include <cmath>

#include <optional>

#include "backends/cuda/common.cuh"
#include "backends/cuda/kernels.h"

namespace onnxtrain::cuda {
namespace {

constexpr int kTensorsPerLaunch = 32;

struct TensorList {
  float* p[kTensorsPerLaunch];
  const float* g[kTensorsPerLaunch];
  float* m[kTensorsPerLaunch];
  float* v[kTensorsPerLaunch];
  int64_t size[kTensorsPerLaunch];
  int count;
};

struct Scalars {
  float b1, b2, omb1, omb2, eps, decay, step_size, bc2_sqrt, hf_decay, max_norm, sign;
  int hf;
};

__global__ void sum_squares_kernel(TensorList list, double* out) {
  __shared__ float shared[32];
  float sum = 0;
  for (int t = 0; t < list.count; ++t)
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < list.size[t]; i += int64_t(gridDim.x) * blockDim.x) {
      const float g = list.g[t][i];
      sum += g * g;
    }
  sum = block_reduce<false>(sum, shared);
  if (threadIdx.x == 0) atomicAdd(out, double(sum));
}

__global__ void adamw_kernel(TensorList list, Scalars s, const double* sum_squares) {
  float gscale = 1;
  if (sum_squares) {
    const double coef = double(s.max_norm) / (sqrt(*sum_squares) + 1e-6);
    if (!(coef >= 1.0)) gscale = float(coef);  // a NaN norm propagates, as in torch
  }
  gscale *= s.sign;
  for (int t = 0; t < list.count; ++t) {
    float* p = list.p[t];
    const float* g = list.g[t];
    float* m = list.m[t];
    float* v = list.v[t];
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < list.size[t]; i += int64_t(gridDim.x) * blockDim.x) {
      const float gi = g[i] * gscale;
      float pi = p[i];
      if (!s.hf) pi *= s.decay;
      const float mi = s.b1 * m[i] + s.omb1 * gi;
      const float vi = s.b2 * v[i] + s.omb2 * (gi * gi);
      if (s.hf) {
        pi -= s.step_size * (mi / (sqrtf(vi) + s.eps));
        pi += s.hf_decay * pi;
      } else {
        pi -= s.step_size * (mi / (sqrtf(vi) / s.bc2_sqrt + s.eps));
      }
      p[i] = pi;
      m[i] = mi;
      v[i] = vi;
    }
  }
}

template <typename Fn>
void for_lists(const std::vector<float*>& params, const std::vector<const float*>& grads,
               const std::vector<float*>& m, const std::vector<float*>& v, const std::vector<int64_t>& sizes, Fn&& fn) {
  TensorList list{};
  for (size_t i = 0; i < params.size(); ++i) {
    if (sizes[i] == 0) continue;
    list.p[list.count] = params[i];
    list.g[list.count] = grads[i];
    list.m[list.count] = m[i];
    list.v[list.count] = v[i];
    list.size[list.count] = sizes[i];
    if (++list.count == kTensorsPerLaunch) {
      fn(list);
      list.count = 0;
    }
  }
  if (list.count) fn(list);
}

}  // namespace

void adamw(const AdamWConfig& cfg, const std::vector<float*>& params, const std::vector<const float*>& grads,
           const std::vector<float*>& exp_avg, const std::vector<float*>& exp_avg_sq,
           const std::vector<int64_t>& sizes, void* stream) {
  const cudaStream_t s = as_stream(stream);
  const unsigned grid = unsigned(multiprocessor_count() * 4);
  std::optional<StreamBuffer<double>> sum_squares_buffer;
  double* sum_squares = nullptr;
  if (cfg.max_grad_norm > 0) {
    sum_squares = sum_squares_buffer.emplace(1, s).get();
    check(cudaMemsetAsync(sum_squares, 0, sizeof(double), s), "cudaMemsetAsync");
    for_lists(params, grads, exp_avg, exp_avg_sq, sizes,
              [&](const TensorList& l) { sum_squares_kernel<<<grid, 256, 0, s>>>(l, sum_squares); });
    check_launch("sum_squares_kernel");
  }
  const double bc1 = 1 - std::pow(cfg.beta1, double(cfg.step)), bc2 = 1 - std::pow(cfg.beta2, double(cfg.step));
  Scalars sc{};
  sc.b1 = float(cfg.beta1);
  sc.b2 = float(cfg.beta2);
  sc.omb1 = float(1 - cfg.beta1);
  sc.omb2 = float(1 - cfg.beta2);
  sc.eps = float(cfg.eps);
  sc.decay = float(1 - cfg.lr * cfg.weight_decay);
  sc.bc2_sqrt = float(std::sqrt(bc2));
  sc.step_size = cfg.hf ? float(cfg.correct_bias ? cfg.lr * std::sqrt(bc2) / bc1 : cfg.lr) : float(cfg.lr / bc1);
  sc.hf_decay = cfg.weight_decay > 0 ? float(-cfg.lr * cfg.weight_decay) : 0.0f;
  sc.max_norm = float(cfg.max_grad_norm);
  sc.sign = cfg.maximize ? -1.0f : 1.0f;
  sc.hf = cfg.hf ? 1 : 0;
  for_lists(params, grads, exp_avg, exp_avg_sq, sizes,
            [&](const TensorList& l) { adamw_kernel<<<grid, 256, 0, s>>>(l, sc, sum_squares); });
  check_launch("adamw_kernel");
}

}  // namespace onnxtrain::cuda
