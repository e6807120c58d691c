#include "onnx/model_io.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <utility>
#include <vector>

#include "core/dispatch.h"
#include "core/file_io.h"
#include "onnx/external_data.h"
#include "onnx/typed_data.h"

namespace onnxtrain {
namespace fs = std::filesystem;

namespace {


// Reads a tensor type's element type and shape into info.
void tensor_type_from_proto(const onnx::TypeProto::Tensor& tt, ValueInfo& info) {
  info.dtype = DType(tt.elem_type());
  if (tt.has_shape()) {
    Shape shape;
    for (const auto& d : tt.shape().dim()) {
      shape.push_back(d.has_dim_value() ? d.dim_value() : -1);
      info.dim_params.push_back(d.has_dim_param() ? d.dim_param() : "");
    }
    info.shape = shape;
  }
}

ValueInfo value_info_from_proto(const onnx::ValueInfoProto& v, const std::string& where) {
  ValueInfo info;
  // An empty type (exporters such as spox write one for values of unknown type) says nothing.
  if (!v.has_type() || v.type().value_case() == onnx::TypeProto::VALUE_NOT_SET) return info;
  const onnx::TypeProto* type = &v.type();
  bool optional = false;
  if (type->has_optional_type()) {
    optional = true;
    type = &type->optional_type().elem_type();
  }
  bool sequence = false;
  if (type->has_sequence_type()) {
    sequence = true;
    type = &type->sequence_type().elem_type();
  }
  if (type->value_case() == onnx::TypeProto::VALUE_NOT_SET) {
    info.kind = sequence ? (optional ? ValueKind::kOptionalSequence : ValueKind::kSequence)
                         : (optional ? ValueKind::kOptionalTensor : ValueKind::kTensor);
    return info;
  }
  if (!type->has_tensor_type())
    OT_THROW(kNotImplemented, where, "value '", v.name(),
             "' is not a tensor, a sequence of tensors or an optional of either (map types and nested "
             "sequences are not supported)");
  tensor_type_from_proto(type->tensor_type(), info);
  info.kind = sequence ? (optional ? ValueKind::kOptionalSequence : ValueKind::kSequence)
                       : (optional ? ValueKind::kOptionalTensor : ValueKind::kTensor);
  return info;
}

void value_info_to_proto(const std::string& name, const ValueInfo& info, onnx::ValueInfoProto* v) {
  v->set_name(name);
  onnx::TypeProto* type = v->mutable_type();
  if (info.kind == ValueKind::kOptionalTensor || info.kind == ValueKind::kOptionalSequence)
    type = type->mutable_optional_type()->mutable_elem_type();
  if (info.kind == ValueKind::kSequence || info.kind == ValueKind::kOptionalSequence)
    type = type->mutable_sequence_type()->mutable_elem_type();
  auto* tt = type->mutable_tensor_type();
  tt->set_elem_type(int(info.dtype));
  if (info.shape) {
    auto* shape = tt->mutable_shape();
    for (size_t i = 0; i < info.shape->size(); ++i) {
      auto* d = shape->add_dim();
      int64_t dim = (*info.shape)[i];
      if (dim >= 0) d->set_dim_value(dim);
      else if (i < info.dim_params.size() && !info.dim_params[i].empty()) d->set_dim_param(info.dim_params[i]);
    }
  }
}

// A top-level initializer whose bytes are not copied into the proto: save_model writes them either
// inline (a model under 2 GB) or to the external data file, straight from the tensor.
struct DeferredInitializer {
  onnx::TensorProto* proto;
  const Tensor* tensor;
};

Graph graph_from_proto(const onnx::GraphProto& g, const std::string& base_dir, const std::string& where);
void graph_to_proto(const Graph& graph, onnx::GraphProto* g, std::vector<DeferredInitializer>* deferred = nullptr);

Attribute attribute_from_proto(const onnx::AttributeProto& a, const std::string& base_dir,
                               const std::string& where) {
  Attribute out;
  using K = Attribute::Kind;
  switch (a.type()) {
    case onnx::AttributeProto::FLOAT: out.kind = K::kFloat; out.f = a.f(); break;
    case onnx::AttributeProto::INT: out.kind = K::kInt; out.i = a.i(); break;
    case onnx::AttributeProto::STRING: out.kind = K::kString; out.s = a.s(); break;
    case onnx::AttributeProto::TENSOR: out.kind = K::kTensor; out.t = tensor_from_proto(a.t(), base_dir); break;
    case onnx::AttributeProto::GRAPH:
      out.kind = K::kGraph;
      out.g = std::make_shared<Graph>(graph_from_proto(a.g(), base_dir, where));
      break;
    case onnx::AttributeProto::FLOATS: out.kind = K::kFloats; out.floats.assign(a.floats().begin(), a.floats().end()); break;
    case onnx::AttributeProto::INTS: out.kind = K::kInts; out.ints.assign(a.ints().begin(), a.ints().end()); break;
    case onnx::AttributeProto::STRINGS: out.kind = K::kStrings; out.strings.assign(a.strings().begin(), a.strings().end()); break;
    case onnx::AttributeProto::TENSORS:
      out.kind = K::kTensors;
      for (const auto& t : a.tensors()) out.tensors.push_back(tensor_from_proto(t, base_dir));
      break;
    case onnx::AttributeProto::TYPE_PROTO:
      out.kind = K::kTypeProto;
      out.s = a.tp().SerializeAsString();
      break;
    default:
      OT_THROW(kNotImplemented, where, "attribute '", a.name(), "' has unsupported type ", int(a.type()));
  }
  return out;
}

void attribute_to_proto(const std::string& name, const Attribute& a, onnx::AttributeProto* p) {
  using K = Attribute::Kind;
  p->set_name(name);
  switch (a.kind) {
    case K::kFloat: p->set_type(onnx::AttributeProto::FLOAT); p->set_f(a.f); break;
    case K::kInt: p->set_type(onnx::AttributeProto::INT); p->set_i(a.i); break;
    case K::kString: p->set_type(onnx::AttributeProto::STRING); p->set_s(a.s); break;
    case K::kTensor: p->set_type(onnx::AttributeProto::TENSOR); tensor_to_proto(a.t, p->mutable_t()); break;
    case K::kGraph: p->set_type(onnx::AttributeProto::GRAPH); graph_to_proto(*a.g, p->mutable_g()); break;
    case K::kFloats: p->set_type(onnx::AttributeProto::FLOATS); for (float f : a.floats) p->add_floats(f); break;
    case K::kInts: p->set_type(onnx::AttributeProto::INTS); for (int64_t i : a.ints) p->add_ints(i); break;
    case K::kStrings: p->set_type(onnx::AttributeProto::STRINGS); for (const auto& s : a.strings) p->add_strings(s); break;
    case K::kTensors:
      p->set_type(onnx::AttributeProto::TENSORS);
      for (const auto& t : a.tensors) tensor_to_proto(t, p->add_tensors());
      break;
    case K::kTypeProto:
      p->set_type(onnx::AttributeProto::TYPE_PROTO);
      p->mutable_tp()->ParseFromString(a.s);
      break;
  }
}

Graph graph_from_proto(const onnx::GraphProto& g, const std::string& base_dir, const std::string& where) {
  Graph graph;
  graph.name = g.name().empty() ? "graph" : g.name();
  if (g.sparse_initializer_size() > 0)
    OT_THROW(kNotImplemented, where, "sparse initializers are not supported");
  for (const auto& init : g.initializer()) {
    if (init.name().empty()) OT_THROW(kInvalidModel, where, "an initializer has no name");
    try {
      graph.initializers[init.name()] = tensor_from_proto(init, base_dir);
    } catch (const Error& e) {
      OT_THROW(kInvalidModel, where, "initializer '", init.name(), "': ", e.what());
    }
  }
  for (const auto& in : g.input()) {
    if (graph.is_initializer(in.name())) continue;  // IR < 4 lists initializers as inputs too
    graph.inputs.push_back({in.name(), value_info_from_proto(in, where)});
  }
  for (const auto& out : g.output()) graph.outputs.push_back({out.name(), value_info_from_proto(out, where)});
  for (const auto& v : g.value_info()) {
    try {
      graph.value_info[v.name()] = value_info_from_proto(v, where);
    } catch (const Error&) {
      // Non-tensor annotations on intermediates are hints only; drop them.
    }
  }
  int unnamed = 0;
  for (const auto& n : g.node()) {
    Node node;
    node.op_type = n.op_type();
    node.domain = n.domain() == "ai.onnx" ? "" : n.domain();
    node.name = n.name().empty() ? n.op_type() + "_" + std::to_string(unnamed++) : n.name();
    node.inputs.assign(n.input().begin(), n.input().end());
    node.outputs.assign(n.output().begin(), n.output().end());
    for (const auto& a : n.attribute()) {
      if (!a.ref_attr_name().empty())
        OT_THROW(kNotImplemented, where, node.context(), "attribute references (functions) are not supported");
      node.attributes[a.name()] = attribute_from_proto(a, base_dir, where + node.context());
    }
    graph.nodes.push_back(std::move(node));
  }
  return graph;
}

void graph_to_proto(const Graph& graph, onnx::GraphProto* g, std::vector<DeferredInitializer>* deferred) {
  g->set_name(graph.name);
  for (const auto& [name, t] : graph.initializers) {
    auto* p = g->add_initializer();
    p->set_name(name);
    if (deferred && t.nbytes() >= kExternalDataMinBytes) {
      p->set_data_type(int(t.dtype()));
      for (int64_t d : t.shape()) p->add_dims(d);
      deferred->push_back({p, &t});
    } else {
      tensor_to_proto(t, p);
    }
  }
  for (const auto& in : graph.inputs) value_info_to_proto(in.name, in.info, g->add_input());
  for (const auto& out : graph.outputs) value_info_to_proto(out.name, out.info, g->add_output());
  for (const auto& [name, info] : graph.value_info)
    if (info.dtype != DType::kUndefined) value_info_to_proto(name, info, g->add_value_info());
  for (const auto& n : graph.nodes) {
    auto* p = g->add_node();
    p->set_name(n.name);
    p->set_op_type(n.op_type);
    if (!n.domain.empty()) p->set_domain(n.domain);
    for (const auto& i : n.inputs) p->add_input(i);
    for (const auto& o : n.outputs) p->add_output(o);
    for (const auto& [k, a] : n.attributes) attribute_to_proto(k, a, p->add_attribute());
  }
}

}  // namespace

Tensor tensor_from_proto(const onnx::TensorProto& p, const std::string& base_dir) {
  DType dt = DType(p.data_type());
  std::string what = "tensor '" + p.name() + "'";
  if (dt == DType::kString) OT_THROW(kNotImplemented, what, ": string tensors are not supported");
  if (!dtype_supported(dt)) OT_THROW(kInvalidModel, what, ": unknown data type ", p.data_type());
  Shape shape(p.dims().begin(), p.dims().end());
  for (int64_t d : shape) OT_CHECK(d >= 0, what, ": negative dimension in ", shape_str(shape));
  if (p.has_segment()) OT_THROW(kNotImplemented, what, ": segmented tensors are not supported");
  Tensor t = Tensor::empty(dt, shape);
  size_t nbytes = t.nbytes();
  if (p.data_location() == onnx::TensorProto::EXTERNAL) {
    std::vector<std::pair<std::string, std::string>> entries;
    for (const auto& kv : p.external_data()) entries.emplace_back(kv.key(), kv.value());
    read_external_data(t, entries, base_dir, what);
    return t;
  }
  if (p.has_raw_data()) {
    OT_CHECK(p.raw_data().size() == nbytes, what, ": raw data holds ", p.raw_data().size(),
             " bytes, shape ", shape_str(shape), " of ", dtype_name(dt), " needs ", nbytes);
    if (nbytes) std::memcpy(t.data(), p.raw_data().data(), nbytes);
    return t;
  }
  switch (dt) {
    case DType::kFloat32: copy_field<float>(p.float_data(), t, what); break;
    case DType::kFloat64: copy_field<double>(p.double_data(), t, what); break;
    case DType::kInt64: copy_field<int64_t>(p.int64_data(), t, what); break;
    case DType::kUint32: case DType::kUint64: copy_field<uint64_t>(p.uint64_data(), t, what); break;
    default: copy_field<int32_t>(p.int32_data(), t, what); break;  // small ints, bool, halves
  }
  return t;
}

void tensor_to_proto(const Tensor& t, onnx::TensorProto* p) {
  p->set_data_type(int(t.dtype()));
  for (int64_t d : t.shape()) p->add_dims(d);
  p->set_raw_data(t.data(), t.nbytes());
}

Model from_proto(const onnx::ModelProto& proto, const std::string& base_dir, const std::string& description) {
  std::string where = "model " + description + ": ";
  if (!proto.has_graph()) OT_THROW(kInvalidModel, where, "it has no graph (is this an ONNX file?)");
  Model model;
  model.description = description;
  model.ir_version = proto.ir_version();
  model.producer_name = proto.producer_name();
  model.producer_version = proto.producer_version();
  for (const auto& op : proto.opset_import())
    model.opsets[op.domain() == "ai.onnx" ? "" : op.domain()] = op.version();
  if (!model.opsets.count("")) model.opsets[""] = proto.opset_import_size() ? 1 : 7;
  if (proto.functions_size() > 0)
    OT_THROW(kNotImplemented, where, "model-local functions are not supported");
  for (const auto& kv : proto.metadata_props()) model.metadata[kv.key()] = kv.value();
  model.graph = graph_from_proto(proto.graph(), base_dir, where);
  return model;
}

Model load_model_from_bytes(const std::string& bytes, const std::string& base_dir,
                            const std::string& description) {
  onnx::ModelProto proto;
  if (bytes.empty() || !proto.ParseFromString(bytes))
    OT_THROW(kInvalidModel, "model ", description, ": cannot parse ", bytes.size(),
             " bytes as an ONNX ModelProto (truncated or not an ONNX file)");
  return from_proto(proto, base_dir, description);
}

std::string initializers_as_inputs(std::string_view bytes, const std::set<std::string>& names,
                                   const std::string& description) {
  onnx::ModelProto proto;
  if (bytes.empty() || bytes.size() > size_t(INT_MAX) || !proto.ParseFromArray(bytes.data(), int(bytes.size())))
    OT_THROW(kInvalidModel, "model ", description, ": cannot parse ", bytes.size(),
             " bytes as an ONNX ModelProto (truncated or not an ONNX file)");
  onnx::GraphProto* g = proto.mutable_graph();
  std::set<std::string> inputs;  // an initializer may be listed as an input already (IR < 4 exports)
  for (const auto& in : g->input()) inputs.insert(in.name());
  google::protobuf::RepeatedPtrField<onnx::TensorProto> kept;
  for (auto& init : *g->mutable_initializer()) {
    if (!names.count(init.name())) {
      kept.Add()->Swap(&init);
      continue;
    }
    if (inputs.count(init.name())) continue;
    onnx::ValueInfoProto* input = g->add_input();
    input->set_name(init.name());
    auto* tt = input->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(init.data_type());
    auto* shape = tt->mutable_shape();
    for (int64_t d : init.dims()) shape->add_dim()->set_dim_value(d);
  }
  g->mutable_initializer()->Swap(&kept);
  return proto.SerializeAsString();
}

Model load_model(const std::string& path) {
  std::string dir = fs::path(path).parent_path().string();
  return load_model_from_bytes(read_model_file(path), dir, "'" + path + "'");
}

namespace {

// The model as a proto whose large top-level initializers are still empty (listed in deferred).
onnx::ModelProto to_proto_deferred(const Model& model, std::vector<DeferredInitializer>* deferred) {
  onnx::ModelProto proto;
  proto.set_ir_version(model.ir_version);
  proto.set_producer_name(model.producer_name);
  proto.set_producer_version(model.producer_version);
  for (const auto& [domain, version] : model.opsets) {
    auto* op = proto.add_opset_import();
    op->set_domain(domain);
    op->set_version(version);
  }
  for (const auto& [k, v] : model.metadata) {
    auto* kv = proto.add_metadata_props();
    kv->set_key(k);
    kv->set_value(v);
  }
  graph_to_proto(model.graph, proto.mutable_graph(), deferred);
  return proto;
}

// The serialized size once the deferred initializers are inline: their bytes plus the tag and
// length varint of each raw_data field (at most 11 bytes) and of the enclosing messages (at most
// 2 x 11 more: the initializer's own length prefix grows too).
int64_t inline_size(const onnx::ModelProto& proto, const std::vector<DeferredInitializer>& deferred) {
  int64_t size = int64_t(proto.ByteSizeLong());
  for (const auto& d : deferred) size += int64_t(d.tensor->nbytes()) + 33;
  return size;
}

void fill_inline(const std::vector<DeferredInitializer>& deferred) {
  for (const auto& d : deferred) d.proto->set_raw_data(d.tensor->data(), d.tensor->nbytes());
}

// Writes every deferred initializer to data_path (external_data.h) and points its proto at it.
void write_external_data(const std::vector<DeferredInitializer>& deferred, const std::string& data_path,
                         const std::string& location) {
  std::vector<const Tensor*> tensors;
  for (const auto& d : deferred) tensors.push_back(d.tensor);
  const std::vector<int64_t> offsets = write_external_data_file(tensors, data_path);
  for (size_t i = 0; i < deferred.size(); ++i) {
    auto* proto = deferred[i].proto;
    proto->set_data_location(onnx::TensorProto::EXTERNAL);
    for (const auto& [k, v] : {std::pair<const char*, std::string>{"location", location},
                               {"offset", std::to_string(offsets[i])},
                               {"length", std::to_string(deferred[i].tensor->nbytes())}}) {
      auto* kv = proto->add_external_data();
      kv->set_key(k);
      kv->set_value(v);
    }
  }
}

}  // namespace

onnx::ModelProto to_proto(const Model& model) {
  std::vector<DeferredInitializer> deferred;
  onnx::ModelProto proto = to_proto_deferred(model, &deferred);
  fill_inline(deferred);
  return proto;
}

std::string save_model_to_bytes(const Model& model) {
  std::vector<DeferredInitializer> deferred;
  onnx::ModelProto proto = to_proto_deferred(model, &deferred);
  int64_t size = inline_size(proto, deferred);
  OT_CHECK(size < kProtobufLimit, "model '", model.graph.name, "' is ", size,
           " bytes, over protobuf's 2 GB limit: save it to a path (initializers go to external data)");
  fill_inline(deferred);
  return proto.SerializeAsString();
}

void save_model(const Model& model, const std::string& path, bool force_external_data) {
  std::vector<DeferredInitializer> deferred;
  onnx::ModelProto proto = to_proto_deferred(model, &deferred);
  if (force_external_data || inline_size(proto, deferred) >= kProtobufLimit) {
    std::string location = fs::path(path).filename().string() + ".data";
    write_external_data(deferred, (fs::path(path).parent_path() / location).string(), location);
  } else {
    fill_inline(deferred);
  }
  OT_CHECK(int64_t(proto.ByteSizeLong()) < kProtobufLimit, "model '", path, "': ", proto.ByteSizeLong(),
           " bytes outside the initializers (large Constant attributes?) pass protobuf's 2 GB limit");
  // Temporary file, fsync, rename, fsync of the folder: a crash leaves the old model or the new one.
  file_io::write_file_atomically(path, [&](int fd, const std::string& what) {
    std::string bytes;
    OT_CHECK(proto.SerializeToString(&bytes), "failed to serialize model to '", path, "'");
    file_io::write_all(fd, bytes.data(), bytes.size(), what);
  });
}

}  // namespace onnxtrain
