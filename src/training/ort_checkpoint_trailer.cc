#include "training/ort_checkpoint_trailer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "core/crc32c.h"
#include "onnxtrain/status.h"

namespace onnxtrain::ort_checkpoint {

namespace {

template <typename T> T load_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // little-endian hosts only, as the rest of the format code
  return v;
}

// A file opened for reading, with the size and CRC-32C of the bytes read through its descriptor;
// nullopt when it cannot be opened.
struct SummedFile {
  file_io::Fd fd;
  uint64_t bytes = 0;
  uint32_t crc = 0;
};
std::optional<SummedFile> open_and_sum(const std::string& path) {
  SummedFile s;
  s.fd.adopt(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (s.fd.get() < 0) return std::nullopt;
  struct stat st {};
  if (::fstat(s.fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  std::vector<uint8_t> chunk(size_t(1) << 20);
  for (;;) {
    ssize_t r = ::read(s.fd.get(), chunk.data(), chunk.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) OT_THROW(kRuntime, "cannot read '", path, "': ", file_io::errno_text(errno));
    if (r == 0) return s;
    s.crc = crc32c(s.crc, chunk.data(), size_t(r));
    s.bytes += uint64_t(r);
  }
}

bool matches(const std::optional<SummedFile>& s, const Trailer& t) {
  return s && s->bytes == t.data_bytes && s->crc == t.data_crc;
}

// The trailer of the main file at path, if it has one (errors: none, the caller reads it again).
std::optional<Trailer> trailer_of_file(const std::string& path) {
  file_io::Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0 || uint64_t(st.st_size) < kTrailerBytes) return std::nullopt;
  std::vector<uint8_t> bytes(size_t(st.st_size));
  try {
    file_io::read_exact_at(fd.get(), bytes.data(), bytes.size(), 0, bytes.size());
    return check_trailer(bytes.data(), bytes.size());
  } catch (const Error&) {
    return std::nullopt;
  }
}

}  // namespace

std::array<uint8_t, kTrailerBytes> encode_trailer(uint32_t main_crc, const Trailer& t) {
  std::array<uint8_t, kTrailerBytes> out{};
  std::memcpy(out.data(), &t.data_bytes, 8);
  std::memcpy(out.data() + 8, &t.data_crc, 4);
  const uint32_t crc = crc32c(main_crc, out.data(), 12);
  std::memcpy(out.data() + 12, &crc, 4);
  std::memcpy(out.data() + 16, kTrailerMagic, 8);
  return out;
}

std::optional<Trailer> check_trailer(const uint8_t* file, uint64_t size) {
  if (size < kTrailerBytes || std::memcmp(file + size - 8, kTrailerMagic, 8) != 0) return std::nullopt;
  const uint8_t* t = file + size - kTrailerBytes;
  const uint32_t stored = load_le<uint32_t>(t + 12), actual = crc32c(0, file, size_t(size - kTrailerBytes + 12));
  if (stored != actual)
    OT_THROW(kInvalidModel, "checksum: the onnxtrain trailer's CRC-32C is ", stored, ", the file's bytes give ",
             actual, " (the file is corrupt)");
  return Trailer{load_le<uint64_t>(t), load_le<uint32_t>(t + 8)};
}

void (*debug_after_external_check)(const std::string& data_path) = nullptr;

ExternalData matching_external_data(const std::string& path, const Trailer& t) {
  const std::string data = path + ".data", pending = data + ".new";
  std::optional<SummedFile> current = open_and_sum(data);
  if (matches(current, t)) return {data, std::move(current->fd), current->bytes};
  if (std::optional<SummedFile> next = open_and_sum(pending); matches(next, t)) {
    try {
      file_io::rename_durably(pending, data);  // finish the interrupted commit (the descriptor stays valid)
      return {data, std::move(next->fd), next->bytes};
    } catch (const Error&) {
      return {pending, std::move(next->fd), next->bytes};  // a read-only folder: read it where it is
    }
  }
  if (!current) OT_THROW(kInvalidModel, "external data: cannot open '", data, "'");
  OT_THROW(kInvalidModel, "external data: '", data, "' is ", current->bytes, " bytes with CRC-32C ", current->crc,
           ", the checkpoint's trailer expects ", t.data_bytes, " bytes with CRC-32C ", t.data_crc,
           " (not this checkpoint's data file, or corrupt)");
}

void commit(const std::string& path, const file_io::FileWriter& write_main, const file_io::FileWriter* write_external) {
  const std::string data = path + ".data", pending = data + ".new";
  // An interrupted commit's data must reach "<path>.data" before step 1 overwrites ".data.new".
  if (::access(pending.c_str(), F_OK) == 0)
    if (std::optional<Trailer> t = trailer_of_file(path); t && t->data_bytes != 0) (void)matching_external_data(path, *t);
  if (write_external) file_io::write_file_atomically(pending, *write_external);
  file_io::write_file_atomically(path, write_main);
  if (write_external) {
    file_io::debug_save_pause();
    file_io::rename_durably(pending, data);
  }
}

}  // namespace onnxtrain::ort_checkpoint
