// CheckpointState and the checkpoint file.
//
// Layout (safetensors): 8-byte little-endian header length N; N bytes of JSON header, padded with
// spaces so the data section starts 8-byte aligned; the data section, where every tensor's bytes
// are [begin, end) relative to its start, contiguous, in header order.
//
// Header: {"__metadata__": {...}, "<tensor>": {"dtype": "F32", "shape": [2, 3],
//          "data_offsets": [0, 24]}, ...}
//   tensors    parameters under their ONNX initializer names; optimizer state as
//              "__optimizer__/<param>/<state name>" (state names contain no '/').
//   metadata   (string values; the JSON ones are JSON text inside the string)
//     onnxtrain.format_version   "1"
//     onnxtrain.parameters       [{"name": "w", "requires_grad": true}, ...] in parameter order;
//                                a nominal parameter (no data) adds "dtype" and "shape" and has
//                                no tensor.
//     onnxtrain.property.<name>  {"type": "int"|"float"|"string", "value": ...}; non-finite
//                                floats are the strings "nan", "inf", "-inf".
//     onnxtrain.optimizer        {"step": 10, "learning_rate": 0.001} (only with optimizer state)
//     onnxtrain.data_crc32c      CRC-32C of the data section, 8 hex digits
//     onnxtrain.header_crc32c    CRC-32C of the compact header JSON without this key
// A safetensors file written by another tool (no onnxtrain.* keys) loads too: every tensor is a
// parameter, floating-point ones require grad.
#include "training/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <unordered_set>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

#include "core/file_io.h"
#include "ir/graph.h"

static_assert(std::endian::native == std::endian::little,
              "checkpoint files are little-endian; a big-endian host needs byte swapping here");

