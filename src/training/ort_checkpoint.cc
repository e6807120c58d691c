// ONNX Runtime's training checkpoint format (ort_checkpoint.h): a bounds-checked flatbuffer reader
// that names the field it rejects, and a writer that lays the small tables out first and streams
// tensor bytes after them (or into "<path>.data") without building the file in memory.
#include "training/ort_checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "core/crc32c.h"
#include "core/file_io.h"
#include "core/memory.h"
#include "training/ort_checkpoint_trailer.h"

namespace onnxtrain::ort_checkpoint {

using file_io::errno_text;
using file_io::Fd;

namespace {

// ---- schema slots (declaration order in the .fbs files)
namespace slot {
enum Checkpoint { kVersion = 0, kModuleState = 1, kOptimizerGroups = 2, kPropertyBag = 3 };
enum ModuleState { kRequiresGrad = 0, kFrozen = 1, kIsNominal = 2, kHasExternal = 3 };
enum OptimizerGroup { kGroupName = 0, kStep = 1, kInitialLr = 2, kOptimizerStates = 3 };
enum ParamState { kParamName = 0, kMomentums = 1 };
enum Property { kPropName = 0, kPropValue = 1 };
enum PropertyBag { kInts = 0, kFloats = 1, kStrings = 2 };
enum Tensor { kName = 0, kDocString = 1, kDims = 2, kDataType = 3, kRawData = 4, kStringData = 5, kExternalOffset = 6 };
}  // namespace slot

// ORT's names for AdamW's moments and onnxtrain's.
const std::pair<const char*, const char*> kStateNames[] = {{"momentum0", "exp_avg"}, {"momentum1", "exp_avg_sq"}};

std::string state_name_from_ort(const std::string& n) {
  for (const auto& [ort, ours] : kStateNames)
    if (n == ort) return ours;
  return n;
}
std::string state_name_to_ort(const std::string& n) {
  for (const auto& [ort, ours] : kStateNames)
    if (n == ours) return ort;
  return n;
}

bool known_dtype(int32_t code) {
  switch (DType(code)) {
    case DType::kFloat32:
    case DType::kUint8:
    case DType::kInt8:
    case DType::kUint16:
    case DType::kInt16:
    case DType::kInt32:
    case DType::kInt64:
    case DType::kBool:
    case DType::kFloat16:
    case DType::kFloat64:
    case DType::kUint32:
    case DType::kUint64:
    case DType::kBFloat16:
      return true;
    default:
      return false;
  }
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// ================================================================ reading

// The file mapped read-only; every access is checked against its size.
class Buffer {
 public:
  Buffer(const uint8_t* data, uint64_t size) : p_(data), size_(size) {}
  uint64_t size() const { return size_; }
  const uint8_t* at(uint64_t pos) const { return p_ + pos; }

  void need(uint64_t pos, uint64_t n, const std::string& field) const {
    if (pos > size_ || n > size_ - pos)
      OT_THROW(kInvalidModel, field, ": expected ", n, " bytes at offset ", pos, " inside the file, but the file has ",
               size_, " bytes (truncated, or an offset is corrupt)");
  }
  template <typename T>
  T scalar(uint64_t pos, const std::string& field) const {
    need(pos, sizeof(T), field);
    return load<T>(p_ + pos);
  }
  // The target of the u32 offset stored at pos.
  uint64_t follow(uint64_t pos, const std::string& field) const {
    uint64_t target = pos + scalar<uint32_t>(pos, field);
    if (target >= size_)
      OT_THROW(kInvalidModel, field, ": expected an offset inside the file (", size_, " bytes), got one to byte ",
               target);
    return target;
  }

 private:
  const uint8_t* p_;
  uint64_t size_;
};

class Table {
 public:
  Table(const Buffer& b, uint64_t pos, std::string name) : b_(b), pos_(pos), name_(std::move(name)) {
    const int32_t soff = b.scalar<int32_t>(pos, name_ + " (table)");
    const int64_t vt = int64_t(pos) - int64_t(soff);
    if (vt < 0 || uint64_t(vt) + 4 > b.size())
      OT_THROW(kInvalidModel, name_, ": expected its vtable inside the file, got byte ", vt);
    vt_ = uint64_t(vt);
    vt_size_ = b.scalar<uint16_t>(vt_, name_ + " (vtable)");
    inline_size_ = b.scalar<uint16_t>(vt_ + 2, name_ + " (vtable)");
    if (vt_size_ < 4 || vt_size_ % 2)
      OT_THROW(kInvalidModel, name_, ": expected an even vtable size of at least 4, got ", vt_size_);
    b.need(vt_, vt_size_, name_ + " (vtable)");
    if (inline_size_ < 4) OT_THROW(kInvalidModel, name_, ": expected a table size of at least 4, got ", inline_size_);
    b.need(pos_, inline_size_, name_ + " (table)");
  }
  const std::string& name() const { return name_; }
  const Buffer& buffer() const { return b_; }
  // The same table under another name in errors (a tensor's, once its name is read).
  Table named(std::string name) const {
    Table t = *this;
    t.name_ = std::move(name);
    return t;
  }
  std::string field(const char* f) const { return name_ + "." + f; }

  // Position of a field present in the table, after checking that `bytes` of it fit.
  std::optional<uint64_t> slot_pos(int s, uint64_t bytes, const char* f) const {
    const uint64_t e = 4 + 2 * uint64_t(s);
    if (e + 2 > vt_size_) return std::nullopt;
    const uint16_t off = load<uint16_t>(b_.at(vt_ + e));
    if (off == 0) return std::nullopt;
    if (off < 4 || off + bytes > inline_size_)
      OT_THROW(kInvalidModel, field(f), ": expected its ", bytes, " bytes inside the table (", inline_size_,
               " bytes), got field offset ", off);
    return pos_ + off;
  }
  template <typename T>
  T scalar(int s, T dflt, const char* f) const {
    auto p = slot_pos(s, sizeof(T), f);
    return p ? load<T>(b_.at(*p)) : dflt;
  }
  std::optional<uint64_t> offset(int s, const char* f) const {
    auto p = slot_pos(s, 4, f);
    if (!p) return std::nullopt;
    return b_.follow(*p, field(f));
  }
  std::optional<Table> table(int s, const char* f) const {
    auto t = offset(s, f);
    if (!t) return std::nullopt;
    return Table(b_, *t, field(f));
  }
  std::optional<std::string> string(int s, const char* f) const {
    auto t = offset(s, f);
    if (!t) return std::nullopt;
    const uint32_t n = b_.scalar<uint32_t>(*t, field(f));
    b_.need(*t + 4, n, field(f));
    return std::string(reinterpret_cast<const char*>(b_.at(*t + 4)), n);
  }
  // A vector: position of its first element and its length, with length * elem_bytes checked.
  std::optional<std::pair<uint64_t, uint32_t>> vector(int s, uint64_t elem_bytes, const char* f) const {
    auto t = offset(s, f);
    if (!t) return std::nullopt;
    const uint32_t n = b_.scalar<uint32_t>(*t, field(f));
    b_.need(*t + 4, uint64_t(n) * elem_bytes, field(f));
    return std::make_pair(*t + 4, n);
  }
  std::vector<Table> tables(int s, const char* f) const {
    std::vector<Table> out;
    auto v = vector(s, 4, f);
    if (!v) return out;
    out.reserve(v->second);
    for (uint32_t i = 0; i < v->second; ++i) {
      std::string fi = field(f) + "[" + std::to_string(i) + "]";
      out.emplace_back(b_, b_.follow(v->first + 4 * uint64_t(i), fi), fi);
    }
    return out;
  }

 private:
  const Buffer& b_;
  uint64_t pos_;
  uint64_t vt_ = 0;
  uint16_t vt_size_ = 0;
  uint16_t inline_size_ = 0;
  std::string name_;
};

// A tensor's description; its bytes are read after the whole structure is validated.
struct TensorRef {
  std::string name;
  std::string field;  // where it is, for errors
  DType dtype = DType::kUndefined;
  std::optional<Shape> shape;  // none: a nominal tensor written without dims
  uint64_t nbytes = 0;
  enum class Where { kNone, kInline, kExternal } where = Where::kNone;
  uint64_t offset = 0;  // of the bytes, in the checkpoint (inline) or in "<path>.data"
};

TensorRef read_tensor(const Table& unnamed, bool nominal, int32_t version) {
  TensorRef r;
  auto name = unnamed.string(slot::kName, "name");
  if (!name || name->empty()) OT_THROW(kInvalidModel, unnamed.field("name"), ": expected a tensor name, got none");
  r.name = *name;
  r.field = unnamed.name() + " ('" + r.name + "')";
  const Table t = unnamed.named(r.field);
  const int32_t code = t.scalar<int32_t>(slot::kDataType, 0, "data_type");
  if (code == int32_t(DType::kString))
    OT_THROW(kInvalidModel, r.field, ".data_type: expected a numeric type, got STRING (not a parameter type)");
  if (!known_dtype(code)) OT_THROW(kInvalidModel, r.field, ".data_type: expected an ONNX tensor type code, got ", code);
  r.dtype = DType(code);
  auto dims = t.vector(slot::kDims, 8, "dims");
  auto raw = t.vector(slot::kRawData, 1, "raw_data");
  const int64_t ext = t.scalar<int64_t>(slot::kExternalOffset, -1, "external_data_offset");
  if (version < 2 && ext != -1)
    OT_THROW(kInvalidModel, r.field, ".external_data_offset: expected none in a version ", version, " checkpoint, got ",
             ext);
  if (ext < -1) OT_THROW(kInvalidModel, r.field, ".external_data_offset: expected -1 or an offset, got ", ext);
  if (nominal) {
    if (raw && raw->second)
      OT_THROW(kInvalidModel, r.field, ".raw_data: expected none in a nominal checkpoint, got ", raw->second, " bytes");
    if (ext != -1)
      OT_THROW(kInvalidModel, r.field, ".external_data_offset: expected none in a nominal checkpoint, got ", ext);
  }
  if (!dims && !nominal) OT_THROW(kInvalidModel, r.field, ".dims: expected the tensor's dims, got none");
  if (dims && (dims->second > 0 || !nominal)) {
    Shape s;
    s.reserve(dims->second);
    uint64_t numel = 1;
    for (uint32_t i = 0; i < dims->second; ++i) {
      const int64_t d = load<int64_t>(t.buffer().at(dims->first + 8 * uint64_t(i)));
      if (d < 0) OT_THROW(kInvalidModel, r.field, ".dims[", i, "]: expected a dimension >= 0, got ", d);
      if (d != 0 && numel > (uint64_t(1) << 62) / uint64_t(d))
        OT_THROW(kInvalidModel, r.field, ".dims: expected a size that fits 64 bits, got dims past it at [", i,
                 "] = ", d);
      numel *= uint64_t(d);
      s.push_back(d);
    }
    r.nbytes = numel * dtype_size(r.dtype);
    r.shape = std::move(s);
  }
  if (nominal) return r;
  if (raw && ext != -1) OT_THROW(kInvalidModel, r.field, ": expected raw_data or external_data_offset, got both");
  if (raw) {
    if (raw->second != r.nbytes)
      OT_THROW(kInvalidModel, r.field, ".raw_data: expected ", r.nbytes, " bytes for ", dtype_name(r.dtype), " ",
               shape_str(*r.shape), ", got ", raw->second);
    r.where = TensorRef::Where::kInline;
    r.offset = raw->first;
  } else if (ext != -1) {
    r.where = TensorRef::Where::kExternal;
    r.offset = uint64_t(ext);
  } else if (r.nbytes != 0) {
    OT_THROW(kInvalidModel, r.field, ": expected raw_data or external_data_offset for ", r.nbytes,
             " bytes, got neither");
  }
  return r;
}

std::vector<TensorRef> read_tensors(const Table& t, int s, const char* f, bool nominal, int32_t version) {
  std::vector<TensorRef> out;
  for (const Table& e : t.tables(s, f)) out.push_back(read_tensor(e, nominal, version));
  return out;
}

struct Mapping {
  const uint8_t* p = nullptr;
  uint64_t size = 0;
  ~Mapping() {
    if (p) ::munmap(const_cast<uint8_t*>(p), size);
  }
};

// A regular file opened for reading, with its size.
struct OpenFile {
  Fd fd;
  uint64_t size = 0;
  OpenFile(const std::string& path, const char* what) : fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd.get() < 0) OT_THROW(kRuntime, "cannot open ", what, " '", path, "': ", errno_text(errno));
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) OT_THROW(kRuntime, "cannot stat ", what, " '", path, "': ", errno_text(errno));
    if (!S_ISREG(st.st_mode)) OT_THROW(kInvalidModel, what, " '", path, "' is not a regular file");
    size = uint64_t(st.st_size);
  }
  explicit OpenFile(ort_checkpoint::ExternalData&& checked) : fd(std::move(checked.fd)), size(checked.size) {}
};

}  // namespace

