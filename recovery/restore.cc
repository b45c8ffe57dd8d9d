#include "recovery/restore.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <cstdio>
#include <cstdlib>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <set>
#include <thread>
#include <unordered_map>

#include "core/bytes.h"
#include "core/checksum.h"
#include "core/clock.h"
#include "core/mutex.h"
#include "core/trace.h"
#include "persist/manifest.h"
#include "persist/pfs_reader.h"
#include "persist/save_planner.h"
#include "recovery/load_planner.h"

namespace cairn {
namespace {

constexpr uint64_t kMsgBytes = 64ull << 20;  // largest single transfer message
constexpr uint32_t kBlobSeq = 0xffffffffu;
constexpr size_t kMaxText = 1 << 20;

// Tag sequence of message `k` of a piece's span (pieces < 2^24, messages < 256).
uint32_t Seq(uint32_t piece, uint64_t k) {
  return (piece << 8) | static_cast<uint32_t>(k);
}

// ---- discovery and agreement ------------------------------------------------------------

struct Inventory {
  uint64_t layout_hash = 0;  // of this rank's target layout
  std::vector<HeldVersion> held;
  std::vector<int64_t> pfs_steps;  // rank 0 only
};

std::string EncodeInventory(const Inventory& inv) {
  ByteWriter w;
  w.Put<uint64_t>(inv.layout_hash);
  w.Put<uint32_t>(static_cast<uint32_t>(inv.held.size()));
  for (const HeldVersion& v : inv.held) {
    w.Put<int32_t>(v.source);
    w.Put<int64_t>(v.step);
    w.Put<uint32_t>(v.world_size);
  }
  w.Put<uint32_t>(static_cast<uint32_t>(inv.pfs_steps.size()));
  for (int64_t s : inv.pfs_steps) w.Put<int64_t>(s);
  return std::move(w.out());
}

Result<Inventory> DecodeInventory(std::string_view b) {
  ByteReader r(b);
  Inventory inv;
  uint32_t n = 0;
  if (!r.Get(&inv.layout_hash) || !r.Get(&n) || n > r.remaining() / 16)
    return Status::Corruption("bad inventory");
  inv.held.resize(n);
  for (HeldVersion& v : inv.held)
    if (!r.Get(&v.source) || !r.Get(&v.step) || !r.Get(&v.world_size))
      return Status::Corruption("bad inventory");
  if (!r.Get(&n) || n > r.remaining() / 8) return Status::Corruption("bad inventory");
  inv.pfs_steps.resize(n);
  for (int64_t& s : inv.pfs_steps)
    if (!r.Get(&s)) return Status::Corruption("bad inventory");
  return inv;
}

struct Choice {
  int64_t step = -1;
  bool from_pfs = false;
};

// Whether every rank that saved `step` is held in some rank's memory.
bool MemoryComplete(const std::vector<Inventory>& inv, int64_t step) {
  uint32_t world = 0;
  std::set<int> sources;
  for (const Inventory& i : inv)
    for (const HeldVersion& v : i.held) {
      if (v.step != step) continue;
      if (world != 0 && v.world_size != world) return false;  // two different jobs' steps
      world = v.world_size;
      sources.insert(v.source);
    }
  if (world == 0) return false;
  for (uint32_t s = 0; s < world; ++s)
    if (!sources.count(static_cast<int>(s))) return false;
  return true;
}

std::optional<Choice> Choose(const std::vector<Inventory>& inv, std::optional<int64_t> want,
                             const std::set<std::pair<int64_t, bool>>& excluded) {
  std::set<int64_t, std::greater<>> steps;
  std::set<int64_t> on_pfs;
  for (const Inventory& i : inv) {
    for (const HeldVersion& v : i.held) steps.insert(v.step);
    for (int64_t s : i.pfs_steps) {
      steps.insert(s);
      on_pfs.insert(s);
    }
  }
  for (int64_t s : steps) {
    if (want && s != *want) continue;
    if (!excluded.count({s, false}) && MemoryComplete(inv, s)) return Choice{s, false};
    if (!excluded.count({s, true}) && on_pfs.count(s)) return Choice{s, true};
  }
  return std::nullopt;
}

std::string DescribeInventory(const std::vector<Inventory>& inv) {
  std::map<int64_t, std::set<int>> mem;
  uint32_t world = 0;
  for (const Inventory& i : inv)
    for (const HeldVersion& v : i.held) {
      mem[v.step].insert(v.source);
      world = std::max(world, v.world_size);
    }
  std::string s = "in memory:";
  if (mem.empty()) s += " nothing";
  for (auto it = mem.rbegin(); it != mem.rend(); ++it)
    s += " step " + std::to_string(it->first) + " (" + std::to_string(it->second.size()) + " of " +
         std::to_string(world) + " ranks)";
  s += "; on the PFS:";
  bool any = false;
  for (const Inventory& i : inv)
    for (int64_t p : i.pfs_steps) {
      s += " " + std::to_string(p);
      any = true;
    }
  if (!any) s += " nothing";
  return s;
}

// One rank's (status, payload) message: the payload when the status is OK, that status
// otherwise, Corruption naming `rank` when the bytes are not such a message.
Result<std::string_view> DecodeChecked(std::string_view bytes, int rank) {
  ByteReader rd(bytes);
  Status st;
  if (!rd.GetStatus(&st, kMaxText))
    return Status::Corruption("garbled message from rank " + std::to_string(rank));
  if (!st.ok()) return st;
  return bytes.substr(bytes.size() - rd.remaining());
}

// Allgather of (status, payload): the payloads when every rank is OK, the first failing
// rank's status otherwise (the same on every rank).
Result<std::vector<std::string>> GatherChecked(Group* g, const Status& mine,
                                               std::string_view payload) {
  ByteWriter w;
  w.PutStatus(mine);
  w.PutBytes(payload.data(), payload.size());
  CAIRN_ASSIGN_OR_RETURN(auto all, g->AllGather(w.out()));
  std::vector<std::string> out(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    CAIRN_ASSIGN_OR_RETURN(std::string_view payload, DecodeChecked(all[r], static_cast<int>(r)));
    out[r] = payload;
  }
  return out;
}

// ---- shard tables of memory versions ------------------------------------------------------

void PutBox(ByteWriter& w, const Box& b) {
  w.Put<uint32_t>(static_cast<uint32_t>(b.ndim()));
  for (size_t d = 0; d < b.ndim(); ++d) {
    w.Put<int64_t>(b.offsets[d]);
    w.Put<int64_t>(b.lengths[d]);
  }
}

bool GetBox(ByteReader& r, Box* b) {
  uint32_t nd = 0;
  if (!r.Get(&nd) || nd > 64) return false;
  b->offsets.resize(nd);
  b->lengths.resize(nd);
  for (uint32_t d = 0; d < nd; ++d)
    if (!r.Get(&b->offsets[d]) || !r.Get(&b->lengths[d])) return false;
  return true;
}

std::string EncodeBlobs(const SlotHeader& h, const std::byte* data) {
  ByteWriter w;
  w.Put<uint32_t>(static_cast<uint32_t>(h.blobs.size()));
  for (const SlotBlob& b : h.blobs) {
    w.PutString(b.name);
    w.PutString(std::string_view(reinterpret_cast<const char*>(data + b.offset), b.nbytes));
  }
  return std::move(w.out());
}

// The tables of the versions of the chosen step this rank holds.
std::string EncodeTables(const std::vector<std::unique_ptr<PinnedVersion>>& pinned) {
  ByteWriter w;
  w.Put<uint32_t>(static_cast<uint32_t>(pinned.size()));
  for (const auto& p : pinned) {
    const SlotHeader& h = p->header();
    w.Put<int32_t>(static_cast<int32_t>(h.rank));
    w.Put<uint64_t>(h.chunk_bytes);
    w.Put<uint64_t>(EncodeBlobs(h, p->data()).size());
    w.Put<uint32_t>(static_cast<uint32_t>(h.shards.size()));
    for (const SlotShard& s : h.shards) {
      w.PutString(s.name);
      w.Put<uint8_t>(static_cast<uint8_t>(s.dtype));
      w.Put<uint32_t>(static_cast<uint32_t>(s.global_shape.size()));
      for (int64_t x : s.global_shape) w.Put<int64_t>(x);
      PutBox(w, s.box);
      w.Put<uint64_t>(s.nbytes);
    }
  }
  return std::move(w.out());
}

struct MemoryCatalog {
  LoadCatalog cat;
  std::vector<std::vector<std::pair<int, uint64_t>>> blob_providers;  // per source: (rank, size)
};

// Adds rank `holder`'s shard tables to the catalog. The bytes come from a peer: every field
// is checked (source below `saved_world`, names, dtypes, boxes inside their shapes, byte
// counts) before it is used, so a garbled table is an error, never a crash or a huge
// allocation.
Status AddTables(int holder, std::string_view bytes, uint32_t saved_world, MemoryCatalog* mc,
                 std::unordered_map<std::string, uint32_t>* tensor_ids,
                 std::map<std::pair<uint32_t, std::vector<int64_t>>, uint32_t>* piece_ids) {
  const auto bad = [&] {
    return Status::Corruption("garbled shard table from rank " + std::to_string(holder));
  };
  ByteReader r(bytes);
  uint32_t n = 0;
  if (!r.Get(&n)) return bad();
  LoadCatalog& cat = mc->cat;
  for (uint32_t t = 0; t < n; ++t) {
    int32_t source = 0;
    uint64_t chunk = 0, blob_bytes = 0;
    uint32_t nshards = 0;
    if (!r.Get(&source) || !r.Get(&chunk) || !r.Get(&blob_bytes) || !r.Get(&nshards) ||
        source < 0 || static_cast<uint32_t>(source) >= saved_world || source >= (1 << 24) ||
        chunk == 0)
      return bad();
    if (cat.chunk_bytes == 0) cat.chunk_bytes = chunk;
    if (chunk != cat.chunk_bytes)
      return Status::InvalidArgument("ranks saved step " + std::to_string(cat.step) +
                                     " with different chunk sizes (" + std::to_string(chunk) +
                                     " and " + std::to_string(cat.chunk_bytes) + ")");
    if (mc->blob_providers.size() <= static_cast<size_t>(source))
      mc->blob_providers.resize(static_cast<size_t>(source) + 1);
    mc->blob_providers[static_cast<size_t>(source)].push_back({holder, blob_bytes});
    for (uint32_t i = 0; i < nshards; ++i) {
      TensorMeta meta;
      uint8_t dt = 0;
      uint32_t nd = 0;
      if (!r.GetString(&meta.name, kMaxText) || !r.Get(&dt) || !r.Get(&nd) || nd > 64) return bad();
      meta.dtype = static_cast<DType>(dt);
      if (DTypeSize(meta.dtype) == 0 || !CheckTensorName(meta.name).ok()) return bad();
      meta.global_shape.resize(nd);
      for (int64_t& x : meta.global_shape)
        if (!r.Get(&x)) return bad();
      Box box;
      uint64_t nbytes = 0;
      if (!GetBox(r, &box) || !r.Get(&nbytes)) return bad();
      if (!CheckedNumElements(meta.global_shape) || !CheckBoxInShape(box, meta.global_shape).ok() ||
          nbytes != static_cast<uint64_t>(box.numel()) * DTypeSize(meta.dtype))
        return bad();
      auto [it, fresh] = tensor_ids->emplace(meta.name, static_cast<uint32_t>(cat.tensors.size()));
      if (fresh) {
        cat.tensors.push_back(meta);
      } else if (!(cat.tensors[it->second] == meta)) {
        return Status::InvalidArgument(
            "step " + std::to_string(cat.step) + ": tensor '" + meta.name +
            "' was saved with different dtypes or shapes by different ranks (" +
            ShapeToString(meta.global_shape) + " vs " +
            ShapeToString(cat.tensors[it->second].global_shape) + ")");
      }
      std::vector<int64_t> key = box.offsets;
      key.insert(key.end(), box.lengths.begin(), box.lengths.end());
      auto [pit, pfresh] = piece_ids->emplace(std::make_pair(it->second, std::move(key)),
                                              static_cast<uint32_t>(cat.pieces.size()));
      if (pfresh) {
        LoadPiece p;
        p.tensor = it->second;
        p.box = std::move(box);
        p.nbytes = nbytes;
        cat.pieces.push_back(std::move(p));
      }
      auto& holders = cat.pieces[pit->second].holders;
      if (holders.empty() || holders.back() != holder) holders.push_back(holder);
    }
  }
  return Status::OK();
}

RankLayout LayoutOf(std::span<const ShardSpec> targets) {
  RankLayout l;
  std::unordered_map<std::string, uint32_t> ids;
  for (const ShardSpec& t : targets) {
    auto [it, fresh] = ids.emplace(t.meta.name, static_cast<uint32_t>(l.tensors.size()));
    if (fresh) l.tensors.push_back(t.meta);
    l.shards.push_back({it->second, t.box});
  }
  return l;
}

// ---- one attempt ---------------------------------------------------------------------------

class StagingBuffer {
 public:
  // `pin`: an engine that copies from it into device memory registers it (pinned memory
  // copies at the link's speed; pageable memory goes through the driver's own bounce).
  StagingBuffer(uint64_t n, bool populate, CopyEngine* pin = nullptr)
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
  ~StagingBuffer() {
    if (pinned_) pinned_->UnregisterHost(p_, n_);
    if (!fallback_) ::munmap(p_, n_);
  }
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
  Status Run();
};

Status Attempt::ReadRuns() {
  // Reads every run of this rank once, in file order, in chunk-sized preads on a few
  // threads, each chunk verified right after its read while it is still in cache. Runs
  // land in their target when they are exactly this rank's target region, else in a small
  // pool of buffers that is reused (fresh memory costs more than the copy here). As each
  // run completes, this thread sends it on to the ranks that need it (packed down to their
  // regions when that is smaller) and fills this rank's targets from it; its buffer goes
  // back to the pool once those sends completed.
  std::map<uint32_t, int> fds;
  Status st;
  std::sort(load.my_runs.begin(), load.my_runs.end(), [&](uint32_t x, uint32_t y) {
    const pb::SavedBox& a = manifest->boxes(cat.pieces[plan.runs[x].piece].pfs_box);
    const pb::SavedBox& b = manifest->boxes(cat.pieces[plan.runs[y].piece].pfs_box);
    return std::make_pair(a.file(), a.offset() + plan.runs[x].lo) <
           std::make_pair(b.file(), b.offset() + plan.runs[y].lo);
  });
  const size_t nruns = load.my_runs.size();
  std::vector<std::vector<uint32_t>> spans_of_run(nruns);
  std::unordered_map<uint32_t, size_t> run_index;
  std::vector<std::byte*> target_of(nruns, nullptr);  // runs read straight into a target
  uint64_t biggest = 0;
  for (size_t k = 0; k < nruns; ++k) {
    const uint32_t run = load.my_runs[k];
    run_index[run] = k;
    const LoadPlan::Run& r = plan.runs[run];
    const pb::SavedBox& b = manifest->boxes(cat.pieces[r.piece].pfs_box);
    if (st.ok() && !fds.count(b.file())) {
      auto fd = env.pfs_fs->Open(JoinPath(step_dir, manifest->files(static_cast<int>(b.file()))),
                                 O_RDONLY | O_CLOEXEC, 0);
      if (fd.ok())
        fds[b.file()] = *fd;
      else
        st = fd.status().WithContext(who);
    }
    for (uint32_t s = plan.piece_first_span[r.piece]; s < plan.piece_first_span[r.piece + 1]; ++s)
      if (plan.spans[s].run == static_cast<int32_t>(run)) spans_of_run[k].push_back(s);
    const uint32_t only = spans_of_run[k].front();
    if (spans_of_run[k].size() == 1 && plan.spans[only].cls == cls)
      target_of[k] = DirectTarget(only);
    if (target_of[k]) direct[only] = true;
    if (!target_of[k]) biggest = std::max(biggest, r.hi - r.lo);
    report->pfs_bytes_read += r.hi - r.lo;
  }
  std::vector<std::vector<const RankLoad::Put*>> puts_of_run(nruns);
  for (const RankLoad::Put& put : load.puts)
    puts_of_run[run_index.at(static_cast<uint32_t>(plan.spans[put.span].run))].push_back(&put);

  // The pool: a slot holds a run's bytes and the packed copies sent from it.
  struct Slot {
    std::unique_ptr<StagingBuffer> run;
    std::vector<std::unique_ptr<StagingBuffer>> packs;
  };
  const size_t pool_size = 3;  // a run being read, one being sent, one spare
  std::vector<std::unique_ptr<Slot>> slots;
  std::vector<Slot*> free_slots;
  std::vector<Slot*> slot_of(nruns, nullptr);
  std::vector<std::vector<uint64_t>> tickets(nruns);
  std::deque<size_t> sent;  // runs whose sends are in flight, oldest first

  struct Item {
    size_t k;
    uint64_t off;  // from the run's lo
    uint64_t n;
  };
  Mutex mu;
  CondVar cv;
  std::deque<Item> queue;
  bool stop = false;
  std::vector<uint64_t> left(nruns, 0);
  std::vector<std::byte*> bufs(nruns, nullptr);
  // Bytes, not vector<bool>: neighbouring flags are written by different threads.
  std::vector<uint8_t> ready(nruns, 0);   // read, and (host targets) packed and filled
  std::vector<uint8_t> copied(nruns, 0);  // the packs and fills were done by a reader
  // By span: its packed bytes. Sized up front: the main thread fills entries for later
  // runs while readers use earlier ones.
  std::vector<std::byte*> pack_buf(plan.spans.size(), nullptr);
  Status copy_st;
  // Packs and fills of run k with memcpy, on the reader that completed it (so they run in
  // parallel with the next reads and this thread's sends).
  const auto copy_run = [&](size_t k) {
    Status x;
    for (const RankLoad::Put* put : puts_of_run[k])
      if (Packed(put->span) && x.ok()) x = Pack(put->span, pack_buf[put->span], true);
    for (uint32_t sp : spans_of_run[k])
      if (plan.spans[sp].cls == cls && !direct[sp] && x.ok()) x = FillFrom(sp, true);
    return x;
  };
  auto work = [&] {
    for (;;) {
      Item it;
      {
        MutexLock lk(mu);
        cv.Wait(lk, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;
        it = queue.front();
        queue.pop_front();
      }
      const LoadPlan::Run& r = plan.runs[load.my_runs[it.k]];
      const pb::SavedBox& b = manifest->boxes(cat.pieces[r.piece].pfs_box);
      std::byte* dst = bufs[it.k] + it.off;
      const std::string path = JoinPath(step_dir, manifest->files(static_cast<int>(b.file())));
      Status s = env.pfs_fs->ReadAt(fds.at(b.file()), dst, it.n, b.offset() + r.lo + it.off)
                     .WithContext(path);
      if (s.ok()) s = CheckSavedChunk(*manifest, b, r.lo + it.off, dst, path);
      MutexLock lk(mu);
      if (s.code() == StatusCode::kCorruption)
        NoteCorrupt(s.WithContext(who));
      else if (!s.ok() && st.ok())
        st = s.WithContext(who);
      if (--left[it.k] == 0) {
        if (env.host_targets && st.ok()) {
          lk.Unlock();
          Status x = copy_run(it.k);
          lk.Lock();
          if (!x.ok() && copy_st.ok()) copy_st = x;
          copied[it.k] = true;
        }
        ready[it.k] = true;
        cv.NotifyAll();
      }
    }
  };
  const int nthreads =
      static_cast<int>(std::max<size_t>(1, std::min<size_t>(env.read_threads, nruns)));
  std::vector<std::thread> threads;
  for (int t = 0; t < nthreads && nruns > 0; ++t) threads.emplace_back(work);

  Status out;
  const auto note = [&](const Status& x) {
    if (!x.ok() && out.ok()) out = x;
  };
  // Gives the slot of the oldest run whose sends are in flight back, once they completed.
  const auto release_oldest = [&] {
    const size_t k = sent.front();
    sent.pop_front();
    for (uint64_t t : tickets[k]) note(env.transport->WaitSend(t, env.timeout_s));
    tickets[k].clear();
    free_slots.push_back(slot_of[k]);
    slot_of[k] = nullptr;
  };
  size_t started = 0;
  const auto start_more = [&] {
    while (started < nruns) {
      const size_t k = started;
      const LoadPlan::Run& r = plan.runs[load.my_runs[k]];
      if (target_of[k]) {
        bufs[k] = target_of[k];
      } else {
        if (free_slots.empty() && slots.size() < pool_size) {
          slots.push_back(std::make_unique<Slot>());
          slots.back()->run = std::make_unique<StagingBuffer>(biggest, false, Pin());
          free_slots.push_back(slots.back().get());
        }
        if (free_slots.empty()) {
          if (sent.empty()) return;  // every slot holds a run still being read or filled
          release_oldest();
        }
        slot_of[k] = free_slots.back();
        free_slots.pop_back();
        bufs[k] = slot_of[k]->run->data();
      }
      for (uint32_t s : spans_of_run[k]) at[s] = bufs[k] + (plan.spans[s].lo - r.lo);
      size_t packs_used = 0;
      for (const RankLoad::Put* put : puts_of_run[k]) {
        const uint32_t s = put->span;
        if (!Packed(s) || pack_buf[s]) continue;
        Slot* slot = slot_of[k];
        if (slot) {
          if (slot->packs.size() <= packs_used)
            slot->packs.push_back(std::make_unique<StagingBuffer>(biggest, false));
          pack_buf[s] = slot->packs[packs_used++]->data();
        } else {
          pack_buf[s] = Staging(packed_bytes[s]);
        }
      }
      MutexLock lk(mu);
      if (st.ok())  // after an error the bytes still go out, so no peer waits for them
        for (uint64_t o = 0; o < r.hi - r.lo; o += cat.chunk_bytes) {
          queue.push_back({k, o, std::min(cat.chunk_bytes, r.hi - r.lo - o)});
          ++left[k];
        }
      if (left[k] == 0) ready[k] = true;
      cv.NotifyAll();
      ++started;
    }
  };
  for (size_t k = 0; k < nruns; ++k) {
    start_more();
    {
      // Keep the sends of earlier runs moving while waiting for this one.
      MutexLock lk(mu);
      while (!cv.WaitFor(lk, std::chrono::microseconds(500),
                         [&] { return k < started && ready[k]; })) {
        lk.Unlock();
        if (env.transport) env.transport->Progress();
        if (k >= started) start_more();
        lk.Lock();
      }
    }
    // Packs and fills, unless the reader that completed the run did them.
    if (!copied[k]) {
      for (const RankLoad::Put* put : puts_of_run[k])
        if (Packed(put->span)) note(Pack(put->span, pack_buf[put->span]));
      for (uint32_t s : spans_of_run[k])
        if (plan.spans[s].cls == cls && !direct[s]) note(FillFrom(s));
    }
    // Sends: each span (packed if its class needs only part of it) to every member of the
    // span's class that gets it from this rank.
    for (const RankLoad::Put* put : puts_of_run[k]) {
      const uint32_t s = put->span;
      const std::byte* src = Packed(s) ? pack_buf[s] : at[s];
      const uint64_t len = Packed(s) ? packed_bytes[s] : plan.spans[s].hi - plan.spans[s].lo;
      for (uint64_t m = 0; m * kMsgBytes < len; ++m) {
        uint64_t t = 0;
        note(env.transport->Send(put->to, Seq(plan.spans[s].piece, m), src + m * kMsgBytes,
                                 std::min(kMsgBytes, len - m * kMsgBytes), &t));
        tickets[k].push_back(t);
      }
    }
    if (slot_of[k]) sent.push_back(k);
  }
  {
    MutexLock lk(mu);
    stop = true;
    cv.NotifyAll();
  }
  for (auto& t : threads) t.join();
  while (!sent.empty()) release_oldest();
  for (auto [f, fd] : fds) (void)env.pfs_fs->Close(fd);
  note(copy_st);
  return st.ok() ? out : st;
}

Status Attempt::Run() {
  load = ForRank(plan, cat, env.rank);
  fills_of_span.assign(plan.spans.size(), {});
  at.assign(plan.spans.size(), nullptr);
  direct.assign(plan.spans.size(), false);
  for (uint32_t fi = 0; fi < plan.fills[cls].size(); ++fi)
    fills_of_span[plan.fills[cls][fi].span].push_back(fi);
  if (cat.pieces.size() >= (1u << 24))
    return Status::InvalidArgument(who + ": more than 2^24 saved pieces");
  Status st;
  // 1. Receives, straight into the target where the bytes are one whole target region.
  PlanPacking();
  for (const RankLoad::Get& g : load.gets) {
    if (g.how != RankLoad::How::kRecv) continue;
    const LoadPlan::Span& sp = plan.spans[g.span];
    const uint64_t n = Packed(g.span) ? packed_bytes[g.span] : sp.hi - sp.lo;
    std::byte* dst = Packed(g.span) ? PackedTarget(g.span) : DirectTarget(g.span);
    direct[g.span] = dst != nullptr;
    at[g.span] = dst ? dst : Staging(n, true, true);
    if ((n + kMsgBytes - 1) / kMsgBytes > 255)
      return Status::InvalidArgument(who + ": a saved piece over 16 GiB");
    for (uint64_t k = 0; k * kMsgBytes < n; ++k)
      CAIRN_RETURN_IF_ERROR(env.transport->PostRecv(g.from, Seq(sp.piece, k),
                                                    at[g.span] + k * kMsgBytes,
                                                    std::min(kMsgBytes, n - k * kMsgBytes)));
    report->bytes_received += n;
  }
  // 2. What this rank holds: where its pieces' bytes are.
  if (!cat.from_pfs)
    for (const auto& [p, loc] : local)
      for (uint32_t s = plan.piece_first_span[p]; s < plan.piece_first_span[p + 1]; ++s)
        at[s] = const_cast<std::byte*>(loc.first->data()) + loc.second->offset + plan.spans[s].lo;
  // 3. PFS: read this rank's runs once, passing each on as it completes.
  if (cat.from_pfs) st = ReadRuns();
  // 4. Memory: sends, each chunk verified before it leaves (packed when the receiving
  // class needs only part of the span).
  std::map<uint32_t, const std::byte*> payload;
  for (const RankLoad::Put& put : cat.from_pfs ? std::span<const RankLoad::Put>()
                                               : std::span<const RankLoad::Put>(load.puts)) {
    const LoadPlan::Span& sp = plan.spans[put.span];
    auto [it, fresh] = payload.emplace(put.span, at[put.span]);
    if (fresh && Packed(put.span)) {
      VerifyLocal(sp.piece, sp.lo, sp.hi);
      std::byte* buf = Staging(packed_bytes[put.span]);
      Status s = Pack(put.span, buf);
      if (!s.ok() && st.ok()) st = s;
      it->second = buf;
    }
    const uint64_t n = Packed(put.span) ? packed_bytes[put.span] : sp.hi - sp.lo;
    for (uint64_t k = 0; k * kMsgBytes < n; ++k) {
      const uint64_t m = std::min(kMsgBytes, n - k * kMsgBytes);
      if (!Packed(put.span))
        VerifyLocal(sp.piece, sp.lo + k * kMsgBytes, sp.lo + k * kMsgBytes + m);
      Status s = env.transport->Send(put.to, Seq(sp.piece, k), it->second + k * kMsgBytes, m);
      if (!s.ok() && st.ok()) st = s;
    }
  }
  // 5. Local copies from this rank's memory.
  for (const RankLoad::Get& g : load.gets) {
    if (g.how != RankLoad::How::kLocal || direct[g.span]) continue;
    const LoadPlan::Span& sp = plan.spans[g.span];
    report->bytes_local += sp.hi - sp.lo;
    std::byte* dst = DirectTarget(g.span);
    if (dst && env.engine->checksums_while_copying() && !verified.count(sp.piece)) {
      // The same layout: checksums taken while copying.
      Status s = CopyVerified(sp.piece, dst);
      if (!s.ok() && st.ok()) st = s;
      continue;
    }
    VerifyLocal(sp.piece, sp.lo, sp.hi);
    Status s = FillFrom(g.span);
    if (!s.ok() && st.ok()) st = s;
  }
  // 6. Everything in flight; then what arrived.
  Status fin = env.transport ? env.transport->Finish(env.timeout_s) : Status::OK();
  if (!fin.ok() && st.ok()) st = fin.WithContext(who + ": restore transfer");
  if (!st.ok()) return st;
  for (const RankLoad::Get& g : load.gets)
    if (g.how == RankLoad::How::kRecv && !direct[g.span])
      CAIRN_RETURN_IF_ERROR(Packed(g.span) ? Unpack(g.span) : FillFrom(g.span));
  return Status::OK();
}

}  // namespace

void AppendRegionCopies(const std::byte* src, uint64_t src_lo, const Box& src_box, std::byte* dst,
                        const Box& dst_box, const Box& region, size_t elem,
                        std::vector<CopyChunk>* out) {
  ForEachRegionBlock(src_box, dst_box, region, elem, [&](uint64_t so, uint64_t dof, uint64_t n) {
    out->push_back({src ? src + (so - src_lo) : nullptr, dst + dof, static_cast<size_t>(n)});
  });
}

Status DecodeRestoreMessageForFuzzing(int kind, std::string_view bytes, uint32_t saved_world) {
  if (kind == 0) return DecodeInventory(bytes).status();
  if (kind == 2) {
    // A rank's status-framed message (every restore allgather), then an inventory in it.
    auto payload = DecodeChecked(bytes, 1);
    return payload.ok() ? DecodeInventory(*payload).status() : payload.status();
  }
  MemoryCatalog mc;
  std::unordered_map<std::string, uint32_t> tensor_ids;
  std::map<std::pair<uint32_t, std::vector<int64_t>>, uint32_t> piece_ids;
  return AddTables(1, bytes, saved_world, &mc, &tensor_ids, &piece_ids);
}

Result<RestoreReport> Restore(const RestoreEnv& env, std::span<const ShardSpec> targets,
                              const RestoreOptions& options) {
  const int64_t t0 = NowNanos();
  Group* g = env.group;
  const std::string who = env.who;
  RestoreReport report;
  std::set<std::pair<int64_t, bool>> excluded;
  const std::string layout = EncodeRankLayout(LayoutOf(targets));
  const uint64_t layout_hash = LayoutHash(layout);
  const bool have_pfs = env.pfs_fs && !env.pfs_job_dir.empty();
  for (;;) {
    // 1. Discovery.
    Inventory mine;
    mine.layout_hash = layout_hash;
    mine.held = env.memory ? env.memory->List() : std::vector<HeldVersion>{};
    Status local_st;
    if (env.rank == 0 && have_pfs && env.pfs_fs->Exists(env.pfs_job_dir)) {
      auto names = env.pfs_fs->ListDir(env.pfs_job_dir);
      if (!names.ok()) {
        env.log->Warning("cannot list " + env.pfs_job_dir + ": " + names.status().ToString());
      } else {
        for (const std::string& n : *names) {
          auto s = ParseStepDirName(n);
          if (s && env.pfs_fs->Exists(JoinPath(JoinPath(env.pfs_job_dir, n), "MANIFEST")))
            mine.pfs_steps.push_back(*s);
        }
      }
    }
    CAIRN_ASSIGN_OR_RETURN(auto gathered, GatherChecked(g, local_st, EncodeInventory(mine)));
    std::vector<Inventory> inv;
    for (const std::string& b : gathered) {
      CAIRN_ASSIGN_OR_RETURN(Inventory i, DecodeInventory(b));
      inv.push_back(std::move(i));
    }
    // 2. Agreement.
    auto choice = Choose(inv, options.step, excluded);
    if (!choice) {
      std::string why;
      for (const auto& s : report.skipped) why += "\n  skipped: " + s;
      const std::string what =
          options.step ? "step " + std::to_string(*options.step) + " is not" : "no version is";
      if (!report.skipped.empty())
        return Status::Corruption(who + ": " + what + " restorable by every rank any more (" +
                                  DescribeInventory(inv) +
                                  "); the targets may be partly written:" + why);
      return Status::NotFound(
          who + ": " + what + " restorable by every rank (" + DescribeInventory(inv) +
          "; this rank: " + (env.memory ? env.memory->Describe() : "no memory tier") +
          (have_pfs ? ", PFS " + env.pfs_job_dir : ", no PFS") + ")");
    }
    const int64_t step = choice->step;
    // 3. Planning.
    MemoryCatalog mc;
    mc.cat.step = step;
    mc.cat.from_pfs = choice->from_pfs;
    // This rank's own version of the step first (the one it reads locally), then replicas.
    std::vector<std::unique_ptr<PinnedVersion>> pinned;
    pb::Manifest manifest;
    std::string step_dir;
    std::vector<std::string> layouts;
    Status pin_st;
    if (!choice->from_pfs) {
      mc.cat.where = "host memory";
      for (const HeldVersion& v : mine.held) {
        if (v.step != step) continue;
        auto p = env.memory->Pin(v);
        if (!p.ok()) {
          pin_st = p.status().WithContext(who);
          break;
        }
        // This rank's own version first: it is the one read locally.
        if (v.source == env.rank)
          pinned.insert(pinned.begin(), std::move(*p));
        else
          pinned.push_back(std::move(*p));
      }
    }
    // Each distinct target layout travels once: from the lowest rank that has it.
    std::vector<uint64_t> hashes;
    bool send_layout = true;
    for (size_t r = 0; r < inv.size(); ++r) {
      hashes.push_back(inv[r].layout_hash);
      if (r < static_cast<size_t>(env.rank) && inv[r].layout_hash == layout_hash)
        send_layout = false;
    }
    ByteWriter w2;
    w2.PutString(send_layout ? std::string_view(layout) : std::string_view());
    const std::string tables = choice->from_pfs ? std::string() : EncodeTables(pinned);
    w2.PutBytes(tables.data(), tables.size());
    CAIRN_ASSIGN_OR_RETURN(auto all2, GatherChecked(g, pin_st, w2.out()));
    std::unordered_map<std::string, uint32_t> tensor_ids;
    std::map<std::pair<uint32_t, std::vector<int64_t>>, uint32_t> piece_ids;
    uint32_t saved_world = 0;  // of the job that saved the chosen step (one world: Choose)
    for (const Inventory& i : inv)
      for (const HeldVersion& v : i.held)
        if (v.step == choice->step) saved_world = std::max(saved_world, v.world_size);
    for (size_t r = 0; r < all2.size(); ++r) {
      ByteReader rd(all2[r]);
      std::string l;
      if (!rd.GetString(&l, all2[r].size()))
        return Status::Corruption(who + ": garbled layout from rank " + std::to_string(r));
      layouts.push_back(std::move(l));
      if (!choice->from_pfs)
        CAIRN_RETURN_IF_ERROR(
            AddTables(static_cast<int>(r),
                      std::string_view(all2[r]).substr(all2[r].size() - rd.remaining()),
                      saved_world, &mc, &tensor_ids, &piece_ids)
                .WithContext(who));
    }
    if (choice->from_pfs) {
      step_dir = JoinPath(env.pfs_job_dir, StepDirName(step));
      std::string encoded;
      Status read_st;
      if (env.rank == 0) {
        auto m = ReadManifest(env.pfs_fs, step_dir);
        if (m.ok())
          encoded = EncodeManifest(*m);
        else
          read_st = m.status();
      }
      ByteWriter bw;
      bw.PutStatus(read_st);
      bw.PutBytes(encoded.data(), encoded.size());
      CAIRN_ASSIGN_OR_RETURN(std::string got, g->Broadcast(0, bw.out()));
      ByteReader br(got);
      Status st0;
      if (!br.GetStatus(&st0, kMaxText)) return Status::Corruption(who + ": garbled manifest");
      if (!st0.ok()) {
        // An unreadable MANIFEST: skip the step like a corrupt one.
        env.log->Warning("skipping step " + std::to_string(step) +
                         " on the PFS: " + st0.ToString());
        report.skipped.push_back(st0.message());
        excluded.insert({step, true});
        continue;
      }
      CAIRN_ASSIGN_OR_RETURN(manifest, DecodeManifest(got.substr(got.size() - br.remaining())));
      mc.cat.where = step_dir;
      mc.cat.chunk_bytes = manifest.chunk_bytes();
      for (const pb::Tensor& t : manifest.tensors())
        mc.cat.tensors.push_back(
            {t.name(), static_cast<DType>(t.dtype()), Shape(t.shape().begin(), t.shape().end())});
      for (int i = 0; i < manifest.boxes_size(); ++i) {
        const pb::SavedBox& b = manifest.boxes(i);
        LoadPiece p;
        p.tensor = b.tensor();
        p.box.offsets.assign(b.offsets().begin(), b.offsets().end());
        p.box.lengths.assign(b.lengths().begin(), b.lengths().end());
        p.nbytes = b.length();
        p.pfs_box = i;
        p.writer = static_cast<int>(b.writer());
        mc.cat.pieces.push_back(std::move(p));
      }
    }
    for (auto& p : mc.cat.pieces) std::sort(p.holders.begin(), p.holders.end());
    CAIRN_ASSIGN_OR_RETURN(LoadTargets lt, GroupTargets(layouts, hashes));
    const int64_t plan_t0 = NowNanos();
    auto plan = MakeLoadPlan(mc.cat, lt);
    Trace::Record("restore plan", "restore", plan_t0, NowNanos());
    if (!plan.ok()) return plan.status();
    if (!plan->unrestored.empty() && !options.partial) {
      std::string names;
      for (size_t i = 0; i < plan->unrestored.size() && i < 5; ++i)
        names += (i ? ", '" : "'") + plan->unrestored[i] + "'";
      if (plan->unrestored.size() > 5)
        names += " and " + std::to_string(plan->unrestored.size() - 5) + " more";
      return Status::InvalidArgument(who + ", step " + std::to_string(step) + " (" + mc.cat.where +
                                     "): saved tensor(s) " + names +
                                     " are in no rank's targets (RestoreOptions::partial "
                                     "allows that)");
    }
    // 4. Transfer.
    RestoreReport attempt_report;
    Attempt a(env, targets, mc.cat, *plan);
    a.manifest = choice->from_pfs ? &manifest : nullptr;
    a.step_dir = step_dir;
    a.report = &attempt_report;
    a.who = who + ", step " + std::to_string(step);
    a.cls = lt.class_of_rank[static_cast<size_t>(env.rank)];
    for (const auto& pv : pinned) {
      for (const SlotShard& s : pv->header().shards) {
        auto tid = tensor_ids.find(s.name);
        if (tid == tensor_ids.end()) continue;
        std::vector<int64_t> key = s.box.offsets;
        key.insert(key.end(), s.box.lengths.begin(), s.box.lengths.end());
        auto pid = piece_ids.find({tid->second, key});
        if (pid != piece_ids.end()) a.local.emplace(pid->second, std::make_pair(pv.get(), &s));
      }
    }
    // Blobs of the same rank number: received from a holder, or read from the PFS.
    std::string blob_bytes;
    Status st;
    if (!choice->from_pfs) {
      // Senders: every rank whose blobs this rank provides.
      for (size_t t = 0; t < mc.blob_providers.size() && t < lt.class_of_rank.size(); ++t) {
        const auto& prov = mc.blob_providers[t];
        if (prov.empty() || static_cast<int>(t) == env.rank) continue;
        bool t_has = false;
        for (auto [h, n] : prov) t_has |= h == static_cast<int>(t);
        if (!t_has && prov.front().first == env.rank) {
          for (const auto& pv : pinned)
            if (pv->header().rank == t) {
              std::string enc = EncodeBlobs(pv->header(), pv->data());
              auto* buf = a.Staging(enc.size());
              std::memcpy(buf, enc.data(), enc.size());
              Status s = env.transport->Send(static_cast<int>(t), kBlobSeq, buf, enc.size());
              if (!s.ok() && st.ok()) st = s;
              break;
            }
        }
      }
      if (static_cast<size_t>(env.rank) < mc.blob_providers.size()) {
        const auto& prov = mc.blob_providers[static_cast<size_t>(env.rank)];
        bool mine_held = false;
        for (auto [h, n] : prov) mine_held |= h == env.rank;
        if (mine_held) {
          blob_bytes = EncodeBlobs(pinned.front()->header(), pinned.front()->data());
        } else if (!prov.empty()) {
          blob_bytes.resize(prov.front().second);
          Status s = env.transport->PostRecv(prov.front().first, kBlobSeq, blob_bytes.data(),
                                             blob_bytes.size());
          if (!s.ok() && st.ok()) st = s;
        }
      }
    }
    if (st.ok()) {
      TraceSpan span("restore transfer", "restore");
      st = a.Run();
    }
    if (st.ok() && choice->from_pfs && env.rank < static_cast<int>(manifest.world_size())) {
      Blobs b;
      st = ReadRankBlobs(env.pfs_fs, step_dir, manifest, env.rank, &b);
      if (st.ok()) attempt_report.blobs = std::move(b);
    } else if (st.ok() && !blob_bytes.empty()) {
      ByteReader br(blob_bytes);
      uint32_t n = 0;
      bool ok = br.Get(&n);
      for (uint32_t i = 0; ok && i < n; ++i) {
        std::string k, v;
        ok = br.GetString(&k, kMaxText) && br.GetString(&v, blob_bytes.size());
        if (ok) attempt_report.blobs.emplace(std::move(k), std::move(v));
      }
      if (!ok) st = Status::Corruption(who + ": garbled blobs of step " + std::to_string(step));
    }
    const bool corrupt = st.ok() && !a.corrupt.ok();
    if (corrupt) st = a.corrupt;
    // 5. Outcome: every rank learns every rank's.
    ByteWriter w3;
    w3.PutStatus(st);
    w3.Put<uint64_t>(attempt_report.pfs_bytes_read);
    CAIRN_ASSIGN_OR_RETURN(auto outcomes, g->AllGather(w3.out()));
    Status first_bad, first_corrupt;
    uint64_t job_pfs = 0;
    for (size_t r = 0; r < outcomes.size(); ++r) {
      ByteReader rd(outcomes[r]);
      Status s;
      uint64_t n = 0;
      if (!rd.GetStatus(&s, kMaxText) || !rd.Get(&n))
        s = Status::Corruption("garbled outcome from rank " + std::to_string(r));
      job_pfs += n;
      if (s.code() == StatusCode::kCorruption) {
        if (first_corrupt.ok()) first_corrupt = s;
      } else if (!s.ok() && first_bad.ok()) {
        first_bad = s;
      }
    }
    if (!first_bad.ok()) return first_bad;
    if (!first_corrupt.ok()) {
      const std::string tier = choice->from_pfs ? "the PFS" : "memory";
      env.log->Warning("skipping step " + std::to_string(step) + " in " + tier + ": " +
                       first_corrupt.message() + "; trying the next older version");
      report.skipped.push_back(first_corrupt.message());
      excluded.insert({step, choice->from_pfs});
      continue;
    }
    // Done.
    attempt_report.step = step;
    attempt_report.skipped = std::move(report.skipped);
    attempt_report.tier = choice->from_pfs                    ? "pfs"
                          : attempt_report.bytes_received > 0 ? "peer"
                                                              : "host";
    for (const ShardSpec& t : targets) attempt_report.bytes += t.nbytes();
    const uint32_t c = lt.class_of_rank[static_cast<size_t>(env.rank)];
    for (const LoadPlan::Fill& f : plan->fills[c]) {
      const LoadPiece& p = mc.cat.pieces[plan->spans[f.span].piece];
      if (!(f.region == targets[f.target].box) || !(f.region == p.box))
        attempt_report.resharded = true;
    }
    if (choice->from_pfs) {
      // PFS pieces are slabs of the saved shards: compare with the shards ranks held.
      std::set<std::pair<uint32_t, std::vector<int64_t>>> saved;
      for (const pb::Shard& s : manifest.shards()) {
        std::vector<int64_t> key(s.offsets().begin(), s.offsets().end());
        key.insert(key.end(), s.lengths().begin(), s.lengths().end());
        saved.insert({s.tensor(), std::move(key)});
      }
      attempt_report.resharded = false;
      std::unordered_map<std::string, uint32_t> ids;
      for (int i = 0; i < manifest.tensors_size(); ++i) ids[manifest.tensors(i).name()] = i;
      for (const ShardSpec& t : targets) {
        std::vector<int64_t> key = t.box.offsets;
        key.insert(key.end(), t.box.lengths.begin(), t.box.lengths.end());
        if (!saved.count({ids[t.meta.name], key})) attempt_report.resharded = true;
      }
    }
    attempt_report.job_pfs_bytes_read = job_pfs;
    attempt_report.job_unique_bytes_needed = plan->unique_bytes_needed;
    attempt_report.seconds = NanosToSeconds(NowNanos() - t0);
    return attempt_report;
  }
}

}  // namespace cairn
