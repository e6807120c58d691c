// model_io.h for the minimal build: the protobuf wire format read and written by wire_format.cc,
// external data by external_data.cc. The protobuf-typed functions of model_io.h (from_proto,
// to_proto, tensor_from_proto, tensor_to_proto) exist only in the full build.
#include <filesystem>

#include "core/file_io.h"
#include "onnx/external_data.h"
#include "onnx/model_io.h"
#include "onnx/wire_format.h"

namespace onnxtrain {
namespace fs = std::filesystem;

namespace {


// Bytes of the model once inline, without building it: the initializers' bytes plus at most
// 33 bytes of framing each (as model_io.cc's inline_size), plus the rest serialized without them.
int64_t inline_size(const Model& model) {
  Model shell = model;
  int64_t size = 0;
  for (auto& [name, t] : shell.graph.initializers) {
    size += int64_t(t.nbytes()) + 33;
    t = Tensor::empty(t.dtype(), Shape{0});
  }
  return size + int64_t(wire::serialize_model(shell).size());
}

void write_model_file(const std::string& path, const std::string& bytes) {
  file_io::write_file_atomically(path, [&](int fd, const std::string& what) {
    file_io::write_all(fd, bytes.data(), bytes.size(), what);
  });
}

}  // namespace

Model load_model_from_bytes(const std::string& bytes, const std::string& base_dir, const std::string& description) {
  return wire::parse_model(bytes, base_dir, description);
}

Model load_model(const std::string& path) {
  std::string dir = fs::path(path).parent_path().string();
  return load_model_from_bytes(read_model_file(path), dir, "'" + path + "'");
}

std::string save_model_to_bytes(const Model& model) {
  const int64_t size = inline_size(model);
  OT_CHECK(size < kProtobufLimit, "model '", model.graph.name, "' is ", size,
           " bytes, over protobuf's 2 GB limit: save it to a path (initializers go to external data)");
  return wire::serialize_model(model);
}

void save_model(const Model& model, const std::string& path, bool force_external_data) {
  std::map<std::string, wire::ExternalTensor> external;
  if (force_external_data || inline_size(model) >= kProtobufLimit) {
    const std::string location = fs::path(path).filename().string() + ".data";
    std::vector<const Tensor*> tensors;
    std::vector<std::string> names;
    for (const auto& [name, t] : model.graph.initializers)
      if (t.nbytes() >= kExternalDataMinBytes) {
        tensors.push_back(&t);
        names.push_back(name);
      }
    const std::vector<int64_t> offsets =
        write_external_data_file(tensors, (fs::path(path).parent_path() / location).string());
    for (size_t i = 0; i < names.size(); ++i)
      external[names[i]] = {location, offsets[i], int64_t(tensors[i]->nbytes())};
  }
  const std::string bytes = wire::serialize_model(model, external);
  OT_CHECK(int64_t(bytes.size()) < kProtobufLimit, "model '", path, "': ", bytes.size(),
           " bytes outside the initializers (large Constant attributes?) pass protobuf's 2 GB limit");
  write_model_file(path, bytes);
}

}  // namespace onnxtrain
