#include "onnx/wire_format.h"

#include <bit>
#include <cstring>
#include <optional>
#include <vector>

#include "onnx/external_data.h"
#include "onnx/typed_data.h"

namespace onnxtrain::wire {
namespace {

// Field numbers of onnx.proto (ONNX IR version 10) for the messages read and written here.
namespace model_f { enum { kIrVersion = 1, kProducerName = 2, kProducerVersion = 3, kGraph = 7, kOpsetImport = 8,
                           kMetadataProps = 14, kFunctions = 25 }; }
namespace graph_f { enum { kNode = 1, kName = 2, kInitializer = 5, kInput = 11, kOutput = 12, kValueInfo = 13,
                           kSparseInitializer = 15 }; }
namespace node_f { enum { kInput = 1, kOutput = 2, kName = 3, kOpType = 4, kAttribute = 5, kDomain = 7 }; }
namespace attr_f { enum { kName = 1, kF = 2, kI = 3, kS = 4, kT = 5, kG = 6, kFloats = 7, kInts = 8, kStrings = 9,
                          kTensors = 10, kTp = 14, kType = 20, kRefAttrName = 21 }; }
namespace attr_type { enum { kFloat = 1, kInt = 2, kString = 3, kTensor = 4, kGraph = 5, kFloats = 6, kInts = 7,
                             kStrings = 8, kTensors = 9, kTypeProto = 13 }; }
namespace tensor_f { enum { kDims = 1, kDataType = 2, kSegment = 3, kFloatData = 4, kInt32Data = 5, kInt64Data = 7,
                            kName = 8, kRawData = 9, kDoubleData = 10, kUint64Data = 11, kExternalData = 13,
                            kDataLocation = 14 }; }
namespace vi_f { enum { kName = 1, kType = 2 }; }
namespace type_f { enum { kTensorType = 1, kSequenceType = 4, kMapType = 5, kSparseTensorType = 8,
                          kOptionalType = 9 }; }
namespace tensor_type_f { enum { kElemType = 1, kShape = 2 }; }
namespace dim_f { enum { kDimValue = 1, kDimParam = 2 }; }
enum WireType { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };
constexpr int kExternalLocation = 1;  // TensorProto.DataLocation.EXTERNAL
constexpr int kMaxDepth = 64;         // nested subgraphs

// ---------------------------------------------------------------- reading

// One field of a message: its number, wire type and value (a varint / fixed value, or the bytes of
// a length-delimited field).
struct Field {
  int number = 0;
  int wire_type = 0;
  uint64_t value = 0;
  std::string_view bytes;
};

class Reader {
 public:
  Reader(std::string_view data, const std::string& where) : data_(data), where_(where) {}

  bool done() const { return pos_ >= data_.size(); }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= data_.size()) fail("a varint runs past the end");
      const uint8_t b = uint8_t(data_[pos_++]);
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    fail("a varint is longer than 10 bytes");
  }

  template <typename T>
  T fixed() {
    if (data_.size() - pos_ < sizeof(T)) fail("a fixed-width value runs past the end");
    T v;
    std::memcpy(&v, data_.data() + pos_, sizeof(T));  // little-endian on every target we build for
    pos_ += sizeof(T);
    return v;
  }

  Field next() {
    Field f;
    const uint64_t tag = varint();
    f.number = int(tag >> 3);
    f.wire_type = int(tag & 7);
    if (f.number == 0) fail("field number 0");
    switch (f.wire_type) {
      case kVarint: f.value = varint(); break;
      case kFixed64: f.value = fixed<uint64_t>(); break;
      case kFixed32: f.value = fixed<uint32_t>(); break;
      case kLengthDelimited: {
        const uint64_t n = varint();
        if (n > data_.size() - pos_) fail("a field of " + std::to_string(n) + " bytes runs past the end");
        f.bytes = data_.substr(pos_, size_t(n));
        pos_ += size_t(n);
        break;
      }
      default: fail("unsupported wire type " + std::to_string(f.wire_type) + " (groups are not ONNX)");
    }
    return f;
  }