bool has_identifier(const void* head, size_t n) {
  return n >= 8 && std::memcmp(static_cast<const uint8_t*>(head) + 4, kFileIdentifier, 4) == 0;
}

CheckpointState read(const std::string& path) {
  OpenFile file(path, "checkpoint");
  if (file.size < 8) OT_THROW(kInvalidModel, "expected at least 8 bytes (root offset and \"ODTC\"), got ", file.size);
  if (file.size > std::numeric_limits<uint32_t>::max())
    OT_THROW(kInvalidModel, "expected at most 4 GiB (a flatbuffer's 32-bit offsets), got ", file.size, " bytes");
  Mapping map;
  void* m = ::mmap(nullptr, file.size, PROT_READ, MAP_PRIVATE, file.fd.get(), 0);
  if (m == MAP_FAILED) OT_THROW(kRuntime, "cannot map: ", errno_text(errno));
  map.p = static_cast<const uint8_t*>(m);
  map.size = file.size;
  Buffer b(map.p, map.size);
  if (!has_identifier(map.p, map.size))
    OT_THROW(kInvalidModel, "file identifier: expected \"ODTC\" at byte 4, got \"",
             std::string(reinterpret_cast<const char*>(map.p) + 4, 4), "\"");
  const std::optional<Trailer> trailer = check_trailer(map.p, map.size);  // files from ORT have none

  // ---- structure, all of it validated before any tensor is allocated
  Table root(b, b.follow(0, "root offset"), "checkpoint");
  const int32_t version = root.scalar<int32_t>(slot::kVersion, 0, "version");
  if (version != 1 && version != 2)
    OT_THROW(kInvalidModel, "checkpoint.version: expected 1 (ORT 1.16-1.17) or 2 (ORT 1.18+), got ", version);
  auto ms = root.table(slot::kModuleState, "module_state");
  if (!ms) OT_THROW(kInvalidModel, "checkpoint.module_state: expected the parameters, got none");
  const uint8_t nominal_byte = ms->scalar<uint8_t>(slot::kIsNominal, 0, "is_nominal_state");
  const uint8_t external_byte = ms->scalar<uint8_t>(slot::kHasExternal, 0, "has_external_data");
  if (nominal_byte > 1)
    OT_THROW(kInvalidModel, ms->field("is_nominal_state"), ": expected a bool, got ", int(nominal_byte));
  if (external_byte > 1)
    OT_THROW(kInvalidModel, ms->field("has_external_data"), ": expected a bool, got ", int(external_byte));
  if (version < 2 && external_byte)
    OT_THROW(kInvalidModel, ms->field("has_external_data"), ": expected false in a version 1 checkpoint, got true");
  const bool nominal = nominal_byte != 0;
  std::vector<TensorRef> trainable = read_tensors(*ms, slot::kRequiresGrad, "requires_grad_params", nominal, version);
  std::vector<TensorRef> frozen = read_tensors(*ms, slot::kFrozen, "frozen_params", nominal, version);

  struct Group {
    std::string field;
    int64_t step = 0;
    float lr = 0;
    std::vector<std::pair<std::string, std::vector<TensorRef>>> states;  // param -> momentums
  };
  std::vector<Group> groups;
  for (const Table& g : root.tables(slot::kOptimizerGroups, "optimizer_groups")) {
    Group out;
    out.field = g.name();
    out.step = g.scalar<int64_t>(slot::kStep, 0, "step");
    out.lr = g.scalar<float>(slot::kInitialLr, 0.f, "initial_learning_rate");
    (void)g.string(slot::kGroupName, "group_name");  // checked, not kept: onnxtrain has one group
    for (const Table& s : g.tables(slot::kOptimizerStates, "optimizer_states")) {
      auto param = s.string(slot::kParamName, "param_name");
      if (!param) OT_THROW(kInvalidModel, s.field("param_name"), ": expected a parameter name, got none");
      out.states.emplace_back(*param, read_tensors(s, slot::kMomentums, "momentums", false, version));
    }
    groups.push_back(std::move(out));
  }
  if (nominal)
    for (const Group& g : groups)
      if (!g.states.empty())
        OT_THROW(kInvalidModel, g.field, ".optimizer_states: expected none in a nominal checkpoint, got ", g.states.size());
  if (groups.size() > 1)
    OT_THROW(kInvalidModel, "checkpoint.optimizer_groups: expected one group (onnxtrain's Optimizer has one), got ",
             groups.size());

  std::vector<std::pair<std::string, PropertyValue>> props;
  if (auto bag = root.table(slot::kPropertyBag, "property_bag")) {
    for (const Table& p : bag->tables(slot::kInts, "ints")) {
      auto n = p.string(slot::kPropName, "name");
      if (!n) OT_THROW(kInvalidModel, p.field("name"), ": expected a property name, got none");
      props.emplace_back(*n, p.scalar<int64_t>(slot::kPropValue, 0, "value"));
    }
    for (const Table& p : bag->tables(slot::kFloats, "floats")) {
      auto n = p.string(slot::kPropName, "name");
      if (!n) OT_THROW(kInvalidModel, p.field("name"), ": expected a property name, got none");
      props.emplace_back(*n, double(p.scalar<float>(slot::kPropValue, 0.f, "value")));
    }
    for (const Table& p : bag->tables(slot::kStrings, "strings")) {
      auto n = p.string(slot::kPropName, "name");
      if (!n) OT_THROW(kInvalidModel, p.field("name"), ": expected a property name, got none");
      props.emplace_back(*n, p.string(slot::kPropValue, "value").value_or(""));
    }
  }

  // ---- every tensor's bytes: where they are, checked against the files' sizes
  std::vector<TensorRef*> all;
  for (auto& r : trainable) all.push_back(&r);
  for (auto& r : frozen) all.push_back(&r);
  for (auto& g : groups)
    for (auto& [p, ms_] : g.states)
      for (auto& r : ms_) all.push_back(&r);
  std::optional<OpenFile> external;
  std::string external_path = path + ".data";
  const bool any_external =
      std::any_of(all.begin(), all.end(), [](const TensorRef* r) { return r->where == TensorRef::Where::kExternal; });
  // With a trailer the data file is opened once, by its check: the tensors are read through the
  // descriptor whose bytes matched the CRC, whatever a concurrent save renames over the path.
  if (trailer && any_external) {
    ExternalData checked = matching_external_data(path, *trailer);
    external_path = checked.path;
    external.emplace(std::move(checked));
    if (debug_after_external_check) debug_after_external_check(external_path);
  }
  for (TensorRef* r : all) {
    if (r->where != TensorRef::Where::kExternal) continue;
    if (!external_byte)
      OT_THROW(kInvalidModel, r->field,
               ".external_data_offset: expected none, as module_state.has_external_data is false; got ", r->offset);
    if (!external) external.emplace(external_path, "external data file");
    if (r->offset > external->size || r->nbytes > external->size - r->offset)
      OT_THROW(kInvalidModel, r->field, ".external_data_offset: expected ", r->nbytes, " bytes at offset ", r->offset,
               " inside '", external_path, "' (", external->size, " bytes), got past its end");
  }

  // ---- data: one allocation for all tensors, read in place
  std::vector<TensorSpec> specs;
  std::vector<TensorRef*> with_data;
  for (TensorRef* r : all)
    if (r->shape && !nominal) {
      specs.push_back({r->dtype, *r->shape});
      with_data.push_back(r);
    }
  std::vector<Tensor> tensors = allocate_tensors(specs, Fill::kUninitialized);
  std::map<const TensorRef*, Tensor> data;
  for (size_t i = 0; i < with_data.size(); ++i) {
    const TensorRef& r = *with_data[i];
    Tensor& t = tensors[i];
    if (r.nbytes == 0) {
    } else if (r.where == TensorRef::Where::kInline) {
      // Large tensors by pread (one kernel copy, no page faults on the mapping); small ones copied.
      if (r.nbytes >= (uint64_t(1) << 20))
        file_io::read_exact_at(file.fd.get(), t.data(), r.nbytes, r.offset, file.size);
      else
        std::memcpy(t.data(), b.at(r.offset), r.nbytes);
    } else {
      file_io::read_exact_at(external->fd.get(), t.data(), r.nbytes, r.offset, external->size);
    }
    if (r.dtype == DType::kBool) {
      const auto* v = static_cast<const uint8_t*>(t.data());
      for (uint64_t k = 0; k < r.nbytes; ++k)
        if (v[k] > 1) OT_THROW(kInvalidModel, r.field, ": BOOL element ", k, " is ", int(v[k]), ", expected 0 or 1");
    }
    data[&r] = std::move(t);
  }

  // ---- the state
  CheckpointState state;
  auto add = [&](const TensorRef& r, bool requires_grad) {
    try {
      if (!nominal)
        state.add_parameter(r.name, data.at(&r), requires_grad);
      else if (r.shape)
        state.add_nominal_parameter(r.name, r.dtype, *r.shape, requires_grad);
      else
        state.add_unshaped_parameter(r.name, r.dtype, requires_grad);
    } catch (const Error& e) {
      OT_THROW(kInvalidModel, r.field, ": ", e.what());
    }
  };
  for (const auto& r : trainable) add(r, true);
  for (const auto& r : frozen) add(r, false);
  for (const Group& g : groups) {
    SavedOptimizerState& opt = state.optimizer_state();
    opt.step = g.step;
    opt.learning_rate = double(g.lr);
    for (const auto& [param, momentums] : g.states) {
      const std::string where = g.field + ".optimizer_states ('" + param + "')";
      if (!state.has_parameter(param))
        OT_THROW(kInvalidModel, where, ".param_name: expected a parameter of module_state, got '", param, "'");
      const Parameter& p = state.parameter(param);
      for (const TensorRef& r : momentums) {
        if (r.dtype != p.dtype() || (p.shape_known() && *r.shape != p.shape()))
          OT_THROW(kInvalidModel, r.field, ": expected ", dtype_name(p.dtype()), " ",
                   p.shape_known() ? shape_str(p.shape()) : std::string("(any shape)"), " like parameter '", param,
                   "', got ", dtype_name(r.dtype), " ", shape_str(*r.shape));
        const SavedOptimizerState& saved = state.optimizer_state();
        if (auto it = saved.param_states.find(param);
            it != saved.param_states.end() && it->second.count(state_name_from_ort(r.name)))
          OT_THROW(kInvalidModel, r.field, ": expected one '", r.name, "' for parameter '", param, "', got another");
        try {
          state.set_optimizer_tensor(param, state_name_from_ort(r.name), data.at(&r));
        } catch (const Error& e) {
          OT_THROW(kInvalidModel, r.field, ": ", e.what());
        }
      }
    }
  }
  for (auto& [name, value] : props) {
    if (state.has_property(name))
      OT_THROW(kInvalidModel, "checkpoint.property_bag: property '", name, "' appears twice");
    try {
      state.add_property(name, std::move(value));
    } catch (const Error& e) {
      OT_THROW(kInvalidModel, "checkpoint.property_bag: ", e.what());
    }
  }
  return state;
}

