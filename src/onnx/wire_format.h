// ONNX ModelProto <-> IR straight from and to the protobuf wire format, with no protobuf library:
// the minimal build's model reader and writer (model_io_minimal.cc). It reads the subset of
// ModelProto, GraphProto, NodeProto, AttributeProto, TensorProto, ValueInfoProto/TypeProto and
// OperatorSetIdProto that the IR holds, skips fields the IR has no place for (doc strings, training
// info), and refuses what the protobuf-based reader refuses (functions, sparse initializers,
// non-tensor graph inputs), with the same messages. Both builds compile it, so the C++ tests check
// it against the protobuf-based model_io.cc (same graphs read, same bytes written).
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "ir/graph.h"

namespace onnxtrain::wire {

// Serialized ModelProto bytes -> Model; external data resolves relative to base_dir.
Model parse_model(std::string_view bytes, const std::string& base_dir, const std::string& description);

// Where a top-level initializer's bytes live when they are not inline (ONNX external data).
struct ExternalTensor {
  std::string location;
  int64_t offset = 0, length = 0;
};

// Model -> serialized ModelProto bytes, field for field what model_io.cc's protobuf writer emits.
// Initializers named in `external` get external_data entries instead of raw_data.
std::string serialize_model(const Model& model, const std::map<std::string, ExternalTensor>& external = {});

}  // namespace onnxtrain::wire
