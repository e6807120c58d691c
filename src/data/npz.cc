// .npy and .npz reading and writing. The zip layout (APPNOTE.TXT 6.3): each member is a local
// header, then its (stored or deflated) bytes; a central directory lists every member with its
// sizes, CRC-32 and local header offset; the end-of-central-directory record (EOCD), found by
// scanning back from the end, locates the central directory. ZIP64 replaces 32-bit fields that
// hold 0xFFFFFFFF (0xFFFF for counts) by 64-bit ones in an "extra field" of id 0x0001 and in a
// ZIP64 EOCD record found through a locator just before the EOCD.
#include "onnxtrain/npz.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
// The minimal build (cmake/minimal.cmake) has no zlib: stored members only, and its own CRC-32.
#ifndef ONNXTRAIN_NPZ_WITHOUT_ZLIB
#include <zlib.h>
#endif

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "core/crc32c.h"
#include "core/file_io.h"

static_assert(std::endian::native == std::endian::little,
              "npy data is read as little-endian; a big-endian host needs byte swapping here");

namespace onnxtrain {

namespace {

using file_io::Fd;
using file_io::read_exact_at;

constexpr uint32_t kLocalHeaderSig = 0x04034b50;
constexpr uint32_t kCentralHeaderSig = 0x02014b50;
constexpr uint32_t kEndSig = 0x06054b50;
constexpr uint32_t kZip64EndSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr size_t kLocalHeaderBytes = 30, kCentralHeaderBytes = 46, kEndBytes = 22;
constexpr size_t kZip64EndBytes = 56, kZip64LocatorBytes = 20;
constexpr uint16_t kStored = 0, kDeflated = 8;
constexpr uint64_t kMaxNpyHeaderBytes = uint64_t(1) << 20;
// Deflate expands at most about 1032:1; a larger claimed ratio means a corrupt size field.
constexpr uint64_t kMaxDeflateRatio = 1032;

uint16_t get16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
uint32_t get32(const uint8_t* p) { return uint32_t(get16(p)) | (uint32_t(get16(p + 2)) << 16); }
uint64_t get64(const uint8_t* p) { return uint64_t(get32(p)) | (uint64_t(get32(p + 4)) << 32); }

void put16(std::string& s, uint16_t v) {
  s += char(v & 0xFF);
  s += char(v >> 8);
}
void put32(std::string& s, uint32_t v) {
  put16(s, uint16_t(v));
  put16(s, uint16_t(v >> 16));
}
void put64(std::string& s, uint64_t v) {
  put32(s, uint32_t(v));
  put32(s, uint32_t(v >> 32));
}

#ifdef ONNXTRAIN_NPZ_WITHOUT_ZLIB
// CRC-32 (the zip polynomial 0xEDB88320, reflected), a byte at a time from a 256-entry table.
uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}
#else
uint32_t crc32_update(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    uInt chunk = uInt(std::min<size_t>(n, size_t(1) << 30));
    crc = uint32_t(::crc32(crc, p, chunk));
    p += chunk;
    n -= chunk;
  }
  return crc;
}
#endif

// Re-throws an error with a prefix naming where it happened.
template <typename F>
auto with_context(const std::string& ctx, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    throw Error(e.code(), ctx + e.what());
  }
}

// ================================================================ .npy dtypes and header

struct NpyType {
  const char* code;
  DType dtype;
};
constexpr NpyType kNpyTypes[] = {
    {"b1", DType::kBool},    {"i1", DType::kInt8},    {"u1", DType::kUint8},   {"i2", DType::kInt16},
    {"u2", DType::kUint16},  {"i4", DType::kInt32},   {"u4", DType::kUint32},  {"i8", DType::kInt64},
    {"u8", DType::kUint64},  {"f2", DType::kFloat16}, {"f4", DType::kFloat32}, {"f8", DType::kFloat64},
};

DType dtype_from_descr(const std::string& descr) {
  if (descr.size() < 2 || !std::strchr("<>|=", descr[0]))
    OT_THROW(kInvalidModel, "dtype descriptor '", descr, "' does not start with a byte order (<, >, | or =)");
  const std::string code = descr.substr(1);
  for (const auto& t : kNpyTypes) {
    if (code != t.code) continue;
    if (descr[0] == '>' && dtype_size(t.dtype) > 1)
      OT_THROW(kNotImplemented, "dtype '", descr, "' is big-endian; save it as little-endian (arr.astype('<",
               code, "'))");
    return t.dtype;
  }
  const char* kind = "this dtype";
  switch (code[0]) {
    case 'O': kind = "object arrays (pickled Python objects)"; break;
    case 'U': case 'S': case 'a': kind = "string arrays"; break;
    case 'c': kind = "complex arrays"; break;
    case 'M': case 'm': kind = "datetime arrays"; break;
    case 'V': kind = "void arrays"; break;
  }
  OT_THROW(kNotImplemented, "dtype '", descr, "': ", kind,
           " are not supported (supported: bool, int8-64, uint8-64, float16/32/64)");
}