  [[noreturn]] void fail(const std::string& what) const {
    OT_THROW(kInvalidModel, where_, "cannot parse the protobuf bytes (truncated or not an ONNX file): ", what,
             " at byte ", pos_);
  }

 private:
  std::string_view data_;
  size_t pos_ = 0;
  const std::string& where_;
};

std::vector<Field> fields_of(std::string_view bytes, const std::string& where) {
  Reader r(bytes, where);
  std::vector<Field> out;
  while (!r.done()) out.push_back(r.next());
  return out;
}

void expect_wire(const Field& f, int wire_type, const char* message, const std::string& where) {
  if (f.wire_type != wire_type)
    OT_THROW(kInvalidModel, where, "cannot parse the protobuf bytes (truncated or not an ONNX file): ", message,
             " field ", f.number, " has wire type ", f.wire_type, ", expected ", wire_type);
}

std::string str(const Field& f, const char* message, const std::string& where) {
  expect_wire(f, kLengthDelimited, message, where);
  return std::string(f.bytes);
}

// A repeated scalar, packed (one length-delimited field) or not (one field per value).
template <typename T>
void append_scalars(const Field& f, std::vector<T>& out, const std::string& where) {
  auto decode = [&](Reader& r, int wire_type) -> T {
    if constexpr (std::is_same_v<T, float>) {
      if (wire_type != kFixed32) r.fail("a float is not fixed32");
      return std::bit_cast<float>(r.fixed<uint32_t>());
    } else if constexpr (std::is_same_v<T, double>) {
      if (wire_type != kFixed64) r.fail("a double is not fixed64");
      return std::bit_cast<double>(r.fixed<uint64_t>());
    } else {
      if (wire_type != kVarint) r.fail("an integer is not a varint");
      return T(r.varint());  // int32 values arrive sign-extended to 64 bits
    }
  };
  if (f.wire_type == kLengthDelimited) {
    Reader r(f.bytes, where);
    const int element = std::is_same_v<T, float> ? kFixed32 : std::is_same_v<T, double> ? kFixed64 : kVarint;
    while (!r.done()) out.push_back(decode(r, element));
  } else if constexpr (std::is_same_v<T, float>) {
    expect_wire(f, kFixed32, "float", where);
    out.push_back(std::bit_cast<float>(uint32_t(f.value)));
  } else if constexpr (std::is_same_v<T, double>) {
    expect_wire(f, kFixed64, "double", where);
    out.push_back(std::bit_cast<double>(f.value));
  } else {
    expect_wire(f, kVarint, "integer", where);
    out.push_back(T(f.value));
  }
}

// Decoded repeated values with the interface typed_data.h's copy_field reads.
template <typename T>
struct Values {
  std::vector<T> v;
  size_t size() const { return v.size(); }
  T Get(int i) const { return v[size_t(i)]; }
};

std::vector<std::pair<std::string, std::string>> string_pairs(const std::vector<std::string_view>& entries,
                                                              const std::string& where) {
  std::vector<std::pair<std::string, std::string>> out;
  for (auto e : entries) {
    std::pair<std::string, std::string> kv;
    for (const Field& f : fields_of(e, where)) {
      if (f.number == 1) kv.first = str(f, "key", where);
      else if (f.number == 2) kv.second = str(f, "value", where);
    }
    out.push_back(std::move(kv));
  }
  return out;
}

