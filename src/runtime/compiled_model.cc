// The pre-compiled model format (compiled_model.h; layout in docs/DESIGN.md, "Formats").
#include "runtime/compiled_model.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <type_traits>

#include "core/crc32c.h"
#include "core/file_io.h"
#include "onnx/model_io.h"

static_assert(std::endian::native == std::endian::little,
              "pre-compiled files are little-endian; a big-endian host needs byte swapping here");

namespace onnxtrain {

namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'O', 'T', 'C', 'M', 'O', 'D', 'E', 'L'};
constexpr size_t kHeaderBytes = 32;  // magic, version, reserved, payload bytes, payload CRC, header CRC
constexpr int kMaxGraphDepth = 64;   // subgraphs nested deeper are refused (a damaged file, not a model)

// ---- writing

class Writer {
 public:
  template <typename T> void pod(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void u32(uint32_t v) { pod(v); }
  void i64(int64_t v) { pod(v); }
  void u64(uint64_t v) { pod(v); }
  void count(size_t n) { u64(uint64_t(n)); }
  void str(const std::string& s) {
    count(s.size());
    out_.append(s);
  }
  void bytes(const void* p, size_t n) {
    count(n);
    out_.append(static_cast<const char*>(p), n);
  }
  void shape(const Shape& s) {
    count(s.size());
    for (int64_t d : s) i64(d);
  }
  void tensor(const Tensor& t, const std::string& what) {
    OT_CHECK(t.defined() && dtype_supported(t.dtype()), "compile: ", what, " has dtype ",
             t.defined() ? dtype_name(t.dtype()) : std::string("undefined"), ", which a pre-compiled file cannot hold");
    pod(int32_t(t.dtype()));
    shape(t.shape());
    bytes(t.data(), t.nbytes());
  }
  void value_info(const ValueInfo& v) {
    pod(int32_t(v.dtype));
    pod(uint8_t(v.kind));
    pod(uint8_t(v.shape.has_value()));
    if (v.shape) shape(*v.shape);
    count(v.dim_params.size());
    for (const auto& p : v.dim_params) str(p);
  }
  void attribute(const Attribute& a, const std::string& what) {
    using K = Attribute::Kind;
    pod(uint8_t(a.kind));
    switch (a.kind) {
      case K::kFloat: pod(a.f); break;
      case K::kInt: i64(a.i); break;
      case K::kString: case K::kTypeProto: str(a.s); break;
      case K::kTensor: tensor(a.t, what); break;
      case K::kGraph: graph(*a.g); break;
      case K::kFloats: count(a.floats.size()); for (float f : a.floats) pod(f); break;
      case K::kInts: count(a.ints.size()); for (int64_t i : a.ints) i64(i); break;
      case K::kStrings: count(a.strings.size()); for (const auto& s : a.strings) str(s); break;
      case K::kTensors: count(a.tensors.size()); for (const auto& t : a.tensors) tensor(t, what); break;
    }
  }
  void graph(const Graph& g) {
    str(g.name);
    count(g.inputs.size());
    for (const auto& v : g.inputs) { str(v.name); value_info(v.info); }
    count(g.outputs.size());
    for (const auto& v : g.outputs) { str(v.name); value_info(v.info); }
    count(g.initializers.size());
    for (const auto& [name, t] : g.initializers) { str(name); tensor(t, "initializer '" + name + "'"); }
    std::map<std::string, const ValueInfo*> infos;  // sorted: the same graph writes the same bytes
    for (const auto& [name, info] : g.value_info) infos[name] = &info;
    count(infos.size());
    for (const auto& [name, info] : infos) { str(name); value_info(*info); }
    count(g.nodes.size());
    for (const auto& n : g.nodes) {
      str(n.name); str(n.op_type); str(n.domain);
      count(n.inputs.size());
      for (const auto& i : n.inputs) str(i);
      count(n.outputs.size());
      for (const auto& o : n.outputs) str(o);
      count(n.attributes.size());
      for (const auto& [key, a] : n.attributes) { str(key); attribute(a, n.context() + "attribute '" + key + "'"); }
    }
  }
  void plan(const PlanRecord& r) {
    str(r.signature);
    u32(r.value_names_crc);
    count(r.dtypes.size());
    for (size_t id = 0; id < r.dtypes.size(); ++id) {
      pod(int32_t(r.dtypes[id]));
      shape(r.shapes[id]);
      pod(r.alias_of[id]);
      pod(r.flags[id]);
      i64(r.offsets[id]);
    }
    u64(r.arena_bytes);
    const MemoryReport& m = r.report;
    for (size_t v : {m.planned_arena_bytes, m.naive_bytes, m.inplace_reuses, m.views, m.peak_live_bytes,
                     m.stashed_bytes, m.stashed_at_peak_bytes})
      u64(uint64_t(v));
  }
  std::string& out() { return out_; }

 private:
  std::string out_;
};

// ---- reading: every read is bounds-checked; a short payload is an error naming the file

class Reader {
 public:
  Reader(const char* p, size_t n, std::string where) : p_(p), end_(p + n), where_(std::move(where)) {}
  template <typename T> T pod() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_, sizeof v);
    p_ += sizeof v;
    return v;
  }
  uint32_t u32() { return pod<uint32_t>(); }
  int64_t i64() { return pod<int64_t>(); }
  uint64_t u64() { return pod<uint64_t>(); }
  // A count of items of at least min_item_bytes each: never more than the bytes left can hold.
  size_t count(size_t min_item_bytes = 1) {
    uint64_t n = u64();
    if (n > uint64_t(end_ - p_) / std::max<size_t>(min_item_bytes, 1)) fail("a count of " + std::to_string(n) + " items");
    return size_t(n);
  }
  std::string str() {
    size_t n = count();
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  Shape shape() {
    Shape s(count(8));
    for (auto& d : s) d = i64();
    return s;
  }
  DType dtype(bool allow_undefined) {
    auto d = DType(pod<int32_t>());
    if (!(dtype_supported(d) || (allow_undefined && d == DType::kUndefined))) fail("dtype " + std::to_string(int(d)));
    return d;
  }
  Tensor tensor() {
    DType d = dtype(false);
    Shape s = shape();
    for (int64_t x : s) if (x < 0) fail("a negative tensor dim");
    size_t n = count();
    uint64_t want = dtype_size(d);
    for (int64_t x : s) want = x != 0 && want > n / uint64_t(x) ? uint64_t(n) + 1 : want * uint64_t(x);
    if (want != n) fail("a tensor of " + shape_str(s) + " with " + std::to_string(n) + " bytes");
    Tensor t = Tensor::empty(d, s);
    if (n) std::memcpy(t.data(), p_, n);
    p_ += n;
    return t;
  }
  ValueInfo value_info() {
    ValueInfo v;
    v.dtype = DType(pod<int32_t>());
    uint8_t kind = pod<uint8_t>();
    if (kind > uint8_t(ValueKind::kOptionalSequence)) fail("value kind " + std::to_string(kind));
    v.kind = ValueKind(kind);
    if (pod<uint8_t>()) v.shape = shape();
    v.dim_params.resize(count(8));
    for (auto& p : v.dim_params) p = str();
    return v;
  }
  Attribute attribute(int depth) {
    using K = Attribute::Kind;
    Attribute a;
    uint8_t kind = pod<uint8_t>();
    if (kind > uint8_t(K::kTypeProto)) fail("attribute kind " + std::to_string(kind));
    a.kind = K(kind);
    switch (a.kind) {
      case K::kFloat: a.f = pod<float>(); break;
      case K::kInt: a.i = i64(); break;
      case K::kString: case K::kTypeProto: a.s = str(); break;
      case K::kTensor: a.t = tensor(); break;
      case K::kGraph: a.g = std::make_shared<Graph>(graph(depth + 1)); break;
      case K::kFloats: a.floats.resize(count(4)); for (auto& f : a.floats) f = pod<float>(); break;
      case K::kInts: a.ints.resize(count(8)); for (auto& i : a.ints) i = i64(); break;
      case K::kStrings: a.strings.resize(count(8)); for (auto& s : a.strings) s = str(); break;
      case K::kTensors: a.tensors.resize(count(8)); for (auto& t : a.tensors) t = tensor(); break;
    }
    return a;
  }
  Graph graph(int depth) {
    if (depth > kMaxGraphDepth) fail("subgraphs nested over " + std::to_string(kMaxGraphDepth) + " deep");
    Graph g;
    g.name = str();
    for (auto* list : {&g.inputs, &g.outputs}) {
      list->resize(count(8));
      for (auto& v : *list) { v.name = str(); v.info = value_info(); }
    }
    for (size_t i = 0, n = count(8); i < n; ++i) {
      std::string name = str();
      g.initializers[name] = tensor();
    }
    for (size_t i = 0, n = count(8); i < n; ++i) {
      std::string name = str();
      g.value_info[name] = value_info();
    }
    g.nodes.resize(count(8));
    for (auto& node : g.nodes) {
      node.name = str(); node.op_type = str(); node.domain = str();
      node.inputs.resize(count(8));
      for (auto& i : node.inputs) i = str();
      node.outputs.resize(count(8));
      for (auto& o : node.outputs) o = str();
      for (size_t i = 0, n = count(8); i < n; ++i) {
        std::string key = str();
        node.attributes[key] = attribute(depth);
      }
    }
    return g;
  }
  PlanRecord plan() {
    PlanRecord r;
    r.signature = str();
    r.value_names_crc = u32();
    const size_t n = count(8);
    r.dtypes.resize(n); r.shapes.resize(n); r.alias_of.resize(n); r.flags.resize(n); r.offsets.resize(n);
    for (size_t id = 0; id < n; ++id) {
      r.dtypes[id] = dtype(true);
      r.shapes[id] = shape();
      r.alias_of[id] = pod<int32_t>();
      r.flags[id] = pod<uint8_t>();
      r.offsets[id] = i64();
    }
    r.arena_bytes = u64();
    MemoryReport& m = r.report;
    for (size_t* v : {&m.planned_arena_bytes, &m.naive_bytes, &m.inplace_reuses, &m.views, &m.peak_live_bytes,
                      &m.stashed_bytes, &m.stashed_at_peak_bytes})
      *v = size_t(u64());
    return r;
  }
  bool at_end() const { return p_ == end_; }
  [[noreturn]] void fail(const std::string& what) const {
    OT_THROW(kInvalidModel, where_, ": damaged payload (", what, " at byte ", kHeaderBytes + size_t(p_ - begin_), ")");
  }
  void set_begin(const char* b) { begin_ = b; }

 private:
  void need(size_t n) const {
    if (size_t(end_ - p_) < n) fail("truncated: " + std::to_string(n) + " more bytes wanted");
  }
  const char* p_;
  const char* end_;
  const char* begin_ = p_;
  std::string where_;
};