std::string descr_of(DType dtype) {
  for (const auto& t : kNpyTypes)
    if (t.dtype == dtype) return (dtype_size(dtype) == 1 ? "|" : "<") + std::string(t.code);
  OT_THROW(kInvalidArgument, "dtype ", dtype_name(dtype), " has no numpy equivalent");
}

// The header is a Python dict literal: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : s_(text) {}

  void parse(std::string& descr, bool& fortran_order, Shape& shape) {
    std::set<std::string> seen;
    skip_ws();
    expect('{');
    while (true) {
      skip_ws();
      if (peek() == '}') break;
      std::string key = string_literal();
      skip_ws();
      expect(':');
      skip_ws();
      if (!seen.insert(key).second) fail("key '" + key + "' appears twice");
      if (key == "descr") {
        if (peek() == '[') OT_THROW(kNotImplemented, "structured dtypes (a list 'descr') are not supported");
        descr = string_literal();
      } else if (key == "fortran_order") {
        fortran_order = boolean();
      } else if (key == "shape") {
        shape = tuple();
      } else {
        fail("unexpected key '" + key + "' (expected descr, fortran_order, shape)");
      }
      skip_ws();
      if (peek() == ',') ++pos_;
      else if (peek() != '}') fail("expected ',' or '}'");
    }
    ++pos_;
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected text after the closing '}'");
    for (const char* k : {"descr", "fortran_order", "shape"})
      if (!seen.count(k)) fail(std::string("missing key '") + k + "'");
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    OT_THROW(kInvalidModel, "malformed .npy header at character ", pos_, ": ", what);
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t')) ++pos_;
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string string_literal() {
    char quote = peek();
    if (quote != '\'' && quote != '"') fail("expected a quoted string");
    size_t end = s_.find(quote, pos_ + 1);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string out(s_.substr(pos_ + 1, end - pos_ - 1));
    if (out.find('\\') != std::string::npos) fail("escapes in strings are not supported");
    pos_ = end + 1;
    return out;
  }
  bool boolean() {
    for (const auto& [word, value] : {std::pair{"True", true}, std::pair{"False", false}})
      if (s_.substr(pos_, std::strlen(word)) == word) {
        pos_ += std::strlen(word);
        return value;
      }
    fail("expected True or False");
  }
  Shape tuple() {
    expect('(');
    Shape shape;
    while (true) {
      skip_ws();
      if (peek() == ')') break;
      if (!std::isdigit(static_cast<unsigned char>(peek()))) fail("expected a dimension (a non-negative integer)");
      int64_t d = 0;
      while (std::isdigit(static_cast<unsigned char>(peek()))) {
        if (__builtin_mul_overflow(d, int64_t(10), &d) || __builtin_add_overflow(d, int64_t(peek() - '0'), &d))
          fail("dimension does not fit in 64 bits");
        ++pos_;
      }
      if (peek() == 'L') ++pos_;  // Python 2 long literals
      shape.push_back(d);
      skip_ws();
      if (peek() == ',') ++pos_;
      else if (peek() != ')') fail("expected ',' or ')' in the shape");
    }
    ++pos_;
    return shape;
  }

  std::string_view s_;
  size_t pos_ = 0;
};

// ================================================================ member bytes

