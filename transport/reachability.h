// Reachability: whether another rank's host can be reached over the network right now,
// asked without UCX. After a link went down, the TCP connection under a UCX endpoint backs
// off (its next retransmission comes up to two minutes after the link returned) or has
// failed; and UCX 1.13's tcp transport aborts the process when an endpoint is made, or
// dropped, while the connect behind it fails. So a rank redials a peer (UcxComm::Redial)
// only once a plain TCP handshake with the peer's host succeeds.
//
// Every rank listens on an ephemeral TCP port (ProbeListener) and tells its peers where in
// its hello ("10.0.0.5:41234,[fd00::5]:41234"). A thread of the listening process accepts
// each handshake and closes it; it reads and writes nothing, so it offers nothing to anyone
// who connects. The orderly close, not the handshake, is the answer: the kernel completes
// handshakes on a listening socket by itself, also for a process that is being killed and
// has not yet closed its sockets (those are reset when it does), and a redial to such a
// peer met UCX's abort (the ASan crash matrix, 2026-11-27: a rank's new endpoint to a rank
// dying from SIGKILL). Nor is any byte written: UCX read a one-byte answer ('y') as a
// message header when a restarted rank dialed a dead rank's address whose port a probe
// listener had taken over, and aborted (the ASan crash matrix, 2026-11-28).
// Thread-safety: a ProbeListener is used by one thread at a time; Probe is reentrant.
#pragma once

#include <memory>
#include <string>

#include "cairn/status.h"

namespace cairn {

class ProbeListener {
 public:
  // Listens on an ephemeral port of every address (IPv6 and IPv4, or IPv4 alone) and starts
  // the thread that answers. Fails only when no socket or thread can be made; a rank
  // without a listener redials without probing. `port`: 0 (an ephemeral one) but in tests.
  static Result<ProbeListener> Open(int port = 0);
  ProbeListener(ProbeListener&& o) noexcept;
  ProbeListener& operator=(ProbeListener&& o) noexcept;
  ProbeListener(const ProbeListener&) = delete;
  ProbeListener& operator=(const ProbeListener&) = delete;
  // Stops answering, then closes the socket: a probe still waiting is reset (kRefused).
  ~ProbeListener();

  // Where peers reach the listener: "host:port" for every address of this host's network
  // interfaces that are up (IPv6 in brackets; loopback only when there is no other),
  // comma-separated, never containing '/'.
  const std::string& addresses() const { return addresses_; }

 private:
  struct Answerer;
  ProbeListener() = default;
  void Stop();
  std::unique_ptr<Answerer> answerer_;
  std::string addresses_;
};

// Asks any of `addresses` (as ProbeListener::addresses() gives them), afresh every 0.5 s
// for at most `timeout_s`: kAnswered once a listener's process closed a handshake; kRefused as
// soon as a host resets the connection (no listener, or one that closed before answering:
// the process that listened is gone, its host and the link are up); kSilent when nothing
// answered (a link down, a host gone, a process stopped; also an empty or malformed list).
enum class Reach { kAnswered, kRefused, kSilent };
Reach Probe(const std::string& addresses, double timeout_s);
// Probe(...) == kAnswered.
bool Reachable(const std::string& addresses, double timeout_s);

}  // namespace cairn