namespace onnxtrain {

// ================================================================ checksum, dtypes, layout

namespace checkpoint {

namespace {

struct Crc32cTable {
  uint32_t t[8][256];
  constexpr Crc32cTable() : t{} {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  }
};
constexpr Crc32cTable kCrcTable;

// Raw (non-inverted) register updates.
uint32_t crc_raw_portable(uint32_t c, const uint8_t* p, size_t n) {
  const auto& t = kCrcTable.t;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= c;
    c = t[7][w & 0xFF] ^ t[6][(w >> 8) & 0xFF] ^ t[5][(w >> 16) & 0xFF] ^ t[4][(w >> 24) & 0xFF] ^
        t[3][(w >> 32) & 0xFF] ^ t[2][(w >> 40) & 0xFF] ^ t[1][(w >> 48) & 0xFF] ^ t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
  return c;
}

}  // namespace

uint32_t crc32c_portable(uint32_t crc, const void* data, size_t n) {
  return ~crc_raw_portable(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t crc32c(uint32_t crc, const void* data, size_t n) {
#if defined(__SSE4_2__)
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t c = ~crc;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = uint32_t(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return ~c32;
#else
  return crc32c_portable(crc, data, n);
#endif
}

std::string hex32(uint32_t v) {
  const char* digits = "0123456789abcdef";
  std::string s(8, '0');
  for (int i = 7; i >= 0; --i, v >>= 4) s[size_t(i)] = digits[v & 15];
  return s;
}

namespace {
struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypeNames[] = {
    {DType::kFloat64, "F64"}, {DType::kFloat32, "F32"}, {DType::kFloat16, "F16"},
    {DType::kBFloat16, "BF16"}, {DType::kInt64, "I64"}, {DType::kInt32, "I32"},
    {DType::kInt16, "I16"}, {DType::kInt8, "I8"}, {DType::kUint64, "U64"},
    {DType::kUint32, "U32"}, {DType::kUint16, "U16"}, {DType::kUint8, "U8"},
    {DType::kBool, "BOOL"},
};

std::string supported_dtype_list() {
  std::string s;
  for (const auto& d : kDTypeNames) {
    if (!s.empty()) s += ' ';
    s += d.name;
  }
  return s;
}
}  // namespace

const char* safetensors_dtype(DType dt) {
  for (const auto& d : kDTypeNames)
    if (d.dtype == dt) return d.name;
  OT_THROW(kInvalidArgument, "dtype ", dtype_name(dt), " cannot be stored in a checkpoint");
}

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (const auto& d : kDTypeNames)
    if (name == d.name) return d.dtype;
  return std::nullopt;
}

uint64_t checked_nbytes(DType dtype, const Shape& shape, const std::string& name) {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0) OT_THROW(kInvalidModel, "tensor '", name, "': negative dimension in shape ", shape_str(shape));
    if (__builtin_mul_overflow(n, uint64_t(d), &n))
      OT_THROW(kInvalidModel, "tensor '", name, "': shape ", shape_str(shape), " overflows 64-bit sizes");
  }
  return n;
}

std::vector<TensorEntry> parse_tensor_entries(const json::Value& header, uint64_t data_size) {
  if (!header.is_object()) OT_THROW(kInvalidModel, "the header is not a JSON object");
  std::vector<TensorEntry> entries;
  for (const auto& [name, info] : header.as_object()) {
    if (name == kMetadataKey) continue;
    auto bad = [&](const std::string& what) {
      OT_THROW(kInvalidModel, "tensor '", name, "': ", what);
    };
    if (!info.is_object()) bad(std::string("expected an object, got ") + json::type_name(info.type()));
    const json::Value* dt = nullptr;
    const json::Value* shape = nullptr;
    const json::Value* offsets = nullptr;
    for (const auto& [k, v] : info.as_object()) {
      if (k == "dtype") dt = &v;
      else if (k == "shape") shape = &v;
      else if (k == "data_offsets") offsets = &v;
      else bad("unknown key \"" + k + "\" (expected dtype, shape, data_offsets)");
    }
    if (!dt || !shape || !offsets) bad("missing \"dtype\", \"shape\" or \"data_offsets\"");
    TensorEntry e;
    e.name = name;
    if (!dt->is_string()) bad("\"dtype\" is not a string");
    auto parsed = dtype_from_safetensors(dt->as_string());
    if (!parsed)
      bad("dtype \"" + dt->as_string() + "\" is not supported (supported: " + supported_dtype_list() + ")");
    e.dtype = *parsed;
    if (!shape->is_array()) bad("\"shape\" is not an array");
    for (const json::Value& d : shape->as_array()) {
      if (!d.is_integer() || d.as_int() < 0) bad("\"shape\" must hold non-negative integers");
      e.shape.push_back(d.as_int());
    }
    if (!offsets->is_array() || offsets->as_array().size() != 2)
      bad("\"data_offsets\" must be an array [begin, end]");
    for (const json::Value& o : offsets->as_array())
      if (!o.is_integer() || o.as_int() < 0) bad("\"data_offsets\" must hold non-negative integers");
    e.begin = uint64_t(offsets->as_array()[0].as_int());
    e.end = uint64_t(offsets->as_array()[1].as_int());
    if (e.begin > e.end)
      bad("data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "] are reversed");
    if (e.end > data_size)
      bad("data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
          "] run past the data section (" + std::to_string(data_size) + " bytes)");
    uint64_t need = checked_nbytes(e.dtype, e.shape, name);
    if (e.end - e.begin != need)
      bad("dtype " + dt->as_string() + " and shape " + shape_str(e.shape) + " need " + std::to_string(need) +
          " bytes, but data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "] hold " +
          std::to_string(e.end - e.begin));
    entries.push_back(std::move(e));
  }
  validate_layout(entries, data_size);
  return entries;
}

void validate_layout(const std::vector<TensorEntry>& entries, uint64_t data_size) {
  std::vector<const TensorEntry*> order;
  order.reserve(entries.size());
  for (const auto& e : entries) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(), [](const TensorEntry* a, const TensorEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  auto range = [](const TensorEntry& e) {
    return "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ")";
  };
  uint64_t covered = 0;
  const TensorEntry* prev = nullptr;
  for (const TensorEntry* e : order) {
    if (e->end > data_size)
      OT_THROW(kInvalidModel, "tensor '", e->name, "': bytes ", range(*e), " run past the data section (",
               data_size, " bytes)");
    if (e->begin < covered)
      OT_THROW(kInvalidModel, "tensor '", e->name, "' at bytes ", range(*e), " overlaps tensor '", prev->name,
               "' at bytes ", range(*prev));
    if (e->begin > covered)
      OT_THROW(kInvalidModel, "bytes [", covered, ", ", e->begin, ") of the data section belong to no tensor");
    covered = e->end;
    prev = e;
  }
  if (covered != data_size)
    OT_THROW(kInvalidModel, "the data section has ", data_size, " bytes but the tensors cover ", covered,
             " (trailing bytes or a wrong header length)");
}

}  // namespace checkpoint

using namespace checkpoint;

// ================================================================ Parameter

const char* property_type_name(const PropertyValue& value) {
  switch (value.index()) {
    case 0: return "int";
    case 1: return "float";
    default: return "string";
  }
}

Parameter::Parameter(std::string name, DType dtype, Shape shape, bool requires_grad)
    : name_(std::move(name)), dtype_(dtype), shape_(std::move(shape)), requires_grad_(requires_grad) {}

void Parameter::check_matches(const Tensor& t, const char* what) const {
  if (!t.defined()) OT_THROW(kInvalidArgument, "parameter '", name_, "': ", what, " is an undefined tensor");
  if (t.dtype() != dtype_ || t.shape() != shape_)
    OT_THROW(kInvalidArgument, "parameter '", name_, "': ", what, " expected ", dtype_name(dtype_), " ",
             shape_str(shape_), ", got ", dtype_name(t.dtype()), " ", shape_str(t.shape()));
}