Tensor parse_tensor(std::string_view bytes, const std::string& base_dir, const std::string& where) {
  int32_t data_type = 0;
  Shape shape;
  std::string name;
  std::optional<std::string_view> raw;
  bool segment = false;
  int64_t location = 0;
  std::vector<std::string_view> external;
  Values<float> floats;
  Values<int32_t> int32s;
  Values<int64_t> int64s;
  Values<double> doubles;
  Values<uint64_t> uint64s;
  for (const Field& f : fields_of(bytes, where)) {
    switch (f.number) {
      case tensor_f::kDims: append_scalars(f, shape, where); break;
      case tensor_f::kDataType: expect_wire(f, kVarint, "data_type", where); data_type = int32_t(f.value); break;
      case tensor_f::kSegment: segment = true; break;
      case tensor_f::kFloatData: append_scalars(f, floats.v, where); break;
      case tensor_f::kInt32Data: append_scalars(f, int32s.v, where); break;
      case tensor_f::kInt64Data: append_scalars(f, int64s.v, where); break;
      case tensor_f::kName: name = str(f, "name", where); break;
      case tensor_f::kRawData: expect_wire(f, kLengthDelimited, "raw_data", where); raw = f.bytes; break;
      case tensor_f::kDoubleData: append_scalars(f, doubles.v, where); break;
      case tensor_f::kUint64Data: append_scalars(f, uint64s.v, where); break;
      case tensor_f::kExternalData: expect_wire(f, kLengthDelimited, "external_data", where); external.push_back(f.bytes); break;
      case tensor_f::kDataLocation: expect_wire(f, kVarint, "data_location", where); location = int64_t(f.value); break;
      default: break;
    }
  }
  // From here on the checks and messages of model_io.cc's tensor_from_proto.
  const DType dt = DType(data_type);
  const std::string what = "tensor '" + name + "'";
  if (dt == DType::kString) OT_THROW(kNotImplemented, what, ": string tensors are not supported");
  if (!dtype_supported(dt)) OT_THROW(kInvalidModel, what, ": unknown data type ", data_type);
  for (int64_t d : shape) OT_CHECK(d >= 0, what, ": negative dimension in ", shape_str(shape));
  if (segment) OT_THROW(kNotImplemented, what, ": segmented tensors are not supported");
  Tensor t = Tensor::empty(dt, shape);
  const size_t nbytes = t.nbytes();
  if (location == kExternalLocation) {
    read_external_data(t, string_pairs(external, where), base_dir, what);
    return t;
  }
  if (raw) {
    OT_CHECK(raw->size() == nbytes, what, ": raw data holds ", raw->size(), " bytes, shape ", shape_str(shape),
             " of ", dtype_name(dt), " needs ", nbytes);
    if (nbytes) std::memcpy(t.data(), raw->data(), nbytes);
    return t;
  }
  switch (dt) {
    case DType::kFloat32: copy_field<float>(floats, t, what); break;
    case DType::kFloat64: copy_field<double>(doubles, t, what); break;
    case DType::kInt64: copy_field<int64_t>(int64s, t, what); break;
    case DType::kUint32: case DType::kUint64: copy_field<uint64_t>(uint64s, t, what); break;
    default: copy_field<int32_t>(int32s, t, what); break;  // small ints, bool, halves
  }
  return t;
}

