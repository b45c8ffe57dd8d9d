// UcxGroup: the Group collectives over a UcxComm.
//
// Each collective has a sequence number that advances identically on every rank; its
// messages are tagged (channel, sender, sequence), so a late message of one collective can
// never be taken for another's. AllGather is Bruck's (ceil(log2 n) rounds, each rank
// talking to two ranks per round; Barrier is an empty one); Broadcast is a binomial tree
// from the root. A rank that fails relays an abort to the ranks still waiting on it, so a
// failure reaches every rank within log2(n) hops. A message lost with its link (the link
// went silent, or the endpoint under it was replaced after a redial) is sent again, and a
// receive goes on waiting, once the link to the same incarnation of the peer is back,
// until the collective's timeout: a cut shorter than CAIRN_OP_TIMEOUT_S costs a
// collective its duration, not its outcome (before, one rank could finish a collective
// the other had failed, and the next one then waited the whole timeout for a message that
// was never coming). A peer that reset the connection (its process died) fails it at
// once, as before. Sizes here are small (layouts, step numbers); bulk data goes through
// the Replicator.
// Thread-safety: one collective at a time.
#pragma once

#include <deque>
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
  // Defined in ucx_group.cc: an inline one is emitted (and exported) by whatever deletes a
  // UcxGroup, libcairn.so's api/checkpointer.cc included (tests/install_test.sh).
  ~UcxGroup() override;
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
  // The endpoint to `peer` as a transfer with it started (UcxComm::peer_epoch and
  // peer_incarnation).
  struct LinkState {
    uint64_t epoch = 0;
    std::string incarnation;
  };
  LinkState Link(int peer) const;
  // Now plus the operation timeout, in NowNanos.
  int64_t OpDeadline() const;
  // After a transfer with `peer` failed: true once an endpoint to the same incarnation of
  // the peer is there to try it again on, before `deadline` (NowNanos): one that replaced
  // the endpoint it failed on (a redial, by either rank), or one this call redials while
  // the failure may be the link's (UcxComm::peer_link_lost). False at once when the peer
  // reset the connection, restarted, or its host refused the redial's probe (its process
  // is gone: a lost rank still fails the collectives in a fraction of a second), and when
  // the owner cancels.
  bool Mend(int peer, const LinkState& was, int64_t deadline);
  // FinishSend of `send` (`bytes` to `to`, tagged `tag`, started at `was`), sending the
  // bytes again while Mend finds the link back.
  Status Deliver(int to, uint64_t tag, const std::string& bytes, UcxComm::PendingSend& send,
                 LinkState was, int64_t deadline);
  // The messages of the last kRememberCollectives collectives, with the endpoint each went
  // on: one sent on an endpoint replaced since may be lost with it, even after its send
  // completed (UCX completes a small send once it is buffered), while its receiver waits
  // for it. Resend sends those again to the same incarnation of their receiver (a copy
  // that arrives twice is never matched: no receive takes its tag a second time).
  static constexpr uint32_t kRememberCollectives = 4;
  struct Sent {
    int to;
    uint64_t tag;
    uint32_t seq;
    std::string bytes;
    LinkState link;
  };
  void Remember(int to, uint64_t tag, std::string_view bytes, const LinkState& link);
  void Resend();
  // Tells the ranks in `waiting` that this collective failed here (best effort).
  void Abort(const std::vector<int>& waiting, Channel channel, uint32_t seq, const Status& why);

  // FinishSend, ended early when the owner cancels.
  Status FinishSend(UcxComm::PendingSend& send);

  UcxComm* comm_;
  Channel collective_;
  Channel broadcast_;
  RecvWait wait_;
  uint32_t seq_ = 0;
  std::deque<Sent> sent_;
};

}  // namespace cairn
