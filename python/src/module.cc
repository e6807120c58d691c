// The Python extension onnxtrain._C: tensors cross as numpy arrays (zero-copy both ways where
// the layout allows), errors as onnxtrain.Error subclasses.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bindings.h"
#include "onnxtrain/limits.h"
#include "onnxtrain/session.h"
#include "ops/registry.h"
#include "core/parallel.h"
#include "runtime/executor.h"

namespace py = pybind11;
using namespace onnxtrain;

namespace onnxtrain::python {

namespace {
// InferenceSession feeds: a list or tuple is a sequence of tensors, None an empty optional.
std::map<std::string, Value> value_feeds_from_dict(const py::dict& feeds) {
  std::map<std::string, Value> out;
  for (auto [k, v] : feeds) {
    std::string name = py::str(k);
    if (v.is_none()) {
      out[name] = Value::none();
    } else if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
      std::vector<Tensor> items;
      size_t i = 0;
      for (auto item : v) items.push_back(tensor_from_numpy(item, "feed '" + name + "' element " + std::to_string(i++)));
      out[name] = Value::of_sequence(std::move(items));
    } else {
      out[name] = tensor_from_numpy(v, "feed '" + name + "'");
    }
  }
  return out;
}

py::object value_to_python(const Value& v) {
  if (v.is_none()) return py::none();
  if (v.is_tensor()) return tensor_to_numpy(v.tensor);
  py::list items;
  for (const auto& t : v.sequence) items.append(tensor_to_numpy(t));
  return items;
}
}  // namespace

}  // namespace onnxtrain::python

using namespace onnxtrain::python;

PYBIND11_MODULE(_C, m) {
  m.doc() = "onnxtrain native core";
  static py::exception<Error> base(m, "Error", PyExc_RuntimeError);
  static py::exception<Error> invalid_argument(m, "InvalidArgument", base.ptr());
  static py::exception<Error> invalid_model(m, "InvalidModel", base.ptr());
  static py::exception<Error> not_implemented(m, "NotImplemented", base.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      switch (e.code()) {
        case ErrorCode::kInvalidArgument: invalid_argument(e.what()); break;
        case ErrorCode::kInvalidModel: invalid_model(e.what()); break;
        case ErrorCode::kNotImplemented: not_implemented(e.what()); break;
        default: base(e.what());
      }
    }
  });

  py::class_<SessionOptions>(m, "SessionOptions")
      .def(py::init<>())
      .def_readwrite("num_threads", &SessionOptions::num_threads)
      .def_readwrite("optimize", &SessionOptions::optimize)
      .def_readwrite("check_shape_rules", &SessionOptions::check_shape_rules)
      .def_readwrite("enable_profiling", &SessionOptions::enable_profiling);

  py::class_<IoInfo>(m, "IoInfo")
      .def_readonly("name", &IoInfo::name)
      .def_property_readonly("dtype", [](const IoInfo& i) { return dtype_name(i.dtype); })
      .def_readonly("rank_known", &IoInfo::rank_known)
      .def_readonly("sequence", &IoInfo::sequence)
      .def_readonly("optional", &IoInfo::optional)
      .def_property_readonly("shape", [](const IoInfo& i) {
        py::list dims;
        for (size_t d = 0; d < i.shape.size(); ++d) {
          if (i.shape[d] >= 0) dims.append(i.shape[d]);
          else if (d < i.dim_params.size() && !i.dim_params[d].empty()) dims.append(i.dim_params[d]);
          else dims.append(py::none());
        }
        return dims;
      });

  py::class_<InferenceSession>(m, "InferenceSession")
      .def(py::init([](py::object model, SessionOptions options) {
             if (py::isinstance<py::bytes>(model)) {
               std::string bytes = model.cast<std::string>();
               py::gil_scoped_release release;
               return std::make_unique<InferenceSession>(InferenceSession::from_bytes(bytes, options));
             }
             std::string path = py::str(model);
             py::gil_scoped_release release;
             return std::make_unique<InferenceSession>(path, options);
           }),
           py::arg("model"), py::arg("options") = SessionOptions())
      .def("run",
           [](InferenceSession& s, const std::vector<std::string>& names, const py::dict& feeds) {
             auto values = value_feeds_from_dict(feeds);
             // bfloat16 inputs arrive as uint16 bit patterns (numpy has no bfloat16).
             for (const auto& in : s.inputs())
               if (auto it = values.find(in.name); it != values.end() && in.dtype == DType::kBFloat16 &&
                                                    it->second.is_tensor() && it->second.tensor.dtype() == DType::kUint16)
                 it->second.tensor = it->second.tensor.view_as(DType::kBFloat16);
             std::vector<Value> outs;
             {
               py::gil_scoped_release release;
               outs = s.run_values(values, names);
               values.clear();
             }
             py::list result;
             for (const auto& v : outs) result.append(value_to_python(v));
             return result;
           })
      .def("inputs", &InferenceSession::inputs)
      .def("outputs", &InferenceSession::outputs)
      .def("memory_report", &InferenceSession::memory_report)
      .def("profile",
           [](const InferenceSession& s) {
             py::list rows;
             for (const auto& n : s.profile())
               rows.append(py::dict(py::arg("node") = n.node_name, py::arg("op_type") = n.op_type,
                                    py::arg("calls") = n.calls, py::arg("total_us") = n.total_us));
             return rows;
           })
      .def("profile_report", &InferenceSession::profile_report);

  m.def("set_num_threads", &set_num_threads);
  m.def("resource_limits", []() {
    const ResourceLimits l = resource_limits();
    return py::dict(py::arg("max_alloc_bytes") = l.max_alloc_bytes, py::arg("max_loop_iterations") = l.max_loop_iterations);
  });
  m.def("set_resource_limits", [](std::optional<uint64_t> max_alloc_bytes, std::optional<int64_t> max_loop_iterations) {
    ResourceLimits l = resource_limits();
    if (max_alloc_bytes) l.max_alloc_bytes = *max_alloc_bytes;
    if (max_loop_iterations) l.max_loop_iterations = *max_loop_iterations;
    set_resource_limits(l);
  }, py::arg("max_alloc_bytes") = py::none(), py::arg("max_loop_iterations") = py::none());
  m.def("live_tensor_bytes", &live_tensor_bytes);
  m.def("num_threads", &num_threads);

  // The registry, for the coverage table and the registry-driven tests.
  m.def("registered_ops", []() {
    py::list out;
    for (const OpSchema* s : OpRegistry::global().all()) {
      py::dict d;
      d["domain"] = s->domain;
      d["op_type"] = s->op_type;
      d["since_version"] = s->since_version;
      d["cpu"] = bool(s->cpu);
      d["shape_rule"] = bool(s->shape);
      d["gradient"] = gradient_status_name(s->gradient_status);
      d["gradient_note"] = s->gradient_note;
      out.append(d);
    }
    return out;
  });

  bind_tools(m);
  bind_autodiff(m);
  bind_checkpoint(m);
  bind_optim(m);
  bind_training(m);
  bind_torch_bridge(m);
}
