// Pre-compiled models (.otc, src/runtime/compiled_model.cc): the bytes through
// read_compiled_model (header, payload records, the embedded graph, kernel versions and plans);
// a model that reads is written back and read again.
#include "fuzz_util.h"
#include "runtime/compiled_model.h"

FUZZ_INITIALIZE_WITH_LIMITS()

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace onnxtrain;
  const std::string path = fuzz::write_scratch("model.otc", data, size);
  // No model.onnx beside it: the staleness check against the source is skipped.
  try {
    CompiledModel compiled = read_compiled_model(path, fuzz::scratch_dir() + "/model.onnx");
    const std::string again = fuzz::scratch_dir() + "/again.otc";
    write_compiled_model(again, compiled, fuzz::scratch_dir() + "/model.onnx");
    read_compiled_model(again, fuzz::scratch_dir() + "/model.onnx");
  } catch (const Error& e) {
    fuzz::refused(e);
  }
  return 0;
}
