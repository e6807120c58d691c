#include "core/memory.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#if defined(ONNXTRAIN_MAPPED_STORAGE)
#include <sys/mman.h>
#endif

namespace onnxtrain {

namespace {

constexpr size_t kAlign = 64;
constexpr size_t kSmallPageBytes = 4096;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

#if defined(ONNXTRAIN_MAPPED_STORAGE)
// A private anonymous mapping of `length` bytes (a multiple of 4 KiB) starting on a
// kHugePageBytes boundary: mmap only promises page alignment, so map one huge page more and give
// back what lies before and after the aligned range. nullptr when the kernel refuses.
void* map_huge_aligned(size_t length) {
  const size_t span = length + kHugePageBytes;
  void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t at = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = round_up(at, kHugePageBytes);
  const size_t head = start - at, tail = span - head - length;
  if (head) ::munmap(raw, head);
  if (tail) ::munmap(reinterpret_cast<void*>(start + length), tail);
  void* p = reinterpret_cast<void*>(start);
#if defined(MADV_HUGEPAGE)
  ::madvise(p, length, MADV_HUGEPAGE);  // advice: where huge pages are off or exhausted, 4 KiB pages
#endif
  return p;
}
#endif

// The length mapped for `bytes` (at least kHugePageBytes): whole 4 KiB pages, and a last partial
// huge page of 1 MiB or more mapped whole (under 1 MiB more memory for 256 or more fewer faults);
// a shorter one stays 4 KiB pages.
size_t mapped_length(size_t bytes) {
  size_t length = round_up(bytes, kSmallPageBytes);
  if (length % kHugePageBytes >= kHugePageBytes / 2) length = round_up(length, kHugePageBytes);
  return length;
}

}  // namespace

std::shared_ptr<void> allocate_storage(size_t bytes, Fill fill) {
  charge_storage(bytes);
#if defined(ONNXTRAIN_MAPPED_STORAGE)
  if (bytes >= kHugePageBytes) {
    const size_t length = mapped_length(bytes);
    if (void* p = map_huge_aligned(length))  // fresh anonymous pages read as zeros: no fill needed
      return std::shared_ptr<void>(p, [length, bytes](void* q) { ::munmap(q, length); release_storage(bytes); });
    release_storage(bytes);
    OT_THROW(kRuntime, "out of memory: cannot map ", bytes, " bytes");
  }
#endif
  const size_t rounded = round_up(bytes ? bytes : 1, kAlign);
  void* p = std::aligned_alloc(kAlign, rounded);
  if (!p) {
    release_storage(bytes);
    OT_THROW(kRuntime, "out of memory allocating ", bytes, " bytes");
  }
  if (fill == Fill::kZeros) std::memset(p, 0, rounded);
  return std::shared_ptr<void>(p, [bytes](void* q) { std::free(q); release_storage(bytes); });
}

void release_huge_pages(void* p, size_t bytes) {
#if defined(__linux__)
  const uintptr_t begin = round_up(reinterpret_cast<uintptr_t>(p), kHugePageBytes);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) / kHugePageBytes * kHugePageBytes;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
#else
  (void)p, (void)bytes;
#endif
}

namespace {
// The largest size a tensor (or a set of them) may have: 2^62 bytes, or half the address space
// where size_t is narrower (wasm32), so that sums and rounding never wrap.
constexpr uint64_t kMaxBytes = std::min<uint64_t>(uint64_t(1) << 62, std::numeric_limits<size_t>::max() / 2);
constexpr const char* kMaxBytesText = sizeof(size_t) >= 8 ? "2^62 bytes" : "half the address space";
}  // namespace

size_t checked_tensor_bytes(DType dtype, const Shape& shape) {
  OT_CHECK(dtype_supported(dtype), "cannot allocate a tensor of dtype ", dtype_name(dtype));
  uint64_t bytes = dtype_size(dtype);
  for (int64_t d : shape) {
    OT_CHECK(d >= 0, "cannot allocate a tensor of shape ", shape_str(shape));
    OT_CHECK(d == 0 || bytes <= kMaxBytes / uint64_t(d), "cannot allocate a tensor of shape ", shape_str(shape),
             " and dtype ", dtype_name(dtype), ": its size passes ", kMaxBytesText);
    bytes *= uint64_t(d);
  }
  return size_t(bytes);
}

size_t tensors_bytes(const std::vector<TensorSpec>& specs) {
  size_t total = 0;
  for (const TensorSpec& s : specs) {
    // At least one byte each: distinct addresses, so that no two tensors look like views of one.
    total += round_up(std::max<size_t>(checked_tensor_bytes(s.dtype, s.shape), 1), kAlign);
    OT_CHECK(uint64_t(total) <= kMaxBytes, "cannot allocate ", specs.size(), " tensors: their size passes ", kMaxBytesText);
  }
  return total;
}

std::vector<Tensor> carve_tensors(const std::shared_ptr<void>& storage, const std::vector<TensorSpec>& specs,
                                  std::vector<std::weak_ptr<void>>* holders) {
  OT_CHECK(storage && reinterpret_cast<uintptr_t>(storage.get()) % kAlign == 0,
           "carve_tensors: the storage must be ", kAlign, "-byte aligned");
  std::vector<Tensor> tensors;
  tensors.reserve(specs.size());
  size_t offset = 0;
  for (const TensorSpec& s : specs) {
    void* at = static_cast<char*>(storage.get()) + offset;
    offset += round_up(std::max<size_t>(size_t(numel(s.shape)) * dtype_size(s.dtype), 1), kAlign);
    // A holder per tensor that keeps the shared storage alive (not an aliasing pointer, whose use
    // count would be the storage's).
    std::shared_ptr<void> holder(at, [storage](void*) {});
    if (holders) holders->push_back(holder);
    tensors.push_back(Tensor::borrow(s.dtype, s.shape, at, std::move(holder)));
  }
  return tensors;
}

std::vector<Tensor> allocate_tensors(const std::vector<TensorSpec>& specs, Fill fill,
                                     std::vector<std::weak_ptr<void>>* holders) {
  return carve_tensors(allocate_storage(tensors_bytes(specs), fill), specs, holders);
}

}  // namespace onnxtrain
