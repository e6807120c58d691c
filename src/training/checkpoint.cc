// CheckpointState: parameters, properties and optimizer state, and how they are saved in a
// safetensors file (the mapping is described in training/checkpoint.h).
#include "training/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <unordered_set>

#include "core/file_io.h"
#include "ir/graph.h"
#include "training/ort_checkpoint.h"

namespace onnxtrain {

using namespace checkpoint;
using safetensors::dtype_from_safetensors;
using safetensors::kMetadataKey;
using safetensors::safetensors_dtype;

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

Parameter Parameter::unshaped(std::string name, DType dtype, bool requires_grad) {
  Parameter p(std::move(name), dtype, {}, requires_grad);
  p.shape_known_ = false;
  return p;
}

void Parameter::check_matches(const Tensor& t, const char* what) const {
  if (!t.defined()) OT_THROW(kInvalidArgument, "parameter '", name_, "': ", what, " is an undefined tensor");
  if (!shape_known_) {
    if (t.dtype() != dtype_)
      OT_THROW(kInvalidArgument, "parameter '", name_, "': ", what, " expected ", dtype_name(dtype_), ", got ",
               dtype_name(t.dtype()));
    return;
  }
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
  if (!shape_known_) {
    shape_ = value.shape();
    shape_known_ = true;
  }
  if (!data_.defined()) {
    data_ = value.clone();
    return;
  }
  if (data_.data() != value.data() && value.nbytes() > 0) std::memmove(data_.data(), value.data(), value.nbytes());
}

void Parameter::adopt_data(Tensor value) {
  check_matches(value, "data");
  if (!shape_known_) {
    shape_ = value.shape();
    shape_known_ = true;
  }
  data_ = std::move(value);
}

Tensor& Parameter::ensure_grad() {
  if (!shape_known_) OT_THROW(kInvalidArgument, "parameter '", name_, "' has no shape yet: set its data first");
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
  if (!safetensors::can_hold(dtype)) OT_THROW(kInvalidArgument, what, ": dtype ", dtype_name(dtype), " cannot be stored in a checkpoint");
}

}  // namespace

CheckpointState::CheckpointState(const CheckpointState& other) {
  other.to_host();
  params_ = other.params_;
  index_ = other.index_;
  properties_ = other.properties_;
  optimizer_ = other.optimizer_;
}

CheckpointState::CheckpointState(CheckpointState&& other) {
  other.to_host();
  params_ = std::move(other.params_);
  index_ = std::move(other.index_);
  properties_ = std::move(other.properties_);
  optimizer_ = std::move(other.optimizer_);
}

CheckpointState& CheckpointState::operator=(const CheckpointState& other) {
  if (this == &other) return *this;
  CheckpointState copy(other);
  return *this = std::move(copy);
}

// Everything is replaced: an attached Module uploads all of it again before its next step.
CheckpointState& CheckpointState::operator=(CheckpointState&& other) {
  if (this == &other) return *this;
  other.to_host();
  host_writes("");
  host_writes_optimizer_state();
  params_ = std::move(other.params_);
  index_ = std::move(other.index_);
  properties_ = std::move(other.properties_);
  optimizer_ = std::move(other.optimizer_);
  return *this;
}

void CheckpointState::attach_device_sync(DeviceSync* sync) {
  if (hook_.sync == sync) return;
  if (DeviceSync* previous = hook_.sync) {
    DeviceSyncPause pause(*this);
    previous->to_host();
    previous->detached();
  }
  hook_.sync = sync;
}

void CheckpointState::detach_device_sync(DeviceSync* sync) {
  if (hook_.sync == sync) hook_.sync = nullptr;
}

void CheckpointState::call_to_host() const {
  DeviceSyncPause pause(*this);  // the callback reads and writes the host tensors itself
  hook_.sync->to_host();
}

void CheckpointState::host_writes(const std::string& param) {
  if (!hook_.sync || hook_.paused) return;
  call_to_host();
  DeviceSyncPause pause(*this);
  hook_.sync->host_writes(param);
}

void CheckpointState::host_writes_optimizer_state() {
  if (!hook_.sync || hook_.paused) return;
  call_to_host();
  DeviceSyncPause pause(*this);
  hook_.sync->host_writes_optimizer_state();
}

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
  safetensors::checked_nbytes(dtype, shape, name);
  if (has_parameter(name)) OT_THROW(kInvalidArgument, "parameter '", name, "' already exists");
  index_[name] = params_.size();
  params_.emplace_back(name, dtype, std::move(shape), requires_grad);
  return params_.back();
}

Parameter& CheckpointState::add_unshaped_parameter(const std::string& name, DType dtype, bool requires_grad) {
  check_parameter_name(name);
  check_storable(dtype, "parameter '" + name + "'");
  if (has_parameter(name)) OT_THROW(kInvalidArgument, "parameter '", name, "' already exists");
  index_[name] = params_.size();
  params_.push_back(Parameter::unshaped(name, dtype, requires_grad));
  return params_.back();
}

