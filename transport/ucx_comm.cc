#include "transport/ucx_comm.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "core/clock.h"
#include "core/filesystem.h"
#include "transport/reachability.h"
#include "transport/rendezvous.h"

namespace cairn {
namespace {

constexpr Channel kHello{1};  // the transport's own: a rank's greeting with the job token
// The sequence of a hello: a rank joining (or restarted), or one that replaced its endpoint
// to the receiver after a failure and asks it to do the same (UcxComm::Redial).
constexpr uint32_t kJoinHello = 0;
constexpr uint32_t kRedialHello = 1;
// A redial whose hello is still not delivered this long after the peer's host answered a
// probe is replaced by a fresh one.
constexpr int64_t kRedialRefreshNs = 10'000'000'000;
// How long a receive from a peer that failed goes on taking what arrives (ProbeReceive).
constexpr int64_t kLastWordsNs = 200'000'000;
// A replaced endpoint is closed this long after (see Redial).
constexpr int64_t kRetiredNs = 10'000'000'000;
// A redial hello does not replace an endpoint that delivered a hello this recently: both
// ranks of a link that came back tend to redial at once, and each must keep the fresh
// connection it just made (replacing it would cancel what is in flight on it).
constexpr int64_t kFreshEndpointNs = 5'000'000'000;

std::string UcsError(ucs_status_t st) {
  return ucs_status_string(st);
}

// After 64 idle polls in a row a wait sleeps 20 us between polls; a poll that made progress
// starts the count again (the callers reset `spins`), so a transfer in full flow is polled
// at once (before: once past 64 idle polls, every idle poll of a long transfer slept, and
// replication over tcp between two namespaces reached 0.55-0.64 of ucx_perftest; after,
// 0.68-0.70: docs/performance.md).
constexpr int kBusySpins = 64;
void Backoff(int& spins) {
  if (++spins > kBusySpins) std::this_thread::sleep_for(std::chrono::microseconds(20));
}

// The longest an idle wait sleeps on the worker's event fd before it looks again (a
// cancel, a deadline, a completion another thread's progress took: see UcxComm::Idle).
constexpr int64_t kEventWaitNs = 2'000'000;
constexpr int64_t kGentleEventWaitNs = 5'000'000;

}  // namespace

UcxComm::UcxComm(const Options& o, const Logger* log)
    : options_(o),
      log_(log),
      rank_(o.rank),
      size_(o.world_size),
      op_timeout_s_(o.op_timeout_s),
      lazy_(o.world_size > o.connect_all_max) {}

Result<std::unique_ptr<UcxComm>> UcxComm::Connect(const Options& options, const Logger* log,
                                                  const std::string& token,
                                                  FileSystem* rendezvous_fs) {
  CAIRN_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<UcxComm> c(new UcxComm(options, log));
  Lock lk(c->mu_);
  auto book = OpenAddressBook(options, rendezvous_fs, log);
  if (!book.ok()) return book.status().WithContext("rank " + std::to_string(options.rank));
  c->book_ = std::move(*book);
  CAIRN_RETURN_IF_ERROR(c->Init().WithContext("rank " + std::to_string(options.rank)));
  CAIRN_RETURN_IF_ERROR(
      c->Bootstrap(lk, token).WithContext("rank " + std::to_string(options.rank)));
  return c;
}

Status UcxComm::Init() {
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return Status::IOError("ucp_config_read: " + UcsError(st));
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA;
  if (options_.ucx_wait_events) params.features |= UCP_FEATURE_WAKEUP;
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) {
    context_ = nullptr;
    return Status::IOError("ucp_init: " + UcsError(st));
  }
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  st = ucp_worker_create(context_, &wp, &worker_);
  if (st != UCS_OK) {
    worker_ = nullptr;
    return Status::IOError("ucp_worker_create: " + UcsError(st));
  }
  if (options_.ucx_wait_events) {
    int fd = -1;
    st = ucp_worker_get_efd(worker_, &fd);
    if (st == UCS_OK) {
      efd_ = fd;
    } else if (log_) {
      log_->Info("UCX gives no event fd (" + UcsError(st) + "): idle waits poll");
    }
  }
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  st = ucp_worker_get_address(worker_, &addr, &len);
  if (st != UCS_OK) return Status::IOError("ucp_worker_get_address: " + UcsError(st));
  address_.assign(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(worker_, addr);
  peers_.resize(static_cast<size_t>(size_));
  address_read_.assign(static_cast<size_t>(size_), 0);
  for (int p = 0; p < size_; ++p) {
    peers_[static_cast<size_t>(p)] = std::make_unique<Peer>();
    peers_[static_cast<size_t>(p)]->self = this;
    peers_[static_cast<size_t>(p)]->rank = p;
  }
  peers_[static_cast<size_t>(rank_)]->verified = true;
  auto probe = ProbeListener::Open();
  if (probe.ok()) {
    probe_ = std::move(*probe);
  } else if (log_) {
    log_->Info("no reachability probe (" + probe.status().message() +
               "): after a link failure, peers redial this rank without probing first");
  }
  return Status::OK();
}

std::string UcxComm::Hello() const {
  return token_ + "/" + std::to_string(rank_) + "/" + nonce_ + "/" +
         (probe_ ? probe_->addresses() : std::string()) + "/" + address_;
}

UcxComm::~UcxComm() {
  closing_ = true;
  Lock lk(mu_);
  // First of all: a peer's redial probe is refused from now on, so a collective waiting on
  // this rank gives it up as gone (UcxGroup::Mend) instead of redialing a rank that is
  // leaving (found under ASan, where closing takes seconds).
  probe_.reset();
  if (!worker_) {  // Connect failed before the worker existed
    if (context_) ucp_cleanup(context_);
    if (book_) book_->Withdraw();
    return;
  }
  // Close every endpoint at once (a flush needs the peers to progress too, and they are
  // closing theirs at the same time); failed peers are closed by force.
  std::vector<UcxRequest> closing;
  for (auto& p : peers_)
    if (p) CloseRetired(*p, 0);
  for (auto& p : peers_) {
    if (!p || !p->ep) continue;
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    // (and those still connecting after a redial, or gone silent: nothing would flush them)
    prm.flags = p->error.load() || p->redial || p->silent ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    auto req = Own(ucp_ep_close_nbx(p->ep, &prm), p->rank, "close");
    if (req.ok() && *req) closing.push_back(std::move(*req));
    p->ep = nullptr;
  }
  const int64_t deadline = NowNanos() + 5'000'000'000;
  bool done = false;
  while (!done) {
    ProgressLocked();
    done = true;
    for (const UcxRequest& r : closing)
      done = done && ucp_request_check_status(r.req_) != UCS_INPROGRESS;
    if (!done && NowNanos() > deadline) break;
  }
  for (auto& p : peers_)
    if (p && p->redial && ucp_request_check_status(p->redial) != UCS_INPROGRESS) {
      FreeLocked(p->redial);
      p->redial = nullptr;
    }
  if (done && abandoned_.load() > 0) {
    // UCX 1.18 aborts in ucp_cleanup ("destroying inuse region") under a send that was
    // abandoned in flight; the worker and context are left to process exit instead.
    for (UcxRequest& r : closing) Free(r);
    if (log_)
      log_->Warning(std::to_string(abandoned_.load()) +
                    " UCX send(s) to failed peers never completed; leaving UCX's worker to "
                    "process exit");
  } else if (done) {
    for (UcxRequest& r : closing) Free(r);
    if (worker_) ucp_worker_destroy(worker_);
    if (context_) ucp_cleanup(context_);
    orphans_.clear();  // (none: an orphan counts as abandoned)
  } else {
    // Destroying the worker under an endpoint still closing aborts the process inside
    // UCX; leaving them to process exit is the lesser evil.
    for (UcxRequest& r : closing) (void)r.release();
    if (log_) log_->Warning("UCX endpoints did not close within 5 s; leaving them to process exit");
  }
  if (!orphans_.empty()) {
    // Their receives live on in the worker left to process exit: so do they (reachable
    // from here, not a leak).
    static Mutex graveyard_mu;
    static auto* graveyard = new std::vector<std::unique_ptr<ProbedBuffers>>();
    MutexLock g(graveyard_mu);
    for (auto& o : orphans_) graveyard->push_back(std::move(o));
    orphans_.clear();
  }
  if (book_) book_->Withdraw();
}

std::string UcxComm::Who(int peer) const {
  return "rank " + std::to_string(rank_) + " -> rank " + std::to_string(peer);
}

void UcxComm::OnPeerError(void* arg, ucp_ep_h ep,
                          ucs_status_t status) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  auto* p = static_cast<Peer*>(arg);
  // Called from ucp_worker_progress, with mu_ held. An endpoint this rank already replaced
  // (Redial, a restarted peer) says nothing about the current one.
  if (ep != p->ep) return;
  int expected = 0;
  if (p->error.compare_exchange_strong(expected, static_cast<int>(status)) && p->self->log_ &&
      !p->self->closing_.load())
    p->self->log_->Warning("connection to rank " + std::to_string(p->rank) +
                           " failed: " + UcsError(status));
}

