// ONNX models through protobuf (src/onnx/model_io.cc): parse, import into the IR, infer shapes
// (a model that parses can still lie about its shapes), then write it back and read that again.
// External data resolves in the scratch folder holding "weights.bin" (fuzz_util.h).
#include <string>

#include "fuzz_util.h"
#include "onnx/model_io.h"
#include "passes/shape_inference.h"

FUZZ_INITIALIZE_WITH_LIMITS()

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace onnxtrain;
  try {
    Model model = load_model_from_bytes(std::string(reinterpret_cast<const char*>(data), size), fuzz::scratch_dir(),
                                        "<fuzz>");
    infer_shapes(model.graph, model.opsets);
    const std::string again = save_model_to_bytes(model);
    Model reread = load_model_from_bytes(again, fuzz::scratch_dir(), "<fuzz, written back>");
    infer_shapes(reread.graph, reread.opsets);
  } catch (const Error& e) {
    fuzz::refused(e);
  }
  return 0;
}
