#include "recovery/pfs_run_reader.h"

#include <fcntl.h>

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "core/pool.h"
#include "persist/pfs_reader.h"

namespace cairn::restore_internal {

Status PfsRunReader::Prepare() {
  const LoadPlan& plan = a_.plan;
  const pb::Manifest& m = *a_.manifest;
  auto box_of = [&](uint32_t run) -> const pb::SavedBox& {
    return m.boxes(a_.cat.pieces[plan.runs[run].piece].pfs_box);
  };
  std::vector<uint32_t>& runs = a_.load.my_runs;
  std::sort(runs.begin(), runs.end(), [&](uint32_t x, uint32_t y) {
    const pb::SavedBox& a = box_of(x);
    const pb::SavedBox& b = box_of(y);
    return std::make_pair(a.file(), a.offset() + plan.runs[x].lo) <
           std::make_pair(b.file(), b.offset() + plan.runs[y].lo);
  });
  nruns_ = runs.size();
  spans_of_run_.assign(nruns_, {});
  puts_of_run_.assign(nruns_, {});
  target_of_.assign(nruns_, nullptr);
  slot_of_.assign(nruns_, nullptr);
  tickets_.assign(nruns_, {});
  bufs_.assign(nruns_, nullptr);
  pack_buf_.assign(plan.spans.size(), nullptr);
  copied_.assign(nruns_, 0);
  std::unordered_map<uint32_t, size_t> run_index;
  Status st;
  for (size_t k = 0; k < nruns_; ++k) {
    const uint32_t run = runs[k];
    run_index[run] = k;
    const LoadPlan::Run& r = plan.runs[run];
    const pb::SavedBox& b = box_of(run);
    if (st.ok() && !files_.count(b.file())) {
      auto f = a_.env.pfs_fs->OpenFile(JoinPath(a_.step_dir, m.files(static_cast<int>(b.file()))),
                                       O_RDONLY | O_CLOEXEC, 0);
      if (f.ok())
        files_[b.file()] = std::move(*f);
      else
        st = f.status().WithContext(a_.who);
    }
    for (uint32_t s = plan.piece_first_span[r.piece]; s < plan.piece_first_span[r.piece + 1]; ++s)
      if (plan.spans[s].run == static_cast<int32_t>(run)) spans_of_run_[k].push_back(s);
    const uint32_t only = spans_of_run_[k].front();
    if (spans_of_run_[k].size() == 1 && plan.spans[only].cls == a_.cls)
      target_of_[k] = a_.DirectTarget(only);
    if (target_of_[k]) a_.direct[only] = true;
    if (!target_of_[k]) biggest_ = std::max(biggest_, r.hi - r.lo);
    a_.report->pfs_bytes_read += r.hi - r.lo;
  }
  for (const RankLoad::Put& put : a_.load.puts)
    puts_of_run_[run_index.at(static_cast<uint32_t>(plan.spans[put.span].run))].push_back(&put);
  return st;
}

Status PfsRunReader::CopyRun(size_t k) {
  Status x;
  for (const RankLoad::Put* put : puts_of_run_[k])
    if (a_.Packed(put->span) && x.ok()) x = a_.Pack(put->span, pack_buf_[put->span], true);
  for (uint32_t sp : spans_of_run_[k])
    if (a_.plan.spans[sp].cls == a_.cls && !a_.direct[sp] && x.ok()) x = a_.FillFrom(sp, true);
  return x;
}

void PfsRunReader::Read(const Item& it) {
  const LoadPlan::Run& r = a_.plan.runs[a_.load.my_runs[it.k]];
  const pb::SavedBox& b = a_.manifest->boxes(a_.cat.pieces[r.piece].pfs_box);
  std::byte* dst = bufs_[it.k] + it.off;
  const std::string path = JoinPath(a_.step_dir, a_.manifest->files(static_cast<int>(b.file())));
  Status s = files_.at(b.file()).ReadAt(dst, it.n, b.offset() + r.lo + it.off).WithContext(path);
  if (s.ok()) s = CheckSavedChunk(*a_.manifest, b, r.lo + it.off, dst, path);
  MutexLock lk(mu_);
  if (s.code() == StatusCode::kCorruption)
    a_.NoteCorrupt(s.WithContext(a_.who));
  else if (!s.ok() && st_.ok())
    st_ = s.WithContext(a_.who);
  if (--left_[it.k] == 0) {
    if (a_.env.host_targets && st_.ok()) {
      lk.Unlock();
      Status x = CopyRun(it.k);
      lk.Lock();
      if (!x.ok() && copy_st_.ok()) copy_st_ = x;
      copied_[it.k] = 1;
    }
    ready_[it.k] = 1;
    cv_.NotifyAll();
  }
}

void PfsRunReader::ReleaseOldest() {
  const size_t k = sent_.front();
  sent_.pop_front();
  for (uint64_t t : tickets_[k]) Note(a_.env.transport->WaitSend(t, a_.env.timeout_s));
  tickets_[k].clear();
  free_slots_.push_back(slot_of_[k]);
  slot_of_[k] = nullptr;
}

void PfsRunReader::StartMore() {
  const uint64_t chunk = a_.cat.chunk_bytes;
  while (started_ < nruns_) {
    const size_t k = started_;
    const LoadPlan::Run& r = a_.plan.runs[a_.load.my_runs[k]];
    if (target_of_[k]) {
      bufs_[k] = target_of_[k];
    } else {
      if (free_slots_.empty() && slots_.size() < kPoolSize) {
        slots_.push_back(std::make_unique<Slot>());
        slots_.back()->run = std::make_unique<StagingBuffer>(biggest_, false, a_.Pin());
        free_slots_.push_back(slots_.back().get());
      }
      if (free_slots_.empty()) {
        if (sent_.empty()) return;  // every slot holds a run still being read or filled
        ReleaseOldest();
      }
      slot_of_[k] = free_slots_.back();
      free_slots_.pop_back();
      bufs_[k] = slot_of_[k]->run->data();
    }
    for (uint32_t s : spans_of_run_[k]) a_.at[s] = bufs_[k] + (a_.plan.spans[s].lo - r.lo);
    size_t packs_used = 0;
    for (const RankLoad::Put* put : puts_of_run_[k]) {
      const uint32_t s = put->span;
      if (!a_.Packed(s) || pack_buf_[s]) continue;
      if (Slot* slot = slot_of_[k]) {
        if (slot->packs.size() <= packs_used)
          slot->packs.push_back(std::make_unique<StagingBuffer>(biggest_, false));
        pack_buf_[s] = slot->packs[packs_used++]->data();
      } else {
        pack_buf_[s] = a_.Staging(a_.packed_bytes[s]);
      }
    }
    MutexLock lk(mu_);
    if (st_.ok())  // after an error the bytes still go out, so no peer waits for them
      for (uint64_t o = 0; o < r.hi - r.lo; o += chunk) {
        reads_->Run([this, it = Item{k, o, std::min(chunk, r.hi - r.lo - o)}] { Read(it); });
        ++left_[k];
      }
    if (left_[k] == 0) ready_[k] = 1;
    cv_.NotifyAll();
    ++started_;
  }
}

void PfsRunReader::WaitReady(size_t k) {
  MutexLock lk(mu_);
  while (!cv_.WaitFor(lk, std::chrono::microseconds(500),
                      [&]() CAIRN_REQUIRES(mu_) { return k < started_ && ready_[k]; })) {
    lk.Unlock();
    if (a_.env.transport) a_.env.transport->Progress();
    if (k >= started_) StartMore();
    lk.Lock();
  }
}

void PfsRunReader::PassOn(size_t k) {
  const LoadPlan& plan = a_.plan;
  if (!copied_[k]) {
    for (const RankLoad::Put* put : puts_of_run_[k])
      if (a_.Packed(put->span)) Note(a_.Pack(put->span, pack_buf_[put->span]));
    for (uint32_t s : spans_of_run_[k])
      if (plan.spans[s].cls == a_.cls && !a_.direct[s]) Note(a_.FillFrom(s));
  }
  // Each span (packed if its class needs only part of it) to every member of the span's
  // class that gets it from this rank.
  for (const RankLoad::Put* put : puts_of_run_[k]) {
    const uint32_t s = put->span;
    const bool packed = a_.Packed(s);
    const std::byte* src = packed ? pack_buf_[s] : a_.at[s];
    const uint64_t len = packed ? a_.packed_bytes[s] : plan.spans[s].hi - plan.spans[s].lo;
    for (uint64_t m = 0; m * kMsgBytes < len; ++m) {
      uint64_t t = 0;
      Note(a_.env.transport->Send(put->to, Seq(plan.spans[s].piece, m), src + m * kMsgBytes,
                                  std::min(kMsgBytes, len - m * kMsgBytes), &t));
      tickets_[k].push_back(t);
    }
  }
  if (slot_of_[k]) sent_.push_back(k);
}

Status PfsRunReader::Run() {
  Status opened = Prepare();
  {
    MutexLock lk(mu_);
    st_ = opened;
    left_.assign(nruns_, 0);
    ready_.assign(nruns_, 0);
  }
  const size_t nthreads = std::max<size_t>(1, std::min<size_t>(a_.env.read_threads, nruns_));
  Pool readers("cairn-read", nruns_ > 0 ? static_cast<int>(nthreads) : 0);
  TaskGroup reads(&readers);
  reads_ = &reads;
  for (size_t k = 0; k < nruns_; ++k) {
    StartMore();
    WaitReady(k);
    PassOn(k);
  }
  reads.Wait();
  reads_ = nullptr;
  while (!sent_.empty()) ReleaseOldest();
  MutexLock lk(mu_);
  Note(copy_st_);
  return st_.ok() ? out_ : st_;
}

}  // namespace cairn::restore_internal
