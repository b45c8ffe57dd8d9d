#include "redundancy/replicator.h"

#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <functional>

#include "core/arith.h"
#include "core/clock.h"
#include "core/kill_point.h"
#include "core/mutex.h"
#include "core/trace.h"
#include "wire/codec.h"

namespace cairn {
namespace {

constexpr uint64_t kReplChunk = 8ull << 20;
// At most kWindow chunks are posted at a time: the transports interleave every posted
// transfer, so posting them all would make every chunk land at the very end and leave
// nothing to verify (or add into parity) while the rest arrives.
constexpr uint32_t kWindow = 2;
// Between tries of a holder that failed: short, since a try costs a connection attempt and
// the sender thread's time, and every try after a link came back is one the data waits for;
// doubling to at most 1 s while the holder stays down.
constexpr int64_t kRetryBackoffNs = 250'000'000;
constexpr int64_t kMaxRetryBackoffNs = 1'000'000'000;
constexpr int64_t kWarnEveryNs = 30'000'000'000;
// How long one try waits for a fresh connection to a holder that was down.
constexpr double kRedialWaitS = 1.5;

uint32_t DataSeq(uint32_t offer, uint32_t chunk) {
  return (offer & 0xffff) << 16 | chunk;
}

// Whether offer `a` was made after offer `b` by the same sender (16-bit sequence numbers
// that wrap; a sender has far fewer than 2^15 offers in flight or in a queue).
bool OfferAfter(uint32_t a, uint32_t b) {
  return static_cast<int16_t>(static_cast<uint16_t>(a - b)) > 0;
}

}  // namespace

// Watches the link to a holder while a push waits on it: once a wait has lasted 1 s, asks
// every second whether the holder's host answers (UcxComm::Reachable). A link seen down and
// then up again means the connection under the push may sit in TCP's retransmission
// back-off for as long again: the push is better given up and the holder redialed than
// waited for until the timeout. A holder that is slow on a link that stays up is waited for.
class LinkWatch {
 public:
  LinkWatch(UcxComm* comm, int holder) : comm_(comm), holder_(holder) {}
  // Call in a wait loop; `waiting_since` is when this wait began.
  bool CameBack(int64_t waiting_since) {
    const int64_t now = NowNanos();
    if (now - waiting_since < 1'000'000'000 || now < next_probe_) return false;
    const bool up = comm_->Reachable(holder_, 0.5);
    next_probe_ = NowNanos() + 1'000'000'000;
    if (!up) saw_down_ = true;
    return up && saw_down_;
  }

 private:
  UcxComm* comm_;
  int holder_;
  bool saw_down_ = false;
  int64_t next_probe_ = 0;
};

namespace {

constexpr double kWaitSliceS = 0.05;

// Verifies a replica while it arrives: as each transfer chunk lands, the checksum chunks
// it completes are checked by a task on the replicator's verify pool (while still warm in
// cache), so only the tail is left when the last byte lands.
class ArrivalVerifier {
 public:
  ArrivalVerifier(Pool* pool, const SlotHeader& h, const std::byte* data)
      : h_(h), data_(data), checks_(pool) {}
  ~ArrivalVerifier() { Finish(); }
  ArrivalVerifier(const ArrivalVerifier&) = delete;
  ArrivalVerifier& operator=(const ArrivalVerifier&) = delete;

  // The next transfer chunk has landed (ok) or the transfer is given up (not ok).
  void Arrived(bool ok) {
    MutexLock l(mu_);
    if (!ok || abort_) {
      abort_ = true;
      return;
    }
    const uint64_t from = uint64_t{arrived_++} * kReplChunk;
    checks_.Run([this, from] { Check(from); });
  }
  // Waits for the checks queued; the number of chunks that had arrived.
  uint32_t Finish() {
    checks_.Wait();
    MutexLock l(mu_);
    return arrived_;
  }
  // After Finish(): the first checksum mismatch, or OK.
  Status status() const {
    MutexLock l(mu_);
    return verified_;
  }

 private:
  void Check(uint64_t from) {
    {
      MutexLock l(mu_);
      if (abort_ || !verified_.ok()) return;
    }
    const int64_t t0 = NowNanos();
    Status st =
        ReplicaStore::VerifyArrived(h_, data_, from, std::min(h_.data_bytes, from + kReplChunk));
    Trace::Record("replica checksum", "checksum", t0, NowNanos());
    MutexLock l(mu_);
    if (!st.ok() && verified_.ok()) verified_ = std::move(st);
  }