Parameter& CheckpointState::parameter(const std::string& name) {
  Parameter& p = const_cast<Parameter&>(find_parameter(name));
  host_writes(name);
  return p;
}

const Parameter& CheckpointState::parameter(const std::string& name) const {
  to_host();
  return find_parameter(name);
}

const Parameter& CheckpointState::find_parameter(const std::string& name) const {
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
  CheckpointState::DeviceSyncPause pause(s);  // dtypes only: nothing to copy down
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
  DeviceSyncPause pause(*this);  // shapes only: nothing to copy down
  int64_t n = 0;
  for (const auto& name : buffer_parameter_names(trainable_only)) {
    const Parameter& p = parameter(name);
    if (!p.shape_known())
      OT_THROW(kInvalidArgument, "parameter '", name, "' has no shape (an ONNX Runtime nominal checkpoint stores names ",
               "and dtypes only): set it with set_parameter first");
    n += p.numel();
  }
  return n;
}

Tensor CheckpointState::to_contiguous_buffer(bool trainable_only) const {
  to_host();
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
  host_writes_optimizer_state();
  if (!optimizer_) optimizer_.emplace();
  return *optimizer_;
}

const SavedOptimizerState& CheckpointState::optimizer_state() const {
  to_host();
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
    if (!safetensors::can_hold(t.dtype())) continue;
    add(name, t, false);
  }
  return s;
}

// ================================================================ save and load

namespace {

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

}  // namespace

const char* checkpoint_format_name(CheckpointFormat f) { return f == CheckpointFormat::kOrt ? "ort" : "onnxtrain"; }

