// UcxGroup: the Group collectives over a UcxComm.
//
// Each collective has a sequence number that advances identically on every rank; its
// messages are tagged (channel, sender, sequence), so a late message of one collective can
// never be taken for another's. AllGather is Bruck's (ceil(log2 n) rounds, each rank
// talking to two ranks per round; Barrier is an empty one); Broadcast is a binomial tree
// from the root. A rank that fails relays an abort to the ranks still waiting on it, so a
// failure reaches every rank within log2(n) hops. Sizes here are small (layouts, step
// numbers); bulk data goes through the Replicator.
// Thread-safety: one collective at a time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cairn/group.h"
#include "transport/ucx_comm.h"

namespace cairn {
namespace wire {
class CollectiveFrame;
}

class UcxGroup final : public Group {
 public:
  // Groups on the same comm need channels of their own (one pair per thread that runs
  // collectives; see api/channels.h). `wait` is how its receives wait: a background thread
  // that waits on its peers most of the time polls gently, and its owner may end a
  // collective in flight by setting `*wait.cancel` (the collective then fails).
  UcxGroup(UcxComm* comm, Channel collective, Channel broadcast, RecvWait wait = {})
      : comm_(comm), collective_(collective), broadcast_(broadcast), wait_(wait) {}
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  Status Barrier() override;
  Result<std::vector<std::string>> AllGather(std::string_view mine) override;
  Result<std::string> Broadcast(int root, std::string_view data) override;

 private:
  // Receives one round's message from `from`: its framed bytes, or the relayed abort as
  // an error.
  // The frame from `from`, decoded into *out (its bytes left in *raw when raw is not null);
  // an abort it carries, or a frame that is none, as an error.
  Status ReceiveRound(int from, uint64_t tag, wire::CollectiveFrame* out,
                      std::string* raw = nullptr);
  // Tells the ranks in `waiting` that this collective failed here (best effort).
  void Abort(const std::vector<int>& waiting, Channel channel, uint32_t seq, const Status& why);

  // FinishSend, ended early when the owner cancels.
  Status FinishSend(UcxComm::PendingSend& send);

  UcxComm* comm_;
  Channel collective_;
  Channel broadcast_;
  RecvWait wait_;
  uint32_t seq_ = 0;
};

}  // namespace cairn
