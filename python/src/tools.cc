// Model-level helpers exposed to Python: running the passes and shape inference on bytes.
#include <pybind11/stl.h>

#include "bindings.h"
#include "onnx/model_io.h"
#include "onnxtrain/cpu_features.h"
#include "passes/passes.h"
#include "passes/shape_inference.h"

namespace py = pybind11;
using namespace onnxtrain;

void bind_tools(py::module_& m) {
  m.def("optimize_model", [](py::bytes model) {
    Model mdl = load_model_from_bytes(std::string(model));
    optimize_for_inference(mdl);
    return py::bytes(save_model_to_bytes(mdl));
  }, "Runs the inference pass pipeline over a serialized model and returns the result.");
  m.def("infer_shapes", [](py::bytes model) {
    Model mdl = load_model_from_bytes(std::string(model));
    infer_shapes(mdl.graph, mdl.opsets);
    return py::bytes(save_model_to_bytes(mdl));
  }, "Annotates value_info with onnxtrain's own shape rules.");
  m.def("cpu_features", []() {
    const CpuFeatures& f = cpu_features();
    py::dict d;
    d["vendor"] = f.vendor;
    for (const auto& [name, on] : f.flags) d[py::str(name)] = on;
    d["onednn_isa"] = f.onednn_isa;
    d["bf16_matmul_native"] = f.bf16_matmul_native;
    d["fp16_matmul_native"] = f.fp16_matmul_native;
    return d;
  }, "What the CPU offers for low precision (CPUID flags the OS enabled) and what the engine runs.");
}