// ValueInfoProto -> (name, ValueInfo), as model_io.cc's value_info_from_proto.
std::pair<std::string, ValueInfo> parse_value_info(std::string_view bytes, const std::string& where) {
  std::string name;
  std::optional<std::string_view> type;
  for (const Field& f : fields_of(bytes, where)) {
    if (f.number == vi_f::kName) name = str(f, "name", where);
    else if (f.number == vi_f::kType) { expect_wire(f, kLengthDelimited, "type", where); type = f.bytes; }
  }
  ValueInfo info;
  if (!type) return {name, info};
  // TypeProto is a oneof (the last one set wins, as in protobuf): optional(elem), sequence(elem),
  // tensor, or a kind onnxtrain does not run (map, sparse tensor).
  struct TypeCase {
    int number = 0;  // 0: nothing set
    std::string_view bytes;
  };
  auto type_case = [&](std::string_view t) {
    TypeCase c;
    for (const Field& f : fields_of(t, where))
      if (f.number == type_f::kTensorType || f.number == type_f::kSequenceType || f.number == type_f::kMapType ||
          f.number == type_f::kSparseTensorType || f.number == type_f::kOptionalType) {
        expect_wire(f, kLengthDelimited, "type", where);
        c = {int(f.number), f.bytes};
      }
    return c;
  };
  auto elem_type = [&](std::string_view container) {  // Sequence / Optional: elem_type = 1
    std::optional<std::string_view> elem;
    for (const Field& f : fields_of(container, where))
      if (f.number == 1) {
        expect_wire(f, kLengthDelimited, "elem_type", where);
        elem = f.bytes;
      }
    return elem ? type_case(*elem) : TypeCase{};
  };
  TypeCase c = type_case(*type);
  // An empty type (exporters such as spox write one for values of unknown type) says nothing.
  if (c.number == 0) return {name, info};
  const bool optional = c.number == type_f::kOptionalType;
  if (optional) c = elem_type(c.bytes);
  const bool sequence = c.number == type_f::kSequenceType;
  if (sequence) c = elem_type(c.bytes);
  info.kind = sequence ? (optional ? ValueKind::kOptionalSequence : ValueKind::kSequence)
                       : (optional ? ValueKind::kOptionalTensor : ValueKind::kTensor);
  if (c.number == 0) return {name, info};
  if (c.number != type_f::kTensorType)
    OT_THROW(kNotImplemented, where, "value '", name,
             "' is not a tensor, a sequence of tensors or an optional of either (map types and nested "
             "sequences are not supported)");
  const std::optional<std::string_view> tensor_type = c.bytes;
  for (const Field& f : fields_of(*tensor_type, where)) {
    if (f.number == tensor_type_f::kElemType) {
      expect_wire(f, kVarint, "elem_type", where);
      info.dtype = DType(int32_t(f.value));
    } else if (f.number == tensor_type_f::kShape) {
      expect_wire(f, kLengthDelimited, "shape", where);
      Shape shape;
      info.dim_params.clear();
      for (const Field& d : fields_of(f.bytes, where)) {
        if (d.number != 1) continue;
        expect_wire(d, kLengthDelimited, "dim", where);
        std::optional<int64_t> value;
        std::optional<std::string> param;
        for (const Field& v : fields_of(d.bytes, where)) {  // a oneof: the last one set wins
          if (v.number == dim_f::kDimValue) { expect_wire(v, kVarint, "dim_value", where); value = int64_t(v.value); param.reset(); }
          else if (v.number == dim_f::kDimParam) { param = str(v, "dim_param", where); value.reset(); }
        }
        shape.push_back(value ? *value : -1);
        info.dim_params.push_back(param ? *param : "");
      }
      info.shape = shape;
    }
  }
  return {name, info};
}

Graph parse_graph(std::string_view bytes, const std::string& base_dir, const std::string& where, int depth);