// The uncompressed bytes of one archive member (or of a whole .npy file), read in order. Reads
// past the recorded size fail; finish() checks the member ends exactly there and its CRC-32.
class MemberReader {
 public:
  MemberReader(int fd, uint64_t file_size, uint64_t offset, uint64_t stored_size, uint64_t size, uint16_t method,
               std::optional<uint32_t> crc)
      : fd_(fd), file_size_(file_size), offset_(offset), stored_size_(stored_size), size_(size), method_(method),
        crc_(crc) {
    if (method_ == kDeflated) {
#ifdef ONNXTRAIN_NPZ_WITHOUT_ZLIB
      OT_THROW(kNotImplemented, "is deflated (np.savez_compressed), and this minimal build has no zlib: save the "
               "arrays with np.savez");
#else
      std::memset(&z_, 0, sizeof z_);
      if (inflateInit2(&z_, -MAX_WBITS) != Z_OK) OT_THROW(kRuntime, "zlib: inflateInit2 failed");
      z_open_ = true;
      in_.resize(size_t(std::min<uint64_t>(stored_size_, 1 << 18)) + 1);
#endif
    }
  }
  ~MemberReader() {
#ifndef ONNXTRAIN_NPZ_WITHOUT_ZLIB
    if (z_open_) inflateEnd(&z_);
#endif
  }
  MemberReader(const MemberReader&) = delete;
  MemberReader& operator=(const MemberReader&) = delete;

  uint64_t size() const { return size_; }
  uint64_t position() const { return produced_; }

  void read(void* dst, uint64_t n) {
    if (n == 0) return;
    if (n > size_ - produced_)
      OT_THROW(kInvalidModel, "data ends after ", size_, " bytes, ", produced_ + n, " needed: truncated");
    if (method_ == kStored) read_exact_at(fd_, dst, size_t(n), offset_ + produced_, file_size_);
    else inflate_into(static_cast<uint8_t*>(dst), n);
    crc_now_ = crc32_update(crc_now_, dst, size_t(n));
    produced_ += n;
  }

  void finish() {
    if (produced_ != size_)
      OT_THROW(kInvalidModel, "holds ", size_, " bytes, but its header and data take ", produced_,
               " (trailing bytes)");
    if (method_ == kDeflated && !ended_) {
      uint8_t extra;
      inflate_into(&extra, 0);  // drives the stream to its end
    }
    if (method_ == kDeflated && consumed_ != stored_size_)
      OT_THROW(kInvalidModel, "the deflate stream ends after ", consumed_, " of its ", stored_size_, " bytes");
    if (crc_ && *crc_ != crc_now_ && kChecksumsEnforced)
      OT_THROW(kInvalidModel, "CRC-32 mismatch (recorded ", *crc_, ", computed ", crc_now_, "): the data is corrupt");
  }

 private:
  // Inflates exactly n bytes into dst; n == 0 checks that the stream ends with no more output.
  void inflate_into(uint8_t* dst, uint64_t n) {
#ifdef ONNXTRAIN_NPZ_WITHOUT_ZLIB
    (void)dst, (void)n;  // unreachable: the constructor refuses deflated members
#else
    uint8_t scratch;
    const bool check_end = n == 0;
    uint64_t left = check_end ? 1 : n;
    uint8_t* out = check_end ? &scratch : dst;
    while (left > 0) {
      if (ended_) {
        if (check_end) return;
        OT_THROW(kInvalidModel, "the deflate stream ends after ", produced_ + (n - left), " bytes, ", size_,
                 " recorded: truncated or corrupt");
      }
      if (z_.avail_in == 0 && consumed_ < stored_size_) {
        size_t chunk = size_t(std::min<uint64_t>(in_.size(), stored_size_ - consumed_));
        read_exact_at(fd_, in_.data(), chunk, offset_ + consumed_, file_size_);
        z_.next_in = in_.data();
        z_.avail_in = uInt(chunk);
        consumed_ += chunk;
      }
      uInt step = uInt(std::min<uint64_t>(left, UINT_MAX));
      z_.next_out = out;
      z_.avail_out = step;
      int rc = ::inflate(&z_, Z_NO_FLUSH);
      uint64_t got = step - z_.avail_out;
      // Bytes still unread in the input buffer do not count as consumed.
      if (rc == Z_STREAM_END) {
        ended_ = true;
        consumed_ -= z_.avail_in;
        z_.avail_in = 0;
      } else if (rc == Z_BUF_ERROR || (rc == Z_OK && got == 0 && z_.avail_in == 0)) {
        if (consumed_ >= stored_size_ && z_.avail_in == 0)
          OT_THROW(kInvalidModel, "the deflate stream is cut short after ", consumed_, " compressed bytes: truncated");
      } else if (rc != Z_OK) {
        OT_THROW(kInvalidModel, "corrupt deflate data (zlib: ", z_.msg ? z_.msg : "error ", z_.msg ? "" : std::to_string(rc),
                 ")");
      }
      if (check_end && got > 0)
        OT_THROW(kInvalidModel, "the deflate stream holds more than the recorded ", size_, " bytes");
      out += got;
      left -= check_end ? 0 : got;
      if (check_end && ended_) return;
    }
#endif
  }

