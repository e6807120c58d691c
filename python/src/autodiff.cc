// Python access to autodiff: serialized model in, serialized training graph out.
#include <pybind11/stl.h>

#include "autodiff/autodiff.h"
#include "bindings.h"
#include "onnx/model_io.h"
#include "passes/passes.h"

namespace py = pybind11;
using namespace onnxtrain;

void bind_autodiff(py::module_& m) {
  m.def(
      "build_gradient_graph",
      [](py::bytes model, const std::vector<std::string>& wrt, const std::vector<std::string>& outputs) {
        std::string bytes = model;
        GradientGraphInfo info;
        std::string out;
        {
          py::gil_scoped_release release;
          Model fwd = load_model_from_bytes(bytes);
          fuse_for_training(fwd);  // the fused ops' gradient kernels, as artifacts get them
          out = save_model_to_bytes(build_gradient_graph(fwd, wrt, outputs, &info));
        }
        return py::make_tuple(py::bytes(out), info.gradient_outputs, info.seed_inputs);
      },
      py::arg("model"), py::arg("wrt"), py::arg("outputs"));
}