Attribute parse_attribute(std::string_view bytes, const std::string& base_dir, const std::string& where,
                          const std::string& node_context, int depth, std::string* name_out) {
  std::string name, ref_attr_name;
  int64_t type = 0;
  Attribute out;
  std::optional<std::string_view> t, g, tp;
  std::vector<std::string_view> tensors;
  for (const Field& f : fields_of(bytes, where)) {
    switch (f.number) {
      case attr_f::kName: name = str(f, "name", where); break;
      case attr_f::kRefAttrName: ref_attr_name = str(f, "ref_attr_name", where); break;
      case attr_f::kType: expect_wire(f, kVarint, "type", where); type = int64_t(f.value); break;
      case attr_f::kF: expect_wire(f, kFixed32, "f", where); out.f = std::bit_cast<float>(uint32_t(f.value)); break;
      case attr_f::kI: expect_wire(f, kVarint, "i", where); out.i = int64_t(f.value); break;
      case attr_f::kS: out.s = str(f, "s", where); break;
      case attr_f::kT: expect_wire(f, kLengthDelimited, "t", where); t = f.bytes; break;
      case attr_f::kG: expect_wire(f, kLengthDelimited, "g", where); g = f.bytes; break;
      case attr_f::kFloats: append_scalars(f, out.floats, where); break;
      case attr_f::kInts: append_scalars(f, out.ints, where); break;
      case attr_f::kStrings: out.strings.push_back(str(f, "strings", where)); break;
      case attr_f::kTensors: expect_wire(f, kLengthDelimited, "tensors", where); tensors.push_back(f.bytes); break;
      case attr_f::kTp: expect_wire(f, kLengthDelimited, "tp", where); tp = f.bytes; break;
      default: break;
    }
  }
  *name_out = name;
  if (!ref_attr_name.empty())
    OT_THROW(kNotImplemented, where, node_context, "attribute references (functions) are not supported");
  const std::string attr_where = where + node_context;
  using K = Attribute::Kind;
  // The fields of other kinds are dropped, as the protobuf path reads only the type's own field.
  Attribute a;
  switch (type) {
    case attr_type::kFloat: a.kind = K::kFloat; a.f = out.f; break;
    case attr_type::kInt: a.kind = K::kInt; a.i = out.i; break;
    case attr_type::kString: a.kind = K::kString; a.s = std::move(out.s); break;
    case attr_type::kTensor: a.kind = K::kTensor; a.t = t ? parse_tensor(*t, base_dir, attr_where) : parse_tensor({}, base_dir, attr_where); break;
    case attr_type::kGraph:
      a.kind = K::kGraph;
      a.g = std::make_shared<Graph>(parse_graph(g ? *g : std::string_view{}, base_dir, attr_where, depth + 1));
      break;
    case attr_type::kFloats: a.kind = K::kFloats; a.floats = std::move(out.floats); break;
    case attr_type::kInts: a.kind = K::kInts; a.ints = std::move(out.ints); break;
    case attr_type::kStrings: a.kind = K::kStrings; a.strings = std::move(out.strings); break;
    case attr_type::kTensors:
      a.kind = K::kTensors;
      for (auto tb : tensors) a.tensors.push_back(parse_tensor(tb, base_dir, attr_where));
      break;
    case attr_type::kTypeProto:  // kept serialized, as the protobuf path keeps it
      a.kind = K::kTypeProto;
      a.s = tp ? std::string(*tp) : std::string();
      break;
    default: OT_THROW(kNotImplemented, attr_where, "attribute '", name, "' has unsupported type ", type);
  }
  return a;
}

// As model_io.cc's graph_from_proto: initializers, then inputs (initializers listed as inputs are
// skipped), outputs, value_info (non-tensor annotations dropped) and nodes.
Graph parse_graph(std::string_view bytes, const std::string& base_dir, const std::string& where, int depth) {
  if (depth > kMaxDepth) OT_THROW(kInvalidModel, where, "subgraphs nest deeper than ", kMaxDepth, " levels");
  std::vector<std::string_view> nodes, initializers, inputs, outputs, value_infos;
  std::string name;
  bool sparse = false;
  for (const Field& f : fields_of(bytes, where)) {
    switch (f.number) {
      case graph_f::kNode: expect_wire(f, kLengthDelimited, "node", where); nodes.push_back(f.bytes); break;
      case graph_f::kName: name = str(f, "name", where); break;
      case graph_f::kInitializer: expect_wire(f, kLengthDelimited, "initializer", where); initializers.push_back(f.bytes); break;
      case graph_f::kInput: expect_wire(f, kLengthDelimited, "input", where); inputs.push_back(f.bytes); break;
      case graph_f::kOutput: expect_wire(f, kLengthDelimited, "output", where); outputs.push_back(f.bytes); break;
      case graph_f::kValueInfo: expect_wire(f, kLengthDelimited, "value_info", where); value_infos.push_back(f.bytes); break;
      case graph_f::kSparseInitializer: sparse = true; break;
      default: break;
    }
  }
  Graph graph;
  graph.name = name.empty() ? "graph" : name;
  if (sparse) OT_THROW(kNotImplemented, where, "sparse initializers are not supported");
  for (auto init : initializers) {
    std::string init_name;
    for (const Field& f : fields_of(init, where))
      if (f.number == tensor_f::kName) init_name = str(f, "name", where);
    if (init_name.empty()) OT_THROW(kInvalidModel, where, "an initializer has no name");
    try {
      graph.initializers[init_name] = parse_tensor(init, base_dir, where);
    } catch (const Error& e) {
      OT_THROW(kInvalidModel, where, "initializer '", init_name, "': ", e.what());
    }
  }
  for (auto in : inputs) {
    auto [in_name, info] = parse_value_info(in, where);
    if (graph.is_initializer(in_name)) continue;  // IR < 4 lists initializers as inputs too
    graph.inputs.push_back({in_name, info});
  }
  for (auto out : outputs) {
    auto [out_name, info] = parse_value_info(out, where);
    graph.outputs.push_back({out_name, info});
  }
  for (auto v : value_infos) {
    try {
      auto [v_name, info] = parse_value_info(v, where);
      graph.value_info[v_name] = info;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kNotImplemented) throw;  // malformed bytes stay an error
      // Non-tensor annotations on intermediates are hints only; drop them.
    }
  }
  int unnamed = 0;
  for (auto nb : nodes) {
    Node node;
    std::vector<std::string_view> attributes;
    for (const Field& f : fields_of(nb, where)) {
      switch (f.number) {
        case node_f::kInput: node.inputs.push_back(str(f, "input", where)); break;
        case node_f::kOutput: node.outputs.push_back(str(f, "output", where)); break;
        case node_f::kName: node.name = str(f, "name", where); break;
        case node_f::kOpType: node.op_type = str(f, "op_type", where); break;
        case node_f::kAttribute: expect_wire(f, kLengthDelimited, "attribute", where); attributes.push_back(f.bytes); break;
        case node_f::kDomain: node.domain = str(f, "domain", where); break;
        default: break;
      }
    }
    if (node.domain == "ai.onnx") node.domain = "";
    if (node.name.empty()) node.name = node.op_type + "_" + std::to_string(unnamed++);
    for (auto ab : attributes) {
      std::string attr_name;
      Attribute a = parse_attribute(ab, base_dir, where, node.context(), depth, &attr_name);
      node.attributes[attr_name] = std::move(a);
    }
    graph.nodes.push_back(std::move(node));
  }
  return graph;
}

