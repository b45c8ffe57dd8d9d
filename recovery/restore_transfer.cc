#include "recovery/restore_transfer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "core/arith.h"
#include "recovery/pfs_run_reader.h"

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
  return PfsRunReader(*this).Run();
}

Status Attempt::PostReceives() {
  for (const RankLoad::Get& g : load.gets) {
    if (g.how != RankLoad::How::kRecv) continue;
    const LoadPlan::Span& sp = plan.spans[g.span];
    const uint64_t n = Packed(g.span) ? packed_bytes[g.span] : sp.hi - sp.lo;
    std::byte* dst = Packed(g.span) ? PackedTarget(g.span) : DirectTarget(g.span);
    direct[g.span] = dst != nullptr;
    at[g.span] = dst ? dst : Staging(n, true, true);
    if (CeilDiv(n, kMsgBytes) > 255)
      return Status::InvalidArgument(who + ": a saved piece over 16 GiB");
    for (uint64_t k = 0; k * kMsgBytes < n; ++k)
      CAIRN_RETURN_IF_ERROR(env.transport->PostRecv(g.from, Seq(cat.from_pfs ? sp.piece : g.seq, k),
                                                    at[g.span] + k * kMsgBytes,
                                                    std::min(kMsgBytes, n - k * kMsgBytes)));
    report->bytes_received += n;
  }
  return Status::OK();
}

void Attempt::SendHeld(Status* st) {
  std::map<uint32_t, const std::byte*> payload;
  for (const RankLoad::Put& put : load.puts) {
    const LoadPlan::Span& sp = plan.spans[put.span];
    auto [it, fresh] = payload.emplace(put.span, at[put.span]);
    if (fresh && Packed(put.span)) {
      VerifyLocal(sp.piece, sp.lo, sp.hi);
      std::byte* buf = Staging(packed_bytes[put.span]);
      Status s = Pack(put.span, buf);
      if (!s.ok() && st->ok()) *st = s;
      it->second = buf;
    }
    const uint64_t n = Packed(put.span) ? packed_bytes[put.span] : sp.hi - sp.lo;
    for (uint64_t k = 0; k * kMsgBytes < n; ++k) {
      const uint64_t m = std::min(kMsgBytes, n - k * kMsgBytes);
      if (!Packed(put.span))
        VerifyLocal(sp.piece, sp.lo + k * kMsgBytes, sp.lo + k * kMsgBytes + m);
      Status s = env.transport->Send(put.to, Seq(put.seq, k), it->second + k * kMsgBytes, m);
      if (!s.ok() && st->ok()) *st = s;
    }
  }
}

void Attempt::CopyLocal(Status* st) {
  for (const RankLoad::Get& g : load.gets) {
    if (g.how != RankLoad::How::kLocal || direct[g.span]) continue;
    const LoadPlan::Span& sp = plan.spans[g.span];
    report->bytes_local += sp.hi - sp.lo;
    std::byte* dst = DirectTarget(g.span);
    if (dst && env.engine->checksums_while_copying() && !verified.count(sp.piece)) {
      // The same layout: checksums taken while copying.
      Status s = CopyVerified(sp.piece, dst);
      if (!s.ok() && st->ok()) *st = s;
      continue;
    }
    VerifyLocal(sp.piece, sp.lo, sp.hi);
    Status s = FillFrom(g.span);
    if (!s.ok() && st->ok()) *st = s;
  }
}

Status Attempt::Run() {
  load = ForRank(plan, cat, env.rank);
  fills_of_span.assign(plan.spans.size(), {});
  at.assign(plan.spans.size(), nullptr);
  direct.assign(plan.spans.size(), false);
  for (uint32_t fi = 0; fi < plan.fills[cls].size(); ++fi)
    fills_of_span[plan.fills[cls][fi].span].push_back(fi);
  // Message tags: a PFS piece's number, or a memory piece's number between the two ranks.
  if (cat.pieces.size() >= (1u << 24))
    return Status::InvalidArgument(who + ": more than 2^24 saved pieces");
  Status st;
  // 1. Receives, straight into the target where the bytes are one whole target region.
  PlanPacking();
  CAIRN_RETURN_IF_ERROR(PostReceives());
  // 2. What this rank holds: where its pieces' bytes are.
  if (!cat.from_pfs)
    for (const auto& [p, loc] : local)
      for (uint32_t s = plan.piece_first_span[p]; s < plan.piece_first_span[p + 1]; ++s)
        at[s] = const_cast<std::byte*>(loc.first->data()) + loc.second->offset + plan.spans[s].lo;
  // 3. PFS: read this rank's runs once, passing each on as it completes.
  if (cat.from_pfs) st = ReadRuns();
  // 4. Memory: sends, each chunk verified before it leaves (packed when the receiving
  // class needs only part of the span).
  if (!cat.from_pfs) SendHeld(&st);
  // 5. Local copies from this rank's memory.
  CopyLocal(&st);
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