const Tensor& Parameter::data() const {
  if (!data_.defined())
    OT_THROW(kInvalidArgument, "parameter '", name_, "' has no data: the checkpoint is nominal (shapes and dtypes ",
             "only); fill it with fill_parameters_from_buffer or set_parameter first");
  return data_;
}

void Parameter::set_data(const Tensor& value) {
  check_matches(value, "data");
  if (!data_.defined()) {
    data_ = value.clone();
    return;
  }
  if (data_.data() != value.data() && value.nbytes() > 0) std::memmove(data_.data(), value.data(), value.nbytes());
}

void Parameter::adopt_data(Tensor value) {
  check_matches(value, "data");
  data_ = std::move(value);
}

Tensor& Parameter::ensure_grad() {
  if (!grad_.defined()) grad_ = Tensor::zeros(dtype_, shape_);
  return grad_;
}

void Parameter::set_grad(Tensor g) {
  if (g.defined()) check_matches(g, "gradient");
  grad_ = std::move(g);
}

void Parameter::zero_grad() {
  if (grad_.defined() && grad_.nbytes() > 0) std::memset(grad_.data(), 0, grad_.nbytes());
}

// ================================================================ CheckpointState

namespace {

void check_parameter_name(const std::string& name) {
  if (name.empty()) OT_THROW(kInvalidArgument, "a parameter name must not be empty");
  if (name == kMetadataKey || name.rfind(kOptimizerPrefix, 0) == 0)
    OT_THROW(kInvalidArgument, "parameter name '", name, "' is reserved (\"", kMetadataKey, "\" and names starting with \"",
             kOptimizerPrefix, "\")");
  if (!json::valid_utf8(name)) OT_THROW(kInvalidArgument, "parameter name is not valid UTF-8");
}

void check_storable(DType dtype, const std::string& what) {
  bool ok = false;
  for (const auto& d : kDTypeNames) ok |= d.dtype == dtype;
  if (!ok) OT_THROW(kInvalidArgument, what, ": dtype ", dtype_name(dtype), " cannot be stored in a checkpoint");
}

}  // namespace

CheckpointState CheckpointState::clone() const {
  CheckpointState c = *this;
  for (auto& p : c.params_) {
    if (p.has_data()) p.adopt_data(p.data().clone());
    if (p.has_grad()) p.set_grad(p.grad().clone());
  }
  if (c.optimizer_)
    for (auto& [param, states] : c.optimizer_->param_states)
      for (auto& [name, t] : states) t = t.clone();
  return c;
}

Parameter& CheckpointState::add_parameter(const std::string& name, Tensor data, bool requires_grad) {
  check_parameter_name(name);
  if (!data.defined()) OT_THROW(kInvalidArgument, "parameter '", name, "': data is an undefined tensor");
  check_storable(data.dtype(), "parameter '" + name + "'");
  if (has_parameter(name)) OT_THROW(kInvalidArgument, "parameter '", name, "' already exists");
  Parameter p(name, data.dtype(), data.shape(), requires_grad);
  p.adopt_data(std::move(data));
  index_[name] = params_.size();
  params_.push_back(std::move(p));
  return params_.back();
}

Parameter& CheckpointState::add_nominal_parameter(const std::string& name, DType dtype, Shape shape,
                                                  bool requires_grad) {
  check_parameter_name(name);
  check_storable(dtype, "parameter '" + name + "'");
  checked_nbytes(dtype, shape, name);
  if (has_parameter(name)) OT_THROW(kInvalidArgument, "parameter '", name, "' already exists");
  index_[name] = params_.size();
  params_.emplace_back(name, dtype, std::move(shape), requires_grad);
  return params_.back();
}

Parameter& CheckpointState::parameter(const std::string& name) {
  return const_cast<Parameter&>(static_cast<const CheckpointState&>(*this).parameter(name));
}

const Parameter& CheckpointState::parameter(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    std::string known;
    for (size_t i = 0; i < params_.size() && i < 8; ++i) {
      if (i) known += ", ";
      known += params_[i].name();
    }
    if (params_.size() > 8) known += ", ...";
    OT_THROW(kInvalidArgument, "no parameter named '", name, "' (the checkpoint has ", params_.size(),
             " parameters", params_.empty() ? "" : ": ", known, ")");
  }
  return params_[it->second];
}

std::vector<std::string> CheckpointState::parameter_names() const {
  std::vector<std::string> names;
  names.reserve(params_.size());
  for (const auto& p : params_) names.push_back(p.name());
  return names;
}