bool UcxComm::peer_failed(int peer) const {
  return peer >= 0 && peer < size_ && peers_[static_cast<size_t>(peer)]->error.load() != 0;
}

bool UcxComm::peer_link_lost(int peer) const {
  if (peer < 0 || peer >= size_) return false;
  const Peer& p = *peers_[static_cast<size_t>(peer)];
  int error = p.error.load();
  if (error == 0) error = p.request_error.load();
  return error == UCS_ERR_ENDPOINT_TIMEOUT || error == UCS_ERR_UNREACHABLE;
}

std::string UcxComm::peer_incarnation(int peer) const {
  if (peer < 0 || peer >= size_) return {};
  Lock lk(mu_);
  return peers_[static_cast<size_t>(peer)]->nonce;
}

void UcxComm::Progress() {
  Lock lk(mu_);
  for (int i = 0; i < 64 && ProgressLocked() != 0; ++i) {
  }
}

unsigned UcxComm::ProgressLocked() {
  const unsigned n = ucp_worker_progress(worker_);
  if (n != 0) progressed_.fetch_add(1, std::memory_order_relaxed);
  return n;
}

void UcxComm::Idle(Lock& lk, int& spins, int64_t deadline_ns,
                   int64_t most_ns) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  if (efd_ < 0 || spins < kBusySpins) {
    lk.Unlock();
    Backoff(spins);
    lk.Lock();
    return;
  }
  // Armed, the worker's event fd turns readable on the next event of any of its
  // transports (a message, a send that can go on, a connection). The arm fails busy when
  // events are already waiting: the caller progresses again at once.
  const ucs_status_t st = ucp_worker_arm(worker_);
  if (st == UCS_ERR_BUSY) return;
  const uint64_t seen = progressed_.load(std::memory_order_relaxed);
  lk.Unlock();
  if (st != UCS_OK || progressed_.load(std::memory_order_relaxed) != seen) {
    // No arm, or another thread progressed the worker since it and may have taken this
    // wait's event (a completion it was waiting for): look again after the usual short sleep.
    Backoff(spins);
  } else {
    // Another thread's progress can also take the event while this one sleeps; the wait
    // is bounded, so such a completion is seen at the latest `most_ns` later.
    const int64_t left = std::max<int64_t>(0, deadline_ns - NowNanos());
    const int64_t ns = std::min(most_ns, left) + 1000;
    timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    pollfd p{efd_, POLLIN, 0};
    (void)ppoll(&p, 1, &ts, nullptr);
  }
  lk.Lock();
}

Status UcxComm::WaitRequest(Lock& lk, UcxRequest& request, int peer, double timeout_s,
                            const char* what, bool* abandoned,
                            std::optional<uint64_t> epoch) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  if (abandoned) *abandoned = false;
  if (!request) return Status::OK();
  const int64_t deadline = NowNanos() + static_cast<int64_t>(timeout_s * 1e9);
  int spins = 0;
  ucs_status_t st;
  while ((st = ucp_request_check_status(request.req_)) == UCS_INPROGRESS) {
    if (ProgressLocked() == 0)
      Idle(lk, spins, deadline, kEventWaitNs);
    else
      spins = 0;
    const bool replaced = epoch && peer_epoch(peer) != *epoch;
    if (peer_failed(peer) || replaced || NowNanos() > deadline) {
      if (!peer_failed(peer) && !replaced) SetSilent(peer, true);
      const bool lost = Free(request);  // cancels it
      if (abandoned) *abandoned = lost;
      if (peer_failed(peer))
        return Status::Unavailable(
            std::string(what) + " " + Who(peer) + ": peer failed (" +
            UcsError(static_cast<ucs_status_t>(peers_[static_cast<size_t>(peer)]->error.load())) +
            ")");
      if (replaced)
        return Status::Unavailable(std::string(what) + " " + Who(peer) +
                                   ": the endpoint was replaced (a redial) while it waited");
      return Status::Unavailable(std::string(what) + " " + Who(peer) + ": timed out after " +
                                 std::to_string(timeout_s) + " s");
    }
  }
  Free(request);
  const bool known = peer >= 0 && peer < size_ && peers_[static_cast<size_t>(peer)];
  if (known) peers_[static_cast<size_t>(peer)]->request_error = static_cast<int>(st);
  if (st != UCS_OK)
    return Status::Unavailable(std::string(what) + " " + Who(peer) + ": " + UcsError(st));
  SetSilent(peer, false);
  return Status::OK();
}

Status UcxComm::Send(int peer, uint64_t tag, const void* buf, size_t n) {
  PendingSend p = StartSend(peer, tag, buf, n);
  return FinishSend(p);
}

Status UcxComm::CheckPeer(int peer, const char* what) const CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  if (peer < 0 || peer >= size_ || peer == rank_)
    return Status::InvalidArgument(std::string(what) + " to rank " + std::to_string(peer) +
                                   ": no such peer");
  const Peer& p = *peers_[static_cast<size_t>(peer)];
  if (!p.ep && !p.address.empty())  // (read with mu_ held by every caller)
    return Status::Unavailable(std::string(what) + " " + Who(peer) +
                               ": no connection (a redial found the link still down)");
  if (!p.ep)
    return Status::InvalidArgument(std::string(what) + " to rank " + std::to_string(peer) +
                                   ": no such peer");
  if (peer_failed(peer))
    return Status::Unavailable(std::string(what) + " " + Who(peer) + ": peer failed");
  return Status::OK();
}

