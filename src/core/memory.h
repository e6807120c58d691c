// Storage of the large buffers that live as long as a model does: checkpoint parameters, gradients,
// optimizer moments, executor arenas. One place decides how they are obtained, because in a
// virtual machine the first touch of memory costs more than the work done on it: writing fresh
// memory cost 9.6 ms per MiB in 4 KiB pages and 0.14-0.65 ms per MiB in 2 MiB pages here
// (`bench/startup --first-touch 64`, loaded machine), and the start of training touched every
// page of these buffers once (BERT h256: 150-200 MiB).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "onnxtrain/tensor.h"

namespace onnxtrain {

enum class Fill { kUninitialized, kZeros };

// From this size on, storage is a private anonymous mapping of its own: 2 MiB aligned (a last
// partial 2 MiB of 1 MiB or more rounded up to a whole one), advised MADV_HUGEPAGE (Linux's
// default transparent-huge-page mode is "madvise": without the advice every page is 4 KiB), and
// zero-filled by the kernel when first touched, so kZeros costs nothing up front. Below it, 64-byte aligned heap memory (zeroed with
// memset for kZeros): a huge page for a small buffer would cost more memory than its faults cost.
inline constexpr size_t kHugePageBytes = size_t(2) << 20;

// Where storage may be mapped pages of its own (here and the executor's recording run): a Unix
// kernel's. Emscripten's mmap is a block of its one heap (memalign, then memset), which its munmap
// frees only whole: the trim to a 2 MiB boundary below fails there, and in 3.1.6's libc a partial
// munmap returns still holding the lock of its list of mappings, so the next mmap or munmap of any
// thread spins forever (the threaded WebAssembly module's first train step hung on it). There, the heap.
#if defined(__unix__) && !defined(__EMSCRIPTEN__)
#define ONNXTRAIN_MAPPED_STORAGE 1
#endif

// Tensor storage counted against the memory limit (include/onnxtrain/limits.h,
// src/core/resource_limits.cc): charge_storage throws Error(kRuntime) naming the request and the
// limit when `bytes` more would pass it; every charge is released when its storage dies.
void charge_storage(size_t bytes);
void release_storage(size_t bytes);
// Bytes of a tensor of this dtype and shape; throws Error(kInvalidArgument) for a negative dim or
// a size past 2^62 (a shape read from a file can multiply past 64 bits).
size_t checked_tensor_bytes(DType dtype, const Shape& shape);
// The iteration limit of one Loop run (0: none).
int64_t max_loop_iterations();

// `bytes` of 64-byte aligned storage (at least 64 bytes), released when the last copy of the
// returned pointer dies. Throws kRuntime when memory is exhausted.
std::shared_ptr<void> allocate_storage(size_t bytes, Fill fill);

struct TensorSpec {
  DType dtype;
  Shape shape;
};

// Tensors carved from one allocate_storage call, each 64-byte aligned, so that buffers smaller than
// a huge page share huge pages (a BERT checkpoint is 100 tensors of 1 MiB or less). Each tensor
// has a holder of its own, as if allocated alone (shares_storage_with is per tensor); the storage
// is released when the last of them dies. `holders`, when given, receives a weak reference to each
// tensor's holder: its use_count() is how many tensors (copies, views) still share that tensor.
std::vector<Tensor> allocate_tensors(const std::vector<TensorSpec>& specs, Fill fill,
                                     std::vector<std::weak_ptr<void>>* holders = nullptr);

// The bytes allocate_tensors takes for `specs` (each tensor 64-byte aligned, at least 64 bytes).
size_t tensors_bytes(const std::vector<TensorSpec>& specs);
// allocate_tensors' carving on storage the caller obtained (at least tensors_bytes(specs) bytes,
// 64-byte aligned), as is: nothing is filled. The storage's own release runs when the last of the
// tensors dies, so a caller can take memory back for another use (TrainModule's blocks).
std::vector<Tensor> carve_tensors(const std::shared_ptr<void>& storage, const std::vector<TensorSpec>& specs,
                                  std::vector<std::weak_ptr<void>>* holders = nullptr);

// Gives the whole huge pages (kHugePageBytes, by address) inside [p, p + bytes) back to the
// system; they read as zeros when next touched. For memory that will not be needed for a while
// in storage kept for later (TrainModule's step block: the gradients' part, between a forward
// and its backward when the caller's loss there may be the step's peak). A no-op where there is
// no madvise.
void release_huge_pages(void* p, size_t bytes);

// Tensor::empty from this size on: a huge-page mapping of its own (allocate_storage), unmapped
// when the tensor dies. glibc maps blocks this large afresh on every allocation anyway, in 4 KiB
// pages whose faults cost this VM 1.5-15 us each (a GPT-style step's 32 MiB logits, or the
// log-softmax scratch its loss computes in the forward and again in the backward: 8,192 faults
// each). Below, glibc's heap, which reuses freed blocks without faulting or zeroing their pages
// again: fresh huge pages for every 2-32 MiB output made steps whose shapes change (padding and
// label sparsity) 10-25% slower. Outputs that die together come from one block instead
// (TrainModule's saved values and gradients), which keeps them from fragmenting the heap.
inline constexpr size_t kLargeTensorBytes = size_t(32) << 20;

}  // namespace onnxtrain