// ================================================================ writing

namespace {

// Lays a flatbuffer out front to back: a table comes before what it points to (offsets are
// unsigned and point forward), its vtable just before it. Scalars sit at multiples of their size,
// as flatbuffers' verifier (which ORT runs) requires.
class Builder {
 public:
  std::vector<uint8_t> b;

  void pad(size_t align, size_t rem = 0) {
    while (b.size() % align != rem) b.push_back(0);
  }
  template <typename T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
  }
  template <typename T>
  void set(size_t at, T v) {
    std::memcpy(b.data() + at, &v, sizeof(T));
  }
  // Points the u32 at `at` to `target` (which lies after it).
  void link(size_t at, uint64_t target) { set<uint32_t>(at, uint32_t(target - at)); }

  struct Field {
    int slot;
    int size;           // 1, 4 or 8 bytes
    uint64_t bits = 0;  // a scalar's value; offsets are linked later
  };
  // Writes a table (linked from `from`: the offset that points to it); returns each field's
  // position, in the order given.
  std::vector<size_t> table(size_t from, const std::vector<Field>& fields) {
    int nslots = 0;
    for (const Field& f : fields) nslots = std::max(nslots, f.slot + 1);
    pad(2);
    const size_t vt = b.size();
    b.resize(b.size() + 4 + 2 * size_t(nslots), 0);
    pad(8, 4);  // the table's first field (after its 4-byte vtable offset) is 8-aligned
    const size_t t = b.size();
    put<int32_t>(int32_t(t - vt));
    link(from, t);
    std::vector<size_t> pos(fields.size());
    for (int size : {8, 4, 1})
      for (size_t i = 0; i < fields.size(); ++i) {
        const Field& f = fields[i];
        if (f.size != size) continue;
        pos[i] = b.size();
        if (size == 8)
          put<uint64_t>(f.bits);
        else if (size == 4)
          put<uint32_t>(uint32_t(f.bits));
        else
          put<uint8_t>(uint8_t(f.bits));
        set<uint16_t>(vt + 4 + 2 * size_t(f.slot), uint16_t(pos[i] - t));
      }
    set<uint16_t>(vt, uint16_t(4 + 2 * nslots));
    set<uint16_t>(vt + 2, uint16_t(b.size() - t));
    return pos;
  }
  size_t string(const std::string& s) {
    pad(4);
    const size_t at = b.size();
    put<uint32_t>(uint32_t(s.size()));
    b.insert(b.end(), s.begin(), s.end());
    b.push_back(0);
    return at;
  }
  size_t int64s(const Shape& v) {
    pad(8, 4);
    const size_t at = b.size();
    put<uint32_t>(uint32_t(v.size()));
    for (int64_t x : v) put<int64_t>(x);
    return at;
  }
  // A vector of n offsets; returns the position of the first one.
  size_t offsets(size_t n) {
    pad(4);
    put<uint32_t>(uint32_t(n));
    const size_t first = b.size();
    b.resize(b.size() + 4 * n, 0);
    return first;
  }
};

