#include "core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <string_view>
#include <thread>

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

void debug_save_pause() {
  static const long pause_ms = [] {
    const char* env = std::getenv("ONNXTRAIN_DEBUG_SAVE_PAUSE_MS");
    return env ? std::max(0L, std::strtol(env, nullptr, 10)) : 0L;
  }();
  if (pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
}

void sync_parent_directory(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() >= 0) (void)::fsync(dfd.get());
}

void rename_durably(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    OT_THROW(kRuntime, "cannot rename '", from, "' to '", to, "': ", errno_text(errno));
  sync_parent_directory(to);
}

const std::string& host_key() {
  static const std::string key = [] {
    std::string id;
    std::ifstream boot("/proc/sys/kernel/random/boot_id");
    std::getline(boot, id);
    char ns[64];
    const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof ns);
    if (n > 0) id.append(ns, size_t(n));
    if (id.empty()) {  // no /proc: the host name
      char host[256] = {};
      ::gethostname(host, sizeof host - 1);
      id = host;
    }
    uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
    for (unsigned char c : id) h = (h ^ c) * 0x100000001b3ull;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    return std::string(hex);
  }();
  return key;
}

void remove_stale_temporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const std::string prefix = p.filename().string() + ".tmp-";
  const std::string ours = "-" + host_key() + "-";
  std::error_code ec;
  fs::directory_iterator it(p.parent_path().empty() ? fs::path(".") : p.parent_path(), ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    // "<pid>-<host key>-<n>": only a dead writer of this host's goes (a live one may be writing
    // it now; another machine's or PID namespace's pid says nothing here).
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + prefix.size(), &end, 10);
    if (pid <= 0 || std::string_view(end).substr(0, ours.size()) != ours || pid == long(::getpid())) continue;
    if (::kill(pid_t(pid), 0) != 0 && errno == ESRCH) ::unlink(it->path().c_str());
  }
}

void write_file_atomically(const std::string& path, const FileWriter& write) {
  static std::atomic<uint64_t> counter{0};
  {  // once per path and process: a directory scan per write costs with many files in the folder
    static std::mutex mutex;
    static std::set<std::string> cleaned;
    std::lock_guard<std::mutex> lock(mutex);
    if (cleaned.insert(path).second) remove_stale_temporaries(path);
  }
  std::string tmp;
  Fd fd;
  // EEXIST: a killed process that had our pid left this name (remove_stale_temporaries spares our pid).
  for (int tries = 0; fd.get() < 0 && tries < 64; ++tries) {
    tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" + host_key() + "-" + std::to_string(counter++);
    fd.adopt(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
    if (fd.get() < 0 && errno != EEXIST) break;
  }
  if (fd.get() < 0) OT_THROW(kRuntime, "cannot create temporary file '", tmp, "': ", errno_text(errno));
  try {
    debug_save_pause();
    const std::string what = "temporary file '" + tmp + "'";
    write(fd.get(), what);
    debug_save_pause();
    if (::fsync(fd.get()) != 0) OT_THROW(kRuntime, "cannot fsync ", what, ": ", errno_text(errno));
    if (::close(fd.release()) != 0) OT_THROW(kRuntime, "cannot close ", what, ": ", errno_text(errno));
    debug_save_pause();
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      OT_THROW(kRuntime, "cannot rename '", tmp, "' to '", path, "': ", errno_text(errno));
  } catch (...) {
    fd.reset();
    ::unlink(tmp.c_str());
    throw;
  }
  debug_save_pause();
  // Make the rename durable. Best effort: the new file is already in place.
  sync_parent_directory(path);
}

}  // namespace onnxtrain::file_io
