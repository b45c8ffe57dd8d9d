// The reachability probe that gates a redial (transport/reachability.h): a host that listens
// answers, one that refuses (its process gone) is told at once, one that never answers (a
// link down) at the timeout, never later, and a malformed address list is unreachable. Everything
// on loopback.
#include "transport/reachability.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <string>
#include <utility>
#include <vector>

#include "core/clock.h"

namespace cairn {
namespace {

// A loopback socket that listens with `backlog` and never accepts: its fd, its address
// in `*at` as "127.0.0.1:port" and in `*target` as a probe target.
void ListenWithoutAccepting(int backlog, int* fd, sockaddr_in* at, std::string* target) {
  *fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(*fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(*fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(*fd, backlog), 0);
  socklen_t n = sizeof a;
  ASSERT_EQ(::getsockname(*fd, reinterpret_cast<sockaddr*>(&a), &n), 0);
  *at = a;
  *target = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
}

TEST(Reachability, AListeningHostAnswersAndAClosedOneDoesNotWithinTheTimeout) {
  std::string addresses;
  {
    auto l = ProbeListener::Open();
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    addresses = l->addresses();
    ASSERT_FALSE(addresses.empty());
    EXPECT_EQ(addresses.find('/'), std::string::npos) << addresses;  // it travels in a hello
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(Reachable(addresses, 2.0)) << addresses;
    // Moved, it still answers (its thread does not live in the moved-from object).
    ProbeListener moved = std::move(*l);
    EXPECT_EQ(Probe(moved.addresses(), 2.0), Reach::kAnswered);
  }
  // The listener is gone: refused at once (nothing listens on that port any more), told
  // apart from a host that does not answer (a collective gives a peer whose process died
  // up on this, and waits on for one behind a cut link: UcxGroup::Mend).
  const int64_t t0 = NowNanos();
  EXPECT_FALSE(Reachable(addresses, 1.0)) << addresses;
  EXPECT_LT(NanosToSeconds(NowNanos() - t0), 1.5);
  const int64_t t1 = NowNanos();
  EXPECT_EQ(Probe(addresses, 5.0), Reach::kRefused) << addresses;
  EXPECT_LT(NanosToSeconds(NowNanos() - t1), 0.3) << "a refused handshake is an answer";
}

TEST(Reachability, AHostThatNeverAnswersIsGivenUpAtTheTimeout) {
  // A listener whose accept queue is full drops further handshakes unanswered, as a host
  // behind a link that is down would (all on loopback: nothing leaves this machine).
  int fd = -1;
  sockaddr_in a{};
  std::string target;
  ListenWithoutAccepting(0, &fd, &a, &target);
  if (HasFatalFailure()) return;
  std::vector<int> fill;  // connections that fill the queue (never accepted)
  for (int i = 0; i < 4; ++i) {
    const int c = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    (void)::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a);
    fill.push_back(c);
  }
  ::usleep(100'000);
  const int64_t t0 = NowNanos();
  EXPECT_EQ(Probe(target, 0.7), Reach::kSilent);
  const double took = NanosToSeconds(NowNanos() - t0);
  EXPECT_GE(took, 0.6);  // it did wait: the handshake hung, it was not refused
  EXPECT_LT(took, 1.2);
  for (int c : fill) ::close(c);
  ::close(fd);
}

// A socket that listens but whose process never answers: the kernel completes the
// handshake by itself, as it does for a process that SIGKILL is tearing down before its
// sockets close. Probing such a peer as alive let a redial make a UCX endpoint to a
// process about to vanish, and UCX 1.13 aborted the prober (the ASan crash matrix).
TEST(Reachability, AHandshakeTheKernelCompletesIsNoAnswerAndTheCloseThatFollowsIsRefused) {
  int fd = -1;
  sockaddr_in a{};
  std::string target;
  ListenWithoutAccepting(16, &fd, &a, &target);
  if (HasFatalFailure()) return;
  EXPECT_EQ(Probe(target, 0.6), Reach::kSilent) << "the handshake completed, nobody answered";
  // The process goes (its socket closes with the probe's handshake still queued): the
  // probe is reset, and says so at once, not at its timeout.
  auto asked = std::async(std::launch::async, [&] {
    const int64_t t0 = NowNanos();
    const Reach r = Probe(target, 5.0);
    return std::make_pair(r, NanosToSeconds(NowNanos() - t0));
  });
  ::usleep(300'000);
  ::close(fd);
  const auto [reach, took] = asked.get();
  EXPECT_EQ(reach, Reach::kRefused);
  EXPECT_LT(took, 1.5);
}

TEST(Reachability, MalformedListsAreUnreachableNotACrash) {
  // (loopback only: a list parsed wrongly must not send anything off this machine)
  for (const char* bad :
       {"", ",", "127.0.0.1", "127.0.0.1:", ":80", "127.0.0.1:0", "127.0.0.1:70000", "[::1:80",
        "localhost:80", "[zz::1]:80", "127.0.0.1:5x", "127.0.0.1:-1"})
    EXPECT_FALSE(Reachable(bad, 0.2)) << bad;
}

}  // namespace
}  // namespace cairn