uint64_t as_bits(double d) {
  float f = float(d);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

struct TensorOut {
  std::string name;
  DType dtype;
  const Shape* shape;  // null: no dims (a nominal parameter without a shape)
  const void* data;    // null: nominal
  uint64_t nbytes;
};

// Raw bytes placed after the tables (or in the external file), linked once the tables are done.
struct Pending {
  size_t field;  // the raw_data offset field, or the external_data_offset field
  const void* data;
  uint64_t nbytes;
};

struct Layout {
  Builder fb;
  std::vector<Pending> inline_data;
  std::vector<Pending> external_data;
  std::vector<uint64_t> starts;  // of each inline raw_data vector, after the tables
  bool external = false;
  uint64_t end = 0;  // the main file's size
  bool fits = true;  // within a flatbuffer's 2 GiB
};

// A nominal tensor is written as ORT writes one: empty dims and empty raw_data (ORT's reader
// requires both fields and ignores the dims), so a nominal checkpoint carries no shapes.
void write_tensor(Layout& L, size_t link_at, const TensorOut& t) {
  Builder& fb = L.fb;
  const bool to_external = L.external && t.data && t.nbytes >= kMinExternalBytes;
  const std::vector<size_t> pos =
      fb.table(link_at, {{slot::kName, 4},
                         {slot::kDims, 4},
                         {slot::kDataType, 4, uint32_t(t.dtype)},
                         to_external ? Builder::Field{slot::kExternalOffset, 8} : Builder::Field{slot::kRawData, 4}});
  fb.link(pos[0], fb.string(t.name));
  fb.link(pos[1], fb.int64s(t.data && t.shape ? *t.shape : Shape{}));
  (to_external ? L.external_data : L.inline_data).push_back({pos[3], t.data, t.nbytes});
}

}  // namespace

