#include "transport/reachability.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "core/clock.h"

namespace cairn {
namespace {

// "host:port" of one address (IPv6 in brackets).
std::string Endpoint(const sockaddr* sa, int port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, text, sizeof text);
    return std::string(text) + ":" + std::to_string(port);
  }
  inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, text, sizeof text);
  return "[" + std::string(text) + "]:" + std::to_string(port);
}

// The addresses of the interfaces that are up, as endpoints at `port`; IPv6 ones only
// when `v6` (a dual-stack listener). Loopback only when there is nothing else.
std::string Endpoints(int port, bool v6) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string out, loopback;
  for (const ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || !(i->ifa_flags & IFF_UP)) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && !(family == AF_INET6 && v6)) continue;
    if (family == AF_INET6) {
      const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr;
      if (IN6_IS_ADDR_LINKLOCAL(&a)) continue;  // needs a scope id to reach
    }
    std::string& to = (i->ifa_flags & IFF_LOOPBACK) ? loopback : out;
    to += (to.empty() ? "" : ",") + Endpoint(i->ifa_addr, port);
  }
  freeifaddrs(list);
  return out.empty() ? loopback : out;
}

// Parses one "host:port" endpoint.
bool ParseEndpoint(const std::string& e, sockaddr_storage* ss, socklen_t* len) {
  const size_t colon = e.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == e.size() || colon + 6 < e.size())
    return false;
  int port = 0;
  for (size_t i = colon + 1; i < e.size(); ++i) {
    if (e[i] < '0' || e[i] > '9') return false;
    port = port * 10 + (e[i] - '0');
  }
  if (port <= 0 || port > 65535) return false;
  std::memset(ss, 0, sizeof *ss);
  if (e.front() == '[') {
    if (colon < 2 || e[colon - 1] != ']') return false;
    auto* s6 = reinterpret_cast<sockaddr_in6*>(ss);
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(static_cast<uint16_t>(port));
    *len = sizeof *s6;
    return inet_pton(AF_INET6, e.substr(1, colon - 2).c_str(), &s6->sin6_addr) == 1;
  }
  auto* s4 = reinterpret_cast<sockaddr_in*>(ss);
  s4->sin_family = AF_INET;
  s4->sin_port = htons(static_cast<uint16_t>(port));
  *len = sizeof *s4;
  return inet_pton(AF_INET, e.substr(0, colon).c_str(), &s4->sin_addr) == 1;
}

}  // namespace

struct ProbeListener::Answerer {
  int listen_fd = -1;
  int stop_fd = -1;  // an eventfd: readable once Stop asks the thread to end
  std::thread thread;