// The whole file, or nullopt when it does not exist.
std::optional<std::string> read_file(const std::string& path) {
  file_io::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return std::nullopt;
    OT_THROW(kRuntime, "cannot open '", path, "': ", file_io::errno_text(errno));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) OT_THROW(kRuntime, "cannot stat '", path, "': ", file_io::errno_text(errno));
  std::string bytes(size_t(st.st_size), '\0');
  file_io::read_exact_at(fd.get(), bytes.data(), bytes.size(), 0, uint64_t(st.st_size));
  return bytes;
}

struct SourceHash {
  uint64_t size = 0;
  uint32_t crc = 0;
};
SourceHash hash_of(const std::string& bytes) { return {bytes.size(), crc32c(0, bytes.data(), bytes.size())}; }

}  // namespace

std::string compiled_path_for(const std::string& onnx_path) {
  const std::string ext = ".onnx";
  if (onnx_path.size() > ext.size() && onnx_path.compare(onnx_path.size() - ext.size(), ext.size(), ext) == 0)
    return onnx_path.substr(0, onnx_path.size() - ext.size()) + ".otc";
  return onnx_path + ".otc";
}

void write_compiled_model(const std::string& path, const CompiledModel& compiled, const std::string& source_path) {
  std::optional<std::string> source = read_file(source_path);
  OT_CHECK(source, "compile: the source model '", source_path, "' does not exist");
  const SourceHash h = hash_of(*source);
  Writer w;
  w.str(ONNXTRAIN_VERSION_STRING);
  w.str(fs::path(source_path).filename().string());
  w.u64(h.size);
  w.u32(h.crc);
  const Model& m = compiled.model;
  w.i64(m.ir_version);
  w.str(m.producer_name);
  w.str(m.producer_version);
  w.count(m.opsets.size());
  for (const auto& [domain, version] : m.opsets) { w.str(domain); w.i64(version); }
  w.count(m.metadata.size());
  for (const auto& [key, value] : m.metadata) { w.str(key); w.str(value); }
  w.graph(m.graph);
  w.count(compiled.kernel_versions.size());
  for (int64_t v : compiled.kernel_versions) w.i64(v);
  w.count(compiled.plans.size());
  for (const auto& p : compiled.plans) w.plan(p);

  const std::string& payload = w.out();
  char header[kHeaderBytes] = {};
  std::memcpy(header, kMagic, 8);
  const uint32_t version = kCompiledFormatVersion, reserved = 0;
  const uint64_t size = payload.size();
  const uint32_t payload_crc = crc32c(0, payload.data(), payload.size());
  std::memcpy(header + 8, &version, 4);
  std::memcpy(header + 12, &reserved, 4);
  std::memcpy(header + 16, &size, 8);
  std::memcpy(header + 24, &payload_crc, 4);
  const uint32_t header_crc = crc32c(0, header, 28);
  std::memcpy(header + 28, &header_crc, 4);
  file_io::write_file_atomically(path, [&](int fd, const std::string& what) {
    file_io::write_all(fd, header, kHeaderBytes, what);
    file_io::write_all(fd, payload.data(), payload.size(), what);
  });
}

