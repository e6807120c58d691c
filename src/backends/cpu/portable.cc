#include "backends/cpu/portable.h"

#include <atomic>
#include <cstdlib>
#include <string_view>

namespace onnxtrain::cpu {
namespace {

// The bounds of "small", from bench/small_kernels.cc (docs/DESIGN.md, "Portable kernels").
// Convolutions: ungrouped, at most this many output positions per image, input and output
// channels, and multiply-adds per call. Wider or grouped ones lose to oneDNN (MobileNet's last
// stage at batch 1: a 160->960 1x1 on 7x7 1.6x, a depthwise 3x3 over 960 channels 6-27x).
constexpr int64_t kPortableConvPositions = 64;
constexpr int64_t kPortableConvChannels = 64;
constexpr int64_t kPortableConvMacs = int64_t(64) << 20;
// Matmuls: at most this many multiply-adds over the whole batch.
constexpr int64_t kPortableMatmulMacs = int64_t(1) << 20;
// Pools: max pooling of at most this many input elements (average pooling stays with oneDNN:
// not measured against it).
constexpr int64_t kPortablePoolElements = int64_t(1) << 20;

constexpr int kUnset = -1;
std::atomic<int> g_choice{kUnset};

// ONNXTRAIN_KERNELS=library / portable / by-size (the default): the process's choice until
// set_kernel_choice. Read at the first primitive built, so a bad value is an error there.
KernelChoice choice_from_environment() {
  const char* env = std::getenv("ONNXTRAIN_KERNELS");
  const std::string_view v = env ? env : "";
  if (v.empty() || v == "by-size") return KernelChoice::kBySize;
  if (v == "library") return KernelChoice::kLibrary;
  if (v == "portable") return KernelChoice::kPortable;
  OT_THROW(kInvalidArgument, "ONNXTRAIN_KERNELS: expected library, portable or by-size, got '", v, "'");
}

bool by_size(bool small) {
  switch (kernel_choice()) {
    case KernelChoice::kLibrary: return false;
    case KernelChoice::kPortable: return true;
    case KernelChoice::kBySize: break;
  }
  return small;
}

}  // namespace

void set_kernel_choice(KernelChoice choice) { g_choice.store(int(choice), std::memory_order_relaxed); }

KernelChoice kernel_choice() {
  int c = g_choice.load(std::memory_order_relaxed);
  if (c == kUnset) {
    c = int(choice_from_environment());
    int expected = kUnset;
    g_choice.compare_exchange_strong(expected, c);  // a concurrent set_kernel_choice wins
    c = g_choice.load(std::memory_order_relaxed);
  }
  return KernelChoice(c);
}

bool portable_conv(const ConvSpec& s) {
  if (s.dtype != DType::kFloat32) return false;
  const int64_t positions = numel(s.out);
  const int64_t macs = s.x[0] * s.out_channels * positions * (s.x[1] / s.group) * numel(s.kernel);
  // Values kept channels last (keep_channels_last, inference graphs) are oneDNN's own layout;
  // here they would cost a reorder each way (the ResNet's 64-channel 8x8 stage at batch 16: its
  // forward 1.5x slower).
  const bool channels_last = s.x_channels_last || s.y_channels_last;
  return by_size(!s.transposed && s.group == 1 && !channels_last && positions <= kPortableConvPositions &&
                 s.x[1] <= kPortableConvChannels && s.out_channels <= kPortableConvChannels &&
                 macs <= kPortableConvMacs);
}

bool portable_pool(const PoolSpec& s) {
  if (s.dtype != DType::kFloat32 || s.x.size() != 4) return false;
  return by_size(s.max && numel(s.x) <= kPortablePoolElements);
}

bool portable_matmul(const MatmulDims& d) {
  if (d.dtype != DType::kFloat32 || d.c_dtype() != DType::kFloat32) return false;
  return by_size(d.batch_count() * d.m * d.n * d.k <= kPortableMatmulMacs);
}

}  // namespace onnxtrain::cpu
