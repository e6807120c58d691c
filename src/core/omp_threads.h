// The calling thread's OpenMP thread count, set for a scope (OpenMP keeps it per thread). oneDNN
// (OpenMP build) sizes a primitive's thread partition when it creates the primitive, so a primitive
// meant to run on one thread is created under the scope too.
#pragma once

#include <omp.h>

namespace onnxtrain {

class OmpThreadsScope {
 public:
  explicit OmpThreadsScope(int threads) : saved_(omp_get_max_threads()) { omp_set_num_threads(threads); }
  ~OmpThreadsScope() { omp_set_num_threads(saved_); }
  OmpThreadsScope(const OmpThreadsScope&) = delete;
  OmpThreadsScope& operator=(const OmpThreadsScope&) = delete;

 private:
  int saved_;
};

}  // namespace onnxtrain