bool CheckpointState::is_nominal() const {
  return std::any_of(params_.begin(), params_.end(), [](const Parameter& p) { return !p.has_data(); });
}

std::vector<std::string> CheckpointState::buffer_parameter_names(bool trainable_only) const {
  std::vector<std::string> names;
  for (const auto& p : params_)
    if (!trainable_only || p.requires_grad()) names.push_back(p.name());
  return names;
}

namespace {
DType common_dtype(const CheckpointState& s, const std::vector<std::string>& names) {
  DType dt = DType::kUndefined;
  std::string first;
  for (const auto& n : names) {
    const Parameter& p = s.parameter(n);
    if (dt == DType::kUndefined) {
      dt = p.dtype();
      first = n;
    } else if (p.dtype() != dt) {
      OT_THROW(kInvalidArgument, "contiguous parameter buffer: parameters must share one dtype, but '", first,
               "' is ", dtype_name(dt), " and '", n, "' is ", dtype_name(p.dtype()));
    }
  }
  return dt == DType::kUndefined ? DType::kFloat32 : dt;
}
}  // namespace

int64_t CheckpointState::buffer_numel(bool trainable_only) const {
  int64_t n = 0;
  for (const auto& name : buffer_parameter_names(trainable_only)) n += parameter(name).numel();
  return n;
}

Tensor CheckpointState::to_contiguous_buffer(bool trainable_only) const {
  auto names = buffer_parameter_names(trainable_only);
  DType dt = common_dtype(*this, names);
  Tensor out = Tensor::empty(dt, {buffer_numel(trainable_only)});
  auto* dst = static_cast<uint8_t*>(out.data());
  for (const auto& n : names) {
    const Tensor& d = parameter(n).data();
    if (d.nbytes()) std::memcpy(dst, d.data(), d.nbytes());
    dst += d.nbytes();
  }
  return out;
}

void CheckpointState::fill_parameters_from_buffer(const Tensor& flat, bool trainable_only) {
  auto names = buffer_parameter_names(trainable_only);
  DType dt = common_dtype(*this, names);
  int64_t need = buffer_numel(trainable_only);
  if (!flat.defined() || flat.rank() != 1 || flat.dtype() != dt || flat.numel() != need)
    OT_THROW(kInvalidArgument, "fill_parameters_from_buffer: expected a 1-D ", dtype_name(dt), " buffer of ", need,
             " elements (", names.size(), trainable_only ? " trainable" : "", " parameters), got ",
             flat.defined() ? dtype_name(flat.dtype()) + " " + shape_str(flat.shape()) : "an undefined tensor");
  const auto* src = static_cast<const uint8_t*>(flat.data());
  for (const auto& n : names) {
    Parameter& p = parameter(n);
    if (!p.has_data()) p.adopt_data(Tensor::empty(p.dtype(), p.shape()));
    Tensor d = p.data();
    if (d.nbytes()) std::memcpy(d.data(), src, d.nbytes());
    src += d.nbytes();
  }
}

void CheckpointState::add_property(const std::string& name, PropertyValue value) {
  if (name.empty()) OT_THROW(kInvalidArgument, "a property name must not be empty");
  if (!json::valid_utf8(name)) OT_THROW(kInvalidArgument, "property name is not valid UTF-8");
  if (auto* s = std::get_if<std::string>(&value); s && !json::valid_utf8(*s))
    OT_THROW(kInvalidArgument, "property '", name, "': string value is not valid UTF-8");
  properties_[name] = std::move(value);
}

const PropertyValue& CheckpointState::get_property(const std::string& name) const {
  auto it = properties_.find(name);
  if (it == properties_.end()) {
    std::string known;
    for (const auto& [k, v] : properties_) {
      if (!known.empty()) known += ", ";
      known += k;
    }
    OT_THROW(kInvalidArgument, "no property named '", name, "' (properties: ", known.empty() ? "none" : known, ")");
  }
  return it->second;
}

SavedOptimizerState& CheckpointState::optimizer_state() {
  if (!optimizer_) optimizer_.emplace();
  return *optimizer_;
}

const SavedOptimizerState& CheckpointState::optimizer_state() const {
  if (!optimizer_) OT_THROW(kInvalidArgument, "the checkpoint has no optimizer state");
  return *optimizer_;
}

void CheckpointState::set_optimizer_tensor(const std::string& param, const std::string& name, Tensor value) {
  parameter(param);  // must exist
  if (name.empty() || name.find('/') != std::string::npos || !json::valid_utf8(name))
    OT_THROW(kInvalidArgument, "optimizer state name '", name, "' for parameter '", param,
             "' must be non-empty UTF-8 without '/'");
  if (!value.defined()) OT_THROW(kInvalidArgument, "optimizer state '", name, "' of '", param, "' is undefined");
  check_storable(value.dtype(), "optimizer state '" + name + "' of '" + param + "'");
  optimizer_state().param_states[param][name] = std::move(value);
}

