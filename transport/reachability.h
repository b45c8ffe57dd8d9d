// Reachability: whether another rank's host can be reached over the network right now,
// asked without UCX. After a link went down, the TCP connection under a UCX endpoint backs
// off (its next retransmission comes up to two minutes after the link returned) or has
// failed; and UCX 1.13's tcp transport aborts the process when an endpoint is made, or
// dropped, while the connect behind it fails. So a rank redials a peer (UcxComm::Redial)
// only once a plain TCP handshake with the peer's host succeeds.
//
// Every rank listens on an ephemeral TCP port (ProbeListener) and tells its peers where in
// its hello ("10.0.0.5:41234,[fd00::5]:41234"). The listener reads nothing and writes
// nothing: it accepts and closes, so it offers nothing to anyone who connects.
// Thread-safety: a ProbeListener is used by one thread at a time; Reachable is reentrant.
#pragma once

#include <string>

#include "cairn/status.h"

namespace cairn {

class ProbeListener {
 public:
  // Listens on an ephemeral port of every address (IPv6 and IPv4, or IPv4 alone). Fails
  // only when no socket can be made; a rank without a listener redials without probing.
  static Result<ProbeListener> Open();
  ProbeListener(ProbeListener&& o) noexcept;
  ProbeListener& operator=(ProbeListener&& o) noexcept;
  ProbeListener(const ProbeListener&) = delete;
  ProbeListener& operator=(const ProbeListener&) = delete;
  ~ProbeListener();

  // Where peers reach the listener: "host:port" for every address of this host's network
  // interfaces that are up (IPv6 in brackets; loopback only when there is no other),
  // comma-separated, never containing '/'.
  const std::string& addresses() const { return addresses_; }
  // Accepts and closes every handshake that completed (never blocks).
  void Drain();

 private:
  ProbeListener() = default;
  int fd_ = -1;
  std::string addresses_;
};

// A TCP handshake with any of `addresses` (as ProbeListener::addresses() gives them),
// tried every 0.5 s for at most `timeout_s`: kAnswered once one completes; kRefused as soon
// as the host answers with a reset (no listener: the process that listened is gone, its
// host and the link are up); kSilent when nothing answered (a link down, a host gone; also
// an empty or malformed list).
enum class Reach { kAnswered, kRefused, kSilent };
Reach Probe(const std::string& addresses, double timeout_s);
// Probe(...) == kAnswered.
bool Reachable(const std::string& addresses, double timeout_s);

}  // namespace cairn
