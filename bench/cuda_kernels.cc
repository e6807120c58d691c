// The CUDA backend's kernels at sizes that fill an H100, against the card's two ceilings measured
// in the same run: bf16 GEMM TFLOP/s through cuBLASLt and device-to-device copy bandwidth. Prints
// one line per kernel: name, median ms of 20 timed calls (after 3 warm-ups, inputs random), and
// TFLOP/s or GB/s (bytes read plus written once). scripts/gpu_check.sh runs it beside
// bench/cuda_kernels_torch.py, which times PyTorch on the same shapes.
//   build-gpu/bench/cuda_kernels_bench
#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/kernels.h"
#include "core/device.h"

using namespace onnxtrain;

namespace {

DeviceBackend* g_backend = nullptr;
Stream g_stream;

Tensor random_on_device(DType dt, const Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Tensor host = Tensor::empty(dt, shape);
  for (int64_t i = 0; i < host.numel(); ++i) {
    const float v = u(rng);
    if (dt == DType::kBFloat16) host.data<bfloat16>()[i] = bfloat16(v);
    else if (dt == DType::kFloat16) host.data<float16>()[i] = float16(v);
    else host.data<float>()[i] = v;
  }
  return to_device(host, Device::kCuda, g_stream);
}

// Timed with CUDA events on the stream, as the PyTorch side is: launch overhead stays out. The
// driver's events: the library holds its own (static) CUDA runtime, and the driver is the one
// both share.
void check_driver(CUresult status, const char* what) {
  if (status == CUDA_SUCCESS) return;
  const char* message = nullptr;
  cuGetErrorString(status, &message);
  std::fprintf(stderr, "%s failed: %s\n", what, message ? message : "unknown error");
  std::exit(1);
}

double median_ms(const std::function<void()>& fn, int reps = 20) {
  for (int i = 0; i < 3; ++i) fn();
  g_backend->synchronize(g_stream);
  const CUstream s = static_cast<CUstream>(g_stream.get());
  CUevent start, end;
  check_driver(cuEventCreate(&start, CU_EVENT_DEFAULT), "cuEventCreate");
  check_driver(cuEventCreate(&end, CU_EVENT_DEFAULT), "cuEventCreate");
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    check_driver(cuEventRecord(start, s), "cuEventRecord");
    fn();
    check_driver(cuEventRecord(end, s), "cuEventRecord");
    check_driver(cuEventSynchronize(end), "cuEventSynchronize");
    float elapsed = 0;
    check_driver(cuEventElapsedTime(&elapsed, start, end), "cuEventElapsedTime");
    ms.push_back(elapsed);
  }
  cuEventDestroy(start);
  cuEventDestroy(end);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// work: FLOPs (unit TFLOP/s) or bytes (unit GB/s).
void report(const char* name, double ms, double work, const char* unit) {
  const double per_second = work / (ms * 1e-3);
  std::printf("%-34s %9.3f ms  %9.1f %s\n", name, ms, per_second / (unit[0] == 'T' ? 1e12 : 1e9), unit);
}

}  // namespace