CheckpointState CheckpointState::from_initializers(const Graph& graph, const std::vector<std::string>& trainable,
                                                   bool nominal, bool share_data) {
  CheckpointState s;
  std::unordered_set<std::string> train_set;
  auto add = [&](const std::string& name, const Tensor& t, bool requires_grad) {
    if (nominal) s.add_nominal_parameter(name, t.dtype(), t.shape(), requires_grad);
    else s.add_parameter(name, share_data ? t : t.clone(), requires_grad);
  };
  for (const auto& name : trainable) {
    auto it = graph.initializers.find(name);
    if (it == graph.initializers.end())
      OT_THROW(kInvalidArgument, "from_initializers: trainable parameter '", name, "' is not an initializer of graph '",
               graph.name, "'");
    if (!is_floating(it->second.dtype()))
      OT_THROW(kInvalidArgument, "from_initializers: trainable parameter '", name, "' has dtype ",
               dtype_name(it->second.dtype()), "; only floating-point parameters can require grad");
    if (!train_set.insert(name).second)
      OT_THROW(kInvalidArgument, "from_initializers: trainable parameter '", name, "' is listed twice");
    add(name, it->second, true);
  }
  // The other initializers are frozen parameters, in name order. Those a checkpoint cannot hold
  // (strings) stay constants of the graph.
  for (const auto& [name, t] : graph.initializers) {
    if (train_set.count(name)) continue;
    if (std::none_of(std::begin(kDTypeNames), std::end(kDTypeNames),
                     [&](const auto& d) { return d.dtype == t.dtype(); }))
      continue;
    add(name, t, false);
  }
  return s;
}

// ================================================================ file I/O (core/file_io.h), header values

namespace {

using file_io::errno_text;
using file_io::Fd;
using file_io::kIoChunk;
using file_io::read_exact_at;

json::Value encode_double(double d) {
  if (std::isnan(d)) return json::Value::string("nan");
  if (std::isinf(d)) return json::Value::string(d > 0 ? "inf" : "-inf");
  return json::Value::number(d);
}

double decode_double(const json::Value& v, const std::string& what) {
  if (v.is_number()) return v.as_double();
  if (v.is_string()) {
    const std::string& s = v.as_string();
    if (s == "nan") return std::nan("");
    if (s == "inf") return HUGE_VAL;
    if (s == "-inf") return -HUGE_VAL;
  }
  OT_THROW(kInvalidModel, what, ": expected a number or \"nan\"/\"inf\"/\"-inf\"");
}

json::Value shape_json(const Shape& shape) {
  json::Value a = json::Value::array();
  for (int64_t d : shape) a.push_back(json::Value::integer(d));
  return a;
}

// The compact header with the header checksum key removed: what the header checksum covers.
uint32_t header_checksum(json::Value header) {
  for (auto& [k, v] : header.as_object())
    if (k == kMetadataKey && v.is_object()) v.erase(kKeyHeaderCrc);
  std::string text = json::dump(header);
  return crc32c(0, text.data(), text.size());
}


}  // namespace

