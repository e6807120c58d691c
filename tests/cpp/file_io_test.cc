// core/file_io: what write_file_atomically's clean-up of killed writers' temporary files removes
// (this host's dead writers' files) and what it leaves (live writers', other hosts').
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>

#include "core/file_io.h"
#include "test_util.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;

class FileIoTest : public test::TempDirTest {};

// A pid no process has now: a child's that has exited and been reaped.
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

TEST_F(FileIoTest, StaleTemporariesOfThisHostsDeadWritersOnlyAreRemoved) {
  const std::string dead = std::to_string(dead_pid()), live = std::to_string(::getppid());
  const std::string here = file_io::host_key(), elsewhere = "0123456789abcdef";
  ASSERT_NE(here, elsewhere);
  const std::string ours_dead = path("f.tmp-" + dead + "-" + here + "-0");
  const std::string ours_live = path("f.tmp-" + live + "-" + here + "-0");
  const std::string other_host = path("f.tmp-" + dead + "-" + elsewhere + "-0");  // a pid of another machine
  const std::string older_format = path("f.tmp-" + dead + "-0");                 // no host key: whose is unknown
  for (const auto& f : {ours_dead, ours_live, other_host, older_format}) test::write_file(f, "partial");
  file_io::write_file_atomically(path("f"), [](int fd, const std::string& what) { file_io::write_all(fd, "new", 3, what); });
  EXPECT_EQ(test::read_file(path("f")), "new");
  EXPECT_FALSE(fs::exists(ours_dead));
  EXPECT_TRUE(fs::exists(ours_live));
  EXPECT_TRUE(fs::exists(other_host));
  EXPECT_TRUE(fs::exists(older_format));
  // The new file's own temporary name carries the host key: nothing of this write is left.
  for (const auto& e : fs::directory_iterator(path("")))
    EXPECT_TRUE(e.path().filename().string().find(here) == std::string::npos || e.path() == ours_live) << e.path();
}

}  // namespace
}  // namespace onnxtrain
