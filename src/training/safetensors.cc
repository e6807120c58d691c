// The safetensors format (safetensors.h): layout validation, checksums, atomic writes.
#include "training/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <cerrno>
#include <set>

#include "core/file_io.h"
#include "core/memory.h"

static_assert(std::endian::native == std::endian::little,
              "safetensors files are little-endian; a big-endian host needs byte swapping here");

namespace onnxtrain::safetensors {

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

bool can_hold(DType dt) {
  return std::any_of(std::begin(kDTypeNames), std::end(kDTypeNames), [&](const DTypeName& d) { return d.dtype == dt; });
}

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
  for (const auto& entry : header.as_object()) {
    // Named references, not a structured binding: the lambda below captures them (clang 14).
    const std::string& name = entry.first;
    const json::Value& info = entry.second;
    if (name == kMetadataKey) continue;
    auto bad = [&, &name = name](const std::string& what) {  // clang 14 captures no structured binding
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

// ================================================================ Contents, write, read

bool Contents::has_metadata_key(std::string_view key) const { return metadata_value(key) != nullptr; }

const std::string* Contents::metadata_value(std::string_view key) const {
  for (const auto& [k, v] : metadata)
    if (k == key) return &v;
  return nullptr;
}

namespace {

using file_io::errno_text;
using file_io::Fd;
using file_io::kIoChunk;
using file_io::read_exact_at;

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

void write(const std::string& path, const Metadata& metadata, const NamedTensors& tensors) {
  std::set<std::string_view> names;
  for (const auto& [name, t] : tensors) {
    if (name == kMetadataKey || !names.insert(name).second)
      OT_THROW(kInvalidArgument, "tensor name '", name, "' is repeated or reserved");
    if (!t.defined()) OT_THROW(kInvalidArgument, "tensor '", name, "' is undefined");
  }
  json::Value meta = json::Value::object();
  auto& mo = meta.as_object();
  for (const auto& [k, v] : metadata) {
    if (k == kKeyDataCrc || k == kKeyHeaderCrc) continue;  // recomputed below
    mo.emplace_back(k, json::Value::string(v));
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

  file_io::write_file_atomically(path, [&](int fd, const std::string& what) {
    file_io::write_all(fd, len_bytes, 8, what);
    file_io::write_all(fd, text.data(), text.size(), what);
    for (const auto& [name, t] : tensors) file_io::write_all(fd, t.data(), t.nbytes(), what);
  });
}

Contents read(const std::string& path) {
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
             " bytes; at most ", file_size - 8, " available): truncated or not a safetensors file");
  if (header_len > kMaxHeaderBytes)
    OT_THROW(kInvalidModel, "header length ", header_len, " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  if (header_len < 2) OT_THROW(kInvalidModel, "header length ", header_len, " is too small for a JSON object");
  std::string text(header_len, '\0');
  read_exact_at(fd.get(), text.data(), text.size(), 8, file_size);
  if (text[0] != '{') OT_THROW(kInvalidModel, "the header does not start with '{': not a safetensors file");
  json::Value header;
  try {
    header = json::parse(text);
  } catch (const Error& e) {
    OT_THROW(kInvalidModel, "header: ", e.what());
  }
  if (!header.is_object()) OT_THROW(kInvalidModel, "the header is not a JSON object");
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file_size - data_start;

  Contents out;
  if (const json::Value* m = header.find(kMetadataKey)) {
    if (!m->is_object()) OT_THROW(kInvalidModel, "\"__metadata__\" is not an object");
    for (const auto& [k, v] : m->as_object()) {
      if (!v.is_string()) OT_THROW(kInvalidModel, "\"__metadata__\" value of \"", k, "\" is not a string");
      out.metadata.emplace_back(k, v.as_string());
    }
  }
  if (const std::string* stored = out.metadata_value(kKeyHeaderCrc)) {
    std::string expect = hex32(header_checksum(header));
    if (*stored != expect && kChecksumsEnforced)
      OT_THROW(kInvalidModel, "header checksum mismatch (stored ", *stored, ", computed ", expect,
               "): the header is corrupt");
  }

  // Validate every entry, then read the data section once, in offset order.
  std::vector<TensorEntry> entries = parse_tensor_entries(header, data_size);
  std::vector<size_t> order(entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return entries[a].begin < entries[b].begin; });
  // Read straight into the tensors' final storage: one allocation for all (huge pages for a
  // large checkpoint), laid out in file order.
  std::vector<TensorSpec> specs;
  specs.reserve(order.size());
  for (size_t i : order) specs.push_back({entries[i].dtype, entries[i].shape});
  std::vector<Tensor> in_file_order = allocate_tensors(specs, Fill::kUninitialized);
  std::vector<Tensor> data(entries.size());
  uint32_t crc = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t i = order[k];
    const TensorEntry& e = entries[i];
    Tensor t = std::move(in_file_order[k]);
    auto* p = static_cast<uint8_t*>(t.data());
    for (uint64_t done = 0; done < e.end - e.begin;) {
      size_t chunk = size_t(std::min<uint64_t>(kIoChunk, e.end - e.begin - done));
      read_exact_at(fd.get(), p + done, chunk, data_start + e.begin + done, file_size);
      crc = crc32c(crc, p + done, chunk);
      done += chunk;
    }
    data[i] = std::move(t);
  }
  if (const std::string* stored = out.metadata_value(kKeyDataCrc)) {
    std::string got = hex32(crc);
    if (*stored != got && kChecksumsEnforced)
      OT_THROW(kInvalidModel, "data checksum mismatch (stored ", *stored, ", computed ", got,
               "): the tensor data is corrupt");
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].dtype != DType::kBool) continue;
    const auto* b = static_cast<const uint8_t*>(data[i].data());
    for (int64_t k = 0; k < data[i].numel(); ++k)
      if (b[k] > 1) OT_THROW(kInvalidModel, "tensor '", entries[i].name, "': BOOL element ", k, " is ", int(b[k]), ", not 0 or 1");
  }
  for (size_t i = 0; i < entries.size(); ++i) out.tensors.emplace_back(entries[i].name, std::move(data[i]));
  return out;
}

}  // namespace onnxtrain::safetensors