void CheckpointState::save(const std::string& path, bool include_optimizer_state) const {
  const std::string ctx = "checkpoint '" + path + "': ";
  try {
    // ---- what to write, validated before any file is touched
    std::vector<std::pair<std::string, Tensor>> tensors;
    json::Value params_meta = json::Value::array();
    for (const auto& p : params_) {
      json::Value entry = json::Value::object();
      entry.set("name", json::Value::string(p.name()));
      entry.set("requires_grad", json::Value::boolean(p.requires_grad()));
      if (p.has_data()) {
        tensors.emplace_back(p.name(), p.data());
      } else {
        entry.set("dtype", json::Value::string(safetensors_dtype(p.dtype())));
        entry.set("shape", shape_json(p.shape()));
      }
      params_meta.push_back(std::move(entry));
    }
    const bool with_optimizer = include_optimizer_state && optimizer_.has_value();
    if (with_optimizer) {
      for (const auto& [param, states] : optimizer_->param_states) {
        if (!has_parameter(param))
          OT_THROW(kInvalidArgument, "optimizer state for '", param, "', which is not a parameter");
        for (const auto& [name, t] : states) {
          if (name.empty() || name.find('/') != std::string::npos)
            OT_THROW(kInvalidArgument, "optimizer state name '", name, "' of '", param, "' must be non-empty without '/'");
          if (!t.defined()) OT_THROW(kInvalidArgument, "optimizer state '", name, "' of '", param, "' is undefined");
          tensors.emplace_back(std::string(kOptimizerPrefix) + param + "/" + name, t);
        }
      }
    }

    // ---- header
    json::Value meta = json::Value::object();
    auto& mo = meta.as_object();
    mo.emplace_back(kKeyFormatVersion, json::Value::string(kFormatVersion));
    mo.emplace_back(kKeyParameters, json::Value::string(json::dump(params_meta)));
    for (const auto& [name, value] : properties_) {
      json::Value pv = json::Value::object();
      pv.set("type", json::Value::string(property_type_name(value)));
      if (auto* i = std::get_if<int64_t>(&value)) pv.set("value", json::Value::integer(*i));
      else if (auto* d = std::get_if<double>(&value)) pv.set("value", encode_double(*d));
      else pv.set("value", json::Value::string(std::get<std::string>(value)));
      mo.emplace_back(kKeyPropertyPrefix + name, json::Value::string(json::dump(pv)));
    }
    if (with_optimizer) {
      json::Value ov = json::Value::object();
      ov.set("step", json::Value::integer(optimizer_->step));
      if (optimizer_->learning_rate) ov.set("learning_rate", encode_double(*optimizer_->learning_rate));
      mo.emplace_back(kKeyOptimizer, json::Value::string(json::dump(ov)));
    }
    uint32_t data_crc = 0;
    for (const auto& [name, t] : tensors) data_crc = crc32c(data_crc, t.data(), t.nbytes());
    mo.emplace_back(kKeyDataCrc, json::Value::string(hex32(data_crc)));

    json::Value header = json::Value::object();
    auto& ho = header.as_object();
    ho.emplace_back(std::string(kMetadataKey), std::move(meta));
    uint64_t offset = 0;
    for (const auto& [name, t] : tensors) {
      json::Value e = json::Value::object();
      e.set("dtype", json::Value::string(safetensors_dtype(t.dtype())));
      e.set("shape", shape_json(t.shape()));
      json::Value offs = json::Value::array();
      offs.push_back(json::Value::integer(int64_t(offset)));
      offset += t.nbytes();
      offs.push_back(json::Value::integer(int64_t(offset)));
      e.set("data_offsets", std::move(offs));
      ho.emplace_back(name, std::move(e));
    }
    uint32_t header_crc = header_checksum(header);
    ho.front().second.as_object().emplace_back(kKeyHeaderCrc, json::Value::string(hex32(header_crc)));
    std::string text = json::dump(header);
    text.append((8 - text.size() % 8) % 8, ' ');  // data section 8-byte aligned
    uint8_t len_bytes[8];
    uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) len_bytes[i] = uint8_t(n >> (8 * i));

    // ---- write a temporary file, then rename it over path
    file_io::write_file_atomically(path, [&](int fd, const std::string& what) {
      file_io::write_all(fd, len_bytes, 8, what);
      file_io::write_all(fd, text.data(), text.size(), what);
      for (const auto& [name, t] : tensors) file_io::write_all(fd, t.data(), t.nbytes(), what);
    });
  } catch (const Error& e) {
    throw Error(e.code(), ctx + e.what());
  }
}

