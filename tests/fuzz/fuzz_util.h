// What the fuzz targets share (docs/ROBUSTNESS.md, "Fuzzing"): the limits every input runs under
// and a scratch folder for the readers that take a path. Each target defines LLVMFuzzerInitialize
// and LLVMFuzzerTestOneInput; libFuzzer drives them in the fuzz build (build-fuzz), replay_main.cc
// replays the kept regression inputs through them in the normal build.
//
// The contract every target checks: whatever the bytes, a reader either succeeds or throws
// onnxtrain::Error. Anything else (a sanitizer report, another exception, an abort, a leak, a
// hang past -timeout, memory past -rss_limit_mb) is a bug to fix where it lives.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "onnxtrain/limits.h"
#include "onnxtrain/status.h"

namespace fuzz {

// Tensor memory far below libFuzzer's -rss_limit_mb (2 GiB) and few Loop iterations: a hostile
// declared size or a Loop that never ends must be an onnxtrain::Error under these limits.
inline constexpr uint64_t kMaxAllocBytes = uint64_t(256) << 20;
inline constexpr int64_t kMaxLoopIterations = 1000;


// A folder of this process's own under $TMPDIR (or /tmp), made on first use, removed at exit.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* tmp = getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/onnxtrain-fuzz-XXXXXX";
    if (!mkdtemp(pattern.data())) {
      std::perror("mkdtemp");
      std::abort();
    }
    return pattern;
  }();
  static const bool removed_at_exit = std::atexit([] { std::filesystem::remove_all(scratch_dir()); }) == 0;
  (void)removed_at_exit;
  return dir;
}

// Writes bytes to scratch_dir()/name and returns the path.
inline std::string write_scratch(const std::string& name, const void* data, size_t size) {
  const std::string path = scratch_dir() + "/" + name;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(data), std::streamsize(size));
  if (!f) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
  return path;
}

// The limits, and "weights.bin" (4 KiB of 0x3f) in scratch_dir(), where the model targets resolve
// external data: references to it read, others fail.
inline void init() {
  setenv("OMP_NUM_THREADS", "1", 1);  // one input at a time, one thread: reproducible, no pool noise
  onnxtrain::ResourceLimits limits;
  limits.max_alloc_bytes = kMaxAllocBytes;
  limits.max_loop_iterations = kMaxLoopIterations;
  onnxtrain::set_resource_limits(limits);
  const std::string weights(4096, '\x3f');
  write_scratch("weights.bin", weights.data(), weights.size());
}

// An input the reader refused, as it should: printed with FUZZ_VERBOSE=1 (to see why seeds fail).
inline void refused(const onnxtrain::Error& e) {
  static const bool verbose = getenv("FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "refused: %s\n", e.what());
}

}  // namespace fuzz

// LLVMFuzzerInitialize for the targets that need nothing but init().
#define FUZZ_INITIALIZE_WITH_LIMITS()                    \
  extern "C" int LLVMFuzzerInitialize(int*, char***) { \
    fuzz::init();                                      \
    return 0;                                          \
  }