Result<UcxRequest> UcxComm::Own(void* request, int peer, const char* what) {
  if (UCS_PTR_IS_ERR(request))
    return Status::Unavailable(std::string(what) + " " + Who(peer) + ": " +
                               UcsError(UCS_PTR_STATUS(request)));
  if (request == nullptr) return UcxRequest();  // completed at once
  requests_.fetch_add(1, std::memory_order_relaxed);
  return UcxRequest(this, request);
}

bool UcxComm::Free(UcxRequest& request) {
  return request && FreeLocked(request.release());
}

bool UcxComm::FreeLocked(void* request) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  return CancelAndFreeLocked({request}) > 0;
}

int UcxComm::CancelAndFreeLocked(const std::vector<void*>& reqs) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  auto in_flight = [&]() CAIRN_REQUIRES(mu_) {
    for (void* q : reqs)
      if (ucp_request_check_status(q) == UCS_INPROGRESS) return true;
    return false;
  };
  for (void* q : reqs)
    if (ucp_request_check_status(q) == UCS_INPROGRESS) ucp_request_cancel(worker_, q);
  const int64_t give_up = NowNanos() + 1'000'000'000;
  while (in_flight() && NowNanos() < give_up) ProgressLocked();
  // A send cannot be cancelled: to a peer that died without an error UCX noticed (shm),
  // it stays in flight, holding the registration of the memory it sends from. Nor can a
  // receive UCX already matched (a rendezvous whose data is still coming).
  int lost = 0;
  for (void* q : reqs) {
    if (ucp_request_check_status(q) == UCS_INPROGRESS) {
      abandoned_.fetch_add(1, std::memory_order_relaxed);
      ++lost;
    }
    ucp_request_free(q);
    requests_.fetch_sub(1, std::memory_order_relaxed);
  }
  return lost;
}

void UcxComm::GiveUp(const std::vector<UcxRequest*>& requests) {
  Lock lk(mu_);
  std::vector<void*> reqs;
  for (UcxRequest* r : requests)
    if (r && *r) reqs.push_back(r->release());
  CancelAndFreeLocked(reqs);
}

void UcxComm::SetSilent(int peer, bool silent) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  if (peer >= 0 && peer < size_ && peers_[static_cast<size_t>(peer)])
    peers_[static_cast<size_t>(peer)]->silent = silent;
}

UcxRequest& UcxRequest::operator=(UcxRequest&& o) noexcept {
  if (this != &o) {
    UcxRequest old(std::move(*this));
    comm_ = std::exchange(o.comm_, nullptr);
    req_ = std::exchange(o.req_, nullptr);
  }
  return *this;
}

UcxRequest::~UcxRequest() {
  if (!req_) return;
  UcxComm* comm = comm_;
  MutexLock lk(comm->mu_);
  comm->FreeLocked(release());
}

UcxComm::PendingSend UcxComm::Started(int peer, void* request, const char* what) {
  PendingSend p;
  p.peer = peer;
  auto r = Own(request, peer, what);
  if (r.ok())
    p.request = std::move(*r);
  else
    p.status = r.status();
  return p;
}

namespace {

// A UCX iov datatype transfer of `frame`'s buffers: the token, then `n` bytes at `buf`.
size_t Frame(TokenFrame& frame, const void* token, size_t token_bytes, void* buf, size_t n,
             ucp_request_param_t* prm) {
  frame.iov[0] = {const_cast<void*>(token), token_bytes};
  frame.iov[1] = {buf, n};
  prm->op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
  prm->datatype = ucp_dt_make_iov();
  return n > 0 ? 2 : 1;
}

}  // namespace

void UcxComm::Refused(int peer, uint64_t tag) {
  const uint64_t n = refused_.fetch_add(1, std::memory_order_relaxed) + 1;
  const int64_t now = NowNanos();
  if (log_ && now - refusal_logged_ns_ > 10'000'000'000) {
    refusal_logged_ns_ = now;
    log_->Warning("dropped a message tagged as from rank " + std::to_string(peer) + " on channel " +
                  std::to_string(tag >> 56) + " that did not carry the job token (" +
                  std::to_string(n) + " so far): a process outside the job reached this rank");
  }
}

UcxComm::PendingSend UcxComm::StartSend(int peer, uint64_t tag, const void* buf, size_t n,
                                        Auth auth) {
  Lock lk(mu_);
  if (Status st = EnsurePeer(lk, peer, "send"); !st.ok()) return PendingSend{{}, {}, peer, st};
  ucp_request_param_t prm{};
  std::unique_ptr<TokenFrame> frame;
  const void* data = buf;
  size_t count = n;
  if (auth == Auth::kToken) {
    frame = std::make_unique<TokenFrame>();
    count = Frame(*frame, token_.data(), token_.size(), const_cast<void*>(buf), n, &prm);
    data = frame->iov;
  }
  PendingSend p =
      Started(peer, ucp_tag_send_nbx(peers_[static_cast<size_t>(peer)]->ep, data, count, tag, &prm),
              "send");
  if (p.request) p.frame = std::move(frame);  // UCX reads the iov until the send completes
  return p;
}

Status UcxComm::FinishSend(PendingSend& send, double timeout_s) {
  if (!send.status.ok()) return send.status;
  Lock lk(mu_);
  return WaitRequest(lk, send.request, send.peer, timeout_s < 0 ? op_timeout_s_ : timeout_s,
                     "send");
}

UcxComm::PendingRecv UcxComm::StartRecv(int peer, uint64_t tag, void* buf, size_t n, Auth auth) {
  Lock lk(mu_);
  PendingRecv r;
  r.peer = peer;
  // An endpoint to the sender reports its failure while we wait (lazy jobs make it now).
  if (lazy_) {
    r.status = EnsurePeer(lk, peer, "receive");
    if (!r.status.ok()) return r;
  }
  r.tag = tag;
  ucp_request_param_t prm{};
  void* data = buf;
  size_t count = n;
  if (auth == Auth::kToken) {
    // The sender's token lands in frame->received; an unfilled one never matches.
    r.frame = std::make_unique<TokenFrame>();
    r.frame->received.assign(token_.size(), '\0');
    count = Frame(*r.frame, r.frame->received.data(), r.frame->received.size(), buf, n, &prm);
    data = r.frame->iov;
  }
  auto req = Own(ucp_tag_recv_nbx(worker_, data, count, tag, ~uint64_t{0}, &prm), peer, "receive");
  if (req.ok())
    r.request = std::move(*req);
  else
    r.status = req.status();
  return r;
}

