// Resource limits (include/onnxtrain/limits.h): the process-wide caps and the count of live tensor
// storage they are checked against (core/memory.h charges and releases it).
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <string>

#include "core/memory.h"
#include "onnxtrain/limits.h"
#include "onnxtrain/status.h"

namespace onnxtrain {

namespace {

constexpr int64_t kDefaultMaxLoopIterations = 10'000'000;

// strtoull and strtoll skip leading white space and take a sign (" -1" wraps to 2^64 - 1): a
// value must begin with a digit.
bool starts_with_digit(const char* text) { return *text >= '0' && *text <= '9'; }

// "123", "64K", "256M", "4G", "1T" (powers of 1024); throws naming the variable otherwise.
uint64_t parse_bytes(const char* var, const char* text) {
  if (!starts_with_digit(text))
    OT_THROW(kInvalidArgument, var, "='", text, "': expected a number of bytes, optionally with K, M, G or T");
  errno = 0;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(text, &end, 10);
  int shift = 0;
  if (end != text && *end) {
    switch (*end) {
      case 'K': case 'k': shift = 10; break;
      case 'M': case 'm': shift = 20; break;
      case 'G': case 'g': shift = 30; break;
      case 'T': case 't': shift = 40; break;
      default: shift = -1;
    }
    ++end;
  }
  if (end == text || *end || shift < 0 || errno || text[0] == '-' || (shift && n > (~0ull >> shift)))
    OT_THROW(kInvalidArgument, var, "='", text, "': expected a number of bytes, optionally with K, M, G or T");
  return uint64_t(n) << shift;
}

int64_t parse_count(const char* var, const char* text) {
  if (!starts_with_digit(text)) OT_THROW(kInvalidArgument, var, "='", text, "': expected a count");
  errno = 0;
  char* end = nullptr;
  const long long n = std::strtoll(text, &end, 10);
  if (end == text || *end || errno || n < 0) OT_THROW(kInvalidArgument, var, "='", text, "': expected a count");
  return n;
}

uint64_t physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
}

ResourceLimits from_environment() {
  ResourceLimits l;
  const char* alloc = std::getenv("ONNXTRAIN_MAX_ALLOC");
  l.max_alloc_bytes = alloc && *alloc ? parse_bytes("ONNXTRAIN_MAX_ALLOC", alloc) : physical_memory();
  const char* loops = std::getenv("ONNXTRAIN_MAX_LOOP_ITERATIONS");
  l.max_loop_iterations = loops && *loops ? parse_count("ONNXTRAIN_MAX_LOOP_ITERATIONS", loops)
                                          : kDefaultMaxLoopIterations;
  return l;
}

std::atomic<uint64_t> max_alloc{0}, live{0};
std::atomic<int64_t> max_loops{0};
std::once_flag read_environment;

void ensure_read() {
  std::call_once(read_environment, [] {
    const ResourceLimits l = from_environment();
    max_alloc = l.max_alloc_bytes;
    max_loops = l.max_loop_iterations;
  });
}

}  // namespace

ResourceLimits resource_limits() {
  ensure_read();
  return {max_alloc.load(), max_loops.load()};
}

void set_resource_limits(const ResourceLimits& limits) {
  // A negative count is a mistake, not "no limit" (that is 0).
  if (limits.max_loop_iterations < 0)
    OT_THROW(kInvalidArgument, "set_resource_limits: max_loop_iterations: expected a count >= 0 (0: no limit), got ",
             limits.max_loop_iterations);
  ensure_read();
  max_alloc = limits.max_alloc_bytes;
  max_loops = limits.max_loop_iterations;
}

uint64_t live_tensor_bytes() { return live.load(); }

void charge_storage(size_t bytes) {
  ensure_read();
  const uint64_t limit = max_alloc.load(std::memory_order_relaxed);
  const uint64_t before = live.fetch_add(bytes, std::memory_order_relaxed);
  if (limit && (bytes > limit || before > limit - bytes)) {
    live.fetch_sub(bytes, std::memory_order_relaxed);
    OT_THROW(kRuntime, "allocating ", bytes, " bytes of tensor storage (", before,
             " already in use) would pass the memory limit of ", limit,
             " bytes (ONNXTRAIN_MAX_ALLOC or onnxtrain::set_resource_limits)");
  }
}

void release_storage(size_t bytes) { live.fetch_sub(bytes, std::memory_order_relaxed); }

int64_t max_loop_iterations() {
  ensure_read();
  return max_loops.load(std::memory_order_relaxed);
}

}  // namespace onnxtrain
