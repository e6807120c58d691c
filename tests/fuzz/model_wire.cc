// ONNX models through the minimal build's own wire-format reader (src/onnx/wire_format.cc, which
// model_io_minimal.cc calls): parse, infer shapes, serialize with the wire-format writer and parse
// that again. External data resolves in the scratch folder holding "weights.bin" (fuzz_util.h).
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "onnx/wire_format.h"
#include "passes/shape_inference.h"

FUZZ_INITIALIZE_WITH_LIMITS()

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace onnxtrain;
  try {
    Model model = wire::parse_model(std::string_view(reinterpret_cast<const char*>(data), size), fuzz::scratch_dir(),
                                    "<fuzz>");
    infer_shapes(model.graph, model.opsets);
    const std::string again = wire::serialize_model(model);
    Model reread = wire::parse_model(again, fuzz::scratch_dir(), "<fuzz, written back>");
    infer_shapes(reread.graph, reread.opsets);
  } catch (const Error& e) {
    fuzz::refused(e);
  }
  return 0;
}