Status UcxComm::FinishRecv(PendingRecv& recv, double timeout_s) {
  if (!recv.status.ok()) return recv.status;
  Lock lk(mu_);
  CAIRN_RETURN_IF_ERROR(WaitRequest(lk, recv.request, recv.peer, timeout_s, "receive"));
  if (recv.frame && recv.frame->received != token_) {
    Refused(recv.peer, recv.tag);
    return Status::FailedPrecondition("receive " + Who(recv.peer) +
                                      ": the message did not carry the job token; refused (the "
                                      "receive buffer's bytes are not the sender's)");
  }
  if (!Verified(lk, recv.peer))
    return Status::FailedPrecondition("receive " + Who(recv.peer) +
                                      ": the sender never presented the job token; refused");
  return Status::OK();
}

Status UcxComm::ProbeReceive(Lock& lk, uint64_t tag, uint64_t mask, int peer, double timeout_s,
                             RecvWait wait, uint64_t* sender_tag,
                             std::string* out) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  const int64_t deadline = NowNanos() + static_cast<int64_t>(timeout_s * 1e9);
  int spins = 0;
  int64_t failed_at = 0;  // when the peer was first seen failed (0: not yet)
  for (;;) {
    ucp_tag_recv_info_t info{};
    ucp_tag_message_h msg = ucp_tag_probe_nb(worker_, tag, mask, 1, &info);
    if (msg) {
      if (sender_tag) *sender_tag = info.sender_tag;
      const int from = peer >= 0 ? peer : static_cast<int>((info.sender_tag >> 32) & 0xffffff);
      // Every message but a hello starts with the job token: it lands apart from the bytes.
      const bool hello = (info.sender_tag >> 56) == kHello.id;
      const bool framed = !hello && info.length >= token_.size();
      // On the heap: UCX cannot cancel a matched receive, so one given up below may still
      // be written into (the rest of a rendezvous arriving). Into a stack frame, that
      // crashed ranks under TSan and load (tests/RELIABILITY.md, "allgather #20").
      auto buf = std::make_unique<ProbedBuffers>();
      TokenFrame& frame = buf->frame;
      buf->bytes.assign(framed ? info.length - token_.size() : info.length, '\0');
      ucp_request_param_t prm{};
      void* data = buf->bytes.data();
      size_t count = buf->bytes.size();
      if (framed) {
        frame.received.assign(token_.size(), '\0');
        count = Frame(frame, frame.received.data(), frame.received.size(), buf->bytes.data(),
                      buf->bytes.size(), &prm);
        data = frame.iov;
      }
      CAIRN_ASSIGN_OR_RETURN(
          UcxRequest req,
          Own(ucp_tag_msg_recv_nbx(worker_, data, count, msg, &prm), from, "receive"));
      // Matched, its data is on the way and UCX cannot cancel the receive: given up, the
      // message would be gone for good (the sender resends only over a replaced endpoint).
      // So it waits as long as an operation may (a rendezvous under TSan and load took
      // over 5 s: "allgather #20", tests/RELIABILITY.md), unless the endpoint is replaced
      // or the peer fails; over transports that cannot report a dead peer, 5 s.
      const bool known = from >= 0 && from < size_ && peers_[static_cast<size_t>(from)];
      const bool reports = known && peers_[static_cast<size_t>(from)]->reports_errors;
      bool abandoned = false;
      Status waited =
          WaitRequest(lk, req, from, std::max(timeout_s, reports ? op_timeout_s_ : 5.0), "receive",
                      &abandoned, known ? std::optional(peer_epoch(from)) : std::nullopt);
      if (abandoned) orphans_.push_back(std::move(buf));
      CAIRN_RETURN_IF_ERROR(waited);
      *out = std::move(buf->bytes);
      if (!hello) {
        // Without the token, dropped, and the probe goes on for the real one.
        if (!framed || frame.received != token_) {
          Refused(from, info.sender_tag);
          if (sender_tag) *sender_tag = 0;
          if (NowNanos() > deadline)
            return Status::Unavailable(
                "receive " + (peer >= 0 ? Who(peer) : std::string("from any rank")) +
                ": nothing with the job token arrived within " + std::to_string(timeout_s) + " s");
          continue;
        }
        if (!Verified(lk, from))
          return Status::FailedPrecondition("receive " + Who(from) +
                                            ": the sender never presented the job token; refused");
      }
      return Status::OK();
    }
    const bool idle = ProgressLocked() == 0;
    if (peer_failed(peer)) {
      // The peer's last message can come in after the news of its exit: UCX's tcp
      // transport may carry the two on different connections of the pair (the news from a
      // send of ours that failed, the message on the peer's own connection), and a rank
      // that sent its last collective message and left is not a failure of that message.
      // So the worker is progressed and probed a while longer before the failure is
      // reported (CI, 2026-11-29: MultiNodeLoss/group1's flush failed on every odd rank,
      // "broadcast #5: receive rank 1 -> rank 0: peer failed", after rank 0 had committed
      // and left; rank 1 then warned at exit of an unmatched message: the broadcast had
      // arrived). Only a failed peer pays it, once per receive; the deadline, a cancel and
      // the idle wait below hold meanwhile as before.
      const int64_t now = NowNanos();
      if (failed_at == 0) failed_at = now;
      if (now - failed_at >= kLastWordsNs)
        return Status::Unavailable(
            "receive " + Who(peer) + ": peer failed (" +
            UcsError(static_cast<ucs_status_t>(peers_[static_cast<size_t>(peer)]->error.load())) +
            ")");
    }
    if (NowNanos() > deadline)
      return Status::Unavailable("receive " +
                                 (peer >= 0 ? Who(peer) : std::string("from any rank")) +
                                 ": nothing arrived within " + std::to_string(timeout_s) + " s");
    if (wait.cancel && wait.cancel->load(std::memory_order_relaxed))
      return Status::Unavailable("receive " +
                                 (peer >= 0 ? Who(peer) : std::string("from any rank")) +
                                 ": given up (closing)");
    if (wait.gentle && !(idle && efd_ >= 0)) {
      // A service loop waits here most of the time: it polls gently, so that it never
      // competes with a transfer in flight for the worker's lock or for a core.
      lk.Unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(500));
      lk.Lock();
    } else if (idle) {
      // A gentle wait with nothing to progress sleeps until something arrives, at once.
      if (wait.gentle) spins = kBusySpins;
      Idle(lk, spins, deadline, wait.gentle ? kGentleEventWaitNs : kEventWaitNs);
    }
  }
}

Result<std::string> UcxComm::Recv(int peer, uint64_t tag, double timeout_s, RecvWait wait) {
  Lock lk(mu_);
  // An endpoint to the sender reports its failure while we wait (lazy jobs make it now).
  if (lazy_) CAIRN_RETURN_IF_ERROR(EnsurePeer(lk, peer, "receive"));
  std::string out;
  CAIRN_RETURN_IF_ERROR(ProbeReceive(lk, tag, ~uint64_t{0}, peer, timeout_s, wait, nullptr, &out));
  return out;
}

