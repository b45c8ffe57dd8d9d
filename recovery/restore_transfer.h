// One attempt at a chosen step (recovery/restore.cc, steps 4 and 5 for this rank): the
// bytes this rank needs are copied from its own memory, received from the ranks that hold
// them, or read from the PFS runs this rank was planned to read (and passed on); every
// chunk is verified before it reaches a target.
// Thread-safety: one Attempt per restore, on the calling thread (PFS reads use helpers).
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/trace.h"
#include "layout/load_planner.h"
#include "persist/manifest.h"
#include "recovery/restore.h"
#include "recovery/restore_wire.h"

namespace cairn::restore_internal {

class StagingBuffer {
 public:
  // `pin`: an engine that copies from it into device memory registers it (pinned memory
  // copies at the link's speed; pageable memory goes through the driver's own bounce).
  StagingBuffer(uint64_t n, bool populate, CopyEngine* pin = nullptr);
  ~StagingBuffer();
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;
  std::byte* data() { return p_; }

 private:
  uint64_t n_;
  std::byte* p_ = nullptr;
  std::unique_ptr<std::byte[]> fallback_;
  CopyEngine* pinned_ = nullptr;
};

struct Attempt {
  Attempt(const RestoreEnv& e, std::span<const ShardSpec> t, const LoadCatalog& c,
          const LoadPlan& p)
      : env(e), targets(t), cat(c), plan(p) {}
  const RestoreEnv& env;
  std::span<const ShardSpec> targets;
  const LoadCatalog& cat;
  const LoadPlan& plan;
  const pb::Manifest* manifest = nullptr;  // PFS versions
  std::string step_dir;
  // Memory versions: where this rank holds each piece (pinned data + the shard).
  std::unordered_map<uint32_t, std::pair<const PinnedVersion*, const SlotShard*>> local;
  RestoreReport* report = nullptr;
  std::string who;

  RankLoad load;
  uint32_t cls = 0;
  std::vector<std::vector<uint32_t>> fills_of_span;  // this rank's fills, by span
  std::vector<std::byte*> at;                        // span bytes [lo, hi) live here
  std::vector<uint8_t> direct;                       // the span was placed in its target
  std::vector<std::unique_ptr<StagingBuffer>> owned;
  std::map<uint32_t, std::vector<uint8_t>> verified;  // memory pieces: chunks checked
  Status corrupt;                                     // first checksum failure

  // Memory for bytes in transit; `populate`: faulted in up front (a receive into fresh
  // pages over UCX's tcp transport runs several times slower); `to_targets`: the bytes are
  // copied from it into the targets (pinned when those are device memory; buffers that
  // are only sent are not).
  std::byte* Staging(uint64_t n, bool populate = false, bool to_targets = false) {
    owned.push_back(std::make_unique<StagingBuffer>(n, populate, to_targets ? Pin() : nullptr));
    return owned.back()->data();
  }
  // The engine that pins buffers feeding device targets, or null for host targets.
  CopyEngine* Pin() const { return env.host_targets ? nullptr : env.engine; }
  // Flags the chunks from `from` on as device copies when target `t` is device memory.
  static void MarkDevice(std::vector<CopyChunk>* c, size_t from, const ShardSpec& t) {
    if (t.memory != MemoryKind::kDevice) return;
    for (size_t i = from; i < c->size(); ++i) (*c)[i].device = true;
  }
  size_t Elem(const LoadPlan::Fill& f) const { return DTypeSize(targets[f.target].meta.dtype); }
  // The target address the whole span can go to directly, or null.
  std::byte* DirectTarget(uint32_t s) {
    if (!env.host_targets) return nullptr;
    const LoadPlan::Span& sp = plan.spans[s];
    const LoadPiece& p = cat.pieces[sp.piece];
    if (fills_of_span[s].size() != 1 || sp.lo != 0 || sp.hi != p.nbytes) return nullptr;
    const LoadPlan::Fill& f = plan.fills[cls][fills_of_span[s][0]];
    if (!(f.region == p.box)) return nullptr;
    std::vector<CopyChunk> c;
    const ShardSpec& t = targets[f.target];
    AppendRegionCopies(nullptr, 0, p.box, static_cast<std::byte*>(t.data), t.box, f.region, Elem(f),
                       &c);
    if (c.size() != 1 || c[0].bytes != p.nbytes) return nullptr;
    return static_cast<std::byte*>(c[0].dst);
  }
  void NoteCorrupt(const Status& st) {
    if (corrupt.ok()) corrupt = st;
  }