// ---------------------------------------------------------------- writing
// Fields in field-number order, as protobuf's serializer emits them; proto2 presence: a field the
// protobuf writer sets is written even when empty or zero.

class Writer {
 public:
  std::string out;

  void varint(uint64_t v) {
    while (v >= 0x80) {
      out.push_back(char(uint8_t(v) | 0x80));
      v >>= 7;
    }
    out.push_back(char(v));
  }
  void tag(int number, int wire_type) { varint(uint64_t(number) << 3 | uint64_t(wire_type)); }
  void int_field(int number, int64_t v) { tag(number, kVarint); varint(uint64_t(v)); }
  void float_field(int number, float v) {
    tag(number, kFixed32);
    const uint32_t bits = std::bit_cast<uint32_t>(v);
    out.append(reinterpret_cast<const char*>(&bits), 4);
  }
  void bytes_field(int number, std::string_view v) {
    tag(number, kLengthDelimited);
    varint(v.size());
    out.append(v);
  }
  void bytes_field(int number, const void* data, size_t n) {
    bytes_field(number, std::string_view(static_cast<const char*>(data), n));
  }
};

std::string tensor_bytes(const Tensor& t, const std::string* name, const ExternalTensor* external) {
  Writer w;
  for (int64_t d : t.shape()) w.int_field(tensor_f::kDims, d);
  w.int_field(tensor_f::kDataType, int64_t(t.dtype()));
  if (name) w.bytes_field(tensor_f::kName, *name);
  if (!external) {
    w.bytes_field(tensor_f::kRawData, t.data(), t.nbytes());
    return w.out;
  }
  for (const auto& [k, v] : {std::pair<const char*, std::string>{"location", external->location},
                             {"offset", std::to_string(external->offset)},
                             {"length", std::to_string(external->length)}}) {
    Writer kv;
    kv.bytes_field(1, k);
    kv.bytes_field(2, v);
    w.bytes_field(tensor_f::kExternalData, kv.out);
  }
  w.int_field(tensor_f::kDataLocation, kExternalLocation);
  return w.out;
}

