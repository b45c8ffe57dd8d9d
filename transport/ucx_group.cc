#include "transport/ucx_group.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/clock.h"
#include "wire/codec.h"

namespace cairn {
namespace {

// Every collective message is a wire::CollectiveFrame: the data (Bruck's blocks, or the one
// block a broadcast carries), or the error that stopped its sender. A rank that fails (a
// peer died or timed out, or an abort came in) sends an abort to every rank still waiting
// on it in this collective, so the failure reaches every rank in at most log2(n) hops
// instead of each waiting out its own timeout.
std::string AbortFrame(const Status& why) {
  wire::CollectiveFrame f;
  f.set_abort(why.message());
  return wire::Encode(f);
}

// Bruck's blocks: the `count` contributions from index `first` on (mod n).
std::string PackBlocks(const std::vector<std::string>& all, int first, int count, int n) {
  wire::CollectiveFrame f;
  auto* blocks = f.mutable_data();
  for (int i = 0; i < count; ++i) blocks->add_block(all[static_cast<size_t>((first + i) % n)]);
  return wire::Encode(f);
}

Status UnpackBlocks(wire::CollectiveFrame& f, std::vector<std::string>* all, int first, int count,
                    int n, int from) {
  if (f.data().block_size() != count)
    return Status::Corruption("allgather: " + std::to_string(f.data().block_size()) +
                              " contributions from rank " + std::to_string(from) + ", expected " +
                              std::to_string(count));
  for (int i = 0; i < count; ++i)
    (*all)[static_cast<size_t>((first + i) % n)] = std::move(*f.mutable_data()->mutable_block(i));
  return Status::OK();
}

}  // namespace

UcxGroup::~UcxGroup() = default;

Status UcxGroup::Barrier() {
  return AllGather({}).status();
}

int64_t UcxGroup::OpDeadline() const {
  return NowNanos() + static_cast<int64_t>(comm_->op_timeout_s() * 1e9);
}

UcxGroup::LinkState UcxGroup::Link(int peer) const {
  return {comm_->peer_epoch(peer), comm_->peer_incarnation(peer)};
}

bool UcxGroup::Mend(int peer, const LinkState& was, int64_t deadline) {
  // A redial waits this long for the peer's host to answer; one that fails at once (no
  // address yet) is not tried again sooner than kPauseMs.
  constexpr double kRedialS = 1.5;
  constexpr int kPauseMs = 200;
  for (;;) {
    if (wait_.cancel && wait_.cancel->load(std::memory_order_relaxed)) return false;
    if (comm_->peer_incarnation(peer) != was.incarnation) return false;  // restarted
    if (comm_->peer_epoch(peer) != was.epoch && !comm_->peer_failed(peer)) return true;
    if (!comm_->peer_link_lost(peer)) return false;  // reset, or no error: not the link's
    const double left = NanosToSeconds(deadline - NowNanos());
    if (left <= 0) return false;
    const int64_t t0 = NowNanos();
    const Status st = comm_->Redial(peer, std::min(kRedialS, left));
    if (st.ok()) return true;
    // The peer's process is gone (its host refused the handshake), or was never there.
    if (st.code() == StatusCode::kFailedPrecondition) return false;
    if (NowNanos() - t0 < kPauseMs * 1'000'000LL)
      std::this_thread::sleep_for(std::chrono::milliseconds(kPauseMs));
  }
}

void UcxGroup::Remember(int to, uint64_t tag, std::string_view bytes, const LinkState& link) {
  sent_.push_back({to, tag, seq_, std::string(bytes), link});
  while (seq_ - sent_.front().seq >= kRememberCollectives) sent_.pop_front();
}

void UcxGroup::Resend() {
  constexpr double kResendS = 1;
  for (Sent& m : sent_) {
    const LinkState now = Link(m.to);
    if (now.incarnation != m.link.incarnation || now.epoch == m.link.epoch ||
        comm_->peer_failed(m.to))
      continue;
    auto send = comm_->StartSend(m.to, m.tag, m.bytes.data(), m.bytes.size());
    if (comm_->FinishSend(send, kResendS).ok()) m.link = now;
  }
}

Status UcxGroup::Deliver(int to, uint64_t tag, const std::string& bytes, UcxComm::PendingSend& send,
                         LinkState was, int64_t deadline) {
  Status st = FinishSend(send);
  while (!st.ok() && Mend(to, was, deadline)) {
    was = Link(to);
    send = comm_->StartSend(to, tag, bytes.data(), bytes.size());
    st = FinishSend(send);
  }
  return st;
}

Status UcxGroup::ReceiveRound(int from, uint64_t tag, wire::CollectiveFrame* out,
                              std::string* raw) {
  // Waits in slices: between them, what this rank sent on an endpoint replaced since goes
  // again (Resend), as the peer may be waiting for it as this rank waits for its message.
  constexpr double kSliceS = 0.5;
  const int64_t deadline = OpDeadline();
  LinkState was = Link(from);
  Result<std::string> got = Status::Unavailable("not received");
  for (;;) {
    const double left = NanosToSeconds(deadline - NowNanos());
    got = comm_->Recv(from, tag, std::clamp(left, 0.0, kSliceS), wait_);
    if (got.ok()) break;
    if (wait_.cancel && wait_.cancel->load(std::memory_order_relaxed)) return got.status();
    if (comm_->peer_failed(from) || Link(from).epoch != was.epoch) {
      if (!Mend(from, was, deadline)) return got.status();
      was = Link(from);
    } else if (NowNanos() >= deadline) {
      return Status::Unavailable("receive rank " + std::to_string(rank()) + " -> rank " +
                                 std::to_string(from) + ": nothing arrived within " +
                                 std::to_string(comm_->op_timeout_s()) + " s");
    }
    Resend();
  }
  Status st = wire::Decode(*got, out, "collective message from rank " + std::to_string(from));
  if (!st.ok()) return st;
  if (raw) *raw = std::move(*got);
  if (out->has_abort())
    return Status::Unavailable(out->abort() + " (an abort relayed by rank " + std::to_string(from) +
                               ")");
  if (!out->has_data())
    return Status::Corruption("collective: an empty message from rank " + std::to_string(from));
  return Status::OK();
}

Status UcxGroup::FinishSend(UcxComm::PendingSend& send) {
  if (wait_.cancel) {
    const int64_t deadline = OpDeadline();
    while (!comm_->Sent(send, 0.1)) {
      if (wait_.cancel->load(std::memory_order_relaxed))
        return comm_->FinishSend(send, 0).WithContext("given up (closing)");
      if (NowNanos() > deadline) break;
    }
  }
  return comm_->FinishSend(send);
}

void UcxGroup::Abort(const std::vector<int>& waiting, Channel channel, uint32_t seq,
                     const Status& why) {
  const std::string m = AbortFrame(why);
  std::vector<UcxComm::PendingSend> sends;
  for (int to : waiting)
    sends.push_back(comm_->StartSend(to, MakeTag(channel, rank(), seq), m.data(), m.size()));
  for (auto& s : sends) (void)FinishSend(s);  // best effort: `to` may be dead too
}

Result<std::vector<std::string>> UcxGroup::AllGather(std::string_view mine) {
  Resend();
  const uint32_t seq = ++seq_;
  const int n = size(), me = rank();
  std::vector<std::string> all(static_cast<size_t>(n));
  all[static_cast<size_t>(me)] = std::string(mine);
  // Bruck's algorithm: in the round of distance d (1, 2, 4, ... < n) a rank sends the
  // contributions it holds, those of ranks me .. me+c-1 (c = min(d, n-d)), to rank me-d
  // and receives those of me+d .. me+d+c-1 from rank me+d: ceil(log2 n) rounds, each rank
  // talking to 2 ranks per round. The send is started before the receive: a large message
  // completes only when its receiver takes it.
  std::vector<int> targets;  // rank me-d of every round, in order
  for (int d = 1; d < n; d *= 2) targets.push_back((me - d + n) % n);
  Status failed;
  size_t round = 0;
  for (int d = 1; d < n; d *= 2, ++round) {
    const int c = std::min(d, n - d);
    const int to = targets[round], from = (me + d) % n;
    const std::string out = PackBlocks(all, me, c, n);
    const int64_t deadline = OpDeadline();
    const LinkState link = Link(to);
    auto send = comm_->StartSend(to, MakeTag(collective_, me, seq), out.data(), out.size());
    Remember(to, MakeTag(collective_, me, seq), out, link);
    wire::CollectiveFrame in;
    const Status got = ReceiveRound(from, MakeTag(collective_, from, seq), &in);
    failed = got.ok() ? UnpackBlocks(in, &all, from, c, n, from) : got;
    // A rank that sent nothing within the timeout will not take this round's message
    // either (n = 2: the same peer): it is given up at once, not waited for a second time.
    Status st = !got.ok() && to == from
                    ? comm_->FinishSend(send, 0)
                    : Deliver(to, MakeTag(collective_, me, seq), out, send, link, deadline);
    if (failed.ok()) failed = st;
    if (!failed.ok()) break;
  }
  if (!failed.ok()) {
    Abort(std::vector<int>(targets.begin() + static_cast<std::ptrdiff_t>(round + 1), targets.end()),
          collective_, seq, failed);
    return failed.WithContext("allgather #" + std::to_string(seq));
  }
  return all;
}

Result<std::string> UcxGroup::Broadcast(int root, std::string_view data) {
  Resend();
  const uint32_t seq = ++seq_;
  const int n = size(), me = rank();
  if (root < 0 || root >= n)
    return Status::InvalidArgument("broadcast from rank " + std::to_string(root) +
                                   " in a group of " + std::to_string(n));
  // A binomial tree over the ranks relative to the root: rank v receives from v minus its
  // highest bit, then sends to v + 2^k for every 2^k above that bit: ceil(log2 n) hops.
  const int v = (me - root + n) % n;
  int high = 1;  // the lowest power of two above v's highest bit (1 for the root)
  while (high <= v) high *= 2;
  std::vector<int> children;
  for (int k = high; v + k < n; k *= 2) children.push_back((v + k + root) % n);
  // The root frames the data once; every other rank forwards the bytes it received.
  wire::CollectiveFrame frame;
  std::string message;
  if (v == 0) {
    frame.mutable_data()->add_block(std::string(data));
    message = wire::Encode(frame);
  } else {
    const int parent = (v - high / 2 + root) % n;
    Status st = ReceiveRound(parent, MakeTag(broadcast_, parent, seq), &frame, &message);
    if (st.ok() && frame.data().block_size() != 1)
      st = Status::Corruption("broadcast: " + std::to_string(frame.data().block_size()) +
                              " blocks from rank " + std::to_string(parent));
    if (!st.ok()) {
      Abort(children, broadcast_, seq, st);
      return st.WithContext("broadcast #" + std::to_string(seq));
    }
  }
  const int64_t deadline = OpDeadline();
  std::vector<UcxComm::PendingSend> sends;
  std::vector<LinkState> links;
  for (int to : children) {
    links.push_back(Link(to));
    sends.push_back(
        comm_->StartSend(to, MakeTag(broadcast_, me, seq), message.data(), message.size()));
    Remember(to, MakeTag(broadcast_, me, seq), message, links.back());
  }
  Status first;
  for (size_t i = 0; i < sends.size(); ++i) {
    Status st =
        Deliver(children[i], MakeTag(broadcast_, me, seq), message, sends[i], links[i], deadline);
    if (first.ok()) first = st;
  }
  if (!first.ok()) return first.WithContext("broadcast #" + std::to_string(seq));
  return std::move(*frame.mutable_data()->mutable_block(0));
}

}  // namespace cairn