CompiledModel read_compiled_model(const std::string& path, const std::string& source_path) {
  const std::string where = "pre-compiled model '" + path + "'";
  std::optional<std::string> file = read_file(path);
  OT_CHECK(file, where, " does not exist");
  const std::string& bytes = *file;
  OT_CHECK(bytes.size() >= kHeaderBytes && std::memcmp(bytes.data(), kMagic, 8) == 0, where,
           " is not a pre-compiled model (no OTCMODEL header)");
  uint32_t version, payload_crc, header_crc;
  uint64_t size;
  std::memcpy(&version, bytes.data() + 8, 4);
  std::memcpy(&size, bytes.data() + 16, 8);
  std::memcpy(&payload_crc, bytes.data() + 24, 4);
  std::memcpy(&header_crc, bytes.data() + 28, 4);
  OT_CHECK(crc32c(0, bytes.data(), 28) == header_crc || !kChecksumsEnforced, where, ": header checksum mismatch (damaged file)");
  OT_CHECK(version == kCompiledFormatVersion, where, " has format version ", version, "; this library reads version ",
           kCompiledFormatVersion, " (compile the artifacts again)");
  OT_CHECK(size == bytes.size() - kHeaderBytes, where, " is truncated or has trailing bytes: the header says ", size,
           " payload bytes, the file has ", bytes.size() - kHeaderBytes);
  const char* payload = bytes.data() + kHeaderBytes;
  OT_CHECK(crc32c(0, payload, size) == payload_crc || !kChecksumsEnforced, where, ": payload checksum mismatch (damaged file)");

  Reader r(payload, size_t(size), where);
  r.set_begin(payload);
  const std::string library = r.str();
  OT_CHECK(library == ONNXTRAIN_VERSION_STRING, where, " was written by onnxtrain ", library, "; this is onnxtrain ",
           ONNXTRAIN_VERSION_STRING, " (compile the artifacts again)");
  const std::string source_name = r.str();
  SourceHash recorded;
  recorded.size = r.u64();
  recorded.crc = r.u32();
  if (std::optional<std::string> source = source_path.empty() ? std::nullopt : read_file(source_path)) {
    const SourceHash now = hash_of(*source);
    OT_CHECK(now.size == recorded.size && now.crc == recorded.crc, where, " is stale: '", source_path,
             "' changed since it was compiled (compiled from ", source_name, " of ", recorded.size, " bytes, CRC-32C ",
             recorded.crc, "; now ", now.size, " bytes, CRC-32C ", now.crc, ")");
  }
  CompiledModel c;
  Model& m = c.model;
  m.ir_version = r.i64();
  m.producer_name = r.str();
  m.producer_version = r.str();
  for (size_t i = 0, n = r.count(16); i < n; ++i) {
    std::string domain = r.str();
    m.opsets[domain] = r.i64();
  }
  for (size_t i = 0, n = r.count(16); i < n; ++i) {
    std::string key = r.str();
    m.metadata[key] = r.str();
  }
  m.graph = r.graph(0);
  m.description = "'" + source_path + "' (pre-compiled: '" + path + "')";
  c.kernel_versions.resize(r.count(8));
  for (auto& v : c.kernel_versions) v = r.i64();
  c.plans.resize(r.count(8));
  for (auto& p : c.plans) p = r.plan();
  if (!r.at_end()) r.fail("trailing bytes after the plans");
  c.compiled_from = path;
  return c;
}

CompiledModel load_model_for_runtime(const std::string& onnx_path) {
  const std::string ext = ".otc";
  if (onnx_path.size() > ext.size() && onnx_path.compare(onnx_path.size() - ext.size(), ext.size(), ext) == 0)
    return read_compiled_model(onnx_path, "");  // named directly: no ONNX file to compare or fall back to
  const std::string compiled = compiled_path_for(onnx_path);
  std::error_code ec;
  if (fs::exists(compiled, ec)) {
    try {
      return read_compiled_model(compiled, onnx_path);
    } catch (const Error& e) {
      if (!fs::exists(onnx_path, ec)) throw;  // nothing to fall back to
      std::fprintf(stderr, "onnxtrain: note: ignoring %s; loading the ONNX file instead\n", e.what());
    }
  }
  CompiledModel c;
  c.model = load_model(onnx_path);
  return c;
}

}  // namespace onnxtrain
