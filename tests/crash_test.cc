// Kill a saving process with SIGKILL at random moments; restore must always give the
// newest CAPTURED version, bit-exact, and never a partial one.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <thread>

#include "cairn/checkpointer.h"
#include "core/filesystem.h"
#include "tests/crash_state.h"
#include "tests/test_util.h"

namespace cairn {
namespace {

constexpr size_t kStateBytes = 12 << 20;

struct Child {
  pid_t pid = -1;
  int out = -1;
};

Child Start(const std::string& root, const std::string& job) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    const std::string bytes = std::to_string(kStateBytes);
    ::execl(CAIRN_CRASH_CHILD, "crash_child", root.c_str(), job.c_str(), bytes.c_str(),
            static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  ::close(fds[1]);
  return {pid, fds[0]};
}

// Reads everything the (dead) child wrote; returns the newest step it reported CAPTURED.
int64_t DrainReports(int fd) {
  std::string all;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) all.append(buf, static_cast<size_t>(n));
  ::close(fd);
  int64_t newest = -1;
  size_t pos = 0;
  while ((pos = all.find("captured ", pos)) != std::string::npos) {
    newest = std::max<int64_t>(newest, std::stoll(all.substr(pos + 9)));
    pos += 9;
  }
  return newest;
}

TEST(Crash, SigkillAtRandomMomentsNeverYieldsATornVersion) {
  testing::TempDir root("crash");
  const int trials = 60;
  std::mt19937_64 rng(std::random_device{}());
  int restored_newer_than_reported = 0;
  testing::CrashState t(kStateBytes);
  for (int trial = 0; trial < trials; ++trial) {
    const std::string job = testing::UniqueJobId("crash");
    // Two lives per trial: the second child resumes from the first one's versions, so the
    // kills also land while a restarted process reuses slots.
    int64_t reported = -1;
    for (int life = 0; life < 2; ++life) {
      Child ch = Start(root.path(), job);
      ASSERT_GT(ch.pid, 0);
      std::this_thread::sleep_for(std::chrono::microseconds(2000 + rng() % 150000));
      ASSERT_EQ(::kill(ch.pid, SIGKILL), 0);
      int status = 0;
      ASSERT_EQ(::waitpid(ch.pid, &status, 0), ch.pid);
      ASSERT_TRUE(WIFSIGNALED(status)) << "child exited on its own with " << WEXITSTATUS(status);
      reported = std::max(reported, DrainReports(ch.out));
    }
    Options o = testing::TestOptions(root, "crash");
    o.job_id = job;
    auto c = Checkpointer::Open(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto versions = (*c)->versions();
    auto rep = (*c)->restore(t.Shards());
    if (reported < 0 && !rep.ok()) {
      EXPECT_EQ(rep.status().code(), StatusCode::kNotFound);  // killed before any capture
      continue;
    }
    ASSERT_TRUE(rep.ok()) << "trial " << trial << ": " << rep.status().ToString();
    // The newest CAPTURED version: at least as new as the last one reported captured.
    ASSERT_GE(rep->step, reported) << "trial " << trial;
    ASSERT_EQ(rep->step, versions.front().step);
    ASSERT_TRUE(rep->skipped.empty()) << rep->skipped.front();
    ASSERT_TRUE(t.Holds(rep->step)) << "trial " << trial << ": step " << rep->step << " torn";
    ASSERT_EQ(rep->blobs.at("step"), std::to_string(rep->step));
    if (rep->step > reported) ++restored_newer_than_reported;
    // Every other listed version is whole too.
    for (size_t i = 1; i < versions.size(); ++i) {
      RestoreOptions ro;
      ro.step = versions[i].step;
      testing::CrashState older(kStateBytes);
      auto r2 = (*c)->restore(older.Shards(), ro);
      ASSERT_TRUE(r2.ok()) << r2.status().ToString();
      ASSERT_TRUE(older.Holds(versions[i].step));
    }
    c->reset();
    ASSERT_TRUE(DefaultFileSystem()->RemoveAll(root.path() + "/" + job).ok());
  }
  // Informational: kills that landed between CAPTURED and the child's report of it.
  std::printf("restored a version newer than the last reported in %d of %d trials\n",
              restored_newer_than_reported, trials);
}

}  // namespace
}  // namespace cairn
