// The CUDA backend's plumbing, shared by its files (no CUDA header here: op files compiled by the
// host compiler include the kernel headers beside this one). Errors name the call that failed.
#pragma once

#include <cstddef>
#include <string>

#include "onnxtrain/tensor.h"

namespace onnxtrain::cuda {

// Throws kRuntime "<what>: <CUDA error name>: <its description>" unless `status` is cudaSuccess;
// `status` is a cudaError_t.
void check(int status, const char* what);
// After a kernel launch: reports a launch error by the kernel's name.
void check_launch(const char* kernel);
// The cuBLASLt handle and a 32 MiB workspace of the current device, made once per process.
void* cublaslt_handle();
void* cublaslt_workspace(size_t* bytes);
// Multiprocessors of the current device (grid sizes of persistent kernels).
int multiprocessor_count();
// One line on the card: "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB)".
std::string describe_device();

}  // namespace onnxtrain::cuda