Result<UcxComm::Incoming> UcxComm::RecvAny(Channel channel, double timeout_s, int source) {
  Lock lk(mu_);
  Incoming in;
  uint64_t sender_tag = 0;
  const uint64_t tag = MakeTag(channel, source >= 0 ? source : 0, 0);
  const uint64_t mask = MakeTag(Channel{0xff}, source >= 0 ? 0xffffff : 0, 0);
  CAIRN_RETURN_IF_ERROR(
      ProbeReceive(lk, tag, mask, -1, timeout_s, RecvWait{.gentle = true}, &sender_tag, &in.bytes));
  in.source = static_cast<int>((sender_tag >> 32) & 0xffffff);
  in.seq = static_cast<uint32_t>(sender_tag);
  return in;
}

bool UcxComm::Arrived(PendingRecv& recv, double timeout_s) {
  if (!recv.status.ok() || !recv.request) return true;
  return Await(recv.request, recv.peer, timeout_s);
}

bool UcxComm::Sent(PendingSend& send, double timeout_s) {
  if (!send.status.ok() || !send.request) return true;
  return Await(send.request, -1, timeout_s);
}

bool UcxComm::Await(UcxRequest& request, int peer, double timeout_s) {
  const int64_t deadline = NowNanos() + static_cast<int64_t>(timeout_s * 1e9);
  int spins = 0;
  Lock lk(mu_);
  for (;;) {
    if (ucp_request_check_status(request.req_) != UCS_INPROGRESS || peer_failed(peer)) return true;
    if (NowNanos() > deadline) return false;
    if (ProgressLocked() == 0)
      Idle(lk, spins, deadline, kEventWaitNs);
    else
      spins = 0;
  }
}

Result<std::unique_ptr<UcxComm::MemRegion>> UcxComm::Register(void* p, size_t n) {
  Lock lk(mu_);
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = p;
  mp.length = n;
  ucp_mem_h memh = nullptr;
  ucs_status_t st = ucp_mem_map(context_, &mp, &memh);
  if (st != UCS_OK)
    return Status::IOError("ucp_mem_map of " + std::to_string(n) + " bytes: " + UcsError(st));
  void* packed = nullptr;
  size_t size = 0;
  st = ucp_rkey_pack(context_, memh, &packed, &size);
  if (st != UCS_OK) {
    ucp_mem_unmap(context_, memh);
    return Status::IOError("ucp_rkey_pack: " + UcsError(st));
  }
  std::string rkey(static_cast<const char*>(packed), size);
  ucp_rkey_buffer_release(packed);
  return std::unique_ptr<MemRegion>(new MemRegion(this, memh, p, std::move(rkey)));
}

UcxComm::MemRegion::~MemRegion() {
  Lock lk(comm_->mu_);
  ucp_mem_unmap(comm_->context_, memh_);
}

Result<std::unique_ptr<UcxComm::RemoteKey>> UcxComm::UnpackRemoteKey(int peer,
                                                                     const std::string& packed) {
  Lock lk(mu_);
  CAIRN_RETURN_IF_ERROR(EnsurePeer(lk, peer, "remote key"));
  ucp_rkey_h k = nullptr;
  ucs_status_t st = ucp_ep_rkey_unpack(peers_[static_cast<size_t>(peer)]->ep, packed.data(), &k);
  if (st != UCS_OK) return Status::IOError("ucp_ep_rkey_unpack " + Who(peer) + ": " + UcsError(st));
  return std::unique_ptr<RemoteKey>(new RemoteKey(this, k));
}

UcxComm::RemoteKey::~RemoteKey() {
  Lock lk(comm_->mu_);
  ucp_rkey_destroy(rkey_);
}

UcxComm::PendingSend UcxComm::StartPut(int peer, const void* src, size_t n, uint64_t remote_addr,
                                       const RemoteKey& key) {
  Lock lk(mu_);
  if (Status st = CheckPeer(peer, "put"); !st.ok()) return PendingSend{{}, {}, peer, st};
  ucp_request_param_t prm{};
  return Started(
      peer,
      ucp_put_nbx(peers_[static_cast<size_t>(peer)]->ep, src, n, remote_addr, key.rkey_, &prm),
      "put");
}

Status UcxComm::Flush(int peer, double timeout_s) {
  Lock lk(mu_);
  CAIRN_RETURN_IF_ERROR(CheckPeer(peer, "flush"));
  ucp_request_param_t prm{};
  CAIRN_ASSIGN_OR_RETURN(
      UcxRequest req,
      Own(ucp_ep_flush_nbx(peers_[static_cast<size_t>(peer)]->ep, &prm), peer, "flush"));
  return WaitRequest(lk, req, peer, timeout_s, "flush");
}

uint64_t UcxComm::peer_epoch(int peer) const {
  return peers_.at(static_cast<size_t>(peer))->epoch.load();
}

void UcxComm::CloseEndpoint(Lock& lk, Peer& peer) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  (void)lk;
  if (!peer.ep) return;
  CloseByForce(peer.ep, peer.rank);
  peer.ep = nullptr;
}

void UcxComm::CloseByForce(ucp_ep_h ep, int rank) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
  auto req = Own(ucp_ep_close_nbx(ep, &prm), rank, "close");
  if (req.ok() && *req) {
    while (ucp_request_check_status(req->req_) == UCS_INPROGRESS) ProgressLocked();
    Free(*req);
  }
}

void UcxComm::RetireEndpoint(Peer& peer) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  if (peer.ep || peer.redial) peer.retired.push_back({peer.ep, peer.redial, NowNanos()});
  peer.ep = nullptr;
  peer.redial = nullptr;
}

void UcxComm::CloseRetired(Peer& peer, int64_t older_than_ns) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  const int64_t now = NowNanos();
  for (auto it = peer.retired.begin(); it != peer.retired.end();) {
    if (now - it->at < older_than_ns) {
      ++it;
      continue;
    }
    if (it->ep) CloseByForce(it->ep, peer.rank);  // completes its redial hello as cancelled
    if (it->redial) FreeLocked(it->redial);
    it = peer.retired.erase(it);
  }
}

Status UcxComm::Greet(Lock& lk, int p, const std::string& address,
                      const std::string& nonce) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  Peer& peer = *peers_[static_cast<size_t>(p)];
  DropEndpoint(lk, peer);  // an endpoint to an earlier incarnation, or a failed one, if any
  peer.error = 0;
  peer.request_error = 0;
  CAIRN_RETURN_IF_ERROR(Connected(p, address));
  peer.nonce = nonce;
  peer.address = address;
  const std::string hello = Hello();
  ucp_request_param_t prm{};
  CAIRN_ASSIGN_OR_RETURN(UcxRequest req,
                         Own(ucp_tag_send_nbx(peer.ep, hello.data(), hello.size(),
                                              MakeTag(kHello, rank_, kJoinHello), &prm),
                             p, "hello"));
  CAIRN_RETURN_IF_ERROR(WaitRequest(lk, req, p, 5.0, "hello"));
  peer.connected_at = NowNanos();
  return Status::OK();
}