  int fd_;
  uint64_t file_size_, offset_, stored_size_, size_;
  uint16_t method_;
  std::optional<uint32_t> crc_;
  uint32_t crc_now_ = 0;
  uint64_t produced_ = 0, consumed_ = 0;
#ifndef ONNXTRAIN_NPZ_WITHOUT_ZLIB
  z_stream z_{};
  bool z_open_ = false;
#endif
  bool ended_ = false;
  std::vector<uint8_t> in_;
};

struct NpyHeader {
  DType dtype = DType::kUndefined;
  Shape shape;
  uint64_t data_bytes = 0;
};

// Reads the magic, version and header dict, and checks the data size against the member's size.
NpyHeader read_npy_header(MemberReader& r) {
  uint8_t pre[10];
  if (r.size() < 10) OT_THROW(kInvalidModel, "is ", r.size(), " bytes, too short for an .npy header");
  r.read(pre, 8);
  if (std::memcmp(pre, "\x93NUMPY", 6) != 0) OT_THROW(kInvalidModel, "does not start with the .npy magic");
  const int major = pre[6], minor = pre[7];
  if (major < 1 || major > 3 || minor != 0)
    OT_THROW(kNotImplemented, ".npy format version ", major, ".", minor, " is not supported (1.0, 2.0, 3.0 are)");
  uint64_t header_len;
  if (major == 1) {
    r.read(pre, 2);
    header_len = get16(pre);
  } else {
    r.read(pre, 4);
    header_len = get32(pre);
  }
  if (header_len > kMaxNpyHeaderBytes)
    OT_THROW(kInvalidModel, ".npy header length ", header_len, " exceeds the limit of ", kMaxNpyHeaderBytes);
  if (header_len > r.size() - r.position())
    OT_THROW(kInvalidModel, ".npy header length ", header_len, " runs past the end of the data: truncated");
  std::string text(header_len, '\0');
  r.read(text.data(), header_len);
  std::string descr;
  bool fortran = false;
  NpyHeader h;
  HeaderParser(text).parse(descr, fortran, h.shape);
  h.dtype = dtype_from_descr(descr);
  if (fortran && h.shape.size() > 1)
    OT_THROW(kNotImplemented, "the array is in Fortran order; save np.ascontiguousarray(a) instead");
  h.data_bytes = dtype_size(h.dtype);
  for (int64_t d : h.shape)
    if (__builtin_mul_overflow(h.data_bytes, uint64_t(d), &h.data_bytes))
      OT_THROW(kInvalidModel, "shape ", shape_str(h.shape), " overflows 64-bit sizes");
  const uint64_t available = r.size() - r.position();
  if (h.data_bytes != available)
    OT_THROW(kInvalidModel, "dtype ", descr, " and shape ", shape_str(h.shape), " need ", h.data_bytes,
             " bytes of data, but ", available, " follow the header",
             h.data_bytes > available ? " (truncated)" : " (trailing bytes)");
  return h;
}

Tensor read_npy(MemberReader& r) {
  NpyHeader h = read_npy_header(r);
  Tensor t = Tensor::empty(h.dtype, h.shape);
  r.read(t.data(), h.data_bytes);
  if (h.dtype == DType::kBool) {
    const auto* b = static_cast<const uint8_t*>(t.data());
    for (uint64_t i = 0; i < h.data_bytes; ++i)
      if (b[i] > 1) OT_THROW(kInvalidModel, "bool element ", i, " holds byte ", int(b[i]), ", not 0 or 1");
  }
  r.finish();
  return t;
}

// ================================================================ zip archive

struct Member {
  std::string name;  // without ".npy"
  uint16_t method = kStored;
  uint32_t crc = 0;
  uint64_t stored_size = 0, size = 0, local_offset = 0, data_offset = 0;
};