std::string value_info_bytes(const std::string& name, const ValueInfo& info) {
  Writer tensor_type;
  tensor_type.int_field(tensor_type_f::kElemType, int64_t(info.dtype));
  if (info.shape) {
    Writer shape;
    for (size_t i = 0; i < info.shape->size(); ++i) {
      Writer dim;
      const int64_t d = (*info.shape)[i];
      if (d >= 0) dim.int_field(dim_f::kDimValue, d);
      else if (i < info.dim_params.size() && !info.dim_params[i].empty()) dim.bytes_field(dim_f::kDimParam, info.dim_params[i]);
      shape.bytes_field(1, dim.out);
    }
    tensor_type.bytes_field(tensor_type_f::kShape, shape.out);
  }
  Writer type;
  type.bytes_field(type_f::kTensorType, tensor_type.out);
  // As model_io.cc's value_info_to_proto: sequence(tensor), then optional(...) around it.
  auto wrap = [&](int field) {
    Writer elem;
    elem.bytes_field(1, type.out);
    Writer outer;
    outer.bytes_field(field, elem.out);
    type = std::move(outer);
  };
  if (info.kind == ValueKind::kSequence || info.kind == ValueKind::kOptionalSequence) wrap(type_f::kSequenceType);
  if (info.kind == ValueKind::kOptionalTensor || info.kind == ValueKind::kOptionalSequence) wrap(type_f::kOptionalType);
  Writer w;
  w.bytes_field(vi_f::kName, name);
  w.bytes_field(vi_f::kType, type.out);
  return w.out;
}

std::string graph_bytes(const Graph& graph, const std::map<std::string, ExternalTensor>* external);

std::string attribute_bytes(const std::string& name, const Attribute& a) {
  using K = Attribute::Kind;
  Writer w;
  w.bytes_field(attr_f::kName, name);
  int type = 0;
  switch (a.kind) {
    case K::kFloat: w.float_field(attr_f::kF, a.f); type = attr_type::kFloat; break;
    case K::kInt: w.int_field(attr_f::kI, a.i); type = attr_type::kInt; break;
    case K::kString: w.bytes_field(attr_f::kS, a.s); type = attr_type::kString; break;
    case K::kTensor: w.bytes_field(attr_f::kT, tensor_bytes(a.t, nullptr, nullptr)); type = attr_type::kTensor; break;
    case K::kGraph: w.bytes_field(attr_f::kG, graph_bytes(*a.g, nullptr)); type = attr_type::kGraph; break;
    case K::kFloats: for (float f : a.floats) w.float_field(attr_f::kFloats, f); type = attr_type::kFloats; break;
    case K::kInts: for (int64_t i : a.ints) w.int_field(attr_f::kInts, i); type = attr_type::kInts; break;
    case K::kStrings: for (const auto& s : a.strings) w.bytes_field(attr_f::kStrings, s); type = attr_type::kStrings; break;
    case K::kTensors:
      for (const auto& t : a.tensors) w.bytes_field(attr_f::kTensors, tensor_bytes(t, nullptr, nullptr));
      type = attr_type::kTensors;
      break;
    case K::kTypeProto: w.bytes_field(attr_f::kTp, a.s); type = attr_type::kTypeProto; break;
  }
  w.int_field(attr_f::kType, type);
  return w.out;
}

