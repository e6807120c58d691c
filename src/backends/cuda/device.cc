// The CUDA device behind core/device.h: memory through cudaMalloc (the executor allocates each
// plan's arena once, as llm.c allocates its activations), one stream per executor, copies.
// Registered from a static initialiser; the probe runs when something first asks for a device, so
// a CUDA build loads and runs on a machine without a GPU and says "no CUDA device" only then.
#include <cuda_runtime.h>
#include <cublasLt.h>

#include <mutex>
#include <sstream>

#include "backends/cuda/runtime.h"
#include "core/device.h"

namespace onnxtrain::cuda {

void check(int status, const char* what) {
  if (status == cudaSuccess) return;
  const auto e = cudaError_t(status);
  OT_THROW(kRuntime, what, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}

void check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) OT_THROW(kRuntime, "CUDA kernel ", kernel, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}

namespace {

struct Lt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t bytes = size_t(32) << 20;  // cuBLASLt's Hopper guidance: 32 MiB lets it pick any kernel
};

Lt& lt() {
  static Lt state = [] {
    Lt s;
    const cublasStatus_t st = cublasLtCreate(&s.handle);
    if (st != CUBLAS_STATUS_SUCCESS) OT_THROW(kRuntime, "cublasLtCreate: ", cublasLtGetStatusString(st));
    check(cudaMalloc(&s.workspace, s.bytes), "cudaMalloc (cuBLASLt workspace)");
    return s;
  }();
  return state;
}

}  // namespace

void* cublaslt_handle() { return lt().handle; }
void* cublaslt_workspace(size_t* bytes) {
  *bytes = lt().bytes;
  return lt().workspace;
}

int multiprocessor_count() {
  static const int count = [] {
    int device = 0, n = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    return n;
  }();
  return count;
}

std::string describe_device() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, device), "cudaGetDeviceProperties");
  std::ostringstream s;
  s.precision(3);
  s << p.name << " (sm_" << p.major << p.minor << ", " << p.multiProcessorCount << " SMs, "
    << double(p.totalGlobalMem) / double(1ull << 30) << " GiB)";
  return s.str();
}

namespace {

class CudaBackend final : public DeviceBackend {
 public:
  Device device() const override { return Device::kCuda; }
  std::string description() const override { return describe_device(); }

  std::shared_ptr<void> allocate(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear it: an out-of-memory error is not sticky
      size_t free_bytes = 0, total = 0;
      cudaMemGetInfo(&free_bytes, &total);
      OT_THROW(kRuntime, "out of CUDA memory allocating ", bytes, " bytes (", free_bytes, " of ", total,
               " bytes free): ", cudaGetErrorString(e));
    }
    return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
  }

  Stream create_stream() override {
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    return Stream(static_cast<void*>(s), [](void* q) { cudaStreamDestroy(static_cast<cudaStream_t>(q)); });
  }

  void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes,
            const Stream& stream) override {
    const cudaMemcpyKind kind = dst_device == Device::kCpu ? cudaMemcpyDeviceToHost
                                : src_device == Device::kCpu ? cudaMemcpyHostToDevice
                                                             : cudaMemcpyDeviceToDevice;
    auto s = static_cast<cudaStream_t>(stream.get());
    check(cudaMemcpyAsync(dst, src, bytes, kind, s), "cudaMemcpyAsync");
    // The host's side of a copy must be complete when copy() returns (pageable memory may be
    // reused or freed at once); device-to-device copies stay queued in order.
    if (kind != cudaMemcpyDeviceToDevice) check(cudaStreamSynchronize(s), "cudaStreamSynchronize (copy)");
  }

  void synchronize(const Stream& stream) override {
    check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream.get())), "a CUDA kernel of this run");
  }
};

DeviceBackend* probe(std::string* why_not) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    *why_not = std::string("no CUDA device: ") +
               (e != cudaSuccess ? std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e)
                                 : std::string("cudaGetDeviceCount says 0 devices"));
    cudaGetLastError();
    return nullptr;
  }
  static CudaBackend backend;
  return &backend;
}

[[maybe_unused]] const DeviceProbe registered = register_device_backend(Device::kCuda, probe);

}  // namespace
}  // namespace onnxtrain::cuda