void CheckpointState::save(const std::string& path, bool include_optimizer_state, CheckpointFormat format) const {
  to_host();
  const std::string ctx = "checkpoint '" + path + "': ";
  if (format == CheckpointFormat::kOrt) {
    try {
      ort_checkpoint::write(*this, path, include_optimizer_state);
    } catch (const Error& e) {
      throw Error(e.code(), "checkpoint '" + path + "' (ONNX Runtime format): " + e.what());
    }
    return;
  }
  try {
    // What to write, validated before any file is touched.
    safetensors::NamedTensors tensors;
    json::Value params_meta = json::Value::array();
    for (const auto& p : params_) {
      json::Value entry = json::Value::object();
      entry.set("name", json::Value::string(p.name()));
      entry.set("requires_grad", json::Value::boolean(p.requires_grad()));
      if (p.has_data()) {
        tensors.emplace_back(p.name(), p.data());
      } else {
        entry.set("dtype", json::Value::string(safetensors_dtype(p.dtype())));
        entry.set("shape", p.shape_known() ? shape_json(p.shape()) : json::Value());  // null: not known
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

    safetensors::Metadata meta;
    meta.emplace_back(kKeyFormatVersion, kFormatVersion);
    meta.emplace_back(kKeyParameters, json::dump(params_meta));
    for (const auto& [name, value] : properties_) {
      json::Value pv = json::Value::object();
      pv.set("type", json::Value::string(property_type_name(value)));
      if (auto* i = std::get_if<int64_t>(&value)) pv.set("value", json::Value::integer(*i));
      else if (auto* d = std::get_if<double>(&value)) pv.set("value", encode_double(*d));
      else pv.set("value", json::Value::string(std::get<std::string>(value)));
      meta.emplace_back(kKeyPropertyPrefix + name, json::dump(pv));
    }
    if (with_optimizer) {
      json::Value ov = json::Value::object();
      ov.set("step", json::Value::integer(optimizer_->step));
      if (optimizer_->learning_rate) ov.set("learning_rate", encode_double(*optimizer_->learning_rate));
      meta.emplace_back(kKeyOptimizer, json::dump(ov));
    }
    safetensors::write(path, meta, tensors);
  } catch (const Error& e) {
    throw Error(e.code(), ctx + e.what());
  }
}

namespace {

// The parameters listed in the metadata, each with its tensor or as nominal (dtype and shape).
void add_listed_parameters(CheckpointState& state, const std::string& listing,
                           const std::map<std::string, const Tensor*>& by_name, std::unordered_set<std::string>& used) {
  json::Value list;
  try {
    list = json::parse(listing);
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
    try {
      if (dt || sh) {  // nominal
        if (by_name.count(n)) OT_THROW(kInvalidModel, "parameter '", n, "' is nominal but also has a tensor");
        std::optional<DType> d = (dt && dt->is_string()) ? dtype_from_safetensors(dt->as_string()) : std::nullopt;
        if (!d) OT_THROW(kInvalidModel, "nominal parameter '", n, "': missing or unsupported \"dtype\"");
        if (sh && sh->is_null()) {
          state.add_unshaped_parameter(n, *d, rg->as_bool());
          continue;
        }
        if (!sh || !sh->is_array()) OT_THROW(kInvalidModel, "nominal parameter '", n, "': \"shape\" is not an array");
        Shape shape;
        for (const json::Value& x : sh->as_array()) {
          if (!x.is_integer() || x.as_int() < 0)
            OT_THROW(kInvalidModel, "nominal parameter '", n, "': \"shape\" must hold non-negative integers");
          shape.push_back(x.as_int());
        }
        state.add_nominal_parameter(n, *d, shape, rg->as_bool());
      } else {
        auto it = by_name.find(n);
        if (it == by_name.end()) OT_THROW(kInvalidModel, "parameter '", n, "' is listed but has no tensor");
        state.add_parameter(n, *it->second, rg->as_bool());
        used.insert(n);
      }
    } catch (const Error& e) {
      OT_THROW(kInvalidModel, e.what());
    }
  }
}

// Optimizer metadata and properties: every onnxtrain.* key but the ones read elsewhere.
void read_metadata(CheckpointState& state, const safetensors::Metadata& metadata) {
  for (const auto& [k, v] : metadata) {
    if (k.rfind(kKeyPrefix, 0) != 0) continue;  // other tools' metadata is ignored
    if (k == kKeyFormatVersion || k == kKeyParameters || k == safetensors::kKeyDataCrc ||
        k == safetensors::kKeyHeaderCrc)
      continue;
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
}

CheckpointState load_impl(const std::string& path) {
  safetensors::Contents file = safetensors::read(path);
  const bool ours = std::any_of(file.metadata.begin(), file.metadata.end(),
                                [](const auto& kv) { return kv.first.rfind(kKeyPrefix, 0) == 0; });
  if (ours) {
    const std::string* version = file.metadata_value(kKeyFormatVersion);
    if (!version) OT_THROW(kInvalidModel, "metadata has onnxtrain keys but no \"", kKeyFormatVersion, "\"");
    if (*version != kFormatVersion)
      OT_THROW(kInvalidModel, "format version \"", *version, "\" is not supported (this build reads \"", kFormatVersion, "\")");
    // The format verified the checksums it found; ours must have both.
    if (!file.has_metadata_key(safetensors::kKeyHeaderCrc))
      OT_THROW(kInvalidModel, "metadata lacks the header checksum \"", safetensors::kKeyHeaderCrc, "\"");
    if (!file.has_metadata_key(safetensors::kKeyDataCrc))
      OT_THROW(kInvalidModel, "metadata lacks the data checksum \"", safetensors::kKeyDataCrc, "\"");
  }

  CheckpointState state;
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : file.tensors) by_name[name] = &t;
  std::unordered_set<std::string> used;
  if (ours) {
    const std::string* listing = file.metadata_value(kKeyParameters);
    if (!listing) OT_THROW(kInvalidModel, "metadata lacks \"", kKeyParameters, "\"");
    add_listed_parameters(state, *listing, by_name, used);
  } else {
    for (const auto& [name, t] : file.tensors) {
      if (name.rfind(kOptimizerPrefix, 0) == 0) continue;
      state.add_parameter(name, t, is_floating(t.dtype()));
      used.insert(name);
    }
  }
  // Optimizer tensors; every other tensor must have been claimed by a parameter.
  for (const auto& [n, t] : file.tensors) {
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
    state.set_optimizer_tensor(param, rest.substr(slash + 1), t);
  }
  if (ours) {
    read_metadata(state, file.metadata);
    if (state.has_optimizer_state() && !file.has_metadata_key(kKeyOptimizer))
      OT_THROW(kInvalidModel, "optimizer tensors without \"", kKeyOptimizer, "\" metadata");
  }
  return state;
}

}  // namespace

CheckpointFormat CheckpointState::file_format(const std::string& path) {
  file_io::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) OT_THROW(kRuntime, "checkpoint '", path, "': cannot open: ", file_io::errno_text(errno));
  uint8_t head[8] = {};
  ssize_t n = ::pread(fd.get(), head, 8, 0);
  if (n == 8 && ort_checkpoint::has_identifier(head, 8)) return CheckpointFormat::kOrt;
  // A safetensors file starts with its header length and '{'; anything else is neither format.
  uint8_t brace = 0;
  if (n == 8 && ::pread(fd.get(), &brace, 1, 8) == 1 && brace == '{') return CheckpointFormat::kOnnxtrain;
  OT_THROW(kInvalidModel, "checkpoint '", path, "': expected onnxtrain's format (safetensors: a header length, then '{') ",
           "or ONNX Runtime's (\"ODTC\" at byte 4), got ", n < 8 ? "a file of " + std::to_string(n < 0 ? 0 : n) + " bytes"
                                                             : std::string("neither"));
}

CheckpointState CheckpointState::load(const std::string& path) {
  bool ort = false;
  {
    file_io::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    uint8_t head[8] = {};
    ort = fd.get() >= 0 && ::pread(fd.get(), head, 8, 0) == 8 && ort_checkpoint::has_identifier(head, 8);
  }
  if (ort) {
    try {
      return ort_checkpoint::read(path);
    } catch (const Error& e) {
      throw Error(e.code(), "checkpoint '" + path + "' (ONNX Runtime format): " + e.what());
    }
  }
  try {
    return load_impl(path);
  } catch (const Error& e) {
    throw Error(e.code(), "checkpoint '" + path + "': " + e.what());
  }
}

}  // namespace onnxtrain