class Archive {
 public:
  explicit Archive(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_.get() < 0) OT_THROW(kRuntime, "cannot open: ", file_io::errno_text(errno));
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0) OT_THROW(kRuntime, "cannot stat: ", file_io::errno_text(errno));
    if (!S_ISREG(st.st_mode)) OT_THROW(kInvalidModel, "not a regular file");
    size_ = uint64_t(st.st_size);
    read_directory();
  }

  const std::vector<Member>& members() const { return members_; }

  MemberReader open(const Member& m) const {
    return MemberReader(fd_.get(), size_, m.data_offset, m.stored_size, m.size, m.method, m.crc);
  }

 private:
  std::vector<uint8_t> read_at(uint64_t offset, uint64_t n) const {
    if (offset > size_ || n > size_ - offset)
      OT_THROW(kInvalidModel, "bytes [", offset, ", ", offset + n, ") lie past the end of the file (", size_,
               " bytes): truncated");
    std::vector<uint8_t> b(n);
    read_exact_at(fd_.get(), b.data(), n, offset, size_);
    return b;
  }

  void read_directory() {
    // ---- end of central directory: the last EOCD signature whose comment reaches the file's end
    const uint64_t tail_len = std::min<uint64_t>(size_, kEndBytes + 0xFFFF);
    std::vector<uint8_t> tail = read_at(size_ - tail_len, tail_len);
    std::optional<uint64_t> eocd;
    for (uint64_t i = tail_len >= kEndBytes ? tail_len - kEndBytes + 1 : 0; i-- > 0;)
      if (get32(&tail[i]) == kEndSig && i + kEndBytes + get16(&tail[i + 20]) == tail_len) {
        eocd = size_ - tail_len + i;
        break;
      }
    if (!eocd) {
      bool zip = size_ >= 4 && get32(read_at(0, 4).data()) == kLocalHeaderSig;
      bool npy = size_ >= 6 && std::memcmp(read_at(0, 6).data(), "\x93NUMPY", 6) == 0;
      OT_THROW(kInvalidModel, zip ? "no end-of-central-directory record: the zip archive is truncated or corrupt"
                              : npy ? "this is an .npy file, not an .npz archive"
                                    : "not a zip archive (.npz files are zip archives of .npy arrays)");
    }
    const uint8_t* e = &tail[*eocd - (size_ - tail_len)];
    uint64_t count = get16(e + 10), cd_size = get32(e + 12), cd_offset = get32(e + 16);
    const uint16_t disk = get16(e + 4), cd_disk = get16(e + 6);  // 0xFFFF: see the ZIP64 record
    if ((disk != 0 && disk != 0xFFFF) || (cd_disk != 0 && cd_disk != 0xFFFF) || get16(e + 8) != get16(e + 10))
      OT_THROW(kNotImplemented, "multi-disk (split) zip archives are not supported");
    uint64_t cd_limit = *eocd;  // the central directory ends before the (ZIP64) end records

    // ---- ZIP64 end records, through the locator just before the EOCD
    if (*eocd >= kZip64LocatorBytes) {
      std::vector<uint8_t> loc = read_at(*eocd - kZip64LocatorBytes, kZip64LocatorBytes);
      if (get32(loc.data()) == kZip64LocatorSig) {
        if (get32(&loc[4]) != 0 || get32(&loc[16]) > 1)
          OT_THROW(kNotImplemented, "multi-disk (split) zip archives are not supported");
        const uint64_t z64 = get64(&loc[8]);
        if (z64 > *eocd - kZip64LocatorBytes || *eocd - kZip64LocatorBytes - z64 < kZip64EndBytes)
          OT_THROW(kInvalidModel, "the ZIP64 end record offset ", z64, " is out of range");
        std::vector<uint8_t> r = read_at(z64, kZip64EndBytes);
        if (get32(r.data()) != kZip64EndSig)
          OT_THROW(kInvalidModel, "no ZIP64 end-of-central-directory record at offset ", z64);
        if (get32(&r[16]) != 0 || get32(&r[20]) != 0 || get64(&r[24]) != get64(&r[32]))
          OT_THROW(kNotImplemented, "multi-disk (split) zip archives are not supported");
        count = get64(&r[32]);
        cd_size = get64(&r[40]);
        cd_offset = get64(&r[48]);
        cd_limit = z64;
      }
    }
    if (cd_offset > cd_limit || cd_size > cd_limit - cd_offset)
      OT_THROW(kInvalidModel, "the central directory [", cd_offset, ", +", cd_size,
               ") runs past the end records: truncated or corrupt");
    if (count > cd_size / kCentralHeaderBytes)
      OT_THROW(kInvalidModel, "the central directory of ", cd_size, " bytes cannot hold ", count, " entries");

    // ---- central directory entries
    std::vector<uint8_t> cd = read_at(cd_offset, cd_size);
    std::set<std::string> names;
    size_t pos = 0;
    for (uint64_t i = 0; i < count; ++i) {
      if (cd_size - pos < kCentralHeaderBytes || get32(&cd[pos]) != kCentralHeaderSig)
        OT_THROW(kInvalidModel, "central directory entry ", i, " at offset ", cd_offset + pos, " is malformed");
      const uint8_t* c = &cd[pos];
      const size_t name_len = get16(c + 28), extra_len = get16(c + 30), comment_len = get16(c + 32);
      if (cd_size - pos - kCentralHeaderBytes < name_len + extra_len + comment_len)
        OT_THROW(kInvalidModel, "central directory entry ", i, " runs past the directory");
      std::string file(reinterpret_cast<const char*>(c + kCentralHeaderBytes), name_len);
      Member m;
      with_context("member '" + file + "': ", [&] {
        const uint16_t flags = get16(c + 8);
        m.method = get16(c + 10);
        m.crc = get32(c + 16);
        m.stored_size = get32(c + 20);
        m.size = get32(c + 24);
        m.local_offset = get32(c + 42);
        uint32_t disk = get16(c + 34);
        read_zip64_extra(c + kCentralHeaderBytes + name_len, extra_len, m, &disk);
        if (disk != 0) OT_THROW(kNotImplemented, "multi-disk (split) zip archives are not supported");
        if (flags & 1) OT_THROW(kNotImplemented, "encrypted members are not supported");
        if (m.method != kStored && m.method != kDeflated)
          OT_THROW(kNotImplemented, "compression method ", m.method, " is not supported (stored and deflate are)");
        if (file.size() < 5 || file.compare(file.size() - 4, 4, ".npy") != 0)
          OT_THROW(kInvalidModel, "is not an .npy array (npz members are named '<array>.npy')");
        m.name = file.substr(0, file.size() - 4);
        if (!names.insert(m.name).second) OT_THROW(kInvalidModel, "appears twice");
        if (m.method == kStored && m.stored_size != m.size)
          OT_THROW(kInvalidModel, "is stored uncompressed but records ", m.stored_size, " stored and ", m.size,
                   " uncompressed bytes");
        if (m.method == kDeflated && m.size / kMaxDeflateRatio > m.stored_size + 1)
          OT_THROW(kInvalidModel, "claims ", m.size, " bytes from ", m.stored_size,
                   " compressed ones, more than deflate can expand: corrupt sizes");
        read_local_header(m, file, cd_offset);
      });
      members_.push_back(std::move(m));
      pos += kCentralHeaderBytes + name_len + extra_len + comment_len;
    }
    if (pos != cd_size)
      OT_THROW(kInvalidModel, "the central directory has ", cd_size - pos, " bytes after its ", count, " entries");

    // ---- members must not overlap
    std::vector<const Member*> order;
    for (const auto& m : members_) order.push_back(&m);
    std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->local_offset < b->local_offset; });
    for (size_t i = 1; i < order.size(); ++i)
      if (order[i - 1]->data_offset + order[i - 1]->stored_size > order[i]->local_offset)
        OT_THROW(kInvalidModel, "members '", order[i - 1]->name, ".npy' and '", order[i]->name, ".npy' overlap");
  }

  // Replaces the 32-bit fields that hold their "see ZIP64" value by the extra field's 64-bit ones.
  static void read_zip64_extra(const uint8_t* p, size_t n, Member& m, uint32_t* disk) {
    for (size_t pos = 0; pos + 4 <= n;) {
      const uint16_t id = get16(p + pos), len = get16(p + pos + 2);
      if (len > n - pos - 4) OT_THROW(kInvalidModel, "an extra field runs past its entry");
      if (id == 0x0001) {
        const uint8_t* f = p + pos + 4;
        size_t left = len;
        auto take = [&](uint64_t& field, size_t bytes) {
          if (left < bytes) OT_THROW(kInvalidModel, "the ZIP64 extra field is too short");
          field = bytes == 8 ? get64(f) : get32(f);
          f += bytes;
          left -= bytes;
        };
        if (m.size == 0xFFFFFFFF) take(m.size, 8);
        if (m.stored_size == 0xFFFFFFFF) take(m.stored_size, 8);
        if (m.local_offset == 0xFFFFFFFF) take(m.local_offset, 8);
        if (*disk == 0xFFFF) {
          uint64_t d;
          take(d, 4);
          *disk = uint32_t(d);
        }
      }
      pos += 4 + len;
    }
  }

  void read_local_header(Member& m, const std::string& file, uint64_t cd_offset) {
    if (m.local_offset > cd_offset || cd_offset - m.local_offset < kLocalHeaderBytes)
      OT_THROW(kInvalidModel, "local header offset ", m.local_offset, " is out of range");
    std::vector<uint8_t> h = read_at(m.local_offset, kLocalHeaderBytes);
    if (get32(h.data()) != kLocalHeaderSig)
      OT_THROW(kInvalidModel, "no local header at offset ", m.local_offset);
    const uint64_t name_len = get16(&h[26]), extra_len = get16(&h[28]);
    m.data_offset = m.local_offset + kLocalHeaderBytes + name_len + extra_len;
    if (m.data_offset > cd_offset || m.stored_size > cd_offset - m.data_offset)
      OT_THROW(kInvalidModel, "its ", m.stored_size, " bytes at offset ", m.data_offset,
               " run into the central directory: truncated or corrupt");
    std::vector<uint8_t> local_name = read_at(m.local_offset + kLocalHeaderBytes, name_len);
    if (std::string(local_name.begin(), local_name.end()) != file || get16(&h[8]) != m.method)
      OT_THROW(kInvalidModel, "the local header disagrees with the central directory");
  }

  Fd fd_;
  uint64_t size_ = 0;
  std::vector<Member> members_;
};

