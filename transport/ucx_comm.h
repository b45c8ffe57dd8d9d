// UcxComm: this rank's UCX context, worker and endpoints to the other ranks of the job.
//
// Start-up (bootstrap) goes through a rendezvous directory on a filesystem all nodes share
// (Options::RendezvousDir(), mode 0700): every rank publishes its worker address there
// (written to a temporary name and renamed). An endpoint to a peer is made from its address
// and opened with a hello carrying the job token and this rank's own address. The token is
// generated once per job (the first rank to start creates "token", mode 0600, atomically)
// and only ranks that present it are accepted: a process of another job or user cannot
// join.
//
// A job of at most Options::connect_all_max ranks connects every pair at start-up: Connect
// reads every address file, greets every rank and waits for every rank's hello (a missing
// rank fails the start). A larger job connects lazily: Connect only publishes, and an
// endpoint to a rank is made when this rank first sends to it or waits for a message from
// it (from the address its hello carried, or else its address file, waited for up to the
// connect timeout). A rank then holds endpoints to, and reads the address files of, only
// the ranks it talks to (collective neighbours, replica partners, restore peers), and a
// message from a rank is accepted only after that rank's hello (UCX matches the tagged
// messages of one endpoint in the order they were sent, so the hello comes first).
//
// Messages are UCX tagged sends. A tag is (channel, source rank, sequence); Recv matches
// the whole tag, so the stages talking over one UcxComm (each on channels of its own,
// handed out by the composition root) never steal each other's messages.
//
// Every message but a hello starts with the job token (sent from a second buffer, no
// copy: a UCX iov), and a receive accepts it only with it. A tag says which rank sent a
// message, but UCX does not say which endpoint it came from: a process that reached the
// worker could otherwise send messages tagged as a rank that greeted properly. A message
// without the token is dropped and counted (refused_messages()): a probe waits on for the
// real one, a posted receive (StartRecv) fails naming the sender, its buffer's bytes not
// to be used. Puts (RMA) go only to memory whose key was sent in such a message.
// The one exception, asked for by the caller (Auth::kContent): a posted transfer whose
// bytes the receiver checks against checksums it got in token-carrying messages before it
// uses them (a replica's chunks, against its offer's header). Those go as one contiguous
// buffer: UCX moves a two-part iov without zero copy, at half the rate (bench/replicate,
// 2026-11-25: 1.0 against 2.4 GB/s over tcp, 3.1 against 5.6 over shared memory).
// Every UCX handle is owned here and released in reverse order of creation.
// Thread-safety: all calls are serialised by an internal mutex (the worker is used by one
// thread at a time).
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cairn/options.h"
#include "cairn/status.h"
#include "core/log.h"
#include "core/mutex.h"
#include "transport/address_book.h"
#include "transport/reachability.h"

namespace cairn {

// A message channel: the first byte of the tags of one conversation. The transport keeps
// ids below kFirstChannel for itself (hellos); the composition root (api/channels.h) gives
// every stage that talks its own channels, with the same ids on every rank.
struct Channel {
  uint8_t id = 0;
  bool operator==(const Channel&) const = default;
};
inline constexpr uint8_t kFirstChannel = 2;

// (channel, source rank < 2^24, sequence) packed into a UCX tag.
inline uint64_t MakeTag(Channel channel, int source, uint32_t seq) {
  return (static_cast<uint64_t>(channel.id) << 56) |
         (static_cast<uint64_t>(static_cast<uint32_t>(source) & 0xffffff) << 32) | seq;
}

class UcxComm;

// The iov of a token-carrying transfer (the token, then the caller's bytes) and, for a
// receive, where the sender's token lands: at a fixed address while the request is in
// flight.
struct TokenFrame {
  ucp_dt_iov_t iov[2] = {};
  std::string received;  // a receive's first bytes (the sender's token)
};

// Where a probed message lands (UcxComm::ProbeReceive): on the heap, so that a receive
// given up after UCX matched it (which UCX cannot cancel) still has its buffers when the
// rest of its data arrives.
struct ProbedBuffers {
  TokenFrame frame;
  std::string bytes;
};

// A UCX request this rank started (send, receive, put, flush, endpoint close), owned by
// exactly one handle: move-only, and freed when the handle goes. A handle dropped while
// its request is still in flight cancels it first (its buffer must stay valid until the
// handle is gone). Empty when the operation completed at once or failed to start.
// Thread-safety: like the UcxComm that made it; never destroy an owning handle from inside
// UcxComm with its lock held (UcxComm frees its own with Free()).
class UcxRequest {
 public:
  UcxRequest() = default;
  UcxRequest(UcxRequest&& o) noexcept
      : comm_(std::exchange(o.comm_, nullptr)), req_(std::exchange(o.req_, nullptr)) {}
  UcxRequest& operator=(UcxRequest&& o) noexcept;
  UcxRequest(const UcxRequest&) = delete;
  UcxRequest& operator=(const UcxRequest&) = delete;
  ~UcxRequest();
  // Whether a request is still owned (not yet waited for, freed or dropped).
  explicit operator bool() const { return req_ != nullptr; }