  const SlotHeader& h_;
  const std::byte* const data_;
  mutable Mutex mu_;
  uint32_t arrived_ CAIRN_GUARDED_BY(mu_) = 0;
  bool abort_ CAIRN_GUARDED_BY(mu_) = false;
  Status verified_ CAIRN_GUARDED_BY(mu_);
  TaskGroup checks_;  // last: destroyed (waited for) first
};

}  // namespace

int64_t ChooseReplicationStep(int64_t attempted, int64_t pending,
                              const std::vector<int64_t>& held) {
  const int64_t gap = attempted < 0 ? 1 : pending - attempted;
  if (gap <= 1) return pending;
  int64_t m = 1;
  while (m <= gap / 2) m *= 2;
  int64_t best = -1;
  for (int64_t s : held)
    if (s > attempted && s <= pending && s % m == 0) best = std::max(best, s);
  return best >= 0 ? best : pending;
}

Replicator::Replicator(UcxComm* comm, ReplicatorChannels channels, Placement placement,
                       HostTier* local, ReplicaStore* store, const Logger* log, double timeout_s,
                       std::optional<ErasureRole> erasure, ThreadPriority priority, double share)
    : comm_(comm),
      ch_(channels),
      placement_(std::move(placement)),
      local_(local),
      store_(store),
      erasure_(std::move(erasure)),
      log_(log),
      timeout_s_(timeout_s),
      share_(erasure_ || !(share > 0) ? 1.0 : std::min(share, 1.0)),
      priority_(priority),
      verify_pool_("cairn-verify", 1, priority) {
  if (erasure_) {
    members_ = placement_.holders_of(comm_->rank());
    members_.push_back(comm_->rank());
    std::sort(members_.begin(), members_.end());
  }
  next_offer_ = static_cast<uint32_t>(WallNanos() & 0xfff) + 1;
  {
    MutexLock lk(mu_);
    last_ok_ns_ = NowNanos();
  }
  sender_ = std::thread([this] { SenderLoop(); });
  service_ = std::thread([this] { ServiceLoop(); });
}

Replicator::~Replicator() {
  {
    MutexLock lk(mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  sender_.join();
  service_.join();
}

void Replicator::Notify(int64_t step) {
  MutexLock lk(mu_);
  const int64_t now = NowNanos();
  if (step > notified_step_) {
    if (notified_step_ >= 0) {
      const double per =
          NanosToSeconds(now - notified_ns_) / static_cast<double>(step - notified_step_);
      step_s_ = step_s_ == 0 ? per : 0.8 * step_s_ + 0.2 * per;
    }
    notified_step_ = step;
    notified_ns_ = now;
  }
  pending_ = std::max(pending_, step);
  if (step > attempted_) unpushed_.push_back(step);
  if (unpushed_.size() > 1024) {  // no push for that long (holders down): bound the list
    stats_.passed_over += 512;    // (the next push is newer than all of these)
    unpushed_.erase(unpushed_.begin(), unpushed_.begin() + 512);
  }
  cv_.NotifyAll();
}

bool Replicator::Tried(int64_t step) const {
  // (Paced replicas: a step the rounds passed over is still pushed for a waiter: NextStep.)
  return stats_.newest_replicated >= step || attempted_ >= step ||
         (named_ && !Paced() && passed_ >= step) || stop_;
}

Status Replicator::WaitReplicated(int64_t step, double timeout_s) {
  MutexLock lk(mu_);
  ++waiters_;  // lifts the pacing while it waits
  cv_.NotifyAll();
  const bool done = cv_.WaitFor(lk, std::chrono::duration<double>(timeout_s),
                                [&]() CAIRN_REQUIRES(mu_) { return Tried(step); });
  --waiters_;
  if (stats_.newest_replicated >= step) return Status::OK();
  if (!done)
    return Status::Unavailable("step " + std::to_string(step) + " not replicated within " +
                               std::to_string(timeout_s) + " s");
  return last_error_.ok()
             ? Status::Unavailable("step " + std::to_string(step) + " was not replicated")
             : last_error_;
}

bool Replicator::WaitTried(int64_t step, double timeout_s, bool urgent) {
  MutexLock lk(mu_);
  if (urgent) {
    ++waiters_;
    cv_.NotifyAll();
  }
  const bool done = cv_.WaitFor(lk, std::chrono::duration<double>(timeout_s),
                                [&]() CAIRN_REQUIRES(mu_) { return Tried(step); });
  if (urgent) --waiters_;
  return done;
}

int64_t Replicator::PaceEvery() const {
  MutexLock lk(mu_);
  return every_;
}

ReplicatorStats Replicator::stats() const {
  MutexLock lk(mu_);
  ReplicatorStats s = stats_;
  const int64_t now = NowNanos();
  s.every = every_;
  s.behind_steps = pending_ < 0 ? 0 : pending_ - stats_.newest_replicated;
  s.push_s = push_s_;
  s.step_s = step_s_;
  // Behind: a push failed since the last acknowledged one, or the one in flight has taken
  // longer than the timeout (a link that went down under it).
  if (failing_since_ns_ != 0 ||
      (push_started_ns_ != 0 && now - push_started_ns_ > static_cast<int64_t>(timeout_s_ * 1e9))) {
    s.unreplicated_s = NanosToSeconds(now - last_ok_ns_);
    s.unreplicated_steps = pending_ - stats_.newest_replicated;
    s.last_error = last_error_.ok() ? "a push has taken longer than CAIRN_REPLICATE_TIMEOUT_S"
                                    : last_error_.message();
  }
  return s;
}

void Replicator::WarnUnreplicated() {
  const int64_t now = NowNanos();
  if (!log_ || now - warned_ns_ < kWarnEveryNs) return;
  warned_ns_ = now;
  const int64_t n = stats_.newest_replicated;
  log_->Warning("rank " + std::to_string(comm_->rank()) +
                "'s versions have not been replicated for " +
                std::to_string(static_cast<int>(NanosToSeconds(now - last_ok_ns_))) + " s (step " +
                std::to_string(pending_) + " is the newest; " + std::to_string(stats_.failed) +
                " failed pushes so far; last: " + last_error_.message() +
                "): losing this node now would take this rank back to " +
                (n >= 0 ? "step " + std::to_string(n) + " from memory"
                        : "the PFS (no version of it is held by another node)"));
}

Status Replicator::Reconnect(int h) {
  {
    MutexLock g(mu_);
    const HolderState& hs = holders_[h];
    if (!hs.down || comm_->peer_epoch(h) != hs.epoch) return Status::OK();
  }
  return comm_->Redial(h, std::min(kRedialWaitS, timeout_s_));
}

bool Replicator::WaitForHolders(const std::vector<int>& holders) {
  // A holder that failed recently is retried after a back-off, or at once when it greeted
  // the job again (restarted). Wait without pinning anything, so training can keep reusing
  // slots meanwhile.
  for (int h : holders) {
    for (;;) {
      HolderState hs;
      {
        MutexLock g(mu_);
        if (stop_) return false;
        hs = holders_[h];
      }
      if (!hs.down || comm_->peer_epoch(h) != hs.epoch || NowNanos() >= hs.retry_at) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return true;
}

void Replicator::RecordPush(int h, int64_t step, const Status& st, uint64_t epoch, int64_t t0,
                            uint64_t bytes) {
  MutexLock g(mu_);
  HolderState& cur = holders_[h];
  if (st.ok()) {
    if (cur.down && log_) log_->Info("replication to rank " + std::to_string(h) + " resumed");
    cur.down = false;
    cur.backoff_ns = 0;
    stats_.bytes += bytes;
    stats_.seconds += NanosToSeconds(NowNanos() - t0);
    stats_.last_push_ms = NanosToSeconds(NowNanos() - t0) * 1e3;
    return;
  }
  ++stats_.failed;
  if (log_)
    log_->Debug("push of step " + std::to_string(step) + " to rank " + std::to_string(h) +
                " failed: " + st.message());
  if (!cur.down && log_)
    log_->Warning("replication of step " + std::to_string(step) + " to rank " + std::to_string(h) +
                  " failed; the version stays CAPTURED and later "
                  "versions are retried (further failures are only counted): " +
                  st.message());
  cur.down = true;
  cur.epoch = epoch;  // a reconnect during the push makes the next try immediate
  cur.backoff_ns = std::min(kMaxRetryBackoffNs, std::max(kRetryBackoffNs, 2 * cur.backoff_ns));
  cur.retry_at = NowNanos() + cur.backoff_ns;
}

SlotHeader BlobsOnlyHeader(const SlotHeader& h, uint64_t* from) {
  SlotHeader b = h;
  b.shards.clear();
  b.chunk_checksums.clear();
  *from = h.blobs.empty() ? h.data_bytes : h.blobs.front().offset;
  for (const SlotBlob& x : h.blobs) *from = std::min(*from, x.offset);
  for (SlotBlob& x : b.blobs) x.offset -= *from;
  b.data_bytes = h.data_bytes - *from;
  return b;
}

void Replicator::ExpectTargets() {
  MutexLock g(mu_);
  named_ = true;
}

void Replicator::SetTarget(int64_t step) {
  MutexLock g(mu_);
  target_ = std::max(target_, step);
  cv_.NotifyAll();
}

void Replicator::SetPassed(int64_t step) {
  MutexLock g(mu_);
  passed_ = std::max(passed_, step);
  cv_.NotifyAll();
}

void Replicator::EndTargets() {
  MutexLock g(mu_);
  named_ = false;
  cv_.NotifyAll();
}

std::optional<int64_t> Replicator::NextStep() {
  if (named_) {
    if (target_ > attempted_) return target_;
    // Paced replicas: someone waits for replication, so the newest step goes now (the step
    // agreement keeps it while its promise stands: StepAgreement::OnReplicated).
    if (Paced() && waiters_ > 0 && pending_ > attempted_) return pending_;
    return std::nullopt;
  }
  if (pending_ <= attempted_) return std::nullopt;
  // Paced: the next push is the first step of the next block, unless someone waits.
  if (every_ > 1 && waiters_ == 0 && attempted_ >= 0 && pending_ / every_ == attempted_ / every_)
    return std::nullopt;
  return pending_;
}

void Replicator::Pace(double seconds) {
  // Quick to fall (a slow first few pushes fill the holders' slots), slow to rise.
  push_s_ = push_s_ == 0        ? seconds
            : seconds < push_s_ ? 0.5 * (push_s_ + seconds)
                                : 0.8 * push_s_ + 0.2 * seconds;
  if (share_ >= 1 || step_s_ <= 0) return;
  // Pushes of push_s_, one every `every` steps of step_s_, take push_s_ / (every * step_s_)
  // of the time: the smallest power of two that keeps it within the share.
  const double need = push_s_ / (share_ * step_s_);
  int64_t every = 1;
  while (every < need && every < (int64_t{1} << 20)) every *= 2;
  // Halve only once the need is well below the half (no flapping at a boundary); at most
  // double per push (one slow push does not stop replication for long).
  if (every < every_ && need > 0.75 * static_cast<double>(every_ / 2)) every = every_;
  every = std::min(every, 2 * every_);
  if (every == every_) return;
  if (log_) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "replication paced: one step in %lld is replicated (a push takes %.0f ms, a "
                  "step %.1f ms; CAIRN_REPLICATE_SHARE=%g of the time), was one in %lld",
                  static_cast<long long>(every), push_s_ * 1e3, step_s_ * 1e3, share_,
                  static_cast<long long>(every_));
    log_->Info(buf);
  }
  every_ = every;
}

void Replicator::ExpectCoverage(std::function<uint64_t(const SlotHeader&)> layout_hash) {
  layout_hash_ = std::move(layout_hash);
}

void Replicator::SetCovered(uint64_t hash, bool covered) {
  MutexLock g(mu_);
  covered_.clear();  // a layout no rank offers any more is not covered
  covered_[hash] = covered;
  coverage_told_ = true;
  cv_.NotifyAll();
}

void Replicator::EndCoverage() {
  MutexLock g(mu_);
  covered_.clear();
  coverage_told_ = true;
  cv_.NotifyAll();
}

void Replicator::AwaitCoverage() {
  if (!layout_hash_ || erasure_) return;
  MutexLock lk(mu_);
  cv_.WaitFor(lk, std::chrono::duration<double>(timeout_s_),
              [&]() CAIRN_REQUIRES(mu_) { return stop_ || coverage_told_; });
}

bool Replicator::BlobsOnly(const SlotHeader& h) {
  if (!layout_hash_ || erasure_) return false;
  const uint64_t hash = layout_hash_(h);
  bool covered = false;
  {
    MutexLock g(mu_);
    auto it = covered_.find(hash);
    covered = it != covered_.end() && it->second;
  }
  if (covered && !said_blobs_only_ && log_) {
    said_blobs_only_ = true;
    uint64_t blob_bytes = 0;
    for (const SlotBlob& b : h.blobs) blob_bytes += b.nbytes;
    log_->Info(
        "every box of this rank's state is also held by a rank on another node (data "
        "parallel): its replicas carry only its blobs (" +
        std::to_string(blob_bytes) + " bytes of step " + std::to_string(h.step) + ", not its " +
        std::to_string(h.data_bytes) +
        " bytes), and a lost node's boxes "
        "come back from those ranks' own slots");
  }
  return covered;
}

Status Replicator::PushToAll(int64_t step, const std::vector<int>& holders) {
  AwaitCoverage();  // before pinning: a pin held while waiting could make a save skip
  {
    MutexLock g(mu_);
    push_started_ns_ = NowNanos();
  }
  auto pinned = local_->Pin(step);
  ReapDraining();
  if (!pinned.ok()) return pinned.status();
  std::shared_ptr<const HostTier::View> view = std::move(*pinned);
  const bool blobs_only = BlobsOnly(view->header());
  std::optional<ReplicaOffer> replica;
  // The steps this rank keeps: the holders keep their replicas (a holder keeping only the
  // newest ones lost the agreed step's replica while another rank skipped its saves, and a
  // lost node then had no step the survivors held: tests/RELIABILITY.md).
  if (!erasure_) replica = MakeReplicaOffer(view->header(), blobs_only, local_->Kept());
  const uint64_t bytes = replica ? replica->bytes : view->header().data_bytes;  // per holder
  Status last = holders.empty() ? Status::FailedPrecondition("no replica holders") : Status::OK();
  for (int h : holders) {
    // A holder that timed out or failed, and has not greeted this rank since: its
    // connection may be stuck or gone, so it is redialed once its host answers.
    Status st = Reconnect(h);
    const uint64_t epoch = comm_->peer_epoch(h);
    const int64_t t0 = NowNanos();
    if (st.ok()) st = Push(h, view, replica ? &*replica : nullptr);
    RecordPush(h, step, st, epoch, t0, bytes);
    if (!st.ok()) last = st;
  }
  if (last.ok()) {
    CAIRN_KILL_POINT("replicate.acked");
    if (blobs_only) {
      MutexLock g(mu_);
      ++stats_.blobs_only;
    }
    Status st = local_->SetState(step, VersionState::kReplicated);
    if (!st.ok() && log_)
      log_->Warning("recording step " + std::to_string(step) + " as REPLICATED: " + st.message());
  }
  return last;
}

void Replicator::SenderLoop() {
  (void)pthread_setname_np(pthread_self(), "cairn-repl-send");
  SetThreadPriority(priority_);
  const int me = comm_->rank();
  const std::vector<int>& holders = placement_.holders_of(me);
  MutexLock lk(mu_);
  for (;;) {
    cv_.Wait(lk, [&]() CAIRN_REQUIRES(mu_) { return stop_ || NextStep().has_value(); });
    if (stop_) return;
    lk.Unlock();
    if (!WaitForHolders(holders)) return;
    lk.Lock();
    const std::optional<int64_t> next = NextStep();
    if (!next) continue;  // EndTargets, or a target tried meanwhile
    const bool named = named_;
    const int64_t pending = pending_, attempted = attempted_;
    lk.Unlock();
    int64_t step = *next;
    if (!named) {
      std::vector<int64_t> held;
      if (pending - attempted > 1)
        for (const VersionInfo& v : local_->Versions()) held.push_back(v.step);
      step = ChooseReplicationStep(attempted, pending, held);
    }
    const Status st = PushToAll(step, holders);
    lk.Lock();
    const int64_t started = push_started_ns_;  // after the coverage wait
    attempted_ = std::max(attempted_, step);
    for (int64_t u : unpushed_) stats_.passed_over += u < step ? 1 : 0;
    std::erase_if(unpushed_, [&](int64_t u) { return u <= step; });
    push_started_ns_ = 0;
    if (st.ok()) {
      ++stats_.replicated;
      stats_.newest_replicated = std::max(stats_.newest_replicated, step);
      if (stats_.replicated > 1)  // the first touches the holders' fresh slots: not a measure
        Pace(NanosToSeconds(NowNanos() - started));
      last_ok_ns_ = NowNanos();
      failing_since_ns_ = 0;
      last_error_ = Status::OK();
    } else {
      last_error_ = st;
      if (failing_since_ns_ == 0) {
        failing_since_ns_ = NowNanos();
        // Say at once what losing this node now would cost, then every 30 s.
        warned_ns_ = failing_since_ns_ - kWarnEveryNs;
      }
      WarnUnreplicated();
    }
    cv_.NotifyAll();
  }
}

void Replicator::ReapDraining() {
  for (auto d = draining_.begin(); d != draining_.end();) {
    for (auto s = d->sends.begin(); s != d->sends.end();) {
      if (!comm_->Sent(*s, 0)) {
        ++s;
        continue;
      }
      (void)comm_->FinishSend(*s, 0.01);
      s = d->sends.erase(s);
    }
    d = d->sends.empty() ? draining_.erase(d) : d + 1;  // unpins the slot
  }
}

Status Replicator::SendChunks(int holder, uint32_t offer,
                              const std::shared_ptr<const HostTier::View>& pinned,
                              const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
                              uint64_t chunk, LinkWatch& watch, const Status& came_back,
                              std::optional<std::string>* early_ack) {
  const HostTier::View& view = *pinned;
  const int me = comm_->rank();
  std::vector<UcxComm::PendingSend> sends;
  uint32_t c = 0;
  for (const auto& [offset, length] : ranges) {
    for (uint64_t b = 0; b < length; b += chunk, ++c) {
      const uint64_t len = std::min(chunk, length - b);
      sends.push_back(comm_->StartSend(holder, MakeTag(ch_.data, me, DataSeq(offer, c)),
                                       view.data() + offset + b, len, UcxComm::Auth::kContent));
    }
  }
  Status first;
  const int64_t sending_since = NowNanos();
  const int64_t deadline = sending_since + static_cast<int64_t>(timeout_s_ * 1e9);
  std::vector<UcxComm::PendingSend> unfinished;
  for (auto& s : sends) {
    while (first.ok() && !comm_->Sent(s, kWaitSliceS)) {
      if (NowNanos() >= deadline) {
        first = Status::Unavailable("data not taken within " + std::to_string(timeout_s_) + " s");
      } else if (comm_->peer_failed(holder)) {
        first = Status::Unavailable("the connection to the holder failed");
      } else if (*early_ack) {
        continue;  // kept: the sends end as the holder took every byte
      } else if (auto a = comm_->Recv(holder, MakeTag(ch_.ack, holder, offer), 0); a.ok()) {
        *early_ack = std::move(*a);
        if (**early_ack != "ok")
          first = Status::Unavailable("the holder gave the transfer up: " + **early_ack);
      } else if (watch.CameBack(sending_since)) {
        first = came_back;
      }
    }
    if (!comm_->Sent(s, 0)) {
      // Given up while UCX still reads the slot: it stays pinned until the send ends (the
      // holder drains what it gave up; ReapDraining).
      unfinished.push_back(std::move(s));
      continue;
    }
    Status st = comm_->FinishSend(s, 0.01);
    if (first.ok()) first = st;
  }
  if (!unfinished.empty()) draining_.push_back({pinned, std::move(unfinished)});
  return first;
}

Replicator::ReplicaOffer Replicator::MakeReplicaOffer(const SlotHeader& h, bool blobs_only,
                                                      const std::vector<int64_t>& keep_steps) {
  ReplicaOffer o;
  wire::ReplicaOffer w;
  if (blobs_only) {
    uint64_t from = 0;
    const SlotHeader b = BlobsOnlyHeader(h, &from);
    w.set_slot_header(EncodeSlotHeader(b));
    if (b.data_bytes > 0) o.ranges.emplace_back(from, b.data_bytes);
    o.bytes = b.data_bytes;
  } else {
    w.set_slot_header(EncodeSlotHeader(h));
    o.ranges.emplace_back(0, h.data_bytes);
    o.bytes = h.data_bytes;
  }
  for (int64_t k : keep_steps) w.add_keep_steps(k);
  o.encoded = wire::Encode(w);
  return o;
}

Status Replicator::Push(int holder, const std::shared_ptr<const HostTier::View>& pinned,
                        const ReplicaOffer* replica) {
  TraceSpan span("replicate push", "replicate");
  const HostTier::View& view = *pinned;
  const int me = comm_->rank();
  const SlotHeader& h = view.header();
  const uint32_t offer = next_offer_.fetch_add(1) & 0xffff;
  const std::string who =
      "replicating step " + std::to_string(h.step) + " to rank " + std::to_string(holder);
  std::string parity_offer;
  std::vector<std::pair<uint64_t, uint64_t>> parity_ranges;
  if (!replica) std::tie(parity_offer, parity_ranges) = ParityOfferFor(holder, h);
  const std::string& encoded = replica ? replica->encoded : parity_offer;
  const std::vector<std::pair<uint64_t, uint64_t>>& ranges =
      replica ? replica->ranges : parity_ranges;
  // Answers to offers this rank gave up (they arrive late after a link came back) are
  // waiting unmatched: drop them, so they do not pile up in UCX's unexpected queue.
  for (Channel c : {ch_.ready, ch_.ack})
    while (comm_->RecvAny(c, 0, holder).ok()) {
    }
  CAIRN_RETURN_IF_ERROR(
      comm_->Send(holder, MakeTag(ch_.offer, me, offer), encoded.data(), encoded.size())
          .WithContext(who));
  CAIRN_KILL_POINT("replicate.offered");
  LinkWatch watch(comm_, holder);
  // (Every error below is returned with `who` in front, once.)
  const Status came_back =
      Status::Unavailable("the link to the holder went down and came back; redialing it");
  // Waits for the answer `tag`, up to the timeout, unless the link went down and came back.
  auto answer = [&](uint64_t tag) -> Result<std::string> {
    const int64_t t0 = NowNanos(), deadline = t0 + static_cast<int64_t>(timeout_s_ * 1e9);
    for (;;) {
      const double left = NanosToSeconds(deadline - NowNanos());
      auto got = comm_->Recv(holder, tag, std::max(0.0, std::min(kWaitSliceS * 10, left)));
      if (got.ok() || left <= kWaitSliceS * 10 || comm_->peer_failed(holder)) return got;
      if (watch.CameBack(t0)) return came_back;
    }
  };
  auto ready = answer(MakeTag(ch_.ready, holder, offer));
  if (!ready.ok()) return ready.status().WithContext(who);
  if (*ready != "ok") return Status::Unavailable(who + ": refused: " + *ready);
  std::optional<std::string> early_ack;
  CAIRN_RETURN_IF_ERROR(SendChunks(holder, offer, pinned, ranges,
                                   replica ? kReplChunk : kParityChunkBytes, watch, came_back,
                                   &early_ack)
                            .WithContext(who));
  CAIRN_KILL_POINT("replicate.data_sent");
  const int64_t t0 = NowNanos();
  Result<std::string> ack =
      early_ack ? Result<std::string>(*early_ack) : answer(MakeTag(ch_.ack, holder, offer));
  if (!ack.ok()) return ack.status().WithContext(who);
  if (*ack != "ok") return Status::Unavailable(who + ": " + *ack);
  MutexLock g(mu_);
  stats_.last_ack_ms = NanosToSeconds(NowNanos() - t0) * 1e3;
  return Status::OK();
}

void Replicator::NoteStaging(uint64_t* touched, uint64_t len) {
  if (len <= *touched) return;
  MutexLock g(mu_);
  stats_.staging_bytes += RoundUp(len, uint64_t{4096}) - RoundUp(*touched, uint64_t{4096});
  *touched = len;
}

void Replicator::Sink(int src, uint32_t offer, uint32_t chunk, uint64_t len) {
  if (scratch_.empty()) {
    scratch_.resize(kReplChunk);  // (zeroed: every page touched)
    NoteStaging(&scratch_touched_, kReplChunk);
  }
  sinks_.push_back({comm_->StartRecv(src, MakeTag(ch_.data, src, DataSeq(offer, chunk)),
                                     scratch_.data(), len, UcxComm::Auth::kContent),
                    NowNanos() + static_cast<int64_t>(2 * timeout_s_ * 1e9)});
}

void Replicator::ReapSinks() {
  const int64_t now = NowNanos();
  std::erase_if(sinks_, [&](SinkRecv& k) {
    if (!comm_->Arrived(k.recv, 0) && now < k.until) return false;
    (void)comm_->FinishRecv(k.recv, 0.001);  // takes it, or cancels it
    return true;
  });
}

void Replicator::ServiceLoop() {
  (void)pthread_setname_np(pthread_self(), "cairn-repl-serv");
  SetThreadPriority(priority_);
  std::optional<UcxComm::Incoming> next;  // an offer that superseded the one answered
  for (;;) {
    {
      MutexLock lk(mu_);
      if (stop_) return;
    }
    comm_->ServiceHellos();
    if (!sinks_.empty()) ReapSinks();
    std::optional<UcxComm::Incoming> in = std::move(next);
    next.reset();
    if (!in) {
      auto got = comm_->RecvAny(ch_.offer, 0.05);
      if (!got.ok()) continue;
      in = std::move(*got);
    }
    // A sender has one push in flight per holder: of the offers of one rank waiting here
    // (a link that was down delivers the given-up ones late, perhaps after newer ones on a
    // fresh connection), only the newest is still wanted.
    while (auto other = TakeOffer(in->source, in->seq))
      if (OfferAfter(other->seq, in->seq)) in = std::move(other);
    HandleOffer(*in, &next);
  }
}

std::optional<UcxComm::Incoming> Replicator::TakeOffer(int src, uint32_t current) {
  auto got = comm_->RecvAny(ch_.offer, 0, src);
  if (!got.ok()) return std::nullopt;
  if (log_)
    log_->Debug(OfferAfter(got->seq, current)
                    ? "offer " + std::to_string(current) + " from rank " + std::to_string(src) +
                          " superseded by offer " + std::to_string(got->seq)
                    : "offer " + std::to_string(got->seq) + " from rank " + std::to_string(src) +
                          " arrived after offer " + std::to_string(current) + ": dropped");
  return std::move(*got);
}

void Replicator::Reply(int src, uint32_t offer, Channel channel, const std::string& text) {
  // An answer the sender does not get within its timeout is one it no longer waits for:
  // never hold this thread longer (a send queued behind a connection that is down).
  UcxComm::PendingSend s =
      comm_->StartSend(src, MakeTag(channel, comm_->rank(), offer), text.data(), text.size());
  (void)comm_->FinishSend(s, timeout_s_);
}

Result<Replicator::Admitted> Replicator::Admit(int src, const std::string& offer) {
  const auto& held = placement_.held_by(comm_->rank());
  if (std::find(held.begin(), held.end(), src) == held.end())
    return Status::FailedPrecondition("this rank does not hold replicas of rank " +
                                      std::to_string(src));
  wire::ReplicaOffer w;
  CAIRN_RETURN_IF_ERROR(wire::Decode(offer, &w, "replica offer"));
  Admitted a;
  CAIRN_ASSIGN_OR_RETURN(a.header, DecodeSlotHeader(w.slot_header()));
  CAIRN_ASSIGN_OR_RETURN(a.tier, store_->TierFor(src));
  // `src` keeps these steps (the agreed one among them) from reuse: so do its replicas here,
  // in place of the newest one (the newest-version rule again when none is held here).
  const std::vector<int64_t> keep(w.keep_steps().begin(), w.keep_steps().end());
  (void)a.tier->Keep(keep, {});
  CAIRN_ASSIGN_OR_RETURN(a.slot, a.tier->Reserve(a.header.step, FullPolicy::kSkip));
  SlotHeader base = a.header;
  auto mem = a.tier->Prepare(a.slot, a.header.step, a.header.data_bytes, base);
  if (!mem.ok()) {
    a.tier->Abort(a.slot);
    return mem.status();
  }
  a.data = *mem;
  return a;
}

Status Replicator::ReceiveChunks(int src, uint32_t offer, uint32_t chunks,
                                 const std::function<UcxComm::PendingRecv(uint32_t)>& post,
                                 const std::function<void(uint32_t, bool)>& landed,
                                 std::optional<UcxComm::Incoming>* next, uint32_t* arrived) {
  std::vector<UcxComm::PendingRecv> recvs(chunks);
  for (uint32_t c = 0; c < std::min(kWindow, chunks); ++c) recvs[c] = post(c);
  CAIRN_KILL_POINT("replicate.ready");
  Reply(src, offer, ch_.ready, "ok");
  Status st;
  *arrived = 0;
  const int64_t deadline = NowNanos() + static_cast<int64_t>(timeout_s_ * 1e9);
  for (uint32_t c = 0; c < chunks; ++c) {
    if (!st.ok()) {
      // Cancel what is still posted: no byte may land in the slot once it is given up.
      if (recvs[c].request) (void)comm_->FinishRecv(recvs[c], 0.001);
      continue;
    }
    // A newer offer from the sender means it gave this one up (its wait timed out,
    // perhaps while the link was down): stop waiting for bytes that will not come, and
    // answer that one next. An older one (late from a link that was down) is dropped.
    while (!comm_->Arrived(recvs[c], 0.05) && NowNanos() < deadline) {
      auto other = TakeOffer(src, offer);
      if (other && OfferAfter(other->seq, offer)) {
        *next = std::move(other);
        st = Status::Unavailable("rank " + std::to_string(src) +
                                 " sent a newer offer: it gave this one up");
        break;
      }
    }
    if (st.ok())
      st = comm_->FinishRecv(recvs[c], std::max(0.01, NanosToSeconds(deadline - NowNanos())));
    else
      (void)comm_->FinishRecv(recvs[c], 0.001);  // cancels it
    if (st.ok()) ++*arrived;
    landed(c, st.ok());
    if (st.ok() && c + kWindow < chunks) recvs[c + kWindow] = post(c + kWindow);
  }
  return st;
}

Status Replicator::Receive(int src, uint32_t offer, const Admitted& a,
                           std::optional<UcxComm::Incoming>* next) {
  const uint64_t n = a.header.data_bytes;
  const uint32_t chunks = static_cast<uint32_t>(CeilDiv(n, kReplChunk));
  ArrivalVerifier verifier(&verify_pool_, a.header, a.data);
  uint32_t arrived = 0;
  Status st = ReceiveChunks(
      src, offer, chunks,
      [&](uint32_t c) {
        const uint64_t b = c * kReplChunk, len = std::min(kReplChunk, n - b);
        // Without the token in front (zero copy): every chunk is checked against the offer's
        // header, which came with the token, before the replica is kept.
        return comm_->StartRecv(src, MakeTag(ch_.data, src, DataSeq(offer, c)), a.data + b, len,
                                UcxComm::Auth::kContent);
      },
      [&](uint32_t, bool ok) { verifier.Arrived(ok); }, next, &arrived);
  if (st.ok()) CAIRN_KILL_POINT("replicate.received");
  verifier.Finish();
  // The sender may still send what it had started: take it into scratch memory, so its
  // sends end (it keeps the slot they read pinned until then).
  if (!st.ok())
    for (uint32_t c = arrived; c < chunks; ++c)
      Sink(src, offer, c, std::min(kReplChunk, n - uint64_t{c} * kReplChunk));
  if (st.ok()) st = chunks > 0 ? verifier.status() : ReplicaStore::Verify(a.header, a.data);
  return st;
}

void Replicator::HandleOffer(UcxComm::Incoming& in, std::optional<UcxComm::Incoming>* next) {
  if (erasure_) return HandleParityOffer(in, next);
  const int src = in.source;
  const uint32_t offer = in.seq;
  // A sender that redialed this rank sent its redial hello before this offer: take it
  // first, so that the answers go over a fresh connection, not one TCP still backs off on.
  comm_->ServiceHellos();
  auto count = [&](uint64_t ReplicatorStats::*field) {
    MutexLock g(mu_);
    ++(stats_.*field);
  };
  auto admitted = Admit(src, in.bytes);
  if (!admitted.ok()) {
    count(&ReplicatorStats::refused);
    if (log_)
      log_->Info("refused a replica from rank " + std::to_string(src) + ": " +
                 admitted.status().message());
    return Reply(src, offer, ch_.ready, admitted.status().message());
  }
  const Admitted& a = *admitted;
  Status st = Receive(src, offer, a, next);
  if (st.ok()) CAIRN_KILL_POINT("replicate.verified");
  if (st.ok()) a.tier->MarkCopied(a.slot);
  if (st.ok()) st = a.tier->Commit(a.slot, a.header);
  if (!st.ok()) {
    a.tier->Abort(a.slot);
    count(&ReplicatorStats::refused);
    if (log_)
      log_->Warning("replica of step " + std::to_string(a.header.step) + " from rank " +
                    std::to_string(src) + " not kept: " + st.message());
    return Reply(src, offer, ch_.ack, "not kept: " + st.message());
  }
  count(&ReplicatorStats::received);
  CAIRN_KILL_POINT("replicate.published");
  Reply(src, offer, ch_.ack, "ok");
}

int Replicator::MemberIndex(int rank) const {
  auto it = std::lower_bound(members_.begin(), members_.end(), rank);
  return it != members_.end() && *it == rank ? static_cast<int>(it - members_.begin()) : -1;
}

std::pair<std::string, std::vector<std::pair<uint64_t, uint64_t>>> Replicator::ParityOfferFor(
    int holder, const SlotHeader& h) const {
  const ErasureScheme& sc = erasure_->scheme;
  const int d = sc.data(), me = MemberIndex(comm_->rank()), to = MemberIndex(holder);
  wire::ParityOffer w;
  w.set_k(static_cast<uint32_t>(sc.k));
  w.set_m(static_cast<uint32_t>(sc.m));
  w.set_world_size(static_cast<uint32_t>(placement_.world_size()));
  w.set_data_bytes(h.data_bytes);
  w.set_slot_header(EncodeSlotHeader(h));
  w.set_keep_step(keep_step_.load());
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (int j = 0; j < d; ++j) {
    const int stripe = StripeOfPiece(sc, me, j);
    const int idx = StripeIndexOf(sc, stripe, to);
    if (idx < d) continue;  // `holder` keeps no parity of this stripe
    auto* p = w.add_pieces();
    p->set_stripe(static_cast<uint32_t>(stripe));
    p->set_j(static_cast<uint32_t>(j));
    p->set_row(static_cast<uint32_t>(idx - d));
    const PieceRange r = PieceOf(h.data_bytes, d, j);
    ranges.emplace_back(r.offset, r.length);
  }
  return {wire::Encode(w), std::move(ranges)};
}

void Replicator::HandleParityOffer(UcxComm::Incoming& in, std::optional<UcxComm::Incoming>* next) {
  const int src = in.source;
  const uint32_t offer = in.seq;
  comm_->ServiceHellos();
  const ErasureScheme& sc = erasure_->scheme;
  ParityStore* store = erasure_->store;
  const int d = sc.data();
  auto count = [&](uint64_t ReplicatorStats::*field) {
    MutexLock g(mu_);
    ++(stats_.*field);
  };
  auto refuse = [&](const Status& why, Channel channel) {
    count(&ReplicatorStats::refused);
    if (log_)
      log_->Info("refused parity pieces from rank " + std::to_string(src) + ": " + why.message());
    Reply(src, offer, channel, (channel == ch_.ack ? "not kept: " : "") + why.message());
  };
  // Admission: a member of this rank's set, pieces of stripes whose parity this rank keeps.
  struct Piece {
    ParityKey key;
    int j = 0;
    PieceRange range;
  };
  std::vector<Piece> pieces;
  wire::ParityOffer w;
  SlotHeader header;
  {
    Status st = MemberIndex(src) < 0 || src == comm_->rank()
                    ? Status::FailedPrecondition("rank " + std::to_string(src) +
                                                 " is not in this rank's erasure-coded set")
                    : wire::Decode(in.bytes, &w, "parity offer");
    if (st.ok() && (w.k() != static_cast<uint32_t>(sc.k) || w.m() != static_cast<uint32_t>(sc.m) ||
                    w.world_size() != static_cast<uint32_t>(placement_.world_size())))
      st = Status::FailedPrecondition("the offer is for another scheme or job size");
    if (st.ok()) {
      auto h = DecodeSlotHeader(w.slot_header());
      if (!h.ok())
        st = h.status();
      else if (h->data_bytes != w.data_bytes())
        st = Status::Corruption("the offer's byte count differs from its header's");
      else
        header = std::move(*h);
    }
    const int me = MemberIndex(comm_->rank()), from = MemberIndex(src);
    for (int i = 0; st.ok() && i < w.pieces_size(); ++i) {
      const auto& p = w.pieces(i);
      if (p.stripe() >= static_cast<uint32_t>(sc.k) || p.j() >= static_cast<uint32_t>(d) ||
          p.row() >= static_cast<uint32_t>(sc.m) ||
          StripeDataMember(sc, static_cast<int>(p.stripe()), static_cast<int>(p.j())) != from ||
          StripeParityMember(sc, static_cast<int>(p.stripe()), static_cast<int>(p.row())) != me) {
        st = Status::Corruption("the offer names a piece this rank keeps no parity of");
        break;
      }
      pieces.push_back({{static_cast<int>(p.stripe()), static_cast<int>(p.row()), header.step},
                        static_cast<int>(p.j()),
                        PieceOf(w.data_bytes(), d, static_cast<int>(p.j()))});
    }
    if (st.ok() && pieces.empty()) st = Status::Corruption("the offer names no piece");
    size_t begun = 0;
    for (; st.ok() && begun < pieces.size(); ++begun) {
      const Piece& p = pieces[begun];
      st = store->Begin(sc, w.world_size(), p.key, p.j, {src, w.data_bytes(), w.slot_header()},
                        PieceBytes(w.data_bytes(), d), w.keep_step());
      if (!st.ok()) break;
    }
    if (!st.ok()) {
      for (size_t i = 0; i < begun; ++i) (void)store->End(pieces[i].key, pieces[i].j, false);
      return refuse(st, ch_.ready);
    }
  }
  // The pieces' bytes in chunks, through two scratch buffers: each chunk is added to the
  // parity as it lands, then its buffer takes the chunk after next. A record's first piece
  // lands in the parity itself where its coefficient is 1 (ParityStore::InPlace).
  std::vector<std::byte*> in_place;
  for (const Piece& p : pieces) in_place.push_back(store->InPlace(p.key, p.j));
  struct Chunk {
    size_t piece;
    uint64_t offset, len;
  };
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < pieces.size(); ++i)
    for (uint64_t b = 0; b < pieces[i].range.length; b += kParityChunkBytes)
      chunks.push_back({i, b, std::min(kParityChunkBytes, pieces[i].range.length - b)});
  // The buffers are allocated once and never initialized (new std::byte[]): only the pages
  // a chunk lands in are touched. Zero-filling 2 x kReplChunk on the first offer made every
  // holder of a set first-touch 16 MiB for pieces of kilobytes at the same moment, 7 s under
  // TSan on a loaded machine, and its first senders timed out waiting for READY
  // (MultiNodeLoss xor4, stop 49's CI). They never move: a receive given up on still has
  // its buffer.
  for (auto& b : window_)
    if (!b) b.reset(new std::byte[kParityChunkBytes]);
  uint32_t arrived = 0;
  Status st = ReceiveChunks(
      src, offer, static_cast<uint32_t>(chunks.size()),
      [&](uint32_t c) {
        std::byte* to = in_place[chunks[c].piece];
        if (!to) NoteStaging(&window_touched_[c % kWindow], chunks[c].len);
        return comm_->StartRecv(src, MakeTag(ch_.data, src, DataSeq(offer, c)),
                                to ? to + chunks[c].offset : window_[c % kWindow].get(),
                                chunks[c].len, UcxComm::Auth::kContent);
      },
      [&](uint32_t c, bool ok) {
        // Added before the buffer takes chunk c + kWindow.
        const Piece& p = pieces[chunks[c].piece];
        if (ok && !in_place[chunks[c].piece])
          store->Add(p.key, p.j, chunks[c].offset, window_[c % kWindow].get(), chunks[c].len);
      },
      next, &arrived);
  if (!st.ok())
    for (size_t c = arrived; c < chunks.size(); ++c)
      Sink(src, offer, static_cast<uint32_t>(c), chunks[c].len);
  if (st.ok()) CAIRN_KILL_POINT("replicate.received");
  if (st.ok()) CAIRN_KILL_POINT("replicate.verified");  // (parity is checked when read)
  for (const Piece& p : pieces) {
    Status ended = store->End(p.key, p.j, st.ok());
    if (st.ok() && !ended.ok()) st = ended;
  }
  if (!st.ok()) return refuse(st, ch_.ack);
  count(&ReplicatorStats::received);
  CAIRN_KILL_POINT("replicate.published");
  Reply(src, offer, ch_.ack, "ok");
}

}  // namespace cairn