void write(const CheckpointState& state, const std::string& path, bool include_optimizer_state,
           const WriteOptions& options) {
  if (options.version != 1 && options.version != 2)
    OT_THROW(kInvalidArgument, "ORT format version: expected 1 or 2, got ", options.version);
  // ---- what to write, validated before any file is touched
  const bool nominal = state.is_nominal();
  std::vector<TensorOut> trainable, frozen;
  for (const Parameter& p : state.parameters()) {
    if (nominal && p.has_data())
      OT_THROW(kInvalidArgument, "ORT's format holds a nominal or a complete checkpoint, not a mix: parameter '",
               p.name(), "' has data, others have none");
    TensorOut t{p.name(), p.dtype(), p.shape_known() ? &p.shape() : nullptr, nullptr, 0};
    if (!nominal) {
      t.data = p.data().data();
      t.nbytes = p.data().nbytes();
    }
    (p.requires_grad() ? trainable : frozen).push_back(t);
  }
  std::vector<std::pair<std::string, std::vector<TensorOut>>> opt_states;
  const bool with_optimizer = include_optimizer_state && state.has_optimizer_state() && !nominal;
  if (with_optimizer) {
    const SavedOptimizerState& opt = state.optimizer_state();
    for (const Parameter& p : state.parameters()) {
      auto it = opt.param_states.find(p.name());
      if (it == opt.param_states.end()) continue;
      std::vector<TensorOut> ms;
      for (const auto& [name, t] : it->second) {
        if (!t.defined()) OT_THROW(kInvalidArgument, "optimizer state '", name, "' of '", p.name(), "' is undefined");
        ms.push_back({state_name_to_ort(name), t.dtype(), &t.shape(), t.data(), t.nbytes()});
      }
      // ORT's order: momentum0, momentum1, then the rest by name.
      std::sort(ms.begin(), ms.end(), [](const TensorOut& a, const TensorOut& b) { return a.name < b.name; });
      opt_states.emplace_back(p.name(), std::move(ms));
    }
    for (const auto& [param, states] : opt.param_states)
      if (!state.has_parameter(param))
        OT_THROW(kInvalidArgument, "optimizer state for '", param, "', which is not a parameter");
  }
  std::vector<const std::pair<const std::string, PropertyValue>*> ints, floats, strings;
  for (const auto& kv : state.properties()) {
    if (std::holds_alternative<int64_t>(kv.second))
      ints.push_back(&kv);
    else if (std::holds_alternative<double>(kv.second))
      floats.push_back(&kv);
    else
      strings.push_back(&kv);
  }
  uint64_t total = 0;
  auto count = [&](const std::vector<TensorOut>& v) {
    for (const auto& t : v) total += t.nbytes;
  };
  count(trainable);
  count(frozen);
  for (const auto& [p, ms] : opt_states) count(ms);

  auto lay_out = [&](bool external_data) {
    Layout L;
    L.external = external_data;
    Builder& fb = L.fb;
    fb.b.resize(4, 0);
    fb.b.insert(fb.b.end(), kFileIdentifier, kFileIdentifier + 4);
    std::vector<Builder::Field> root_fields = {{slot::kVersion, 4, uint32_t(options.version)}, {slot::kModuleState, 4}};
    if (with_optimizer) root_fields.push_back({slot::kOptimizerGroups, 4});
    if (!state.properties().empty()) root_fields.push_back({slot::kPropertyBag, 4});
    const std::vector<size_t> root = fb.table(0, root_fields);

    auto tensor_vector = [&](size_t from, const std::vector<TensorOut>& ts) {
      const size_t first = fb.offsets(ts.size());
      fb.link(from, first - 4);
      for (size_t i = 0; i < ts.size(); ++i) write_tensor(L, first + 4 * i, ts[i]);
    };
    {  // module state
      std::vector<Builder::Field> f = {{slot::kRequiresGrad, 4}, {slot::kFrozen, 4}, {slot::kIsNominal, 1, nominal}};
      if (options.version >= 2) f.push_back({slot::kHasExternal, 1, L.external});
      const std::vector<size_t> ms = fb.table(root[1], f);
      tensor_vector(ms[0], trainable);
      tensor_vector(ms[1], frozen);
    }
    size_t next = 2;
    if (with_optimizer) {
      const SavedOptimizerState& opt = state.optimizer_state();
      const size_t groups = fb.offsets(1);
      fb.link(root[next++], groups - 4);
      const std::vector<size_t> g = fb.table(groups, {{slot::kGroupName, 4},
                                                      {slot::kStep, 8, uint64_t(opt.step)},
                                                      {slot::kInitialLr, 4, as_bits(opt.learning_rate.value_or(0.0))},
                                                      {slot::kOptimizerStates, 4}});
      fb.link(g[0], fb.string(kGroupName));
      const size_t first = fb.offsets(opt_states.size());
      fb.link(g[3], first - 4);
      for (size_t i = 0; i < opt_states.size(); ++i) {
        const std::vector<size_t> s = fb.table(first + 4 * i, {{slot::kParamName, 4}, {slot::kMomentums, 4}});
        fb.link(s[0], fb.string(opt_states[i].first));
        tensor_vector(s[1], opt_states[i].second);
      }
    }
    if (!state.properties().empty()) {
      const std::vector<size_t> bag = fb.table(root[next], {{slot::kInts, 4}, {slot::kFloats, 4}, {slot::kStrings, 4}});
      auto props = [&](size_t from, const auto& list, int value_size, auto value) {
        const size_t first = fb.offsets(list.size());
        fb.link(from, first - 4);
        for (size_t i = 0; i < list.size(); ++i) {
          const auto* kv = list[i];
          const std::vector<size_t> p =
              fb.table(first + 4 * i, {{slot::kPropName, 4}, {slot::kPropValue, value_size, value(kv->second)}});
          fb.link(p[0], fb.string(kv->first));
          if (std::holds_alternative<std::string>(kv->second))
            fb.link(p[1], fb.string(std::get<std::string>(kv->second)));
        }
      };
      props(bag[0], ints, 8, [](const PropertyValue& v) { return uint64_t(std::get<int64_t>(v)); });
      props(bag[1], floats, 4, [](const PropertyValue& v) { return as_bits(std::get<double>(v)); });
      props(bag[2], strings, 4, [](const PropertyValue&) { return uint64_t(0); });
    }
    // Raw bytes after the tables, each vector's data 16-byte aligned.
    uint64_t end = fb.b.size();
    std::vector<uint64_t>& starts = L.starts;
    for (const Pending& p : L.inline_data) {
      end += (16 - (end + 4) % 16) % 16;
      starts.push_back(end);
      fb.link(p.field, end);
      end += 4 + p.nbytes;
    }
    L.end = end;
    L.fits = end <= uint64_t(std::numeric_limits<int32_t>::max());
    return L;
  };
  // ---- layout: all inline while the file fits a flatbuffer's 2 GiB (as ORT 1.19 writes), else
  // (version 2) every tensor of 64 bytes or more in "<path>.data"
  const bool auto_external = options.external_threshold == kExternalWhenNeeded;
  const bool external = options.version >= 2 && (auto_external ? false : total > options.external_threshold);
  Layout L = lay_out(external);
  if (!L.fits && auto_external && options.version >= 2) L = lay_out(true);
  if (!L.fits)
    OT_THROW(kInvalidArgument, "ORT format: the checkpoint would be ", L.end,
             " bytes, past the 2 GiB a flatbuffer holds",
             options.version < 2 ? " (version 1 has no external data)" : "");
  Builder& fb = L.fb;
  const std::vector<uint64_t>& starts = L.starts;
  uint64_t ext_end = 0;
  for (const Pending& p : L.external_data) {
    ext_end += (64 - ext_end % 64) % 64;
    fb.set<int64_t>(p.field, int64_t(ext_end));
    ext_end += p.nbytes;
  }

  // ---- the files (ort_checkpoint_trailer.h: the trailer and the commit of both files)
  Trailer trailer;
  auto write_external = [&](int fd, const std::string& what) {
    static const uint8_t zeros[64] = {};
    auto put = [&](const void* p, size_t n) {
      file_io::write_all(fd, p, n, what);
      trailer.data_crc = crc32c(trailer.data_crc, p, n);
      trailer.data_bytes += n;
    };
    trailer = {};
    uint64_t at = 0;
    for (const Pending& p : L.external_data) {
      const uint64_t gap = (64 - at % 64) % 64;
      put(zeros, size_t(gap));
      put(p.data, p.nbytes);
      at += gap + p.nbytes;
    }
  };
  auto write_main = [&](int fd, const std::string& what) {
    uint32_t crc = 0;
    auto put = [&](const void* p, size_t n) {
      file_io::write_all(fd, p, n, what);
      crc = crc32c(crc, p, n);
    };
    put(fb.b.data(), fb.b.size());
    uint64_t at = fb.b.size();
    static const uint8_t zeros[64] = {};
    for (size_t i = 0; i < L.inline_data.size(); ++i) {
      put(zeros, size_t(starts[i] - at));
      const uint32_t n = uint32_t(L.inline_data[i].nbytes);
      put(&n, 4);
      put(L.inline_data[i].data, L.inline_data[i].nbytes);
      at = starts[i] + 4 + n;
    }
    const auto tail = encode_trailer(crc, trailer);  // the external file is written first
    file_io::write_all(fd, tail.data(), tail.size(), what);
  };
  const file_io::FileWriter external_writer = write_external;
  commit(path, write_main, L.external ? &external_writer : nullptr);
}

}  // namespace onnxtrain::ort_checkpoint