Status UcxComm::Reconnect(Lock& lk, int p, const std::string& nonce,
                          std::string address) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  Peer& peer = *peers_[static_cast<size_t>(p)];
  std::string file_nonce;
  // The restarted peer wrote its address file before greeting us; allow for a slow reader.
  for (int attempt = 0; address.empty(); ++attempt) {
    Status rs = ReadAddress(p, &address, &file_nonce);
    if (!rs.ok() && (rs.code() != StatusCode::kNotFound || attempt > 100)) return rs;
    if (!rs.ok() || file_nonce != nonce) address.clear();
    if (!address.empty()) break;
    if (attempt > 100)
      return Status::Unavailable("rank " + std::to_string(p) +
                                 " greeted us, but its address file does not match");
    lk.Unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    lk.Lock();
  }
  CAIRN_RETURN_IF_ERROR(Greet(lk, p, address, nonce));
  peer.epoch.fetch_add(1);
  if (log_) log_->Info("rank " + std::to_string(p) + " restarted; reconnected to it");
  return Status::OK();
}

void UcxComm::DropEndpoint(Lock& lk, Peer& peer) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  CloseEndpoint(lk, peer);  // by force: completes what is in flight on it as cancelled
  if (peer.redial) {
    FreeLocked(peer.redial);
    peer.redial = nullptr;
  }
}

bool UcxComm::Reachable(int p, double timeout_s) {
  if (p < 0 || p >= size_ || p == rank_) return false;
  std::string probe;
  {
    Lock lk(mu_);
    probe = peers_[static_cast<size_t>(p)]->hello_probe;
  }
  return probe.empty() || cairn::Reachable(probe, timeout_s);
}

Status UcxComm::Redial(int p, double timeout_s) {
  if (p < 0 || p >= size_ || p == rank_)
    return Status::InvalidArgument("redial rank " + std::to_string(p) + ": no such peer");
  Peer& peer = *peers_[static_cast<size_t>(p)];
  std::string probe;
  {
    Lock lk(mu_);
    if (peer.address.empty())
      return Status::FailedPrecondition("redial " + Who(p) + ": never connected to it");
    probe = peer.hello_probe;
  }
  // No UCX endpoint is made while the peer's host does not answer (see reachability.h).
  const Reach reach = probe.empty() ? Reach::kAnswered : Probe(probe, timeout_s);
  if (reach == Reach::kRefused)
    return Status::FailedPrecondition("redial " + Who(p) + ": its host (" + probe +
                                      ") refused the handshake: the process is gone");
  if (reach == Reach::kSilent)
    return Status::Unavailable("redial " + Who(p) + ": its host (" + probe +
                               ") did not answer a TCP handshake within " +
                               std::to_string(timeout_s) + " s; the link is still down");
  Lock lk(mu_);
  // The peer restarted (its hello carried another nonce): the address this rank knows is
  // the dead incarnation's, so connect to the greeter instead.
  if (!peer.hello_address.empty() && !peer.hello_nonce.empty() && peer.hello_nonce != peer.nonce) {
    if (peer.redial) {
      FreeLocked(peer.redial);
      peer.redial = nullptr;
    }
    Status st = Reconnect(lk, p, peer.hello_nonce, peer.hello_address);
    if (!st.ok()) return Status::Unavailable("redial " + Who(p) + ": " + st.message());
    peer.connected_at = NowNanos();
    return Status::OK();
  }
  // The peer redialed this rank meanwhile (both ends of a link tend to at once): its fresh
  // connection is as good as one this rank would make, and replacing it would cancel what
  // is in flight on it.
  if (!peer.redial && peer.ep && !peer_failed(p) &&
      NowNanos() - peer.connected_at < kFreshEndpointNs)
    return Status::OK();
  if (!peer.redial || peer_failed(p) || NowNanos() - peer.redial_at > kRedialRefreshNs)
    CAIRN_RETURN_IF_ERROR(StartRedial(p));
  return AwaitRedial(lk, p, timeout_s);
}

Status UcxComm::StartRedial(int p) {
  Peer& peer = *peers_[static_cast<size_t>(p)];
  // The old endpoint is retired, not closed: closing it would reset the connection the
  // peer's endpoint to this rank may share, and fail what is in flight there.
  RetireEndpoint(peer);
  peer.error = 0;
  peer.request_error = 0;
  Status st = Connected(p, peer.address, /*may_fall_back=*/false);
  if (!st.ok()) return Status::Unavailable("redial " + Who(p) + ": " + st.message());
  peer.redial_hello = Hello();
  ucp_request_param_t prm{};
  void* r = ucp_tag_send_nbx(peer.ep, peer.redial_hello.data(), peer.redial_hello.size(),
                             MakeTag(kHello, rank_, kRedialHello), &prm);
  if (UCS_PTR_IS_ERR(r))
    return Status::Unavailable("redial " + Who(p) + ": " + UcsError(UCS_PTR_STATUS(r)));
  if (r != nullptr) {
    requests_.fetch_add(1, std::memory_order_relaxed);
    peer.redial = r;
    peer.redial_at = NowNanos();
  }
  return Status::OK();
}

Status UcxComm::AwaitRedial(Lock& lk, int p, double timeout_s) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  Peer& peer = *peers_[static_cast<size_t>(p)];
  const int64_t deadline = NowNanos() + static_cast<int64_t>(timeout_s * 1e9);
  int spins = 0;
  for (;;) {
    // Another thread may have finished or replaced the attempt while the lock was free.
    const ucs_status_t st = peer.redial ? ucp_request_check_status(peer.redial) : UCS_OK;
    if (st != UCS_INPROGRESS) {
      if (peer.redial) FreeLocked(peer.redial);
      peer.redial = nullptr;
      if (st != UCS_OK || peer_failed(p))
        return Status::Unavailable(
            "redial " + Who(p) + ": " +
            UcsError(st != UCS_OK ? st : static_cast<ucs_status_t>(peer.error.load())));
      peer.epoch.fetch_add(1);
      peer.connected_at = NowNanos();
      if (log_) log_->Info("connection to rank " + std::to_string(p) + " re-established");
      return Status::OK();
    }
    if (peer_failed(p))
      return Status::Unavailable("redial " + Who(p) + ": " +
                                 UcsError(static_cast<ucs_status_t>(peer.error.load())));
    if (NowNanos() > deadline)
      return Status::Unavailable("redial " + Who(p) + ": no connection within " +
                                 std::to_string(timeout_s) + " s (the link is still down?)");
    if (ProgressLocked() == 0) Idle(lk, spins, deadline, kEventWaitNs);
  }
}

namespace {

// A hello: "<token>/<rank>/<nonce>/<probe>/<address>" (probe: where its ProbeListener
// listens, perhaps empty; the address is raw bytes, last). False when it does not carry
// `token`.
bool ParseHello(const std::string& got, const std::string& token, std::string* nonce,
                std::string* probe, std::string* address) {
  if (got.size() <= kTokenHexBytes || got.compare(0, kTokenHexBytes, token) != 0 ||
      got[kTokenHexBytes] != '/')
    return false;
  const size_t r_end = got.find('/', kTokenHexBytes + 1);
  if (r_end == std::string::npos) return false;
  const size_t n_end = got.find('/', r_end + 1);
  if (n_end == std::string::npos) return false;
  const size_t p_end = got.find('/', n_end + 1);
  if (p_end == std::string::npos) return false;
  *nonce = got.substr(r_end + 1, n_end - r_end - 1);
  *probe = got.substr(n_end + 1, p_end - n_end - 1);
  *address = got.substr(p_end + 1);
  return !nonce->empty() && !address->empty();
}

}  // namespace

