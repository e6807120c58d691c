#include "core/parallel.h"

#include <cctype>
#include <cstdlib>
#include <string>

#include "onnxtrain/status.h"

namespace onnxtrain {

void set_num_threads(int n) {
  if (n > 0) omp_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

bool pool_sleeps_between_regions() {
  // Read at each call (plans decide once): libgomp reads it once at startup, and a test sets it.
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  if (!policy) return false;
  std::string p(policy);
  for (char& c : p) c = char(std::tolower(static_cast<unsigned char>(c)));
  return p == "passive";
}

int64_t serial_step_work() {
  if (!pool_sleeps_between_regions()) return 0;
  const char* env = std::getenv("ONNXTRAIN_SERIAL_WORK");
  return env && *env ? serial_work() : kPassiveSerialWork;
}

int64_t serial_work() {
  static const int64_t limit = [] {
    const char* env = std::getenv("ONNXTRAIN_SERIAL_WORK");
    if (!env || !*env) return kSerialWork;
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    if (*end != '\0' || v < 0)
      OT_THROW(kInvalidArgument, "ONNXTRAIN_SERIAL_WORK: expected a non-negative count of multiply-adds, got '",
               std::string(env), "'");
    return int64_t(v);
  }();
  return limit;
}

}  // namespace onnxtrain