namespace {

CheckpointState load_impl(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) OT_THROW(kRuntime, "cannot open: ", errno_text(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) OT_THROW(kRuntime, "cannot stat: ", errno_text(errno));
  if (!S_ISREG(st.st_mode)) OT_THROW(kInvalidModel, "not a regular file");
  const uint64_t file_size = uint64_t(st.st_size);
  if (file_size < 8)
    OT_THROW(kInvalidModel, "file is ", file_size, " bytes, too short for the 8-byte header length");
  uint8_t len_bytes[8];
  read_exact_at(fd.get(), len_bytes, 8, 0, file_size);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > file_size - 8)
    OT_THROW(kInvalidModel, "header length ", header_len, " runs past the end of the file (", file_size,
             " bytes; at most ", file_size - 8, " available): truncated or not a checkpoint");
  if (header_len > kMaxHeaderBytes)
    OT_THROW(kInvalidModel, "header length ", header_len, " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  if (header_len < 2) OT_THROW(kInvalidModel, "header length ", header_len, " is too small for a JSON object");
  std::string text(header_len, '\0');
  read_exact_at(fd.get(), text.data(), text.size(), 8, file_size);
  if (text[0] != '{') OT_THROW(kInvalidModel, "the header does not start with '{': not a safetensors checkpoint");
  json::Value header;
  try {
    header = json::parse(text);
  } catch (const Error& e) {
    OT_THROW(kInvalidModel, "header: ", e.what());
  }
  if (!header.is_object()) OT_THROW(kInvalidModel, "the header is not a JSON object");
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file_size - data_start;

  // ---- metadata
  std::map<std::string, std::string> meta;
  if (const json::Value* m = header.find(kMetadataKey)) {
    if (!m->is_object()) OT_THROW(kInvalidModel, "\"__metadata__\" is not an object");
    for (const auto& [k, v] : m->as_object()) {
      if (!v.is_string()) OT_THROW(kInvalidModel, "\"__metadata__\" value of \"", k, "\" is not a string");
      meta[k] = v.as_string();
    }
  }
  const bool ours = std::any_of(meta.begin(), meta.end(), [](const auto& kv) { return kv.first.rfind(kKeyPrefix, 0) == 0; });
  if (ours) {
    auto v = meta.find(kKeyFormatVersion);
    if (v == meta.end()) OT_THROW(kInvalidModel, "metadata has onnxtrain keys but no \"", kKeyFormatVersion, "\"");
    if (v->second != kFormatVersion)
      OT_THROW(kInvalidModel, "format version \"", v->second, "\" is not supported (this build reads \"", kFormatVersion, "\")");
    auto h = meta.find(kKeyHeaderCrc);
    if (h == meta.end()) OT_THROW(kInvalidModel, "metadata lacks the header checksum \"", kKeyHeaderCrc, "\"");
    std::string expect = hex32(header_checksum(header));
    if (h->second != expect)
      OT_THROW(kInvalidModel, "header checksum mismatch (stored ", h->second, ", computed ", expect,
               "): the header is corrupt");
    if (!meta.count(kKeyDataCrc)) OT_THROW(kInvalidModel, "metadata lacks the data checksum \"", kKeyDataCrc, "\"");
  }

  // ---- tensors: validate every entry, then read the data section once, in offset order
  std::vector<TensorEntry> entries = parse_tensor_entries(header, data_size);
  std::vector<size_t> order(entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return entries[a].begin < entries[b].begin; });
  std::vector<Tensor> data(entries.size());
  uint32_t crc = 0;
  for (size_t i : order) {
    const TensorEntry& e = entries[i];
    Tensor t = Tensor::empty(e.dtype, e.shape);
    auto* p = static_cast<uint8_t*>(t.data());
    for (uint64_t done = 0; done < e.end - e.begin;) {
      size_t chunk = size_t(std::min<uint64_t>(kIoChunk, e.end - e.begin - done));
      read_exact_at(fd.get(), p + done, chunk, data_start + e.begin + done, file_size);
      crc = crc32c(crc, p + done, chunk);
      done += chunk;
    }
    data[i] = std::move(t);
  }
  if (ours) {
    std::string got = hex32(crc);
    if (meta[kKeyDataCrc] != got)
      OT_THROW(kInvalidModel, "data checksum mismatch (stored ", meta[kKeyDataCrc], ", computed ", got,
               "): the tensor data is corrupt");
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].dtype != DType::kBool) continue;
    const auto* b = static_cast<const uint8_t*>(data[i].data());
    for (int64_t k = 0; k < data[i].numel(); ++k)
      if (b[k] > 1) OT_THROW(kInvalidModel, "tensor '", entries[i].name, "': BOOL element ", k, " is ", int(b[k]), ", not 0 or 1");
  }

  // ---- assemble the state
  CheckpointState state;
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < entries.size(); ++i) by_name[entries[i].name] = i;
  std::unordered_set<std::string> used;
  if (ours) {
    auto pm = meta.find(kKeyParameters);
    if (pm == meta.end()) OT_THROW(kInvalidModel, "metadata lacks \"", kKeyParameters, "\"");
    json::Value list;
    try {
      list = json::parse(pm->second);
    } catch (const Error& e) {
      OT_THROW(kInvalidModel, "\"", kKeyParameters, "\": ", e.what());
    }
    if (!list.is_array()) OT_THROW(kInvalidModel, "\"", kKeyParameters, "\" is not a JSON array");
    for (const json::Value& item : list.as_array()) {
      const json::Value* name = item.is_object() ? item.find("name") : nullptr;
      const json::Value* rg = item.is_object() ? item.find("requires_grad") : nullptr;
      if (!name || !name->is_string() || !rg || !rg->is_bool())
        OT_THROW(kInvalidModel, "\"", kKeyParameters, "\": each entry needs a string \"name\" and a boolean \"requires_grad\"");
      const std::string& n = name->as_string();
      const json::Value* dt = item.find("dtype");
      const json::Value* sh = item.find("shape");
      if (state.has_parameter(n)) OT_THROW(kInvalidModel, "parameter '", n, "' is listed twice");
      if (dt || sh) {  // nominal
        if (by_name.count(n)) OT_THROW(kInvalidModel, "parameter '", n, "' is nominal but also has a tensor");
        std::optional<DType> d = (dt && dt->is_string()) ? dtype_from_safetensors(dt->as_string()) : std::nullopt;
        if (!d) OT_THROW(kInvalidModel, "nominal parameter '", n, "': missing or unsupported \"dtype\"");
        if (!sh || !sh->is_array()) OT_THROW(kInvalidModel, "nominal parameter '", n, "': \"shape\" is not an array");
        Shape shape;
        for (const json::Value& x : sh->as_array()) {
          if (!x.is_integer() || x.as_int() < 0)
            OT_THROW(kInvalidModel, "nominal parameter '", n, "': \"shape\" must hold non-negative integers");
          shape.push_back(x.as_int());
        }
        try {
          state.add_nominal_parameter(n, *d, shape, rg->as_bool());
        } catch (const Error& e) {
          OT_THROW(kInvalidModel, e.what());
        }
      } else {
        auto it = by_name.find(n);
        if (it == by_name.end()) OT_THROW(kInvalidModel, "parameter '", n, "' is listed but has no tensor");
        try {
          state.add_parameter(n, data[it->second], rg->as_bool());
        } catch (const Error& e) {
          OT_THROW(kInvalidModel, e.what());
        }
        used.insert(n);
      }
    }
  } else {
    for (size_t i = 0; i < entries.size(); ++i) {
      if (entries[i].name.rfind(kOptimizerPrefix, 0) == 0) continue;
      state.add_parameter(entries[i].name, data[i], is_floating(entries[i].dtype));
      used.insert(entries[i].name);
    }
  }
  // Optimizer tensors; every other tensor must have been claimed by a parameter.
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string& n = entries[i].name;
    if (used.count(n)) continue;
    if (n.rfind(kOptimizerPrefix, 0) != 0)
      OT_THROW(kInvalidModel, "tensor '", n, "' is neither a listed parameter nor optimizer state");
    std::string rest = n.substr(kOptimizerPrefix.size());
    size_t slash = rest.rfind('/');
    if (slash == std::string::npos || slash == 0 || slash + 1 == rest.size())
      OT_THROW(kInvalidModel, "optimizer tensor '", n, "' is not named \"", kOptimizerPrefix, "<param>/<state>\"");
    std::string param = rest.substr(0, slash);
    if (!state.has_parameter(param))
      OT_THROW(kInvalidModel, "optimizer tensor '", n, "' refers to '", param, "', which is not a parameter");
    state.set_optimizer_tensor(param, rest.substr(slash + 1), data[i]);
  }
  if (ours) {
    for (const auto& [k, v] : meta) {
      if (k.rfind(kKeyPrefix, 0) != 0) continue;  // other tools' metadata is ignored
      if (k == kKeyFormatVersion || k == kKeyParameters || k == kKeyDataCrc || k == kKeyHeaderCrc) continue;
      json::Value j;
      try {
        j = json::parse(v);
      } catch (const Error& e) {
        OT_THROW(kInvalidModel, "metadata \"", k, "\": ", e.what());
      }
      if (k == kKeyOptimizer) {
        const json::Value* step = j.is_object() ? j.find("step") : nullptr;
        if (!step || !step->is_integer()) OT_THROW(kInvalidModel, "metadata \"", k, "\": needs an integer \"step\"");
        SavedOptimizerState& opt = state.optimizer_state();
        opt.step = step->as_int();
        if (const json::Value* lr = j.find("learning_rate")) opt.learning_rate = decode_double(*lr, "metadata \"" + k + "\" learning_rate");
      } else if (k.rfind(kKeyPropertyPrefix, 0) == 0) {
        std::string name = k.substr(std::strlen(kKeyPropertyPrefix));
        const json::Value* type = j.is_object() ? j.find("type") : nullptr;
        const json::Value* value = j.is_object() ? j.find("value") : nullptr;
        if (!type || !type->is_string() || !value)
          OT_THROW(kInvalidModel, "property '", name, "': needs \"type\" and \"value\"");
        const std::string& t = type->as_string();
        if (t == "int" && value->is_integer()) state.add_property(name, value->as_int());
        else if (t == "float") state.add_property(name, decode_double(*value, "property '" + name + "'"));
        else if (t == "string" && value->is_string()) state.add_property(name, value->as_string());
        else OT_THROW(kInvalidModel, "property '", name, "': type \"", t, "\" with a ", json::type_name(value->type()), " value");
      } else {
        OT_THROW(kInvalidModel, "unknown metadata key \"", k, "\"");
      }
    }
    if (state.has_optimizer_state() && !meta.count(kKeyOptimizer))
      OT_THROW(kInvalidModel, "optimizer tensors without \"", kKeyOptimizer, "\" metadata");
  }
  return state;
}

}  // namespace

CheckpointState CheckpointState::load(const std::string& path) {
  try {
    return load_impl(path);
  } catch (const Error& e) {
    throw Error(e.code(), "checkpoint '" + path + "': " + e.what());
  }
}

}  // namespace onnxtrain