  // Memory: checks the chunks of piece `p` that [lo, hi) covers (each once).
  void VerifyLocal(uint32_t p, uint64_t lo, uint64_t hi) {
    TraceSpan span("restore checksum", "checksum");
    auto [pv, shard] = local.at(p);
    const SlotHeader& h = pv->header();
    auto& done = verified[p];
    done.resize(shard->num_chunks, 0);
    std::vector<HostRange> ranges;
    std::vector<uint32_t> which;
    for (uint64_t c = lo / cat.chunk_bytes; c < shard->num_chunks && c * cat.chunk_bytes < hi;
         ++c) {
      if (done[c]) continue;
      auto [b, e] = h.ChunkRange(*shard, static_cast<uint32_t>(c));
      ranges.push_back({pv->data() + b, static_cast<size_t>(e - b)});
      which.push_back(static_cast<uint32_t>(c));
    }
    std::vector<uint64_t> sums(ranges.size());
    env.engine->ChecksumHost(ranges, sums.data());
    for (size_t i = 0; i < which.size(); ++i) {
      done[which[i]] = 1;
      if (sums[i] != h.chunk_checksums[shard->first_chunk + which[i]])
        ReportMismatch(*pv, *shard, which[i]);
    }
  }

  // Packing: a receiving class that needs less than a whole span (a strided part of it)
  // gets only its regions, one after the other, each in row-major order.
  std::vector<std::vector<uint32_t>> fills_any;  // by span: fills of the span's class
  std::vector<uint64_t> packed_bytes;            // by span: bytes of those regions
  void PlanPacking() {
    fills_any.assign(plan.spans.size(), {});
    packed_bytes.assign(plan.spans.size(), 0);
    for (const auto& fills : plan.fills)
      for (uint32_t i = 0; i < fills.size(); ++i) {
        const LoadPlan::Fill& f = fills[i];
        fills_any[f.span].push_back(i);
        const LoadPiece& p = cat.pieces[plan.spans[f.span].piece];
        packed_bytes[f.span] +=
            static_cast<uint64_t>(f.region.numel()) * DTypeSize(cat.tensors[p.tensor].dtype);
      }
  }
  bool Packed(uint32_t s) const { return packed_bytes[s] < plan.spans[s].hi - plan.spans[s].lo; }
  // The regions of span `s`'s class, packed into `dst` from the span's bytes.
  Status Pack(uint32_t s, std::byte* dst, bool here = false) {
    const LoadPlan::Span& sp = plan.spans[s];
    const LoadPiece& p = cat.pieces[sp.piece];
    const size_t elem = DTypeSize(cat.tensors[p.tensor].dtype);
    std::vector<CopyChunk> chunks;
    uint64_t off = 0;
    for (uint32_t fi : fills_any[s]) {
      const Box& region = plan.fills[sp.cls][fi].region;
      AppendRegionCopies(at[s], sp.lo, p.box, dst + off, region, region, elem, &chunks);
      off += static_cast<uint64_t>(region.numel()) * elem;
    }
    return CopyChunks(chunks, here);
  }
  // Where a packed span can be received straight into this rank's target, or null.
  std::byte* PackedTarget(uint32_t s) {
    if (!env.host_targets || fills_of_span[s].size() != 1) return nullptr;
    const LoadPlan::Fill& f = plan.fills[cls][fills_of_span[s][0]];
    const ShardSpec& t = targets[f.target];
    std::vector<CopyChunk> c;
    AppendRegionCopies(nullptr, 0, f.region, static_cast<std::byte*>(t.data), t.box, f.region,
                       Elem(f), &c);
    return c.size() == 1 ? static_cast<std::byte*>(c[0].dst) : nullptr;
  }
  // Fills this rank's targets from a packed span.
  Status Unpack(uint32_t s) {
    std::vector<CopyChunk> chunks;
    uint64_t off = 0;
    for (uint32_t fi : fills_of_span[s]) {
      const LoadPlan::Fill& f = plan.fills[cls][fi];
      const ShardSpec& t = targets[f.target];
      const size_t from = chunks.size();
      AppendRegionCopies(at[s] + off, 0, f.region, static_cast<std::byte*>(t.data), t.box, f.region,
                         Elem(f), &chunks);
      MarkDevice(&chunks, from, t);
      off += static_cast<uint64_t>(f.region.numel()) * Elem(f);
    }
    if (chunks.empty()) return Status::OK();
    return env.engine->Copy(chunks, nullptr).WithContext(who + ": restore copy");
  }

