// Model-level helpers exposed to Python: running the passes and shape inference on bytes.
#include <pybind11/stl.h>

#include "bindings.h"
#include "core/device.h"
#include "onnx/model_io.h"
#include "onnxtrain/cpu_features.h"
#include "passes/passes.h"
#include "passes/shape_inference.h"
#include "training/lora.h"
#include "training/quantize.h"
#include "onnxtrain/training.h"

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
  m.def("gpu_features", []() {
    py::dict d;
    std::string why;
    const bool available = device_available(Device::kCuda, &why);
    d["available"] = available;
    if (available) d["description"] = device_backend(Device::kCuda).description();
    else d["reason"] = why;
    return d;
  });
  m.def("cpu_features", []() {
    const CpuFeatures& f = cpu_features();
    py::dict d;
    d["vendor"] = f.vendor;
    for (const auto& [name, on] : f.flags) d[py::str(name)] = on;
    d["onednn_isa"] = f.onednn_isa;
    d["bf16_matmul_native"] = f.bf16_matmul_native;
    d["fp16_matmul_native"] = f.fp16_matmul_native;
    d["model"] = f.model;
    const GemmRates& rates = gemm_rates();
    d["gemm_gflops"] = py::dict(py::arg("fp32") = rates.fp32_gflops, py::arg("bf16") = rates.bf16_gflops,
                                py::arg("source") = rates.source);
    d["bf16_pays"] = rates.bf16_pays();
    return d;
  }, "What the CPU offers for low precision (CPUID flags the OS enabled), what the engine runs, and "
     "whether bf16 GEMMs beat fp32 ones here (measured once per process).");
  m.def("quantize_model", [](py::bytes model, int bits, int block_size, bool symmetric, std::vector<std::string> exclude) {
    Model mdl = load_model_from_bytes(std::string(model));
    QuantizeOptions o{bits, block_size, symmetric, std::move(exclude)};
    QuantizeReport r = quantize_model(mdl, o);
    py::list layers;
    for (const auto& l : r.layers)
      layers.append(py::dict(py::arg("node") = l.node, py::arg("weight") = l.weight, py::arg("K") = l.k,
                             py::arg("N") = l.n, py::arg("relative_error") = l.relative_error));
    py::dict report(py::arg("layers") = layers, py::arg("skipped") = r.skipped,
                    py::arg("weight_bytes_before") = r.weight_bytes_before,
                    py::arg("weight_bytes_after") = r.weight_bytes_after, py::arg("table") = r.table());
    return py::make_tuple(py::bytes(save_model_to_bytes(mdl)), report);
  }, "MatMul/Gemm fp32 weights -> com.microsoft.MatMulNBits; returns (model bytes, report).");
  m.def("lora_info", [](const std::string& path) {
    LoraInfo info = lora_info(load_model(path));
    py::list adapters;
    for (const auto& a : info.adapters)
      adapters.append(py::dict(py::arg("node") = a.node, py::arg("module") = a.module, py::arg("weight") = a.weight,
                               py::arg("A") = a.a, py::arg("B") = a.b, py::arg("in") = a.in, py::arg("out") = a.out));
    return py::dict(py::arg("rank") = info.rank, py::arg("alpha") = info.alpha, py::arg("dropout") = info.dropout, py::arg("base_hash") = info.base_hash,
                    py::arg("adapters") = adapters);
  }, "The LoRA adapters recorded in a training/eval/exported model (empty adapters when none).");
  m.def("export_lora_adapters", [](const std::string& model_path, std::shared_ptr<CheckpointState> state,
                                   const std::string& out) {
    export_lora_adapters(model_path, *state, out);
  }, "Writes the adapters as safetensors with PEFT's key names.");
  m.def("import_lora_adapters", [](const std::string& model_path, std::shared_ptr<CheckpointState> state,
                                   const std::string& file) {
    import_lora_adapters(model_path, *state, file);
  }, "Sets the state's adapters from a PEFT adapter_model.safetensors.");
  m.def("merge_lora_file", [](const std::string& path) {
    Model mdl = load_model(path);
    int merged = merge_lora(mdl);
    save_model(mdl, path);
    return merged;
  }, "Folds fp32-base adapters into their weights in place; returns how many were merged.");
}
