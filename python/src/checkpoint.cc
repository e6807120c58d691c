// Python bindings of CheckpointState (include/onnxtrain/training.h). The user-facing classes
// (CheckpointState, Parameter, Parameters, Properties) are in python/onnxtrain/api.py; this is
// the thin native layer under them. Parameter data crosses as numpy copies; bfloat16 parameters
// appear as float32 arrays (exact) and are rounded back to bfloat16 when set.
#include <pybind11/stl.h>

#include <cstring>

#include "bindings.h"
#include "ir/graph.h"
#include "onnx/model_io.h"
#include "onnxtrain/training.h"
#include "training/ort_checkpoint.h"

namespace py = pybind11;
using namespace onnxtrain;
using namespace onnxtrain::python;

namespace {

py::array to_numpy_copy(const Tensor& t) {
  if (t.dtype() == DType::kBFloat16) {
    Tensor f = Tensor::empty(DType::kFloat32, t.shape());
    const auto* src = t.data<bfloat16>();
    float* dst = f.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) dst[i] = float(src[i]);
    return tensor_to_numpy(f);
  }
  return tensor_to_numpy(t.clone());
}

// A tensor for parameter p from a numpy array; bfloat16 parameters take float32 arrays.
Tensor from_numpy_for(const Parameter& p, py::handle obj, const std::string& what) {
  Tensor t = tensor_from_numpy(obj, what);
  if (p.dtype() == DType::kBFloat16 && t.dtype() == DType::kFloat32) {
    Tensor b = Tensor::empty(DType::kBFloat16, t.shape());
    const float* src = t.data<float>();
    auto* dst = b.data<bfloat16>();
    for (int64_t i = 0; i < t.numel(); ++i) dst[i] = bfloat16(src[i]);
    return b;
  }
  return t;
}

py::object property_to_python(const PropertyValue& v) {
  if (auto* i = std::get_if<int64_t>(&v)) return py::int_(*i);
  if (auto* d = std::get_if<double>(&v)) return py::float_(*d);
  return py::str(std::get<std::string>(v));
}

std::string dtype_str(DType dt) { return dtype_name(dt); }

}  // namespace