bool UcxComm::TakeHello(Lock& lk, int p, const std::string& got, bool redial,
                        bool* restarted) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  *restarted = false;
  std::string nonce, probe, address;
  if (!ParseHello(got, token_, &nonce, &probe, &address)) {
    if (log_)
      log_->Warning("refused a hello claiming to be rank " + std::to_string(p) +
                    ": wrong job token");
    return false;
  }
  Peer& peer = *peers_[static_cast<size_t>(p)];
  peer.verified = true;
  peer.hello_nonce = nonce;
  peer.hello_address = address;
  peer.hello_probe = probe;
  // An endpoint made from an older incarnation's address (a peer that restarted, or an
  // address file read before the peer rewrote it) is replaced by one to the greeter; so is
  // none, where one existed and failed to be remade (a redial to the dead incarnation).
  if ((peer.ep || !peer.address.empty()) && nonce != peer.nonce) {
    Status st = Reconnect(lk, p, nonce, address);
    if (st.ok())
      *restarted = true;
    else if (log_)
      log_->Warning("could not reconnect to restarted rank " + std::to_string(p) + ": " +
                    st.message());
  } else if (peer.ep && redial && !peer.redial &&
             (peer_failed(p) || NowNanos() - peer.connected_at > kFreshEndpointNs)) {
    // The peer replaced its endpoint to this rank after a timeout or failure: ours to it
    // may be stuck the same way (TCP backing off, or failed). Replace it by one to the
    // address it greeted from, with a join hello (which asks nothing back).
    RetireEndpoint(peer);
    Status st = Greet(lk, p, address, nonce);
    if (st.ok()) {
      peer.epoch.fetch_add(1);
      *restarted = true;
      if (log_)
        log_->Info("rank " + std::to_string(p) + " redialed after a failure; reconnected to it");
    } else if (log_) {
      log_->Warning("rank " + std::to_string(p) +
                    " redialed, but reconnecting to it failed: " + st.message());
    }
  }
  return true;
}

bool UcxComm::Verified(Lock& lk, int p) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  if (p < 0 || p >= size_) return false;
  if (peers_[static_cast<size_t>(p)]->verified) return true;
  // Its hello was sent before its other messages on the same endpoint, so it is here.
  std::string got;
  uint64_t sender_tag = 0;
  Status rs = ProbeReceive(lk, MakeTag(kHello, p, 0), ~uint64_t{0}, -1, 0, {}, &sender_tag, &got);
  bool restarted = false;
  return rs.ok() && TakeHello(lk, p, got, false, &restarted);
}

Status UcxComm::EnsurePeer(Lock& lk, int p, const char* what) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  if (p < 0 || p >= size_ || p == rank_) return CheckPeer(p, what);
  Peer& peer = *peers_[static_cast<size_t>(p)];
  if (!lazy_ || (peer.ep && !peer_failed(p))) return CheckPeer(p, what);
  // Connect (or, for a failed peer, reconnect once its address file has changed): to the
  // address its hello carried, else the one in its file, waiting for the file to appear
  // (or change) up to the connect timeout.
  const bool failed = peer.ep != nullptr;
  const int64_t deadline = NowNanos() + static_cast<int64_t>(options_.connect_timeout_s * 1e9);
  std::string last_error, refused;  // the last failure, and the address that gave it
  int wait_ms = 2;
  for (;;) {
    std::string address, nonce;
    if (!peer.hello_address.empty() && peer.hello_nonce != peer.nonce) {
      address = peer.hello_address;
      nonce = peer.hello_nonce;
    } else {
      Status rs = ReadAddress(p, &address, &nonce);
      if (!rs.ok() && rs.code() != StatusCode::kNotFound) return rs;
      if (!rs.ok() || (failed && nonce == peer.nonce) || nonce == refused) address.clear();
    }
    if (!address.empty()) {
      Status st = failed ? Reconnect(lk, p, nonce, address) : Greet(lk, p, address, nonce);
      if (st.ok()) return CheckPeer(p, what);
      last_error = st.message();  // perhaps a dead process's file: wait for a new one
      refused = nonce;
      peer.hello_address.clear();
    }
    if (failed && last_error.empty()) return CheckPeer(p, what);  // it has not restarted
    if (NowNanos() > deadline)
      return Status::Unavailable(std::string(what) + " " + Who(p) + ": rank " + std::to_string(p) +
                                 " never appeared in " + book_->where() + " within " +
                                 std::to_string(options_.connect_timeout_s) + " s" +
                                 (last_error.empty() ? "" : " (last failure: " + last_error + ")"));
    // Gently: on a parallel filesystem every look is a metadata-server operation.
    lk.Unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
    wait_ms = std::min(2 * wait_ms, 200);
    lk.Lock();
    if (peer.ep && !peer_failed(p)) return CheckPeer(p, what);  // another thread connected
  }
}

Status UcxComm::ReadAddress(int peer, std::string* address,
                            std::string* nonce) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  address_read_[static_cast<size_t>(peer)] = 1;
  Status st = book_->Read(peer, address, nonce);
  // A networked filesystem's client reconnecting (ENOTCONN), or holding a handle of the
  // file an earlier incarnation wrote (ESTALE: found by the crash matrix over a GlusterFS
  // volume, restarting a job): the file is read again, as one not written yet is.
  if (TransientFsError(st)) return Status::NotFound(st.message() + " (read again)");
  return st;
}

int UcxComm::addresses_read() const {
  MutexLock lk(mu_);
  int n = 0;
  for (uint8_t r : address_read_) n += r;
  return n;
}

int UcxComm::endpoints() const {
  MutexLock lk(mu_);
  int n = 0;
  for (const auto& p : peers_) n += p && p->ep ? 1 : 0;
  return n;
}

std::vector<int> UcxComm::ServiceHellos() {
  std::vector<int> out;
  Lock lk(mu_);
  for (auto& p : peers_)
    if (!p->retired.empty()) CloseRetired(*p, kRetiredNs);
  for (;;) {
    uint64_t sender_tag = 0;
    std::string got;
    Status rs = ProbeReceive(lk, static_cast<uint64_t>(kHello.id) << 56, uint64_t{0xff} << 56, -1,
                             0, {}, &sender_tag, &got);
    if (sender_tag == 0) break;  // no hello waiting
    if (!rs.ok()) continue;
    const int p = static_cast<int>((sender_tag >> 32) & 0xffffff);
    if (p < 0 || p >= size_ || p == rank_) continue;
    bool restarted = false;
    const bool redial = static_cast<uint32_t>(sender_tag) == kRedialHello;
    if (TakeHello(lk, p, got, redial, &restarted) && restarted) out.push_back(p);
  }
  return out;
}