 private:
  friend class UcxComm;
  UcxRequest(UcxComm* comm, void* req) : comm_(comm), req_(req) {}
  void* release() {
    comm_ = nullptr;
    return std::exchange(req_, nullptr);
  }
  UcxComm* comm_ = nullptr;
  void* req_ = nullptr;
};

// How UcxComm::Recv waits: `gentle` polls every 0.5 ms instead of spinning (for a
// background thread that may wait long); a set `*cancel` ends the wait (Unavailable).
struct RecvWait {
  bool gentle = false;
  const std::atomic<bool>* cancel = nullptr;
};

class UcxComm {
 public:
  // Joins the job as options.rank of options.world_size. `token` overrides the job token
  // read from the rendezvous directory (tests use it to play an intruder). Fails with
  // Unavailable naming the ranks that never appeared within options.connect_timeout_s, or
  // FailedPrecondition naming a rank that presented a wrong token. `rendezvous_fs`: the
  // filesystem of the rendezvous directory (nullptr: POSIX; tests make it fail).
  static Result<std::unique_ptr<UcxComm>> Connect(const Options& options, const Logger* log,
                                                  const std::string& token = "",
                                                  FileSystem* rendezvous_fs = nullptr);
  ~UcxComm();
  UcxComm(const UcxComm&) = delete;
  UcxComm& operator=(const UcxComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Sends `n` bytes to `peer`; returns when `buf` may be reused (not a proof of delivery).
  Status Send(int peer, uint64_t tag, const void* buf, size_t n);
  // Starts sending `n` bytes to `peer`; `buf` must stay valid until FinishSend. Sends to
  // several peers should be started together and finished after the matching receives:
  // large messages complete only when the receiver takes them.
  struct PendingSend {
    std::unique_ptr<TokenFrame> frame;  // outlives `request` (declared first)
    UcxRequest request;
    int peer = -1;
    Status status;  // set when the send failed at once
  };
  // How a posted transfer proves its sender (see the top): the job token in front of the
  // bytes, or (both sides must agree) nothing, the receiver checking the bytes themselves.
  enum class Auth { kToken, kContent };
  PendingSend StartSend(int peer, uint64_t tag, const void* buf, size_t n,
                        Auth auth = Auth::kToken);
  // Waits for a started send; `timeout_s` < 0 means the operation timeout.
  Status FinishSend(PendingSend& send, double timeout_s = -1);
  // Receives directly into `buf` (at most `n` bytes) the message carrying exactly `tag`.
  struct PendingRecv {
    std::unique_ptr<TokenFrame> frame;  // outlives `request` (declared first)
    UcxRequest request;
    int peer = -1;
    Status status;
    uint64_t tag = 0;
  };
  PendingRecv StartRecv(int peer, uint64_t tag, void* buf, size_t n, Auth auth = Auth::kToken);
  Status FinishRecv(PendingRecv& recv, double timeout_s);
  // Drives the worker until `recv` completed (true) or `timeout_s` passed (false); never
  // cancels it (FinishRecv then takes the result). True for a receive that failed to start.
  bool Arrived(PendingRecv& recv, double timeout_s);
  // The same for a send, true only once it ended: UCX cannot cancel a send, and may read
  // its buffer until then, whatever became of the peer (FinishSend then takes the result).
  bool Sent(PendingSend& send, double timeout_s);
  // Gives up the requests still owned among `requests` (of receives and sends) together:
  // cancels each one, waits for the cancels once (1 s at most in all, where a Finish*
  // that gives up waits up to 1 s for its own) and frees them; a send UCX would not cancel
  // counts as abandoned (see Close). Their Finish* calls then return OK at once: the
  // caller has its error already.
  void GiveUp(const std::vector<UcxRequest*>& requests);
  // Takes the next message on `channel` from any rank (or only from `source` when >= 0).
  // Unavailable on timeout (0: look once).
  struct Incoming {
    int source = -1;
    uint32_t seq = 0;
    std::string bytes;
  };
  Result<Incoming> RecvAny(Channel channel, double timeout_s, int source = -1);
  // Answers the hellos of restarted peers: verifies their token, reconnects to their new
  // address and greets them back, so a rank that restarts can rejoin a running job; and
  // the redial hellos of peers that replaced their endpoint to this rank (Redial): replaces
  // the endpoint to them too. Returns the ranks reconnected. Call it regularly from a
  // service thread.
  std::vector<int> ServiceHellos();
  // For a live peer that timed out or failed (not one that restarted: that one greets the
  // job itself): once a TCP handshake with its host succeeds (transport/reachability.h),
  // replaces the endpoint to it by a fresh connection to the same address and greets it
  // with a redial hello, which makes `peer` replace its endpoint to this rank too (see
  // ServiceHellos). An old connection may sit in TCP's retransmission back-off (up to two
  // minutes between tries) long after the link came back, or have failed for good; a
  // fresh one gets through as soon as the link does. OK once the hello was delivered (the
  // link works again); Unavailable when the host did not answer within `timeout_s` (no
  // UCX call was made) or the hello was not delivered in that time (it stays in flight; a
  // later call waits on for it); FailedPrecondition when the host refused the handshake
  // (the peer's process is gone). Bumps peer_epoch(peer) on success. Call it from a thread
  // that may block for about 2 x `timeout_s`.
  Status Redial(int peer, double timeout_s);
  // Whether `peer`'s host answers a TCP handshake within `timeout_s` (reachability.h);
  // true when its hello named no probe listener (nothing to ask).
  bool Reachable(int peer, double timeout_s);
  // Counts reconnections to `peer` (changes when the peer restarted, redialed this rank, or
  // this rank redialed it).
  uint64_t peer_epoch(int peer) const;
  // Receives the message carrying exactly `tag`, which `peer` sends. Unavailable if `peer`
  // fails or nothing arrives within `timeout_s`.
  Result<std::string> Recv(int peer, uint64_t tag, double timeout_s, RecvWait wait = {});

  // Memory registered with this rank's UCX context for RMA; unregistered on destruction
  // (it must not outlive the UcxComm).
  class MemRegion {
   public:
    ~MemRegion();
    const std::string& packed_rkey() const { return rkey_; }
    uint64_t address() const { return reinterpret_cast<uint64_t>(base_); }

   private:
    friend class UcxComm;
    MemRegion(UcxComm* c, ucp_mem_h h, void* base, std::string rkey)
        : comm_(c), memh_(h), base_(base), rkey_(std::move(rkey)) {}
    UcxComm* comm_;
    ucp_mem_h memh_;
    void* base_;
    std::string rkey_;
  };
  Result<std::unique_ptr<MemRegion>> Register(void* p, size_t n);
  // A peer's packed remote key, unpacked for this rank's endpoint to it.
  class RemoteKey {
   public:
    ~RemoteKey();

   private:
    friend class UcxComm;
    RemoteKey(UcxComm* c, ucp_rkey_h k) : comm_(c), rkey_(k) {}
    UcxComm* comm_;
    ucp_rkey_h rkey_;
  };
  Result<std::unique_ptr<RemoteKey>> UnpackRemoteKey(int peer, const std::string& packed);
  // Writes `n` bytes into `peer`'s registered memory at `remote_addr` (non-blocking; the
  // bytes are in place only after Flush).
  PendingSend StartPut(int peer, const void* src, size_t n, uint64_t remote_addr,
                       const RemoteKey& key);
  // Completes every put to `peer` at the remote side (ucp_ep_flush).
  Status Flush(int peer, double timeout_s);

  // Drives the worker until it has nothing left to do right now (transfers started with
  // StartSend/StartRecv advance only while some call drives it).
  void Progress();

  // Whether `peer`'s endpoint reported an error (it died or reset the connection).
  bool peer_failed(int peer) const;
  // Whether that error (or the last failed request's) may be the link's: a timeout (a cut
  // link, a frozen peer; but UCX's tcp transport reports a peer whose process died as a
  // timeout too) rather than a reset. Only a redial tells them apart: the dead process's
  // host refuses its probe (Redial's FailedPrecondition).
  bool peer_link_lost(int peer) const;
  // The incarnation of `peer` the endpoint to it talks to (the nonce of its address; it
  // changes when the peer restarted and this rank reconnected to the new process).
  std::string peer_incarnation(int peer) const;
  // Whether this job connects lazily (more than Options::connect_all_max ranks).
  bool lazy() const { return lazy_; }
  // Endpoints this rank holds now, and how many ranks' addresses it has read from the
  // address book (their address files, or PMIx lookups; each rank counted once) since it
  // started.
  int endpoints() const;
  int addresses_read() const;
  // Messages dropped because they did not carry the job token (see the top).
  uint64_t refused_messages() const { return refused_.load(std::memory_order_relaxed); }
  // UCX requests started and not yet completed and released (sends, receives, puts,
  // flushes, endpoint closes): what the soak watches for leaks.
  int64_t requests_in_flight() const { return requests_.load(std::memory_order_relaxed); }
  double op_timeout_s() const { return op_timeout_s_; }

 private:
  struct Peer {
    ucp_ep_h ep = nullptr;
    std::atomic<int> error{0};  // ucs_status_t of a failure, 0 while healthy
    // A request to or from this peer ran out of time with no error from UCX, and none
    // completed since (guarded by mu_): its endpoint is closed by force, as a failed one,
    // instead of waiting to flush to a peer that stopped answering (a cut link).
    bool silent = false;
    // The ucs_status_t of the last request to or from this peer that failed, 0 once one
    // succeeded (a request can fail with the endpoint's error before UCX reports it).
    std::atomic<int> request_error{0};
    UcxComm* self = nullptr;
    int rank = -1;
    std::string nonce;  // of the address this endpoint was made from
    std::atomic<uint64_t> epoch{0};
    // `ep` was made with peer error handling: UCX reports this peer's failure (false over
    // UCX 1.13's shared memory, where a dead peer shows up only as a timeout; mu_).
    bool reports_errors = false;
    // From the peer's latest hello (guarded by mu_): it presented the job token, and
    // its address then (a lazy endpoint is made from it without reading the file).
    bool verified = false;
    std::string hello_nonce, hello_address;
    std::string hello_probe;  // where its ProbeListener listens (transport/reachability.h)
    std::string address;      // the endpoint was made to this address (guarded by mu_)
    // A redial hello in flight on `ep` (owned, counted in requests_), and when it started.
    void* redial = nullptr;
    int64_t redial_at = 0;
    std::string redial_hello;  // its bytes, which UCX reads until it completes
    int64_t connected_at = 0;  // when a hello on `ep` was last delivered (NowNanos)
    // Endpoints a redial replaced, with the redial hello in flight on each, closed a
    // while later (CloseRetired).
    struct Retired {
      ucp_ep_h ep;
      void* redial;
      int64_t at;
    };
    std::vector<Retired> retired;
  };
  // The functions taking a Lock hold mu_ through `lk` on entry and on return, releasing it
  // around blocking UCX progress (the analysis cannot follow a lock passed by reference:
  // they are CAIRN_REQUIRES(mu_) to their callers and unchecked inside).
  using Lock = MutexLock;
  UcxComm(const Options& o, const Logger* log);
  Status Init() CAIRN_NO_THREAD_SAFETY_ANALYSIS;  // before the object is shared
  Status Bootstrap(Lock& lk, const std::string& token_override) CAIRN_REQUIRES(mu_);
  // Bootstrap's halves (every peer connected up front): a hello with the token to every
  // peer's published address, retried as address files change, until `deadline`; then
  // every peer's hello received and its token checked.
  Status GreetAll(Lock& lk, int64_t deadline) CAIRN_REQUIRES(mu_);
  Status AwaitHellos(Lock& lk, int64_t deadline) CAIRN_REQUIRES(mu_);
  // Waits for a request with the lock held except while backing off, then frees it (after
  // cancelling it on a timeout or a failed peer); `request` is empty on return.
  // `*abandoned` (when given) says whether the request was still in flight when freed (a
  // matched receive or a send UCX would not cancel): its buffers must then outlive it.
  // Given `epoch`, it also gives up when peer_epoch(peer) is no longer that (the endpoint
  // was replaced).
  Status WaitRequest(Lock& lk, UcxRequest& request, int peer, double timeout_s, const char* what,
                     bool* abandoned = nullptr, std::optional<uint64_t> epoch = std::nullopt)
      CAIRN_REQUIRES(mu_);
  // Drives the worker until `request` ended, `peer` (if >= 0) failed or `timeout_s` passed
  // (false).
  bool Await(UcxRequest& request, int peer, double timeout_s) CAIRN_EXCLUDES(mu_);
  // Makes the endpoint to `peer`, with peer-failure reporting when the transports allow it;
  // `may_fall_back`: when they do not (UCX 1.13's shared memory), the job's endpoints are
  // made without it from then on (both ends of a connection must agree). A redial never
  // falls back: unreachable there means the link is still down.
  Status Connected(int peer, const std::string& address, bool may_fall_back = true)
      CAIRN_REQUIRES(mu_);
  // Reads `peer`'s address file: OK with the address and its nonce, or why not.
  void CloseEndpoint(Lock& lk, Peer& p) CAIRN_REQUIRES(mu_);
  // Replaces the endpoint to `peer` by one to `address` and sends it our hello.
  Status Greet(Lock& lk, int peer, const std::string& address, const std::string& nonce)
      CAIRN_REQUIRES(mu_);
  // Probes for a message matching `tag` under `mask` (from `peer`, or any rank if -1) and
  // receives it into *out, waiting up to `timeout_s` (0: look once). `wait.gentle` polls
  // every 0.5 ms instead of spinning; a set `*wait.cancel` ends the wait
  // (Unavailable).
  // *sender_tag is set only when a message was found.
  Status ProbeReceive(Lock& lk, uint64_t tag, uint64_t mask, int peer, double timeout_s,
                      RecvWait wait, uint64_t* sender_tag, std::string* out) CAIRN_REQUIRES(mu_);
  Status CheckPeer(int peer, const char* what) const;
  // CheckPeer, after connecting to `peer` first in a lazy job (see the top); a failed
  // peer is reconnected when its address file has changed (it restarted).
  Status EnsurePeer(Lock& lk, int peer, const char* what) CAIRN_REQUIRES(mu_);
  // Whether `peer` has greeted this rank with the job token; takes its hello from the
  // queue when it is waiting there (and reconnects when it names a new incarnation).
  bool Verified(Lock& lk, int peer) CAIRN_REQUIRES(mu_);
  // Records a hello `got` from `peer`: false when it lacks the job token. Reconnects when
  // it comes from a new incarnation of a peer this rank holds an endpoint to (`restarted`).
  // A redial hello (`redial`) replaces the endpoint to a peer of the same incarnation.
  bool TakeHello(Lock& lk, int peer, const std::string& got, bool redial, bool* restarted)
      CAIRN_REQUIRES(mu_);
  // Closes `peer`'s endpoint by force and frees its redial hello, if any.
  void DropEndpoint(Lock& lk, Peer& peer) CAIRN_REQUIRES(mu_);
  void CloseByForce(ucp_ep_h ep, int rank) CAIRN_REQUIRES(mu_);
  // Moves `peer`'s endpoint (and its redial hello) to peer.retired.
  // Redial's two halves: a fresh endpoint to `p` with the redial hello sent on it, and
  // the wait (progressing the worker, the lock let go meanwhile) until the hello is
  // delivered, the peer fails or `timeout_s` passes.
  Status StartRedial(int p) CAIRN_REQUIRES(mu_);
  Status AwaitRedial(Lock& lk, int p, double timeout_s) CAIRN_REQUIRES(mu_);
  void RetireEndpoint(Peer& peer) CAIRN_REQUIRES(mu_);
  // Closes the retired endpoints of `peer` older than `older_than_ns`.
  void CloseRetired(Peer& peer, int64_t older_than_ns) CAIRN_REQUIRES(mu_);
  // Takes ownership of what a UCX call returned: an owning handle for a request in flight
  // (counted), an empty one when it completed at once, or Unavailable naming `what` and
  // the peer when it failed to start.
  Result<UcxRequest> Own(void* request, int peer, const char* what);
  // Frees a request (cancelling it first if still in flight) and empties the handle; true
  // when it was abandoned (still in flight).
  bool Free(UcxRequest& request) CAIRN_REQUIRES(mu_);
  bool FreeLocked(void* request) CAIRN_REQUIRES(mu_);
  // Cancels the requests still in flight, waits for the cancels once (1 s at most in all)
  // and frees them all; one UCX would not cancel (a send, a matched receive) counts as
  // abandoned. Returns how many were.
  int CancelAndFreeLocked(const std::vector<void*>& requests) CAIRN_REQUIRES(mu_);
  // Marks `peer` (when it is one) as gone silent, or not (Peer::silent).
  void SetSilent(int peer, bool silent) CAIRN_REQUIRES(mu_);
  // Progresses the worker once; counts a progress that did something (progressed_).
  unsigned ProgressLocked() CAIRN_REQUIRES(mu_);
  // The wait of a polling loop whose last progress found nothing to do (`lk` holds mu_ on
  // entry and return, and releases it meanwhile): the first 64 in a row only let other
  // threads in; then it sleeps on the worker's event fd until something happens, `most_ns`
  // pass or `deadline_ns` comes (CAIRN_UCX_WAIT=event), or 20 us (poll, or no event fd).
  // On a machine whose every wake costs a trip through a hypervisor, polling every 20 us
  // took most of two vCPUs (docs/performance.md, issue 34 part 16).
  void Idle(Lock& lk, int& spins, int64_t deadline_ns, int64_t most_ns) CAIRN_REQUIRES(mu_);
  PendingSend Started(int peer, void* request, const char* what) CAIRN_REQUIRES(mu_);
  friend class UcxRequest;
  // Connects afresh to `peer`'s incarnation `nonce`, at `address` (read from its address
  // file when empty).
  Status Reconnect(Lock& lk, int peer, const std::string& nonce, std::string address)
      CAIRN_REQUIRES(mu_);
  std::string Who(int peer) const;
  static void OnPeerError(void* arg, ucp_ep_h ep, ucs_status_t status);

  Options options_;
  const Logger* log_;
  int rank_;
  int size_;
  double op_timeout_s_;
  std::unique_ptr<AddressBook> book_;  // set by Connect before anything else
  mutable Mutex mu_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ CAIRN_GUARDED_BY(mu_) = nullptr;  // UCX worker calls hold mu_
  std::string address_;                                  // this worker's address
  std::string token_;
  std::string nonce_;  // of this process's address file
  // Answers peers' reachability probes; none when it could not be made (set by Init).
  std::optional<ProbeListener> probe_;
  // This rank's hello: the job token, rank, nonce, probe listener and worker address.
  std::string Hello() const;
  bool lazy_ = false;
  // Read the address of rank p (guarded by mu_; sized by Init()).
  std::vector<uint8_t> address_read_;
  // Reads rank `peer`'s address from the book (counted in addresses_read()); a transient
  // filesystem error (TransientFsError) is NotFound: read again, as a file not yet written.
  Status ReadAddress(int peer, std::string* address, std::string* nonce) CAIRN_REQUIRES(mu_);
  bool warned_no_peer_errors_ CAIRN_GUARDED_BY(mu_) = false;
  std::atomic<bool> closing_{false};   // peer errors while shutting down are expected
  std::atomic<int64_t> requests_{0};   // owned by a UcxRequest and not yet freed
  std::atomic<int64_t> abandoned_{0};  // freed while still in flight (uncancellable sends)
  // The buffers of probed receives abandoned in flight: UCX may still write into them, so
  // they live as long as the worker (with it, to process exit).
  std::vector<std::unique_ptr<ProbedBuffers>> orphans_ CAIRN_GUARDED_BY(mu_);
  int efd_ = -1;                         // the worker's event fd (set by Init; -1: idle waits poll)
  std::atomic<uint64_t> progressed_{0};  // progresses that did something
  std::atomic<uint64_t> refused_{0};     // messages without the job token
  int64_t refusal_logged_ns_ CAIRN_GUARDED_BY(mu_) = 0;
  // Counts (and at most every 10 s logs) a message from `peer` on `tag` without the token.
  void Refused(int peer, uint64_t tag) CAIRN_REQUIRES(mu_);
  // Sized by Init() and fixed afterwards; a Peer's endpoint changes with mu_ held, its
  // error and epoch are atomics (set by UCX callbacks).
  std::vector<std::unique_ptr<Peer>> peers_;
};

}  // namespace cairn
