#include "recovery/ucx_transport.h"

#include <map>
#include <vector>

namespace cairn {
namespace {

class UcxRestoreTransport final : public RestoreTransport {
 public:
  UcxRestoreTransport(UcxComm* comm, Channel channel) : comm_(comm), channel_(channel) {}
  ~UcxRestoreTransport() override { (void)Finish(1.0); }

  Status Send(int peer, uint32_t seq, const void* buf, size_t n, uint64_t* ticket) override {
    const uint64_t id = next_++;
    if (ticket) *ticket = id;
    auto& s = sends_[id] = comm_->StartSend(peer, MakeTag(channel_, comm_->rank(), seq), buf, n);
    return s.status;
  }
  Status WaitSend(uint64_t ticket, double timeout_s) override {
    auto it = sends_.find(ticket);
    if (it == sends_.end()) return Status::OK();
    Status st = comm_->FinishSend(it->second, timeout_s);
    sends_.erase(it);
    return st;
  }
  Status PostRecv(int peer, uint32_t seq, void* buf, size_t n, uint64_t* ticket) override {
    recvs_.push_back(comm_->StartRecv(peer, MakeTag(channel_, peer, seq), buf, n));
    if (ticket) *ticket = recvs_.size();
    return recvs_.back().status;
  }
  Status WaitRecv(uint64_t ticket, double timeout_s) override {
    if (ticket == 0 || ticket > recvs_.size()) return Status::OK();
    if (!failed_.ok()) return failed_;
    Status st = comm_->FinishRecv(recvs_[ticket - 1], timeout_s);  // Finish's later: OK at once
    if (!st.ok()) failed_ = st;
    return st;
  }
  void Progress() override { comm_->Progress(); }
  Status Finish(double timeout_s) override {
    // Each request may take `timeout_s` from the end of the one before (a slow link keeps a
    // restore going), but once one failed the others are given up together, at once: a
    // link cut in the middle of a restore cost the timeout, then a second of cancelling,
    // once per piece still on the wire (LinkFlap.ARestoreCutMidTransfer...).
    Status first = failed_;
    failed_ = Status::OK();
    for (auto& r : recvs_) {
      if (!first.ok()) break;
      first = comm_->FinishRecv(r, timeout_s);
    }
    if (first.ok())
      for (auto& [id, s] : sends_) {
        first = comm_->FinishSend(s, timeout_s);
        if (!first.ok()) break;
      }
    if (!first.ok()) {
      std::vector<UcxRequest*> left;
      for (auto& r : recvs_) left.push_back(&r.request);
      for (auto& [id, s] : sends_) left.push_back(&s.request);
      comm_->GiveUp(left);
    }
    recvs_.clear();
    sends_.clear();
    return first;
  }

 private:
  UcxComm* comm_;
  Channel channel_;
  uint64_t next_ = 1;
  std::map<uint64_t, UcxComm::PendingSend> sends_;
  std::vector<UcxComm::PendingRecv> recvs_;
  Status failed_;  // the first WaitRecv that failed since the last Finish
};

}  // namespace

std::unique_ptr<RestoreTransport> MakeUcxRestoreTransport(UcxComm* comm, Channel channel) {
  return std::make_unique<UcxRestoreTransport>(comm, channel);
}

}  // namespace cairn