void bind_checkpoint(py::module_& m) {
  py::class_<CheckpointState, std::shared_ptr<CheckpointState>>(m, "CheckpointState")
      .def(py::init<>())
      .def_static(
          "load",
          [](const std::string& path) {
            py::gil_scoped_release release;
            return std::make_shared<CheckpointState>(CheckpointState::load(path));
          },
          py::arg("path"))
      .def(
          "save",
          [](const CheckpointState& s, const std::string& path, bool include_optimizer_state, const std::string& format) {
            CheckpointFormat f = CheckpointFormat::kOnnxtrain;
            if (format == "ort") f = CheckpointFormat::kOrt;
            else if (format != "onnxtrain")
              OT_THROW(kInvalidArgument, "save_checkpoint: format expected \"onnxtrain\" or \"ort\", got \"", format, "\"");
            py::gil_scoped_release release;
            s.save(path, include_optimizer_state, f);
          },
          py::arg("path"), py::arg("include_optimizer_state") = true, py::arg("format") = "onnxtrain")
      .def(
          "_save_ort",
          [](const CheckpointState& s, const std::string& path, bool include_optimizer_state, int version,
             uint64_t external_threshold) {
            py::gil_scoped_release release;
            try {
              ort_checkpoint::write(s, path, include_optimizer_state, {version, external_threshold});
            } catch (const Error& e) {
              throw Error(e.code(), "checkpoint '" + path + "' (ONNX Runtime format): " + e.what());
            }
          },
          py::arg("path"), py::arg("include_optimizer_state"), py::arg("version"), py::arg("external_threshold"),
          "for tests: ONNX Runtime's format with a chosen version and external data threshold (bytes)")
      .def_static(
          "file_format",
          [](const std::string& path) { return std::string(checkpoint_format_name(CheckpointState::file_format(path))); },
          py::arg("path"))
      .def_static(
          "from_onnx_model",
          [](py::object model, const std::vector<std::string>& trainable, bool nominal) {
            Model mdl;
            if (py::isinstance<py::bytes>(model)) {
              std::string bytes = model.cast<std::string>();
              py::gil_scoped_release release;
              mdl = load_model_from_bytes(bytes);
            } else {
              std::string path = py::str(model);
              py::gil_scoped_release release;
              mdl = load_model(path);
            }
            return std::make_shared<CheckpointState>(CheckpointState::from_initializers(mdl.graph, trainable, nominal));
          },
          py::arg("model"), py::arg("trainable"), py::arg("nominal") = false)
      .def("clone", [](const CheckpointState& s) { return std::make_shared<CheckpointState>(s.clone()); })
      // ---- parameters
      .def(
          "add_parameter",
          [](CheckpointState& s, const std::string& name, py::handle value, bool requires_grad) {
            s.add_parameter(name, tensor_from_numpy(value, "parameter '" + name + "'").clone(), requires_grad);
          },
          py::arg("name"), py::arg("value"), py::arg("requires_grad"))
      .def(
          "add_nominal_parameter",
          [](CheckpointState& s, const std::string& name, const py::dtype& dtype, const Shape& shape,
             bool requires_grad) { s.add_nominal_parameter(name, dtype_from_numpy(dtype), shape, requires_grad); },
          py::arg("name"), py::arg("dtype"), py::arg("shape"), py::arg("requires_grad"))
      .def("parameter_names", &CheckpointState::parameter_names)
      .def("has_parameter", &CheckpointState::has_parameter, py::arg("name"))
      .def("is_nominal", &CheckpointState::is_nominal)
      .def(
          "parameter_info",
          [](const CheckpointState& s, const std::string& name) {
            const Parameter& p = s.parameter(name);
            py::object shape = p.shape_known() ? py::object(py::tuple(py::cast(p.shape()))) : py::object(py::none());
            return py::make_tuple(dtype_str(p.dtype()), shape, p.requires_grad(), p.has_data(), p.has_grad());
          },
          py::arg("name"), "(dtype, shape or None when unknown, requires_grad, has_data, has_grad)")
      .def(
          "get_parameter_data",
          [](const CheckpointState& s, const std::string& name) { return to_numpy_copy(s.parameter(name).data()); },
          py::arg("name"))
      .def(
          "set_parameter_data",
          [](CheckpointState& s, const std::string& name, py::handle value) {
            Parameter& p = s.parameter(name);
            p.set_data(from_numpy_for(p, value, "parameter '" + name + "'"));
          },
          py::arg("name"), py::arg("value"))
      .def(
          "get_parameter_grad",
          [](const CheckpointState& s, const std::string& name) -> py::object {
            const Parameter& p = s.parameter(name);
            if (!p.has_grad()) return py::none();
            return to_numpy_copy(p.grad());
          },
          py::arg("name"))
      .def(
          "set_parameter_grad",
          [](CheckpointState& s, const std::string& name, py::object value) {
            Parameter& p = s.parameter(name);
            if (value.is_none()) p.set_grad(Tensor());
            else p.set_grad(from_numpy_for(p, value, "gradient of '" + name + "'").clone());
          },
          py::arg("name"), py::arg("value"))
      .def(
          "set_requires_grad",
          [](CheckpointState& s, const std::string& name, bool r) { s.parameter(name).set_requires_grad(r); },
          py::arg("name"), py::arg("requires_grad"))
      .def(
          "to_contiguous_buffer",
          [](const CheckpointState& s, bool trainable_only) { return to_numpy_copy(s.to_contiguous_buffer(trainable_only)); },
          py::arg("trainable_only") = true)
      .def(
          "fill_parameters_from_buffer",
          [](CheckpointState& s, py::handle buffer, bool trainable_only) {
            s.fill_parameters_from_buffer(tensor_from_numpy(buffer, "parameter buffer"), trainable_only);
          },
          py::arg("buffer"), py::arg("trainable_only") = true)
      // ---- properties
      .def("property_names",
           [](const CheckpointState& s) {
             std::vector<std::string> names;
             for (const auto& [k, v] : s.properties()) names.push_back(k);
             return names;
           })
      .def("has_property", &CheckpointState::has_property, py::arg("name"))
      .def(
          "get_property", [](const CheckpointState& s, const std::string& name) { return property_to_python(s.get_property(name)); },
          py::arg("name"))
      .def(
          "set_int_property", [](CheckpointState& s, const std::string& name, int64_t v) { s.add_property(name, v); },
          py::arg("name"), py::arg("value"))
      .def(
          "set_float_property", [](CheckpointState& s, const std::string& name, double v) { s.add_property(name, v); },
          py::arg("name"), py::arg("value"))
      .def(
          "set_string_property",
          [](CheckpointState& s, const std::string& name, const std::string& v) { s.add_property(name, v); },
          py::arg("name"), py::arg("value"))
      .def("remove_property", &CheckpointState::remove_property, py::arg("name"))
      // ---- optimizer state
      .def("has_optimizer_state", &CheckpointState::has_optimizer_state)
      .def("clear_optimizer_state", &CheckpointState::clear_optimizer_state)
      .def_property(
          "optimizer_step", [](const CheckpointState& s) { return s.optimizer_state().step; },
          [](CheckpointState& s, int64_t step) { s.optimizer_state().step = step; })
      .def_property(
          "optimizer_learning_rate",
          [](const CheckpointState& s) -> py::object {
            const auto& lr = s.optimizer_state().learning_rate;
            return lr ? py::object(py::float_(*lr)) : py::object(py::none());
          },
          [](CheckpointState& s, std::optional<double> lr) { s.optimizer_state().learning_rate = lr; })
      .def(
          "get_optimizer_state",
          [](const CheckpointState& s) {
            py::dict out;
            for (const auto& [param, states] : s.optimizer_state().param_states) {
              py::dict d;
              for (const auto& [name, t] : states) d[py::str(name)] = to_numpy_copy(t);
              out[py::str(param)] = d;
            }
            return out;
          },
          "{param: {state name: numpy array}}")
      .def(
          "set_optimizer_tensor",
          [](CheckpointState& s, const std::string& param, const std::string& name, py::handle value) {
            s.set_optimizer_tensor(param, name, tensor_from_numpy(value, "optimizer state '" + name + "'").clone());
          },
          py::arg("param"), py::arg("name"), py::arg("value"));
}
