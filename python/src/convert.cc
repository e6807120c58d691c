// numpy <-> Tensor and the dicts the binding files share (declared in bindings.h). The binding
// files use these; module.cc, the extension's entry, uses the binding files.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "bindings.h"

namespace onnxtrain::python {

DType dtype_from_numpy(const py::dtype& dt) {
  switch (dt.kind()) {
    case 'f':
      if (dt.itemsize() == 4) return DType::kFloat32;
      if (dt.itemsize() == 8) return DType::kFloat64;
      if (dt.itemsize() == 2) return DType::kFloat16;
      break;
    case 'i':
      if (dt.itemsize() == 1) return DType::kInt8;
      if (dt.itemsize() == 2) return DType::kInt16;
      if (dt.itemsize() == 4) return DType::kInt32;
      if (dt.itemsize() == 8) return DType::kInt64;
      break;
    case 'u':
      if (dt.itemsize() == 1) return DType::kUint8;
      if (dt.itemsize() == 2) return DType::kUint16;
      if (dt.itemsize() == 4) return DType::kUint32;
      if (dt.itemsize() == 8) return DType::kUint64;
      break;
    case 'b': return DType::kBool;
  }
  OT_THROW(kInvalidArgument, "numpy dtype ", std::string(py::str(static_cast<const py::handle&>(dt))), " is not supported");
}

py::dtype numpy_dtype(DType dt) {
  switch (dt) {
    case DType::kFloat32: return py::dtype::of<float>();
    case DType::kFloat64: return py::dtype::of<double>();
    case DType::kFloat16: return py::dtype("float16");
    case DType::kInt8: return py::dtype::of<int8_t>();
    case DType::kInt16: return py::dtype::of<int16_t>();
    case DType::kInt32: return py::dtype::of<int32_t>();
    case DType::kInt64: return py::dtype::of<int64_t>();
    case DType::kUint8: return py::dtype::of<uint8_t>();
    case DType::kUint16: return py::dtype::of<uint16_t>();
    case DType::kUint32: return py::dtype::of<uint32_t>();
    case DType::kUint64: return py::dtype::of<uint64_t>();
    case DType::kBool: return py::dtype::of<bool>();
    // numpy has no bfloat16: its bits travel as uint16, as ONNX's own tools do.
    case DType::kBFloat16: return py::dtype::of<uint16_t>();
    default: OT_THROW(kNotImplemented, "dtype ", dtype_name(dt), " has no numpy equivalent");
  }
}

Tensor tensor_from_numpy(py::handle obj, const std::string& what) {
  py::array arr = py::array::ensure(obj, py::array::c_style);
  if (!arr) OT_THROW(kInvalidArgument, what, ": expected a numpy array, got ", std::string(py::str(obj.get_type())));
  DType dt = dtype_from_numpy(arr.dtype());
  Shape shape(arr.shape(), arr.shape() + arr.ndim());
  // Keep the array alive while the tensor lives; the release may happen without the GIL.
  auto* keep = new py::object(arr);
  std::shared_ptr<void> holder(keep, [](void* p) {
    py::gil_scoped_acquire gil;
    delete static_cast<py::object*>(p);
  });
  return Tensor::borrow(dt, shape, const_cast<void*>(arr.data()), holder);
}

py::array tensor_to_numpy(const Tensor& t) {
  auto* keep = new Tensor(t);
  py::capsule owner(keep, [](void* p) { delete static_cast<Tensor*>(p); });
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
  return py::array(numpy_dtype(t.dtype()), shape, t.data(), owner);
}

std::map<std::string, Tensor> feeds_from_dict(const py::dict& feeds) {
  std::map<std::string, Tensor> out;
  for (auto [k, v] : feeds) {
    std::string name = py::str(k);
    out[name] = tensor_from_numpy(v, "feed '" + name + "'");
  }
  return out;
}

py::dict stats_dict(const StepStats& s) {
  py::dict d;
  d["grad_norm"] = s.grad_norm;
  d["clip_coef"] = s.clip_coef;
  d["skipped"] = s.skipped;
  d["loss_scale"] = s.loss_scale;
  return d;
}

}  // namespace onnxtrain::python