std::string npz_context(const std::string& path) { return "npz '" + path + "': "; }
std::string array_context(const Member& m) { return "array '" + m.name + "': "; }

// ================================================================ writing

std::string npy_header(const Tensor& t) {
  std::string dict = "{'descr': '" + descr_of(t.dtype()) + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < t.shape().size(); ++i)
    dict += std::to_string(t.shape()[i]) + (t.shape().size() == 1 ? "," : i + 1 < t.shape().size() ? ", " : "");
  dict += "), }";
  // Version 1.0 when the header length fits 16 bits; the whole header is padded to 64 bytes.
  const bool v1 = dict.size() + 1 + 10 + 63 <= 0xFFFF;
  const size_t prefix = v1 ? 10 : 12;
  dict.append((64 - (prefix + dict.size() + 1) % 64) % 64, ' ');
  dict += '\n';
  std::string out("\x93NUMPY", 6);
  out += char(v1 ? 1 : 2);
  out += char(0);
  if (v1) put16(out, uint16_t(dict.size()));
  else put32(out, uint32_t(dict.size()));
  return out + dict;
}

// Every member carries ZIP64 sizes and offsets (as numpy writes them), so one layout serves any size.
std::string zip64_extra(uint64_t size, uint64_t offset, bool with_offset) {
  std::string e;
  put16(e, 0x0001);
  put16(e, with_offset ? 24 : 16);
  put64(e, size);
  put64(e, size);
  if (with_offset) put64(e, offset);
  return e;
}

