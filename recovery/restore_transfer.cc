#include "recovery/restore_transfer.h"

#include <fcntl.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <thread>

#include "core/checksum.h"
#include "core/clock.h"
#include "core/mutex.h"
#include "persist/pfs_reader.h"

namespace cairn::restore_internal {

StagingBuffer::StagingBuffer(uint64_t n, bool populate, CopyEngine* pin)
    : n_(std::max<uint64_t>(n, 1)) {
  void* p = ::mmap(nullptr, n_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | (populate ? MAP_POPULATE : 0), -1, 0);
  if (p == MAP_FAILED) {
    fallback_ = std::make_unique<std::byte[]>(n_);
    p_ = fallback_.get();
  } else {
    p_ = static_cast<std::byte*>(p);
  }
  if (pin && pin->RegisterHost(p_, n_).ok()) pinned_ = pin;
}
StagingBuffer::~StagingBuffer() {
  if (pinned_) pinned_->UnregisterHost(p_, n_);
  if (!fallback_) ::munmap(p_, n_);
}

Status Attempt::ReadRuns() {
  // Reads every run of this rank once, in file order, in chunk-sized preads on a few
  // threads, each chunk verified right after its read while it is still in cache. Runs
  // land in their target when they are exactly this rank's target region, else in a small
  // pool of buffers that is reused (fresh memory costs more than the copy here). As each
  // run completes, this thread sends it on to the ranks that need it (packed down to their
  // regions when that is smaller) and fills this rank's targets from it; its buffer goes
  // back to the pool once those sends completed.
  std::map<uint32_t, int> fds;
  Status st;
  std::sort(load.my_runs.begin(), load.my_runs.end(), [&](uint32_t x, uint32_t y) {
    const pb::SavedBox& a = manifest->boxes(cat.pieces[plan.runs[x].piece].pfs_box);
    const pb::SavedBox& b = manifest->boxes(cat.pieces[plan.runs[y].piece].pfs_box);
    return std::make_pair(a.file(), a.offset() + plan.runs[x].lo) <
           std::make_pair(b.file(), b.offset() + plan.runs[y].lo);
  });
  const size_t nruns = load.my_runs.size();
  std::vector<std::vector<uint32_t>> spans_of_run(nruns);
  std::unordered_map<uint32_t, size_t> run_index;
  std::vector<std::byte*> target_of(nruns, nullptr);  // runs read straight into a target
  uint64_t biggest = 0;
  for (size_t k = 0; k < nruns; ++k) {
    const uint32_t run = load.my_runs[k];
    run_index[run] = k;
    const LoadPlan::Run& r = plan.runs[run];
    const pb::SavedBox& b = manifest->boxes(cat.pieces[r.piece].pfs_box);
    if (st.ok() && !fds.count(b.file())) {
      auto fd = env.pfs_fs->Open(JoinPath(step_dir, manifest->files(static_cast<int>(b.file()))),
                                 O_RDONLY | O_CLOEXEC, 0);
      if (fd.ok())
        fds[b.file()] = *fd;
      else
        st = fd.status().WithContext(who);
    }
    for (uint32_t s = plan.piece_first_span[r.piece]; s < plan.piece_first_span[r.piece + 1]; ++s)
      if (plan.spans[s].run == static_cast<int32_t>(run)) spans_of_run[k].push_back(s);
    const uint32_t only = spans_of_run[k].front();
    if (spans_of_run[k].size() == 1 && plan.spans[only].cls == cls)
      target_of[k] = DirectTarget(only);
    if (target_of[k]) direct[only] = true;
    if (!target_of[k]) biggest = std::max(biggest, r.hi - r.lo);
    report->pfs_bytes_read += r.hi - r.lo;
  }
  std::vector<std::vector<const RankLoad::Put*>> puts_of_run(nruns);
  for (const RankLoad::Put& put : load.puts)
    puts_of_run[run_index.at(static_cast<uint32_t>(plan.spans[put.span].run))].push_back(&put);

  // The pool: a slot holds a run's bytes and the packed copies sent from it.
  struct Slot {
    std::unique_ptr<StagingBuffer> run;
    std::vector<std::unique_ptr<StagingBuffer>> packs;
  };
  const size_t pool_size = 3;  // a run being read, one being sent, one spare
  std::vector<std::unique_ptr<Slot>> slots;
  std::vector<Slot*> free_slots;
  std::vector<Slot*> slot_of(nruns, nullptr);
  std::vector<std::vector<uint64_t>> tickets(nruns);
  std::deque<size_t> sent;  // runs whose sends are in flight, oldest first

  struct Item {
    size_t k;
    uint64_t off;  // from the run's lo
    uint64_t n;
  };
  Mutex mu;
  CondVar cv;
  std::deque<Item> queue;
  bool stop = false;
  std::vector<uint64_t> left(nruns, 0);
  std::vector<std::byte*> bufs(nruns, nullptr);
  // Bytes, not vector<bool>: neighbouring flags are written by different threads.
  std::vector<uint8_t> ready(nruns, 0);   // read, and (host targets) packed and filled
  std::vector<uint8_t> copied(nruns, 0);  // the packs and fills were done by a reader
  // By span: its packed bytes. Sized up front: the main thread fills entries for later
  // runs while readers use earlier ones.
  std::vector<std::byte*> pack_buf(plan.spans.size(), nullptr);
  Status copy_st;
  // Packs and fills of run k with memcpy, on the reader that completed it (so they run in
  // parallel with the next reads and this thread's sends).
  const auto copy_run = [&](size_t k) {
    Status x;
    for (const RankLoad::Put* put : puts_of_run[k])
      if (Packed(put->span) && x.ok()) x = Pack(put->span, pack_buf[put->span], true);
    for (uint32_t sp : spans_of_run[k])
      if (plan.spans[sp].cls == cls && !direct[sp] && x.ok()) x = FillFrom(sp, true);
    return x;
  };
  auto work = [&] {
    for (;;) {
      Item it;
      {
        MutexLock lk(mu);
        cv.Wait(lk, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;
        it = queue.front();
        queue.pop_front();
      }
      const LoadPlan::Run& r = plan.runs[load.my_runs[it.k]];
      const pb::SavedBox& b = manifest->boxes(cat.pieces[r.piece].pfs_box);
      std::byte* dst = bufs[it.k] + it.off;
      const std::string path = JoinPath(step_dir, manifest->files(static_cast<int>(b.file())));
      Status s = env.pfs_fs->ReadAt(fds.at(b.file()), dst, it.n, b.offset() + r.lo + it.off)
                     .WithContext(path);
      if (s.ok()) s = CheckSavedChunk(*manifest, b, r.lo + it.off, dst, path);
      MutexLock lk(mu);
      if (s.code() == StatusCode::kCorruption)
        NoteCorrupt(s.WithContext(who));
      else if (!s.ok() && st.ok())
        st = s.WithContext(who);
      if (--left[it.k] == 0) {
        if (env.host_targets && st.ok()) {
          lk.Unlock();
          Status x = copy_run(it.k);
          lk.Lock();
          if (!x.ok() && copy_st.ok()) copy_st = x;
          copied[it.k] = true;
        }
        ready[it.k] = true;
        cv.NotifyAll();
      }
    }
  };
  const int nthreads =
      static_cast<int>(std::max<size_t>(1, std::min<size_t>(env.read_threads, nruns)));
  std::vector<std::thread> threads;
  for (int t = 0; t < nthreads && nruns > 0; ++t) threads.emplace_back(work);

  Status out;
  const auto note = [&](const Status& x) {
    if (!x.ok() && out.ok()) out = x;
  };
  // Gives the slot of the oldest run whose sends are in flight back, once they completed.
  const auto release_oldest = [&] {
    const size_t k = sent.front();
    sent.pop_front();
    for (uint64_t t : tickets[k]) note(env.transport->WaitSend(t, env.timeout_s));
    tickets[k].clear();
    free_slots.push_back(slot_of[k]);
    slot_of[k] = nullptr;
  };
  size_t started = 0;
  const auto start_more = [&] {
    while (started < nruns) {
      const size_t k = started;
      const LoadPlan::Run& r = plan.runs[load.my_runs[k]];
      if (target_of[k]) {
        bufs[k] = target_of[k];
      } else {
        if (free_slots.empty() && slots.size() < pool_size) {
          slots.push_back(std::make_unique<Slot>());
          slots.back()->run = std::make_unique<StagingBuffer>(biggest, false, Pin());
          free_slots.push_back(slots.back().get());
        }
        if (free_slots.empty()) {
          if (sent.empty()) return;  // every slot holds a run still being read or filled
          release_oldest();
        }
        slot_of[k] = free_slots.back();
        free_slots.pop_back();
        bufs[k] = slot_of[k]->run->data();
      }
      for (uint32_t s : spans_of_run[k]) at[s] = bufs[k] + (plan.spans[s].lo - r.lo);
      size_t packs_used = 0;
      for (const RankLoad::Put* put : puts_of_run[k]) {
        const uint32_t s = put->span;
        if (!Packed(s) || pack_buf[s]) continue;
        Slot* slot = slot_of[k];
        if (slot) {
          if (slot->packs.size() <= packs_used)
            slot->packs.push_back(std::make_unique<StagingBuffer>(biggest, false));
          pack_buf[s] = slot->packs[packs_used++]->data();
        } else {
          pack_buf[s] = Staging(packed_bytes[s]);
        }
      }
      MutexLock lk(mu);
      if (st.ok())  // after an error the bytes still go out, so no peer waits for them
        for (uint64_t o = 0; o < r.hi - r.lo; o += cat.chunk_bytes) {
          queue.push_back({k, o, std::min(cat.chunk_bytes, r.hi - r.lo - o)});
          ++left[k];
        }
      if (left[k] == 0) ready[k] = true;
      cv.NotifyAll();
      ++started;
    }
  };
  for (size_t k = 0; k < nruns; ++k) {
    start_more();
    {
      // Keep the sends of earlier runs moving while waiting for this one.
      MutexLock lk(mu);
      while (!cv.WaitFor(lk, std::chrono::microseconds(500),
                         [&] { return k < started && ready[k]; })) {
        lk.Unlock();
        if (env.transport) env.transport->Progress();
        if (k >= started) start_more();
        lk.Lock();
      }
    }
    // Packs and fills, unless the reader that completed the run did them.
    if (!copied[k]) {
      for (const RankLoad::Put* put : puts_of_run[k])
        if (Packed(put->span)) note(Pack(put->span, pack_buf[put->span]));
      for (uint32_t s : spans_of_run[k])
        if (plan.spans[s].cls == cls && !direct[s]) note(FillFrom(s));
    }
    // Sends: each span (packed if its class needs only part of it) to every member of the
    // span's class that gets it from this rank.
    for (const RankLoad::Put* put : puts_of_run[k]) {
      const uint32_t s = put->span;
      const std::byte* src = Packed(s) ? pack_buf[s] : at[s];
      const uint64_t len = Packed(s) ? packed_bytes[s] : plan.spans[s].hi - plan.spans[s].lo;
      for (uint64_t m = 0; m * kMsgBytes < len; ++m) {
        uint64_t t = 0;
        note(env.transport->Send(put->to, Seq(plan.spans[s].piece, m), src + m * kMsgBytes,
                                 std::min(kMsgBytes, len - m * kMsgBytes), &t));
        tickets[k].push_back(t);
      }
    }
    if (slot_of[k]) sent.push_back(k);
  }
  {
    MutexLock lk(mu);
    stop = true;
    cv.NotifyAll();
  }
  for (auto& t : threads) t.join();
  while (!sent.empty()) release_oldest();
  for (auto [f, fd] : fds) (void)env.pfs_fs->Close(fd);
  note(copy_st);
  return st.ok() ? out : st;
}

Status Attempt::Run() {
  load = ForRank(plan, cat, env.rank);
  fills_of_span.assign(plan.spans.size(), {});
  at.assign(plan.spans.size(), nullptr);
  direct.assign(plan.spans.size(), false);
  for (uint32_t fi = 0; fi < plan.fills[cls].size(); ++fi)
    fills_of_span[plan.fills[cls][fi].span].push_back(fi);
  if (cat.pieces.size() >= (1u << 24))
    return Status::InvalidArgument(who + ": more than 2^24 saved pieces");
  Status st;
  // 1. Receives, straight into the target where the bytes are one whole target region.
  PlanPacking();
  for (const RankLoad::Get& g : load.gets) {
    if (g.how != RankLoad::How::kRecv) continue;
    const LoadPlan::Span& sp = plan.spans[g.span];
    const uint64_t n = Packed(g.span) ? packed_bytes[g.span] : sp.hi - sp.lo;
    std::byte* dst = Packed(g.span) ? PackedTarget(g.span) : DirectTarget(g.span);
    direct[g.span] = dst != nullptr;
    at[g.span] = dst ? dst : Staging(n, true, true);
    if ((n + kMsgBytes - 1) / kMsgBytes > 255)
      return Status::InvalidArgument(who + ": a saved piece over 16 GiB");
    for (uint64_t k = 0; k * kMsgBytes < n; ++k)
      CAIRN_RETURN_IF_ERROR(env.transport->PostRecv(g.from, Seq(sp.piece, k),
                                                    at[g.span] + k * kMsgBytes,
                                                    std::min(kMsgBytes, n - k * kMsgBytes)));
    report->bytes_received += n;
  }
  // 2. What this rank holds: where its pieces' bytes are.
  if (!cat.from_pfs)
    for (const auto& [p, loc] : local)
      for (uint32_t s = plan.piece_first_span[p]; s < plan.piece_first_span[p + 1]; ++s)
        at[s] = const_cast<std::byte*>(loc.first->data()) + loc.second->offset + plan.spans[s].lo;
  // 3. PFS: read this rank's runs once, passing each on as it completes.
  if (cat.from_pfs) st = ReadRuns();
  // 4. Memory: sends, each chunk verified before it leaves (packed when the receiving
  // class needs only part of the span).
  std::map<uint32_t, const std::byte*> payload;
  for (const RankLoad::Put& put : cat.from_pfs ? std::span<const RankLoad::Put>()
                                               : std::span<const RankLoad::Put>(load.puts)) {
    const LoadPlan::Span& sp = plan.spans[put.span];
    auto [it, fresh] = payload.emplace(put.span, at[put.span]);
    if (fresh && Packed(put.span)) {
      VerifyLocal(sp.piece, sp.lo, sp.hi);
      std::byte* buf = Staging(packed_bytes[put.span]);
      Status s = Pack(put.span, buf);
      if (!s.ok() && st.ok()) st = s;
      it->second = buf;
    }
    const uint64_t n = Packed(put.span) ? packed_bytes[put.span] : sp.hi - sp.lo;
    for (uint64_t k = 0; k * kMsgBytes < n; ++k) {
      const uint64_t m = std::min(kMsgBytes, n - k * kMsgBytes);
      if (!Packed(put.span))
        VerifyLocal(sp.piece, sp.lo + k * kMsgBytes, sp.lo + k * kMsgBytes + m);
      Status s = env.transport->Send(put.to, Seq(sp.piece, k), it->second + k * kMsgBytes, m);
      if (!s.ok() && st.ok()) st = s;
    }
  }
  // 5. Local copies from this rank's memory.
  for (const RankLoad::Get& g : load.gets) {
    if (g.how != RankLoad::How::kLocal || direct[g.span]) continue;
    const LoadPlan::Span& sp = plan.spans[g.span];
    report->bytes_local += sp.hi - sp.lo;
    std::byte* dst = DirectTarget(g.span);
    if (dst && env.engine->checksums_while_copying() && !verified.count(sp.piece)) {
      // The same layout: checksums taken while copying.
      Status s = CopyVerified(sp.piece, dst);
      if (!s.ok() && st.ok()) st = s;
      continue;
    }
    VerifyLocal(sp.piece, sp.lo, sp.hi);
    Status s = FillFrom(g.span);
    if (!s.ok() && st.ok()) st = s;
  }
  // 6. Everything in flight; then what arrived.
  Status fin = env.transport ? env.transport->Finish(env.timeout_s) : Status::OK();
  if (!fin.ok() && st.ok()) st = fin.WithContext(who + ": restore transfer");
  if (!st.ok()) return st;
  for (const RankLoad::Get& g : load.gets)
    if (g.how == RankLoad::How::kRecv && !direct[g.span])
      CAIRN_RETURN_IF_ERROR(Packed(g.span) ? Unpack(g.span) : FillFrom(g.span));
  return Status::OK();
}

}  // namespace cairn::restore_internal
