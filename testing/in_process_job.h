// An in-process job for tests of the restore collective: every rank a thread of this
// process, collectives through an in-process Group, the bytes between ranks through an
// in-process RestoreTransport, memory versions as real slot headers and bytes held in
// vectors (tests/recovery_test.cc; the UCX path of the same code is tested by
// recovery_process_test). Header-only: it uses recovery/, which cairn_testing does not link.
// Thread-safety: InProcessJob is shared by the rank threads (its own locks); each
// ThreadGroup, MailTransport and VecMemory belongs to one rank's thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "cairn/group.h"
#include "recovery/restore.h"
#include "tiers/slot_header.h"

namespace cairn::testing {

// The collectives of a job whose ranks are threads of this process.
class InProcessJob {
 public:
  explicit InProcessJob(int n) : n_(n), slots_(static_cast<size_t>(n)) {}
  int size() const { return n_; }
  Result<std::vector<std::string>> AllGather(int rank, std::string_view mine) {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return !draining_; });
    slots_[static_cast<size_t>(rank)] = std::string(mine);
    if (++arrived_ == n_) {
      result_ = slots_;
      draining_ = true;
      cv_.notify_all();
    } else {
      cv_.wait(lk, [&] { return draining_; });
    }
    std::vector<std::string> out = result_;
    if (--arrived_ == 0) {
      draining_ = false;
      cv_.notify_all();
    }
    return out;
  }
  // Messages: (from, to, seq) -> bytes.
  void Post(int from, int to, uint32_t seq, const void* p, size_t n) {
    std::lock_guard lk(mail_mu_);
    mail_[{from, to, seq}].assign(static_cast<const char*>(p), n);
    mail_cv_.notify_all();
  }
  bool Take(int from, int to, uint32_t seq, void* p, size_t n) {
    std::unique_lock lk(mail_mu_);
    const auto key = std::make_tuple(from, to, seq);
    if (!mail_cv_.wait_for(lk, std::chrono::seconds(30), [&] { return mail_.count(key) > 0; }))
      return false;
    const std::string& m = mail_[key];
    const bool ok = m.size() == n;
    std::memcpy(p, m.data(), std::min(n, m.size()));
    mail_.erase(key);
    return ok;
  }

 private:
  int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> slots_, result_;
  int arrived_ = 0;
  bool draining_ = false;
  std::mutex mail_mu_;
  std::condition_variable mail_cv_;
  std::map<std::tuple<int, int, uint32_t>, std::string> mail_;
};

// One rank's Group of an InProcessJob (Broadcast is an AllGather).
class ThreadGroup final : public Group {
 public:
  ThreadGroup(InProcessJob* job, int rank) : job_(job), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return job_->size(); }
  Status Barrier() override { return job_->AllGather(rank_, "").status(); }
  Result<std::vector<std::string>> AllGather(std::string_view mine) override {
    return job_->AllGather(rank_, mine);
  }
  Result<std::string> Broadcast(int root, std::string_view data) override {
    CAIRN_ASSIGN_OR_RETURN(auto all, job_->AllGather(rank_, data));
    return all[static_cast<size_t>(root)];
  }

 private:
  InProcessJob* job_;
  int rank_;
};

// One rank's RestoreTransport of an InProcessJob: sends are copied into a mailbox at once;
// Finish takes every posted receive from it (30 s each at most).
class MailTransport final : public RestoreTransport {
 public:
  MailTransport(InProcessJob* job, int rank) : job_(job), rank_(rank) {}
  Status Send(int peer, uint32_t seq, const void* buf, size_t n, uint64_t* ticket) override {
    job_->Post(rank_, peer, seq, buf, n);  // copied: complete at once
    if (ticket) *ticket = 0;
    return Status::OK();
  }
  Status WaitSend(uint64_t, double) override { return Status::OK(); }
  Status PostRecv(int peer, uint32_t seq, void* buf, size_t n, uint64_t* ticket) override {
    recvs_.push_back({peer, seq, buf, n, false});
    if (ticket) *ticket = recvs_.size();
    return Status::OK();
  }
  Status WaitRecv(uint64_t ticket, double) override {
    if (ticket == 0 || ticket > recvs_.size()) return Status::OK();
    return Take(recvs_[ticket - 1]);
  }
  Status Finish(double) override {
    Status st;
    for (Recv& r : recvs_) {
      Status one = Take(r);
      if (!one.ok() && st.ok()) st = one;
    }
    recvs_.clear();
    return st;
  }

 private:
  struct Recv {
    int peer;
    uint32_t seq;
    void* buf;
    size_t n;
    bool taken;
  };
  Status Take(Recv& r) {
    if (r.taken) return Status::OK();
    r.taken = true;
    if (!job_->Take(r.peer, rank_, r.seq, r.buf, r.n))
      return Status::Unavailable("no message " + std::to_string(r.seq) + " from rank " +
                                 std::to_string(r.peer));
    return Status::OK();
  }
  InProcessJob* job_;
  int rank_;
  std::vector<Recv> recvs_;
};

// A version one rank saved: a real slot header and its bytes.
struct SavedVersion {
  SlotHeader header;
  std::vector<std::byte> data;
  std::string path;
};

class PinnedSaved final : public PinnedVersion {
 public:
  explicit PinnedSaved(const SavedVersion* v) : v_(v) {}
  const SlotHeader& header() const override { return v_->header; }
  const std::byte* data() const override { return v_->data.data(); }
  const std::string& path() const override { return v_->path; }

 private:
  const SavedVersion* v_;
};

// A MemorySource of the versions in `held`.
class VecMemory final : public MemorySource {
 public:
  std::vector<const SavedVersion*> held;
  std::vector<HeldVersion> List() override {
    std::vector<HeldVersion> out;
    for (const SavedVersion* v : held)
      out.push_back({static_cast<int>(v->header.rank), v->header.step, v->header.world_size});
    return out;
  }
  Result<std::unique_ptr<PinnedVersion>> Pin(const HeldVersion& h) override {
    for (const SavedVersion* v : held)
      if (static_cast<int>(v->header.rank) == h.source && v->header.step == h.step)
        return std::unique_ptr<PinnedVersion>(new PinnedSaved(v));
    return Status::NotFound("not held");
  }
  std::string Describe() const override { return "test memory"; }
};

}  // namespace cairn::testing