void put_common_fields(std::string& s, uint32_t crc, const std::string& file, size_t extra_len) {
  put16(s, 45);      // version needed: ZIP64
  put16(s, 0);       // flags
  put16(s, kStored);
  put16(s, 0);       // time 00:00
  put16(s, 0x21);    // date 1980-01-01
  put32(s, crc);
  put32(s, 0xFFFFFFFF);  // sizes: in the ZIP64 extra field
  put32(s, 0xFFFFFFFF);
  put16(s, uint16_t(file.size()));
  put16(s, uint16_t(extra_len));
}

}  // namespace

// ================================================================ public functions

std::vector<NpzEntry> list_npz(const std::string& path) {
  return with_context(npz_context(path), [&] {
    Archive archive(path);
    std::vector<NpzEntry> out;
    for (const Member& m : archive.members())
      with_context(array_context(m), [&] {
        MemberReader r = archive.open(m);
        NpyHeader h = read_npy_header(r);
        out.push_back({m.name, h.dtype, h.shape, m.method == kDeflated, m.stored_size});
      });
    return out;
  });
}

std::vector<NamedArray> load_npz(const std::string& path, const std::vector<std::string>& only) {
  return with_context(npz_context(path), [&] {
    Archive archive(path);
    std::vector<const Member*> chosen;
    for (const auto& name : only) {
      const Member* found = nullptr;
      for (const Member& m : archive.members())
        if (m.name == name) found = &m;
      if (!found) {
        std::string have;
        for (const Member& m : archive.members()) have += (have.empty() ? "" : ", ") + m.name;
        OT_THROW(kInvalidArgument, "no array named '", name, "' (arrays: ", have.empty() ? "none" : have, ")");
      }
      chosen.push_back(found);
    }
    if (only.empty())
      for (const Member& m : archive.members()) chosen.push_back(&m);
    std::vector<NamedArray> out;
    for (const Member* m : chosen)
      with_context(array_context(*m), [&] {
        MemberReader r = archive.open(*m);
        out.push_back({m->name, read_npy(r)});
      });
    return out;
  });
}

