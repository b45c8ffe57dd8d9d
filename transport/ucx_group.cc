#include "transport/ucx_group.h"

#include <cstring>

namespace cairn {
namespace {

// Every collective message starts with one byte: kData, then the payload, or kAbort, then
// the error that stopped its sender. A rank that fails (a peer died or timed out, or an
// abort came in) sends kAbort to every rank still waiting on it in this collective, so
// the failure reaches every rank in at most log2(n) hops instead of each waiting out its
// own timeout.
constexpr char kData = 'D';
constexpr char kAbort = 'A';

std::string Framed(char kind, std::string_view body) {
  std::string m(1, kind);
  m.append(body);
  return m;
}

// Bruck's blocks: `count` contributions, each as a 4-byte length then its bytes.
std::string PackBlocks(const std::vector<std::string>& all, int first, int count, int n) {
  std::string out(1, kData);
  for (int i = 0; i < count; ++i) {
    const std::string& b = all[static_cast<size_t>((first + i) % n)];
    const auto len = static_cast<uint32_t>(b.size());
    out.append(reinterpret_cast<const char*>(&len), sizeof len);
    out.append(b);
  }
  return out;
}

Status UnpackBlocks(std::string_view m, std::vector<std::string>* all, int first, int count, int n,
                    int from) {
  size_t off = 1;
  for (int i = 0; i < count; ++i) {
    uint32_t len = 0;
    if (m.size() - off < sizeof len)
      return Status::Corruption("allgather: a short message from rank " + std::to_string(from));
    std::memcpy(&len, m.data() + off, sizeof len);
    off += sizeof len;
    if (m.size() - off < len)
      return Status::Corruption("allgather: a short message from rank " + std::to_string(from));
    (*all)[static_cast<size_t>((first + i) % n)] = std::string(m.substr(off, len));
    off += len;
  }
  if (off != m.size())
    return Status::Corruption("allgather: a long message from rank " + std::to_string(from));
  return Status::OK();
}

}  // namespace

Status UcxGroup::Barrier() {
  return AllGather({}).status();
}

Status UcxGroup::ReceiveRound(int from, uint64_t tag, std::string* out) {
  auto got = comm_->Recv(from, tag, comm_->op_timeout_s());
  if (!got.ok()) return got.status();
  if (got->empty() || ((*got)[0] != kData && (*got)[0] != kAbort))
    return Status::Corruption("collective: a malformed message from rank " + std::to_string(from));
  if ((*got)[0] == kAbort)
    return Status::Unavailable(got->substr(1) + " (an abort relayed by rank " +
                               std::to_string(from) + ")");
  *out = std::move(*got);
  return Status::OK();
}

void UcxGroup::Abort(const std::vector<int>& waiting, Channel channel, uint32_t seq,
                     const Status& why) {
  const std::string m = Framed(kAbort, why.message());
  std::vector<UcxComm::PendingSend> sends;
  for (int to : waiting)
    sends.push_back(comm_->StartSend(to, MakeTag(channel, rank(), seq), m.data(), m.size()));
  for (auto& s : sends) (void)comm_->FinishSend(s);  // best effort: `to` may be dead too
}

Result<std::vector<std::string>> UcxGroup::AllGather(std::string_view mine) {
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
    auto send = comm_->StartSend(to, MakeTag(collective_, me, seq), out.data(), out.size());
    std::string in;
    failed = ReceiveRound(from, MakeTag(collective_, from, seq), &in);
    if (failed.ok()) failed = UnpackBlocks(in, &all, from, c, n, from);
    Status st = comm_->FinishSend(send);
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
  std::string message = Framed(kData, data);
  if (v != 0) {
    const int parent = (v - high / 2 + root) % n;
    Status st = ReceiveRound(parent, MakeTag(broadcast_, parent, seq), &message);
    if (!st.ok()) {
      Abort(children, broadcast_, seq, st);
      return st.WithContext("broadcast #" + std::to_string(seq));
    }
  }
  std::vector<UcxComm::PendingSend> sends;
  for (int to : children)
    sends.push_back(
        comm_->StartSend(to, MakeTag(broadcast_, me, seq), message.data(), message.size()));
  Status first;
  for (auto& s : sends) {
    Status st = comm_->FinishSend(s);
    if (first.ok()) first = st;
  }
  if (!first.ok()) return first.WithContext("broadcast #" + std::to_string(seq));
  return message.substr(1);
}

}  // namespace cairn
