// The JSON reader (src/training/json.cc) that checkpoint headers, checkpoint metadata and the
// artifacts' metadata go through: parse; what parses dumps, and dump(parse(dump(v))) == dump(v).
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "fuzz_util.h"
#include "onnxtrain/status.h"
#include "training/json.h"

FUZZ_INITIALIZE_WITH_LIMITS()

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace onnxtrain;
  json::Value v;
  try {
    v = json::parse(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const Error& e) {
    fuzz::refused(e);
    return 0;
  }
  // A parsed value is valid JSON: dumping it and parsing that must not fail, and must be stable.
  const std::string once = json::dump(v);
  const std::string twice = json::dump(json::parse(once));
  if (once != twice) {
    std::fprintf(stderr, "json: dump(parse(dump(v))) != dump(v):\n%s\n%s\n", once.c_str(), twice.c_str());
    std::abort();
  }
  return 0;
}