Tensor load_npy(const std::string& path) {
  return with_context("npy '" + path + "': ", [&] {
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) OT_THROW(kRuntime, "cannot open: ", file_io::errno_text(errno));
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) OT_THROW(kRuntime, "cannot stat: ", file_io::errno_text(errno));
    if (!S_ISREG(st.st_mode)) OT_THROW(kInvalidModel, "not a regular file");
    const uint64_t size = uint64_t(st.st_size);
    MemberReader r(fd.get(), size, 0, size, size, kStored, std::nullopt);
    return read_npy(r);
  });
}

void save_npz(const std::string& path, const std::vector<NamedArray>& arrays) {
  with_context(npz_context(path), [&] {
    struct Prepared {
      std::string file, header;
      const Tensor* data;
      uint32_t crc;
      uint64_t size, offset;
    };
    std::vector<Prepared> members;
    std::set<std::string> names;
    uint64_t offset = 0;
    for (const auto& a : arrays) {
      OT_CHECK(!a.name.empty() && a.name.find('\0') == std::string::npos, "array names must be non-empty");
      OT_CHECK(names.insert(a.name).second, "array '", a.name, "' is given twice");
      OT_CHECK(a.value.defined(), "array '", a.name, "' is undefined");
      Prepared p{a.name + ".npy", npy_header(a.value), &a.value, 0, 0, offset};
      OT_CHECK(p.file.size() <= 0xFFFF, "array name '", a.name, "' is too long for a zip archive");
      p.crc = crc32_update(crc32_update(0, p.header.data(), p.header.size()), a.value.data(), a.value.nbytes());
      p.size = p.header.size() + a.value.nbytes();
      offset += kLocalHeaderBytes + p.file.size() + 20 + p.size;
      members.push_back(std::move(p));
    }
    std::string directory;
    for (const auto& p : members) {
      std::string extra = zip64_extra(p.size, p.offset, true);
      put32(directory, kCentralHeaderSig);
      put16(directory, 45);  // version made by
      put_common_fields(directory, p.crc, p.file, extra.size());
      put16(directory, 0);   // comment length
      put16(directory, 0);   // disk
      put16(directory, 0);   // internal attributes
      put32(directory, 0);   // external attributes
      put32(directory, 0xFFFFFFFF);  // local header offset: in the ZIP64 extra field
      directory += p.file + extra;
    }
    const uint64_t cd_offset = offset, cd_size = directory.size();
    std::string end;
    put32(end, kZip64EndSig);
    put64(end, kZip64EndBytes - 12);
    put16(end, 45);
    put16(end, 45);
    put32(end, 0);
    put32(end, 0);
    put64(end, members.size());
    put64(end, members.size());
    put64(end, cd_size);
    put64(end, cd_offset);
    put32(end, kZip64LocatorSig);
    put32(end, 0);
    put64(end, cd_offset + cd_size);
    put32(end, 1);
    put32(end, kEndSig);
    put16(end, 0);
    put16(end, 0);
    put16(end, uint16_t(std::min<uint64_t>(members.size(), 0xFFFF)));
    put16(end, uint16_t(std::min<uint64_t>(members.size(), 0xFFFF)));
    put32(end, uint32_t(std::min<uint64_t>(cd_size, 0xFFFFFFFF)));
    put32(end, uint32_t(std::min<uint64_t>(cd_offset, 0xFFFFFFFF)));
    put16(end, 0);

    file_io::write_file_atomically(path, [&](int fd, const std::string& what) {
      for (const auto& p : members) {
        std::string local;
        put32(local, kLocalHeaderSig);
        put_common_fields(local, p.crc, p.file, 20);
        local += p.file + zip64_extra(p.size, 0, false);
        file_io::write_all(fd, local.data(), local.size(), what);
        file_io::write_all(fd, p.header.data(), p.header.size(), what);
        file_io::write_all(fd, p.data->data(), p.data->nbytes(), what);
      }
      file_io::write_all(fd, directory.data(), directory.size(), what);
      file_io::write_all(fd, end.data(), end.size(), what);
    });
  });
}

}  // namespace onnxtrain
