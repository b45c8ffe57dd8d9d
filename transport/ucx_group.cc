#include "transport/ucx_group.h"

namespace cairn {

Status UcxGroup::Barrier() {
  return AllGather({}).status();
}

Result<std::vector<std::string>> UcxGroup::AllGather(std::string_view mine) {
  const uint32_t seq = ++seq_;
  const int n = size(), me = rank();
  std::vector<std::string> all(static_cast<size_t>(n));
  all[static_cast<size_t>(me)] = std::string(mine);
  // Send to the ranks after us first, in ring order, so no rank is everyone's first target.
  // All sends are started before any receive: a large message completes only when its
  // receiver takes it, so blocking sends would deadlock.
  std::vector<UcxComm::PendingSend> sends;
  for (int k = 1; k < n; ++k) {
    const int to = (me + k) % n;
    sends.push_back(comm_->StartSend(to, MakeTag(collective_, me, seq), mine.data(), mine.size()));
  }
  Status first;
  for (int k = 1; k < n && first.ok(); ++k) {
    const int from = (me - k + n) % n;
    auto got = comm_->Recv(from, MakeTag(collective_, from, seq), comm_->op_timeout_s());
    if (!got.ok())
      first = got.status();
    else
      all[static_cast<size_t>(from)] = std::move(*got);
  }
  for (auto& s : sends) {
    Status st = comm_->FinishSend(s);
    if (first.ok()) first = st;
  }
  if (!first.ok()) return first.WithContext("allgather #" + std::to_string(seq));
  return all;
}

Result<std::string> UcxGroup::Broadcast(int root, std::string_view data) {
  const uint32_t seq = ++seq_;
  const int n = size(), me = rank();
  if (root < 0 || root >= n)
    return Status::InvalidArgument("broadcast from rank " + std::to_string(root) +
                                   " in a group of " + std::to_string(n));
  if (me == root) {
    std::vector<UcxComm::PendingSend> sends;
    for (int k = 1; k < n; ++k) {
      const int to = (me + k) % n;
      sends.push_back(comm_->StartSend(to, MakeTag(broadcast_, me, seq), data.data(), data.size()));
    }
    Status first;
    for (auto& s : sends) {
      Status st = comm_->FinishSend(s);
      if (first.ok()) first = st;
    }
    if (!first.ok()) return first.WithContext("broadcast #" + std::to_string(seq));
    return std::string(data);
  }
  auto got = comm_->Recv(root, MakeTag(broadcast_, root, seq), comm_->op_timeout_s());
  if (!got.ok()) return got.status().WithContext("broadcast #" + std::to_string(seq));
  return std::move(*got);
}

}  // namespace cairn
