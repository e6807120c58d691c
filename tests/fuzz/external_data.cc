// ONNX external data resolution (src/onnx/external_data.cc). The input is a tensor's element count
// (first byte) and its external_data entries, one "key=value" per line. The model folder holds
// weights.bin (4 KiB) and a symbolic link "escape" to a folder beside it, whose secret.bin must
// never be read: a location that resolves outside the model folder is refused, or the target
// aborts. Whatever succeeds must have read the tensor's bytes from inside the folder.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_util.h"
#include "onnx/external_data.h"

namespace {
std::string model_dir;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  namespace fs = std::filesystem;
  fuzz::init();
  model_dir = fuzz::scratch_dir() + "/model";
  fs::create_directories(model_dir + "/sub");
  fs::create_directories(fuzz::scratch_dir() + "/outside");
  const std::string weights(4096, '\x3f'), secret(4096, '\x5a');
  fuzz::write_scratch("model/weights.bin", weights.data(), weights.size());
  fuzz::write_scratch("model/sub/weights.bin", weights.data(), weights.size());
  fuzz::write_scratch("outside/secret.bin", secret.data(), secret.size());
  fuzz::write_scratch("secret.bin", secret.data(), secret.size());
  std::error_code ec;
  fs::create_directory_symlink("../outside", model_dir + "/escape", ec);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace onnxtrain;
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::vector<std::pair<std::string, std::string>> entries;
  for (size_t at = 0; at <= text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    const size_t eq = line.find('=');
    if (eq != std::string::npos) entries.emplace_back(line.substr(0, eq), line.substr(eq + 1));
    at = end + 1;
  }
  try {
    Tensor t = Tensor::zeros(DType::kFloat32, {int64_t(data[0] % 64)});
    read_external_data(t, entries, model_dir, "fuzz tensor");
    const auto* bytes = static_cast<const uint8_t*>(t.data());
    for (size_t i = 0; i < t.nbytes(); ++i)
      if (bytes[i] == 0x5a) {
        std::fprintf(stderr, "external data read a file outside the model folder\n");
        std::abort();
      }
  } catch (const Error& e) {
    fuzz::refused(e);
  }
  return 0;
}
