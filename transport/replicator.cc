#include "transport/replicator.h"

#include <algorithm>

#include "core/clock.h"
#include "core/kill_point.h"
#include "core/mutex.h"
#include "core/trace.h"

namespace cairn {
namespace {

constexpr uint64_t kReplChunk = 8ull << 20;
constexpr int64_t kRetryBackoffNs = 2'000'000'000;

uint32_t DataSeq(uint32_t offer, uint32_t chunk) {
  return (offer & 0xffff) << 16 | chunk;
}

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
                       HostTier* local, ReplicaStore* store, const Logger* log, double timeout_s)
    : comm_(comm),
      ch_(channels),
      placement_(std::move(placement)),
      local_(local),
      store_(store),
      log_(log),
      timeout_s_(timeout_s) {
  next_offer_ = static_cast<uint32_t>(WallNanos() & 0xfff) + 1;
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
  pending_ = std::max(pending_, step);
  cv_.NotifyAll();
}

Status Replicator::WaitReplicated(int64_t step, double timeout_s) {
  MutexLock lk(mu_);
  const bool done =
      cv_.WaitFor(lk, std::chrono::duration<double>(timeout_s), [&]() CAIRN_REQUIRES(mu_) {
        return stats_.newest_replicated >= step || attempted_ >= step || stop_;
      });
  if (stats_.newest_replicated >= step) return Status::OK();
  if (!done)
    return Status::Unavailable("step " + std::to_string(step) + " not replicated within " +
                               std::to_string(timeout_s) + " s");
  return last_error_.ok()
             ? Status::Unavailable("step " + std::to_string(step) + " was not replicated")
             : last_error_;
}

ReplicatorStats Replicator::stats() const {
  MutexLock lk(mu_);
  return stats_;
}

void Replicator::SenderLoop() {
  const int me = comm_->rank();
  const std::vector<int>& holders = placement_.holders_of(me);
  MutexLock lk(mu_);
  for (;;) {
    cv_.Wait(lk, [&]() CAIRN_REQUIRES(mu_) { return stop_ || pending_ > attempted_; });
    if (stop_) return;
    lk.Unlock();
    // A holder that failed recently is retried after a back-off, or at once when it
    // greeted the job again (restarted). Wait without pinning anything, so training can
    // keep reusing slots meanwhile.
    for (int h : holders) {
      for (;;) {
        HolderState hs;
        {
          MutexLock g(mu_);
          if (stop_) return;
          hs = holders_[h];
        }
        if (!hs.down || comm_->peer_epoch(h) != hs.epoch || NowNanos() >= hs.retry_at) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    lk.Lock();
    const int64_t pending = pending_, attempted = attempted_;
    lk.Unlock();
    std::vector<int64_t> held;
    if (pending - attempted > 1)
      for (const VersionInfo& v : local_->Versions()) held.push_back(v.step);
    const int64_t step = ChooseReplicationStep(attempted, pending, held);
    bool all_ok = !holders.empty();
    Status last;
    auto view = local_->Pin(step);
    if (!view.ok()) {
      all_ok = false;
      last = view.status();
    } else {
      for (int h : holders) {
        const uint64_t epoch = comm_->peer_epoch(h);
        const int64_t t0 = NowNanos();
        Status st = Push(h, **view);
        MutexLock g(mu_);
        HolderState& cur = holders_[h];
        if (st.ok()) {
          if (cur.down && log_) log_->Info("replication to rank " + std::to_string(h) + " resumed");
          cur.down = false;
          stats_.bytes += (*view)->header().data_bytes;
          stats_.seconds += NanosToSeconds(NowNanos() - t0);
          stats_.last_push_ms = NanosToSeconds(NowNanos() - t0) * 1e3;
        } else {
          all_ok = false;
          last = st;
          ++stats_.failed;
          if (!cur.down && log_)
            log_->Warning("replication of step " + std::to_string(step) + " to rank " +
                          std::to_string(h) +
                          " failed; the version stays CAPTURED and later "
                          "versions are retried (further failures are only counted): " +
                          st.message());
          cur.down = true;
          cur.epoch = epoch;  // a reconnect during the push makes the next try immediate
          cur.retry_at = NowNanos() + kRetryBackoffNs;
        }
      }
      if (all_ok) {
        CAIRN_KILL_POINT("replicate.acked");
        Status st = local_->SetState(step, VersionState::kReplicated);
        if (!st.ok() && log_)
          log_->Warning("recording step " + std::to_string(step) +
                        " as REPLICATED: " + st.message());
      }
      view->reset();
    }
    lk.Lock();
    attempted_ = std::max(attempted_, step);
    if (all_ok) {
      ++stats_.replicated;
      stats_.newest_replicated = std::max(stats_.newest_replicated, step);
    } else {
      last_error_ = last;
    }
    cv_.NotifyAll();
  }
}

Status Replicator::Push(int holder, const HostTier::View& view) {
  TraceSpan span("replicate push", "replicate");
  const int me = comm_->rank();
  const SlotHeader& h = view.header();
  const uint32_t offer = next_offer_.fetch_add(1) & 0xffff;
  const std::string who =
      "replicating step " + std::to_string(h.step) + " to rank " + std::to_string(holder);
  const std::string header = EncodeSlotHeader(h);
  CAIRN_RETURN_IF_ERROR(
      comm_->Send(holder, MakeTag(ch_.offer, me, offer), header.data(), header.size())
          .WithContext(who));
  CAIRN_KILL_POINT("replicate.offered");
  auto ready = comm_->Recv(holder, MakeTag(ch_.ready, holder, offer), timeout_s_);
  if (!ready.ok()) return ready.status().WithContext(who);
  if (*ready != "ok") return Status::Unavailable(who + ": refused: " + *ready);
  const uint64_t n = h.data_bytes;
  const uint32_t chunks = static_cast<uint32_t>((n + kReplChunk - 1) / kReplChunk);
  std::vector<UcxComm::PendingSend> sends;
  for (uint32_t c = 0; c < chunks; ++c) {
    const uint64_t b = c * kReplChunk, len = std::min(kReplChunk, n - b);
    sends.push_back(comm_->StartSend(holder, MakeTag(ch_.data, me, DataSeq(offer, c)),
                                     view.data() + b, len, UcxComm::Auth::kContent));
  }
  Status first;
  const int64_t deadline = NowNanos() + static_cast<int64_t>(timeout_s_ * 1e9);
  for (auto& s : sends) {
    Status st = comm_->FinishSend(s, std::max(0.01, NanosToSeconds(deadline - NowNanos())));
    if (first.ok()) first = st;
  }
  CAIRN_RETURN_IF_ERROR(first.WithContext(who));
  CAIRN_KILL_POINT("replicate.data_sent");
  const int64_t t0 = NowNanos();
  auto ack = comm_->Recv(holder, MakeTag(ch_.ack, holder, offer), timeout_s_);
  if (!ack.ok()) return ack.status().WithContext(who);
  if (*ack != "ok") return Status::Unavailable(who + ": " + *ack);
  MutexLock g(mu_);
  stats_.last_ack_ms = NanosToSeconds(NowNanos() - t0) * 1e3;
  return Status::OK();
}

void Replicator::ServiceLoop() {
  for (;;) {
    {
      MutexLock lk(mu_);
      if (stop_) return;
    }
    comm_->ServiceHellos();
    auto in = comm_->RecvAny(ch_.offer, 0.05);
    if (in.ok()) HandleOffer(*in);
  }
}

void Replicator::HandleOffer(UcxComm::Incoming& in) {
  const int src = in.source;
  const uint32_t offer = in.seq;
  auto reply = [&](Channel channel, const std::string& text) {
    (void)comm_->Send(src, MakeTag(channel, comm_->rank(), offer), text.data(), text.size());
  };
  auto refuse = [&](const std::string& why) {
    {
      MutexLock g(mu_);
      ++stats_.refused;
    }
    if (log_) log_->Info("refused a replica from rank " + std::to_string(src) + ": " + why);
    reply(ch_.ready, why);
  };
  const auto& held = placement_.held_by(comm_->rank());
  if (std::find(held.begin(), held.end(), src) == held.end())
    return refuse("this rank does not hold replicas of rank " + std::to_string(src));
  auto h = DecodeSlotHeader(in.bytes);
  if (!h.ok()) return refuse(h.status().message());
  auto tier = store_->TierFor(src);
  if (!tier.ok()) return refuse(tier.status().message());
  auto slot = (*tier)->Reserve(h->step, FullPolicy::kSkip);
  if (!slot.ok()) return refuse(slot.status().message());
  SlotHeader base = *h;
  auto mem = (*tier)->Prepare(*slot, h->step, h->data_bytes, base);
  if (!mem.ok()) {
    (*tier)->Abort(*slot);
    return refuse(mem.status().message());
  }
  const uint64_t n = h->data_bytes;
  const uint32_t chunks = static_cast<uint32_t>((n + kReplChunk - 1) / kReplChunk);
  // At most kWindow chunks of 8 MiB are posted at a time: the transports interleave every posted
  // transfer, so posting them all would make every chunk land at the very end and leave
  // nothing to verify while the rest arrives.
  constexpr uint32_t kWindow = 2;
  std::vector<UcxComm::PendingRecv> recvs(chunks);
  auto post = [&](uint32_t c) {
    const uint64_t b = c * kReplChunk, len = std::min(kReplChunk, n - b);
    // Without the token in front (zero copy): every chunk is checked against the offer's
    // header, which came with the token, before the replica is kept (below).
    recvs[c] = comm_->StartRecv(src, MakeTag(ch_.data, src, DataSeq(offer, c)), *mem + b, len,
                                UcxComm::Auth::kContent);
  };
  for (uint32_t c = 0; c < std::min(kWindow, chunks); ++c) post(c);
  CAIRN_KILL_POINT("replicate.ready");
  reply(ch_.ready, "ok");
  // Verify while receiving: a helper thread checks every checksum chunk as soon as the
  // transfer chunk that completes it has arrived (still warm in cache), so only the tail is
  // left when the last byte lands.
  Mutex vmu;
  CondVar vcv;
  size_t arrived = 0;
  bool abort = false;
  Status verified;
  const std::byte* data = *mem;
  std::thread verifier([&] {
    for (uint32_t i = 0; i < chunks && verified.ok(); ++i) {
      {
        MutexLock vl(vmu);
        vcv.Wait(vl, [&] { return abort || arrived > i; });
        if (abort) return;
      }
      const int64_t t0 = NowNanos();
      verified =
          ReplicaStore::VerifyArrived(*h, data, i * kReplChunk, std::min(n, (i + 1) * kReplChunk));
      Trace::Record("replica checksum", "checksum", t0, NowNanos());
    }
  });
  Status st;
  const int64_t deadline = NowNanos() + static_cast<int64_t>(timeout_s_ * 1e9);
  for (uint32_t c = 0; c < chunks; ++c) {
    if (!st.ok()) {
      // Cancel what is still posted: no byte may land in the slot once it is given up.
      if (recvs[c].request) (void)comm_->FinishRecv(recvs[c], 0.001);
      continue;
    }
    st = comm_->FinishRecv(recvs[c], std::max(0.01, NanosToSeconds(deadline - NowNanos())));
    if (st.ok() && c + kWindow < chunks) post(c + kWindow);
    MutexLock vl(vmu);
    if (st.ok())
      ++arrived;
    else
      abort = true;
    vcv.NotifyAll();
  }
  if (st.ok()) CAIRN_KILL_POINT("replicate.received");
  verifier.join();
  if (st.ok()) st = chunks > 0 ? verified : ReplicaStore::Verify(*h, data);
  if (st.ok()) CAIRN_KILL_POINT("replicate.verified");
  if (st.ok()) (*tier)->MarkCopied(*slot);
  if (st.ok()) st = (*tier)->Commit(*slot, *h);
  if (!st.ok()) {
    (*tier)->Abort(*slot);
    {
      MutexLock g(mu_);
      ++stats_.refused;
    }
    if (log_)
      log_->Warning("replica of step " + std::to_string(h->step) + " from rank " +
                    std::to_string(src) + " not kept: " + st.message());
    reply(ch_.ack, "not kept: " + st.message());
    return;
  }
  {
    MutexLock g(mu_);
    ++stats_.received;
  }
  CAIRN_KILL_POINT("replicate.published");
  reply(ch_.ack, "ok");
}

}  // namespace cairn