int main() {
  std::string why;
  if (!device_available(Device::kCuda, &why)) {
    std::printf("skipped: %s\n", why.c_str());
    return 0;
  }
  g_backend = &device_backend(Device::kCuda);
  g_stream = g_backend->create_stream();
  void* s = g_stream.get();
  std::printf("device: %s\n", g_backend->description().c_str());

  {  // the compute ceiling: one large bf16 product
    const int64_t n = 8192;
    Tensor a = random_on_device(DType::kBFloat16, {n, n}, 1), b = random_on_device(DType::kBFloat16, {n, n}, 2);
    Tensor c = empty_on(Device::kCuda, DType::kBFloat16, {n, n});
    cuda::GemmDesc d;
    d.dtype = DType::kBFloat16;
    d.m = d.n = d.k = n;
    const double ms = median_ms([&] { cuda::gemm(d, a.data(), b.data(), c.data(), s); });
    report(("gemm bf16 " + std::to_string(n) + "^3").c_str(), ms, 2.0 * double(n) * n * n, "TFLOP/s");
    d.dtype = DType::kFloat32;
    const int64_t m = 4096;
    Tensor a32 = random_on_device(DType::kFloat32, {m, m}, 3), b32 = random_on_device(DType::kFloat32, {m, m}, 4);
    Tensor c32 = empty_on(Device::kCuda, DType::kFloat32, {m, m});
    d.m = d.n = d.k = m;
    const double ms32 = median_ms([&] { cuda::gemm(d, a32.data(), b32.data(), c32.data(), s); });
    report("gemm fp32 4096^3 (no TF32)", ms32, 2.0 * double(m) * m * m, "TFLOP/s");
  }
  {  // the bandwidth ceiling: a device-to-device copy
    const int64_t elems = int64_t(256) << 20;
    Tensor a = random_on_device(DType::kFloat32, {elems}, 5), b = empty_on(Device::kCuda, DType::kFloat32, {elems});
    const double ms = median_ms([&] { g_backend->copy(b.data(), Device::kCuda, a.data(), Device::kCuda, a.nbytes(), g_stream); });
    report("copy d2d fp32", ms, 2.0 * double(a.nbytes()), "GB/s");
    Tensor c = empty_on(Device::kCuda, DType::kFloat32, {elems});
    const double add = median_ms([&] { cuda::binary(cuda::Binary::kAdd, DType::kFloat32, a.data(), a.shape(), b.data(), b.shape(), c.data(), c.shape(), s); });
    report("add fp32 (same shapes)", add, 3.0 * double(a.nbytes()), "GB/s");
    Tensor row = random_on_device(DType::kFloat32, {1024}, 6);
    const Shape m2{elems / 1024, 1024};
    const double badd = median_ms([&] { cuda::binary(cuda::Binary::kAdd, DType::kFloat32, a.data(), m2, row.data(), {1024}, c.data(), m2, s); });
    report("add fp32 (bias row broadcast)", badd, 2.0 * double(a.nbytes()), "GB/s");
  }
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    const std::string tag = dt == DType::kFloat32 ? " fp32" : " bf16";
    const int64_t rows = 16384, d = 768;
    Tensor x = random_on_device(dt, {rows, d}, 7), y = empty_on(Device::kCuda, dt, {rows, d});
    Tensor scale = random_on_device(dt, {d}, 8), bias = random_on_device(dt, {d}, 9);
    Tensor mean = empty_on(Device::kCuda, DType::kFloat32, {rows}), inv = empty_on(Device::kCuda, DType::kFloat32, {rows});
    const double bytes = 2.0 * double(x.nbytes());
    report(("layernorm fwd [16384, 768]" + tag).c_str(),
           median_ms([&] { cuda::layer_norm(dt, x.data(), scale.data(), bias.data(), y.data(), mean.data<float>(), inv.data<float>(), rows, d, 1e-5f, s); }),
           bytes, "GB/s");
    Tensor dx = empty_on(Device::kCuda, dt, {rows, d}), ds = empty_on(Device::kCuda, dt, {d}), db = empty_on(Device::kCuda, dt, {d});
    report(("layernorm bwd [16384, 768]" + tag).c_str(),
           median_ms([&] { cuda::layer_norm_grad(dt, y.data(), x.data(), scale.data(), mean.data<float>(), inv.data<float>(), dx.data(), ds.data(), db.data(), rows, d, 1e-5f, s); }),
           3.0 * double(x.nbytes()), "GB/s");
    const int64_t vocab = 50257, tokens = 4096;
    Tensor logits = random_on_device(dt, {tokens, vocab}, 10), probs = empty_on(Device::kCuda, dt, {tokens, vocab});
    report(("softmax [4096, 50257]" + tag).c_str(),
           median_ms([&] { cuda::softmax(false, dt, logits.data(), probs.data(), tokens, vocab, 1, s); }),
           2.0 * double(logits.nbytes()), "GB/s");
  }
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {  // the layout ops' copy, and the embedding's gather
    const std::string tag = dt == DType::kFloat32 ? " fp32" : " bf16";
    const int64_t b = 32, seq = 512, heads = 12, hd = 64;
    Tensor x = random_on_device(dt, {b, seq, heads, hd}, 11), y = empty_on(Device::kCuda, dt, {b, heads, seq, hd});
    const size_t es = dtype_size(dt);
    // [B, S, H, D] -> [B, H, S, D]: contiguous rows of D, and [B, H, S, D] -> [B, H, D, S]: the inner dim moves.
    const cuda::StridedCopy heads_first{{b, heads, seq, hd}, {seq * heads * hd, hd, heads * hd, 1}, {}, 0, 0};
    const cuda::StridedCopy keys_last{{b, heads, hd, seq}, {heads * seq * hd, seq * hd, 1, hd}, {}, 0, 0};
    auto contiguous = [](cuda::StridedCopy c) {
      c.dst_strides = {c.shape[1] * c.shape[2] * c.shape[3], c.shape[2] * c.shape[3], c.shape[3], 1};
      return c;
    };
    report(("transpose [32,512,12,64] 0213" + tag).c_str(),
           median_ms([&] { cuda::strided_copy(es, x.data(), y.data(), contiguous(heads_first), s); }), 2.0 * double(x.nbytes()),
           "GB/s");
    report(("transpose [32,12,512,64] 0132" + tag).c_str(),
           median_ms([&] { cuda::strided_copy(es, y.data(), x.data(), contiguous(keys_last), s); }), 2.0 * double(x.nbytes()),
           "GB/s");
    const int64_t vocab = 30522, d = 768, tokens = 16384;
    Tensor table = random_on_device(dt, {vocab, d}, 12), rows = empty_on(Device::kCuda, dt, {tokens, d});
    std::vector<int64_t> ids(static_cast<size_t>(tokens));
    std::mt19937 rng(13);
    for (int64_t& id : ids) id = rng() % 4 == 0 ? 0 : int64_t(rng() % uint32_t(vocab));  // a quarter padding
    report(("gather [30522,768] x 16384" + tag).c_str(),
           median_ms([&] { cuda::gather(es, table.data(), ids.data(), rows.data(), tokens, 1, vocab, d, s); }),
           2.0 * double(rows.nbytes()), "GB/s");
    report(("gather grad [30522,768] x 16384" + tag).c_str(),
           median_ms([&] { cuda::gather_grad(dt, rows.data(), ids.data(), table.data(), tokens, 1, vocab, d, s); }),
           double(rows.nbytes() + table.nbytes()), "GB/s");
  }
  return 0;
}