  // Copies the fills of span `s` from its bytes.
  Status FillFrom(uint32_t s, bool here = false) {
    std::vector<CopyChunk> chunks;
    const LoadPlan::Span& sp = plan.spans[s];
    const LoadPiece& p = cat.pieces[sp.piece];
    for (uint32_t fi : fills_of_span[s]) {
      const LoadPlan::Fill& f = plan.fills[cls][fi];
      const ShardSpec& t = targets[f.target];
      const size_t from = chunks.size();
      AppendRegionCopies(at[s], sp.lo, p.box, static_cast<std::byte*>(t.data), t.box, f.region,
                         Elem(f), &chunks);
      MarkDevice(&chunks, from, t);
    }
    return CopyChunks(chunks, here);
  }
  // With the engine, or (`here`: host memory only) with memcpy on the calling thread.
  Status CopyChunks(std::span<const CopyChunk> chunks, bool here) {
    if (chunks.empty()) return Status::OK();
    if (!here) return env.engine->Copy(chunks, nullptr).WithContext(who + ": restore copy");
    for (const CopyChunk& c : chunks) std::memcpy(c.dst, c.src, c.bytes);
    return Status::OK();
  }

  // Memory: copies the whole of piece `p` to `dst` with the engine checksumming while it
  // copies, then compares with the recorded checksums.
  Status CopyVerified(uint32_t p, std::byte* dst) {
    auto [pv, shard] = local.at(p);
    const SlotHeader& h = pv->header();
    std::vector<CopyChunk> chunks;
    for (uint32_t c = 0; c < shard->num_chunks; ++c) {
      auto [b, e] = h.ChunkRange(*shard, c);
      chunks.push_back({pv->data() + b, dst + (b - shard->offset), static_cast<size_t>(e - b)});
    }
    std::vector<uint64_t> sums(chunks.size());
    CAIRN_RETURN_IF_ERROR(
        env.engine->Copy(chunks, sums.data()).WithContext(who + ": restore copy"));
    for (uint32_t c = 0; c < shard->num_chunks; ++c)
      if (sums[c] != h.chunk_checksums[shard->first_chunk + c]) ReportMismatch(*pv, *shard, c);
    return Status::OK();
  }
  void ReportMismatch(const PinnedVersion& pv, const SlotShard& shard, uint32_t c) {
    auto [b, e] = pv.header().ChunkRange(shard, c);
    NoteCorrupt(Status::Corruption(who + ": checksum mismatch in tensor '" + shard.name + "' box " +
                                   shard.box.ToString() + ", bytes [" + std::to_string(b) + ", " +
                                   std::to_string(e) + ") of " + pv.path()));
  }

  Status ReadRuns();
  // Run's phases: the receives posted (into the targets where a span is one whole target
  // region, else staging); this rank's held pieces sent to the ranks that need them
  // (verified, packed where only part is needed); the copies from this rank's own memory.
  // The last two add their first error to *st and go on.
  Status PostReceives();
  void SendHeld(Status* st);
  void CopyLocal(Status* st);
  Status Run();
};

}  // namespace cairn::restore_internal
