#include "core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "onnxtrain/status.h"

namespace onnxtrain::file_io {

std::string errno_text(int err) { return std::strerror(err); }

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void write_all(int fd, const void* data, size_t n, const std::string& what) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min(n, kIoChunk));
    if (w < 0) {
      if (errno == EINTR) continue;
      OT_THROW(kRuntime, "cannot write ", what, ": ", errno_text(errno));
    }
    p += w;
    n -= size_t(w);
  }
}

void read_exact_at(int fd, void* data, size_t n, uint64_t offset, uint64_t file_size) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, std::min(n, kIoChunk), off_t(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      OT_THROW(kRuntime, "read error at byte ", offset, ": ", errno_text(errno));
    }
    if (r == 0)
      OT_THROW(kInvalidModel, "file truncated: expected ", file_size, " bytes, ended at byte ", offset,
               " (was it changed while loading?)");
    p += r;
    n -= size_t(r);
    offset += uint64_t(r);
  }
}

void write_file_atomically(const std::string& path,
                           const std::function<void(int fd, const std::string& what)>& write) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
  if (fd.get() < 0) OT_THROW(kRuntime, "cannot create temporary file '", tmp, "': ", errno_text(errno));
  try {
    const std::string what = "temporary file '" + tmp + "'";
    write(fd.get(), what);
    if (::fsync(fd.get()) != 0) OT_THROW(kRuntime, "cannot fsync ", what, ": ", errno_text(errno));
    if (::close(fd.release()) != 0) OT_THROW(kRuntime, "cannot close ", what, ": ", errno_text(errno));
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      OT_THROW(kRuntime, "cannot rename '", tmp, "' to '", path, "': ", errno_text(errno));
  } catch (...) {
    fd.reset();
    ::unlink(tmp.c_str());
    throw;
  }
  // Make the rename durable. Best effort: the new file is already in place.
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() >= 0) (void)::fsync(dfd.get());
}

void write_files_atomically(const std::vector<std::pair<std::string, FileWriter>>& files) {
  static std::atomic<uint64_t> counter{0};
  std::vector<std::string> tmps;
  size_t renamed = 0;
  try {
    for (const auto& [path, write] : files) {
      const std::string tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
      Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
      if (fd.get() < 0) OT_THROW(kRuntime, "cannot create temporary file '", tmp, "': ", errno_text(errno));
      tmps.push_back(tmp);
      const std::string what = "temporary file '" + tmp + "'";
      write(fd.get(), what);
      if (::fsync(fd.get()) != 0) OT_THROW(kRuntime, "cannot fsync ", what, ": ", errno_text(errno));
      if (::close(fd.release()) != 0) OT_THROW(kRuntime, "cannot close ", what, ": ", errno_text(errno));
    }
    for (; renamed < files.size(); ++renamed)
      if (::rename(tmps[renamed].c_str(), files[renamed].first.c_str()) != 0)
        OT_THROW(kRuntime, "cannot rename '", tmps[renamed], "' to '", files[renamed].first, "': ", errno_text(errno));
  } catch (...) {
    for (size_t i = renamed; i < tmps.size(); ++i) ::unlink(tmps[i].c_str());
    throw;
  }
  for (const auto& [path, write] : files) {
    std::filesystem::path dir = std::filesystem::path(path).parent_path();
    if (dir.empty()) dir = ".";
    Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dfd.get() >= 0) (void)::fsync(dfd.get());
  }
}

}  // namespace onnxtrain::file_io