std::string graph_bytes(const Graph& graph, const std::map<std::string, ExternalTensor>* external) {
  Writer w;
  for (const auto& n : graph.nodes) {
    Writer node;
    for (const auto& i : n.inputs) node.bytes_field(node_f::kInput, i);
    for (const auto& o : n.outputs) node.bytes_field(node_f::kOutput, o);
    node.bytes_field(node_f::kName, n.name);
    node.bytes_field(node_f::kOpType, n.op_type);
    for (const auto& [k, a] : n.attributes) node.bytes_field(node_f::kAttribute, attribute_bytes(k, a));
    if (!n.domain.empty()) node.bytes_field(node_f::kDomain, n.domain);
    w.bytes_field(graph_f::kNode, node.out);
  }
  w.bytes_field(graph_f::kName, graph.name);
  for (const auto& [name, t] : graph.initializers) {
    const ExternalTensor* ext = nullptr;
    if (external) {
      auto it = external->find(name);
      if (it != external->end()) ext = &it->second;
    }
    w.bytes_field(graph_f::kInitializer, tensor_bytes(t, &name, ext));
  }
  for (const auto& in : graph.inputs) w.bytes_field(graph_f::kInput, value_info_bytes(in.name, in.info));
  for (const auto& out : graph.outputs) w.bytes_field(graph_f::kOutput, value_info_bytes(out.name, out.info));
  for (const auto& [name, info] : graph.value_info)
    if (info.dtype != DType::kUndefined) w.bytes_field(graph_f::kValueInfo, value_info_bytes(name, info));
  return w.out;
}

}  // namespace

Model parse_model(std::string_view bytes, const std::string& base_dir, const std::string& description) {
  const std::string where = "model " + description + ": ";
  if (bytes.empty())
    OT_THROW(kInvalidModel, "model ", description, ": cannot parse 0 bytes as an ONNX ModelProto (truncated or not an ONNX file)");
  Model model;
  model.description = description;
  std::optional<std::string_view> graph;
  std::vector<std::string_view> metadata;
  bool functions = false, any_opset = false;
  model.ir_version = 0;
  model.producer_name.clear();
  for (const Field& f : fields_of(bytes, where)) {
    switch (f.number) {
      case model_f::kIrVersion: expect_wire(f, kVarint, "ir_version", where); model.ir_version = int64_t(f.value); break;
      case model_f::kProducerName: model.producer_name = str(f, "producer_name", where); break;
      case model_f::kProducerVersion: model.producer_version = str(f, "producer_version", where); break;
      case model_f::kGraph: expect_wire(f, kLengthDelimited, "graph", where); graph = f.bytes; break;
      case model_f::kOpsetImport: {
        expect_wire(f, kLengthDelimited, "opset_import", where);
        std::string domain;
        int64_t version = 0;
        for (const Field& o : fields_of(f.bytes, where)) {
          if (o.number == 1) domain = str(o, "domain", where);
          else if (o.number == 2) { expect_wire(o, kVarint, "version", where); version = int64_t(o.value); }
        }
        model.opsets[domain == "ai.onnx" ? "" : domain] = version;
        any_opset = true;
        break;
      }
      case model_f::kMetadataProps: expect_wire(f, kLengthDelimited, "metadata_props", where); metadata.push_back(f.bytes); break;
      case model_f::kFunctions: functions = true; break;
      default: break;
    }
  }
  if (!graph) OT_THROW(kInvalidModel, where, "it has no graph (is this an ONNX file?)");
  if (!model.opsets.count("")) model.opsets[""] = any_opset ? 1 : 7;
  if (functions) OT_THROW(kNotImplemented, where, "model-local functions are not supported");
  for (auto& [k, v] : string_pairs(metadata, where)) model.metadata[k] = v;
  model.graph = parse_graph(*graph, base_dir, where, 0);
  return model;
}

std::string serialize_model(const Model& model, const std::map<std::string, ExternalTensor>& external) {
  Writer w;
  w.int_field(model_f::kIrVersion, model.ir_version);
  w.bytes_field(model_f::kProducerName, model.producer_name);
  w.bytes_field(model_f::kProducerVersion, model.producer_version);
  w.bytes_field(model_f::kGraph, graph_bytes(model.graph, &external));
  for (const auto& [domain, version] : model.opsets) {
    Writer op;
    op.bytes_field(1, domain);
    op.int_field(2, version);
    w.bytes_field(model_f::kOpsetImport, op.out);
  }
  for (const auto& [k, v] : model.metadata) {
    Writer kv;
    kv.bytes_field(1, k);
    kv.bytes_field(2, v);
    w.bytes_field(model_f::kMetadataProps, kv.out);
  }
  return w.out;
}

}  // namespace onnxtrain::wire