Status UcxComm::Connected(int peer, const std::string& address, bool may_fall_back) {
  Peer& p = *peers_[static_cast<size_t>(peer)];
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
  ep.err_mode = warned_no_peer_errors_ ? UCP_ERR_HANDLING_MODE_NONE : UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &UcxComm::OnPeerError;
  ep.err_handler.arg = &p;
  ucs_status_t st = ucp_ep_create(worker_, &ep, &p.ep);
  if (st == UCS_ERR_UNREACHABLE && ep.err_mode == UCP_ERR_HANDLING_MODE_PEER && may_fall_back) {
    // UCX 1.13's shared-memory transports cannot report peer failures: connect without
    // that mode; a dead peer then shows up as a timeout instead of an error callback.
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    st = ucp_ep_create(worker_, &ep, &p.ep);
    if (st == UCS_OK && log_ && !warned_no_peer_errors_) {
      warned_no_peer_errors_ = true;
      log_->Info(
          "the selected UCX transports cannot report peer failures; dead peers are "
          "detected by timeouts");
    }
  }
  if (st != UCS_OK) {
    p.ep = nullptr;
    return Status::IOError("ucp_ep_create " + Who(peer) + ": " + UcsError(st));
  }
  p.reports_errors = ep.err_mode == UCP_ERR_HANDLING_MODE_PEER;
  return Status::OK();
}

Status UcxComm::Bootstrap(Lock& lk,
                          const std::string& token_override) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  // A rendezvous on a networked filesystem whose client is reconnecting (a job restarted
  // right after a link came back) answers ENOTCONN for a few seconds, and a rank other than
  // 0 finds no job token until rank 0 has made it: tried again until the connect timeout,
  // as a peer that has not appeared yet is waited for.
  const int64_t join_deadline = NowNanos() + static_cast<int64_t>(options_.connect_timeout_s * 1e9);
  auto joined_or = book_->Join(address_, token_override);
  for (int64_t pause_ms = 100;
       !joined_or.ok() && book_->JoinAgain(joined_or.status()) && NowNanos() < join_deadline;
       pause_ms = std::min<int64_t>(2 * pause_ms, 1000)) {
    if (log_ && pause_ms == 100)
      log_->Info("the rendezvous in " + book_->where() + " failed (" +
                 joined_or.status().ToString() + "); trying again until the connect timeout");
    lk.Unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    lk.Lock();
    joined_or = book_->Join(address_, token_override);
  }
  CAIRN_ASSIGN_OR_RETURN(AddressBook::Joined joined, std::move(joined_or));
  token_ = std::move(joined.token);
  nonce_ = std::move(joined.nonce);
  if (lazy_) {
    if (log_)
      log_->Info("published this rank's address in " + book_->where() +
                 "; connecting to ranks when first talking to them (" + std::to_string(size_) +
                 " ranks > CAIRN_CONNECT_ALL_MAX=" + std::to_string(options_.connect_all_max) +
                 ")");
    return Status::OK();
  }
  const int64_t deadline = NowNanos() + static_cast<int64_t>(options_.connect_timeout_s * 1e9);
  CAIRN_RETURN_IF_ERROR(GreetAll(lk, deadline));
  CAIRN_RETURN_IF_ERROR(AwaitHellos(lk, deadline));
  if (log_)
    log_->Info("connected to " + std::to_string(size_ - 1) + " peers via " + book_->where());
  return Status::OK();
}

Status UcxComm::GreetAll(Lock& lk, int64_t deadline) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  // Read every peer's address and send it a hello with the token; a peer whose hello
  // fails (a stale address of a dead process) is retried when its file changes.
  const auto n = static_cast<size_t>(size_);
  std::vector<std::string> tried(n), last_error(n);
  std::vector<bool> connected(n, false);
  connected[static_cast<size_t>(rank_)] = true;
  for (;;) {
    bool all = true;
    for (int p = 0; p < size_; ++p) {
      const auto k = static_cast<size_t>(p);
      if (connected[k]) continue;
      all = false;
      std::string address, nonce;
      Status rs = ReadAddress(p, &address, &nonce);
      if (rs.code() == StatusCode::kNotFound || (rs.ok() && nonce == tried[k])) continue;
      CAIRN_RETURN_IF_ERROR(rs);
      tried[k] = nonce;
      // Even an endpoint that cannot be created is retried: the file may be a dead
      // process's (a job restarted under the same rendezvous directory), and the live
      // peer rewrites it soon. The timeout error below repeats the last failure.
      Status st = Greet(lk, p, address, nonce);
      if (st.ok()) {
        connected[k] = true;
      } else {
        last_error[k] = st.message();
        if (log_)
          log_->Info("hello to rank " + std::to_string(p) +
                     " failed, will retry when its address file changes: " + st.message());
      }
    }
    if (all) return Status::OK();
    if (NowNanos() > deadline) {
      std::string missing, why;
      for (size_t p = 0; p < n; ++p) {
        if (connected[p]) continue;
        missing += " " + std::to_string(p);
        if (why.empty() && !last_error[p].empty()) why = " (last failure: " + last_error[p] + ")";
      }
      return Status::Unavailable("ranks" + missing + " never appeared in " + book_->where() +
                                 " within " + std::to_string(options_.connect_timeout_s) + " s" +
                                 why);
    }
    ProgressLocked();
    lk.Unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    lk.Lock();
  }
}

Status UcxComm::AwaitHellos(Lock& lk, int64_t deadline) CAIRN_NO_THREAD_SAFETY_ANALYSIS {
  // Every peer must greet us with the job token before we accept anything from it. A
  // hello without it is refused and the wait goes on: it can come from a rank of another
  // job that redialed an address of its own dead peer whose port this rank now holds (seen
  // in an ASan crash matrix beside another job), and failing here would let any such
  // process stop this job's start.
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    std::string got, nonce, probe, address;
    int refused = 0;
    for (;;) {
      const double left = std::max(0.0, NanosToSeconds(deadline - NowNanos()));
      Status rs = ProbeReceive(lk, MakeTag(kHello, p, 0), ~uint64_t{0}, p, left, {}, nullptr, &got);
      if (!rs.ok()) {
        const std::string wrong =
            refused ? "; refused " + std::to_string(refused) + " hello(s) claiming to be rank " +
                          std::to_string(p) +
                          " with a wrong job token (a process of another job or user?)"
                    : "";
        return Status::Unavailable(
            "rank " + std::to_string(p) + " never said hello with the job token within " +
            std::to_string(options_.connect_timeout_s) + " s (" + rs.message() + wrong + ")");
      }
      if (ParseHello(got, token_, &nonce, &probe, &address)) break;
      if (refused++ == 0 && log_)
        log_->Warning("refused a hello claiming to be rank " + std::to_string(p) +
                      ": wrong job token (a process of another job or user?); waiting for "
                      "rank " +
                      std::to_string(p) + "'s own");
    }
    Peer& peer = *peers_[static_cast<size_t>(p)];
    peer.verified = true;
    peer.hello_nonce = nonce;
    peer.hello_address = address;
    peer.hello_probe = probe;
    // If we greeted an address left by a previous incarnation of p (read before p rewrote
    // its file, and a small send to it completed locally), p never heard from us: greet
    // the process that greeted us instead.
    if (nonce != peer.nonce) CAIRN_RETURN_IF_ERROR(Reconnect(lk, p, nonce, address));
  }
  return Status::OK();
}

}  // namespace cairn