  // Accepts every handshake and closes it at once, until stop_fd is readable: the orderly
  // close (FIN) is the answer. No byte is written: a UCX endpoint that dials this port
  // (a dead process's address file naming a port this listener took over) must meet a
  // closed connection, not bytes it reads as a message header (UCX 1.13 aborted on "yyyy").
  void Run() {
    pollfd p[2] = {{listen_fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    for (;;) {
      if (::poll(p, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (p[1].revents != 0) return;
      for (int i = 0; i < 64; ++i) {
        const int c = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c < 0) break;
        ::close(c);
      }
    }
  }
};

Result<ProbeListener> ProbeListener::Open(int port) {
  ProbeListener l;
  bool v6 = true;
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  struct Closer {  // on every early return; the Answerer owns the socket once it exists
    int& fd;
    ~Closer() {
      if (fd >= 0) ::close(fd);
    }
  } closer{fd};
  if (fd >= 0) {
    int off = 0;
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    if (::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off) != 0 ||
        ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  if (fd < 0) {  // no IPv6 here
    v6 = false;
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return Status::FromErrno(errno, "probe listener: socket");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      return Status::FromErrno(errno, "probe listener: bind");
  }
  if (::listen(fd, SOMAXCONN) != 0) return Status::FromErrno(errno, "probe listener: listen");
  sockaddr_storage bound{};
  socklen_t n = sizeof bound;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &n) != 0)
    return Status::FromErrno(errno, "probe listener: getsockname");
  const int bound_port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  l.addresses_ = Endpoints(bound_port, v6);
  l.answerer_ = std::make_unique<Answerer>();
  l.answerer_->listen_fd = std::exchange(fd, -1);
  l.answerer_->stop_fd = ::eventfd(0, EFD_CLOEXEC);
  if (l.answerer_->stop_fd < 0) return Status::FromErrno(errno, "probe listener: eventfd");
  Answerer* a = l.answerer_.get();
  try {
    a->thread = std::thread([a] { a->Run(); });
  } catch (const std::system_error& e) {
    return Status::Unavailable(std::string("probe listener: no thread: ") + e.what());
  }
  return l;
}

ProbeListener::ProbeListener(ProbeListener&& o) noexcept = default;

ProbeListener& ProbeListener::operator=(ProbeListener&& o) noexcept {
  if (this != &o) {
    Stop();
    answerer_ = std::move(o.answerer_);
    addresses_ = std::move(o.addresses_);
  }
  return *this;
}

ProbeListener::~ProbeListener() {
  Stop();
}

void ProbeListener::Stop() {
  if (!answerer_) return;
  Answerer& a = *answerer_;
  if (a.thread.joinable()) {
    const uint64_t one = 1;
    (void)!::write(a.stop_fd, &one, sizeof one);
    a.thread.join();
  }
  // Handshakes the thread had not accepted yet are reset with the socket.
  if (a.listen_fd >= 0) ::close(a.listen_fd);
  if (a.stop_fd >= 0) ::close(a.stop_fd);
  answerer_.reset();
}

Reach Probe(const std::string& addresses, double timeout_s) {
  std::vector<std::pair<sockaddr_storage, socklen_t>> targets;
  for (size_t begin = 0; begin < addresses.size();) {
    size_t end = addresses.find(',', begin);
    if (end == std::string::npos) end = addresses.size();
    sockaddr_storage ss;
    socklen_t len = 0;
    if (ParseEndpoint(addresses.substr(begin, end - begin), &ss, &len))
      targets.push_back({ss, len});
    begin = end + 1;
  }
  // A fresh handshake every 0.5 s: a SYN lost while the link was down is retried by the
  // kernel only 1 s later, then 3 s, 7 s... A connection is first `connecting`, then waits
  // for the listener's answer.
  constexpr int64_t kRoundNs = 500'000'000;
  struct Asking {
    int fd;
    bool connected;
  };
  std::vector<Asking> asking;
  bool reached = false, refused = false;
  const int64_t start = NowNanos(), deadline = start + static_cast<int64_t>(timeout_s * 1e9);
  int64_t next_round = start;
  while (!reached && !refused && !targets.empty()) {
    const int64_t now = NowNanos();
    if (now >= deadline) break;
    if (now >= next_round) {
      next_round = now + kRoundNs;
      for (auto& [ss, len] : targets) {
        const int fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        if (::connect(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0) {
          asking.push_back({fd, true});
        } else if (errno == EINPROGRESS) {
          asking.push_back({fd, false});
        } else {
          if (errno == ECONNREFUSED) refused = true;
          ::close(fd);
        }
      }
      if (refused) break;
    }
    const int64_t wait_ns = std::min(deadline, next_round) - NowNanos();
    if (asking.empty()) {
      if (wait_ns > 0) ::poll(nullptr, 0, static_cast<int>(wait_ns / 1'000'000) + 1);
      continue;
    }
    std::vector<pollfd> fds;
    for (const Asking& a : asking)
      fds.push_back({a.fd, static_cast<short>(a.connected ? POLLIN : POLLOUT), 0});
    if (::poll(fds.data(), fds.size(),
               static_cast<int>(std::max<int64_t>(wait_ns, 0) / 1'000'000) + 1) <= 0)
      continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      Asking& a = asking[i];
      if (fds[i].revents == 0) continue;
      if (!a.connected) {
        int err = 0;
        socklen_t n = sizeof err;
        if (::getsockopt(a.fd, SOL_SOCKET, SO_ERROR, &err, &n) == 0 && err == 0) {
          a.connected = true;  // the handshake: now the process's answer
          continue;
        }
        if (err == ECONNREFUSED) refused = true;
      } else {
        char got = 0;
        const ssize_t r = ::recv(a.fd, &got, 1, MSG_DONTWAIT);
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (r == 0) {
          reached = true;  // an orderly close: a thread of the process accepted and closed it
        } else if (r < 0 && errno == ECONNRESET) {
          // Reset: the listening socket closed with this handshake still queued, its process
          // is gone.
          refused = true;
        }  // bytes: not a probe listener (a port taken over by another process): no answer
      }
      ::close(a.fd);
      a.fd = -1;
    }
    std::erase_if(asking, [](const Asking& a) { return a.fd < 0; });
  }
  for (const Asking& a : asking) ::close(a.fd);
  return reached ? Reach::kAnswered : refused ? Reach::kRefused : Reach::kSilent;
}

bool Reachable(const std::string& addresses, double timeout_s) {
  return Probe(addresses, timeout_s) == Reach::kAnswered;
}

}  // namespace cairn
