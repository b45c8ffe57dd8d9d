#include "api/checkpointer.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "core/checksum.h"
#include "core/clock.h"
#include "core/kill_point.h"
#include "core/trace.h"
#include "persist/manifest.h"
#include "recovery/ucx_transport.h"

namespace cairn {
namespace {

// Slot offsets: cache-line aligned for streaming stores; shards of 1 MiB or more start on
// a 4 KiB page so the PFS writers can hand them to O_DIRECT without a bounce copy.
constexpr uint64_t kShardAlign = 64;
constexpr uint64_t kLargeShardAlign = 4096;
constexpr uint64_t kLargeShard = 1ull << 20;
constexpr size_t kMaxBlobs = 1 << 16;

uint64_t AlignUp(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

std::string ShardKey(const std::string& name, const Box& box) {
  std::string k = name;
  k.push_back('\0');
  for (size_t d = 0; d < box.ndim(); ++d) {
    k.append(reinterpret_cast<const char*>(&box.offsets[d]), sizeof(int64_t));
    k.append(reinterpret_cast<const char*>(&box.lengths[d]), sizeof(int64_t));
  }
  return k;
}

}  // namespace

struct Checkpointer::Request {
  uint64_t seq = 0;
  int device = -1;                    // of the device shards (-1: none)
  CudaStream stream = nullptr;        // that wrote them
  std::shared_ptr<StreamMark> after;  // on `stream` at save(): the copy starts after it
  int slot = -1;
  SlotHeader header;                    // complete but for checksums
  std::vector<CopyChunk> chunks;        // src set; dst filled in once the slot is mapped
  std::vector<uint64_t> chunk_offsets;  // destination offsets in the slot
  std::vector<std::string> blob_bytes;  // in header.blobs order
};

Checkpointer::Checkpointer(Options options, std::unique_ptr<CopyEngine> engine)
    : options_(std::move(options)),
      log_("cairn rank " + std::to_string(options_.rank), options_.log_level),
      engine_(std::move(engine)) {
  stats_.copy_engine = std::string(engine_->name());
}

Result<std::unique_ptr<Checkpointer>> Checkpointer::Open(Options options) {
  CAIRN_RETURN_IF_ERROR(options.Validate());
  if (!options.trace_path.empty()) Trace::Enable(options.rank);
  FileSystem* fs = options.fs ? options.fs : DefaultFileSystem();
  CAIRN_ASSIGN_OR_RETURN(auto engine, MakeCopyEngine(options.copy_engine, options.copy_threads));
  std::unique_ptr<Checkpointer> c(new Checkpointer(std::move(options), std::move(engine)));
  HostTierConfig tc;
  tc.dir = HostTier::RankDir(c->options_.host_root, c->options_.job_id, c->options_.node,
                             c->options_.rank);
  tc.slots = c->options_.slots;
  tc.slot_bytes = c->options_.slot_bytes;
  CopyEngine* e = c->engine_.get();
  // Pinning a slot (CUDA) is for speed only: a mapping the driver will not pin (some
  // filesystems refuse long-term pins of their pages) is still copied into, more slowly.
  const Logger* log = &c->log_;
  tc.on_map = [e, log](void* p, size_t n) {
    Status st = e->RegisterHost(p, n);
    if (!st.ok())
      log->Warning("a host slot could not be pinned for device copies (" + st.ToString() +
                   "); copies into it go through the driver's staging, slower");
    return Status::OK();
  };
  tc.on_unmap = [e](void* p, size_t n) { e->UnregisterHost(p, n); };
  auto tier = HostTier::Open(std::move(tc), fs, &c->log_);
  if (!tier.ok()) return tier.status().WithContext(c->Who());
  c->tier_ = std::move(*tier);
  auto held = c->tier_->Versions();
  if (!held.empty())
    c->log_.Info("host tier " + c->tier_->dir() + " holds " + std::to_string(held.size()) +
                 " restorable version(s), newest step " + std::to_string(held.front().step));
  const Options& o = c->options_;
  if (o.world_size > 1) {
    CAIRN_ASSIGN_OR_RETURN(c->comm_, UcxComm::Connect(o, &c->log_));
    c->group_ = std::make_unique<UcxGroup>(c->comm_.get());
    c->persist_group_ = std::make_unique<UcxGroup>(c->comm_.get(), MsgKind::kPersistCollective,
                                                   MsgKind::kPersistBroadcast);
  } else {
    c->persist_group_ = std::make_unique<SoloGroup>();
  }
  if (o.world_size > 1 && o.replicas > 0) {
    if (o.world_size % o.local_world_size != 0)
      return Status::InvalidArgument(c->Who() + ": world size " + std::to_string(o.world_size) +
                                     " is not a multiple of the local world size " +
                                     std::to_string(o.local_world_size));
    const int nodes = o.world_size / o.local_world_size;
    CAIRN_ASSIGN_OR_RETURN(
        Placement placement,
        Placement::Make(nodes, o.local_world_size, std::min(o.replicas, nodes - 1),
                        o.group_placement ? PlacementStrategy::kGroup : PlacementStrategy::kRing));
    if (o.replicas > nodes - 1)
      c->log_.Warning("CAIRN_REPLICAS=" + std::to_string(o.replicas) + " but the job has only " +
                      std::to_string(nodes) + " nodes: keeping " + std::to_string(nodes - 1));
    if (o.node != o.rank / o.local_world_size)
      return Status::InvalidArgument(c->Who() + ": node id " + std::to_string(o.node) +
                                     " does not match RANK / LOCAL_WORLD_SIZE = " +
                                     std::to_string(o.rank / o.local_world_size) +
                                     " (replica placement assumes consecutive ranks per node)");
    c->replica_sources_ = placement.held_by(o.rank);
    // As many versions of each source as it keeps itself: a node that lost its partner
    // then still finds, among every source's replicas, the steps the partner's ranks had
    // in common when it died (with 2, a source whose pushes ran ahead had evicted them).
    c->store_ = std::make_unique<ReplicaStore>(
        JoinPath(JoinPath(o.host_root, o.job_id), "node-" + std::to_string(o.node)), fs, &c->log_,
        o.slots);
    if (nodes > 1)
      c->replicator_ =
          std::make_unique<Replicator>(c->comm_.get(), std::move(placement), c->tier_.get(),
                                       c->store_.get(), &c->log_, o.replicate_timeout_s);
  }
  PersistConfig pc;
  pc.job = o.job_id;
  pc.job_dir = PfsJobDir(o.pfs_root, o.job_id);
  pc.every = o.persist_every;
  pc.keep = o.keep_on_pfs;
  pc.writer.threads = o.persist_threads;
  pc.writer.direct = o.persist_direct;
  pc.writer.chunk_bytes = o.chunk_bytes;
  pc.planner.align_bytes = o.chunk_bytes;
  Checkpointer* self = c.get();
  // Drains hold back while a capture is copying (they would slow the copy a fence may be
  // waiting for), but never more than 50 ms per chunk, so they always progress.
  pc.writer.yield = [self] {
    std::unique_lock lk(self->mu_);
    self->cv_.wait_for(lk, std::chrono::milliseconds(50),
                       [&] { return self->copied_seq_ >= self->submitted_seq_; });
  };
  pc.rate_bytes_per_s = o.persist_rate;
  pc.priority = static_cast<PersistPriority>(o.persist_priority);
  c->persister_ =
      std::make_unique<Persister>(std::move(pc), c->tier_.get(), c->persist_group_.get(),
                                  o.pfs_fs ? o.pfs_fs : fs, &c->log_, [self](uint64_t seq) {
                                    std::unique_lock lk(self->mu_);
                                    self->cv_.wait(lk, [&] { return self->done_seq_ >= seq; });
                                  });
  c->capture_thread_ = std::thread([p = c.get()] { p->CaptureLoop(); });
  return c;
}

Checkpointer::~Checkpointer() {
  {
    std::unique_lock lk(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  if (capture_thread_.joinable()) capture_thread_.join();
  persister_.reset();   // runs the persist rounds already due (every rank has the same ones)
  replicator_.reset();  // stops pushing before the tiers and the connections go
  store_.reset();
  persist_group_.reset();
  group_.reset();
  comm_.reset();
  if (!options_.trace_path.empty()) {
    const std::string path =
        Trace::RankPath(options_.trace_path, options_.rank, options_.world_size);
    Status st = Trace::Write(path);
    if (!st.ok()) log_.Warning(st.ToString());
  }
}

Status Checkpointer::CheckReachable(const ShardSpec& s, const std::string& who, int* device) {
  CAIRN_RETURN_IF_ERROR(CheckShard(s).WithContext(who));
  if (s.memory != MemoryKind::kDevice) return Status::OK();
  if (engine_->name() != "cuda")
    return Status::InvalidArgument(who + ": tensor '" + s.meta.name +
                                   "' is in device memory but the copy engine is '" +
                                   std::string(engine_->name()) + "'");
  if (s.nbytes() == 0) return Status::OK();
  // Tensors keep their addresses from one iteration to the next, and under unified
  // addressing an address belongs to one device: look each up once.
  auto it = device_of_.find(s.data);
  if (it == device_of_.end()) {
    auto d = engine_->DeviceOf(s.data);
    if (!d.ok())
      return Status::InvalidArgument(who + ": tensor '" + s.meta.name + "' is given as device " +
                                     "memory: " + d.status().message());
    if (device_of_.size() >= (1u << 20)) device_of_.clear();
    it = device_of_.emplace(s.data, *d).first;
  }
  if (device) *device = it->second;
  return Status::OK();
}

std::string Checkpointer::Who() const {
  return "rank " + std::to_string(options_.rank);
}

Result<SaveOutcome> Checkpointer::save(int64_t step, std::span<const ShardSpec> shards,
                                       const Blobs& blobs, CudaStream stream) {
  TraceSpan span("save", "api");
  const int64_t t0 = NowNanos();
  const std::string who = Who() + ", step " + std::to_string(step);
  if (step < 0) return Status::InvalidArgument(who + ": step must not be negative");
  if (last_step_ && step <= *last_step_)
    return Status::InvalidArgument(who + ": steps must increase (the last save was step " +
                                   std::to_string(*last_step_) + ")");
  if (blobs.size() > kMaxBlobs)
    return Status::InvalidArgument(who + ": too many blobs (" + std::to_string(blobs.size()) + ")");

  // Validate everything before reserving anything.
  std::unordered_map<std::string, const TensorMeta*> metas;
  std::unordered_set<std::string> keys;
  int device = -1;
  const ShardSpec* on_device = nullptr;
  for (const ShardSpec& s : shards) {
    int d = -1;
    CAIRN_RETURN_IF_ERROR(CheckReachable(s, who, &d));
    if (d >= 0 && device >= 0 && d != device)
      return Status::InvalidArgument(who + ": tensor '" + s.meta.name + "' is on CUDA device " +
                                     std::to_string(d) + " but tensor '" + on_device->meta.name +
                                     "' on device " + std::to_string(device) +
                                     "; the device tensors of one save must be on one device");
    if (d >= 0 && device < 0) device = d, on_device = &s;
    auto [it, fresh] = metas.emplace(s.meta.name, &s.meta);
    if (!fresh && !(*it->second == s.meta))
      return Status::InvalidArgument(who + ": tensor '" + s.meta.name +
                                     "' is given with two different dtypes or global shapes");
    if (!keys.insert(ShardKey(s.meta.name, s.box)).second)
      return Status::InvalidArgument(who + ": tensor '" + s.meta.name + "' box " +
                                     s.box.ToString() + " is given twice");
  }
  for (const auto& [name, bytes] : blobs)
    CAIRN_RETURN_IF_ERROR(CheckTensorName(name).WithContext(who + ": blob name"));

  // Lay the version out in a slot and cut it into chunks.
  auto req = std::make_unique<Request>();
  SlotHeader& h = req->header;
  h.step = step;
  h.rank = static_cast<uint32_t>(options_.rank);
  h.world_size = static_cast<uint32_t>(options_.world_size);
  h.node = static_cast<uint32_t>(options_.node);
  h.chunk_bytes = options_.chunk_bytes;
  uint64_t off = 0;
  uint32_t chunk_index = 0;
  h.shards.reserve(shards.size());
  for (const ShardSpec& s : shards) {
    SlotShard r;
    r.name = s.meta.name;
    r.dtype = s.meta.dtype;
    r.global_shape = s.meta.global_shape;
    r.box = s.box;
    r.nbytes = s.nbytes();
    r.offset = off = AlignUp(off, r.nbytes >= kLargeShard ? kLargeShardAlign : kShardAlign);
    r.first_chunk = chunk_index;
    r.num_chunks = static_cast<uint32_t>((r.nbytes + h.chunk_bytes - 1) / h.chunk_bytes);
    for (uint32_t i = 0; i < r.num_chunks; ++i) {
      const uint64_t b = static_cast<uint64_t>(i) * h.chunk_bytes;
      CopyChunk c;
      c.src = static_cast<const std::byte*>(s.data) + b;
      c.bytes = static_cast<size_t>(std::min(h.chunk_bytes, r.nbytes - b));
      c.device = s.memory == MemoryKind::kDevice;
      req->chunks.push_back(c);
      req->chunk_offsets.push_back(r.offset + b);
    }
    chunk_index += r.num_chunks;
    off += r.nbytes;
    h.shards.push_back(std::move(r));
  }
  for (const auto& [name, bytes] : blobs) {
    SlotBlob b;
    b.name = name;
    b.offset = off = AlignUp(off, kShardAlign);
    b.nbytes = bytes.size();
    off += b.nbytes;
    h.blobs.push_back(std::move(b));
    req->blob_bytes.push_back(bytes);
  }
  h.data_bytes = off;
  h.chunk_checksums.assign(chunk_index, 0);
  if (device >= 0) {
    // The point in the training stream the version must reflect (an event record: the
    // host does not wait).
    auto mark = engine_->MarkStream(device, stream);
    if (!mark.ok()) return mark.status().WithContext(who);
    req->after = std::move(*mark);
    req->device = device;
    req->stream = stream;
  }

  auto slot = tier_->Reserve(step, options_.full_policy);
  last_step_ = step;
  std::unique_lock lk(mu_);
  if (!slot.ok()) {
    if (slot.status().code() != StatusCode::kUnavailable) return slot.status().WithContext(who);
    ++stats_.skipped;
    if (!warned_skip_) {
      log_.Warning(who + " skipped: " + slot.status().message() +
                   " (policy skip; later skips are only counted in stats)");
      warned_skip_ = true;
    }
    const uint64_t seq = submitted_seq_;
    const double dt = NanosToSeconds(NowNanos() - t0);
    stats_.save_call_total_s += dt;
    stats_.save_call_max_s = std::max(stats_.save_call_max_s, dt);
    lk.unlock();
    persister_->OnSave(seq, step);
    return SaveOutcome::kSkipped;
  }
  req->slot = *slot;
  req->seq = ++submitted_seq_;
  queue_.push_back(std::move(req));
  ++stats_.saves;
  const uint64_t seq = submitted_seq_;
  const double dt = NanosToSeconds(NowNanos() - t0);
  stats_.save_call_total_s += dt;
  stats_.save_call_max_s = std::max(stats_.save_call_max_s, dt);
  lk.unlock();
  // After unlocking: a woken capture thread must not find the lock still held.
  cv_.notify_all();
  persister_->OnSave(seq, step);
  return SaveOutcome::kQueued;
}

Status Checkpointer::fence() {
  return Fence(false, true, nullptr);
}

Status Checkpointer::fence(CudaStream consumer) {
  return Fence(false, false, consumer);
}

Status Checkpointer::fence_host() {
  return Fence(true, false, nullptr);
}

Status Checkpointer::Fence(bool host, bool own_streams, CudaStream consumer) {
  TraceSpan span("fence", "api");
  const int64_t t0 = NowNanos();
  std::unique_lock lk(mu_);
  if (host)
    cv_.wait(lk, [&] { return copied_seq_ >= submitted_seq_; });
  else
    cv_.wait(lk, [&] { return queued_seq_ >= submitted_seq_; });
  auto marks = std::move(pending_marks_);
  pending_marks_.clear();
  Status st = fence_error_;
  fence_error_ = Status::OK();
  lk.unlock();
  if (!host) {
    // The copy stream runs versions in order: the newest mark per (stream, device) covers
    // the older ones, so only those are waited for.
    std::vector<std::pair<CudaStream, int>> ordered;
    for (auto it = marks.rbegin(); it != marks.rend(); ++it) {
      const std::pair<CudaStream, int> key{own_streams ? it->second : consumer,
                                           it->first->device()};
      if (std::find(ordered.begin(), ordered.end(), key) != ordered.end()) continue;
      ordered.push_back(key);
      Status w = engine_->StreamWait(*it->first, key.first);
      if (!w.ok() && st.ok()) st = w.WithContext(Who() + ": fence");
    }
  }
  const double dt = NanosToSeconds(NowNanos() - t0);
  lk.lock();
  ++stats_.fences;
  stats_.fence_wait_total_s += dt;
  stats_.fence_wait_max_s = std::max(stats_.fence_wait_max_s, dt);
  return st;
}

uint64_t Checkpointer::copies_done() const {
  std::lock_guard lk(mu_);
  return copied_seq_;
}

void Checkpointer::WaitSettled(std::unique_lock<std::mutex>& lk) {
  cv_.wait(lk, [&] { return done_seq_ >= submitted_seq_; });
}

Status Checkpointer::wait_captured() {
  std::unique_lock lk(mu_);
  WaitSettled(lk);
  Status st = capture_error_;
  capture_error_ = Status::OK();
  fence_error_ = Status::OK();
  return st;
}

void Checkpointer::CaptureLoop() {
  for (;;) {
    std::unique_ptr<Request> r;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued is done
      r = std::move(queue_.front());
      queue_.pop_front();
    }
    Capture(*r);
  }
}

void Checkpointer::Capture(Request& r) {
  TraceSpan span("capture copy", "capture");
  SlotHeader& h = r.header;
  const std::string who = Who() + ", step " + std::to_string(h.step);
  Status st;
  int64_t copy_ns = 0;
  auto base = tier_->Prepare(r.slot, h.step, h.data_bytes, h);
  if (!base.ok()) {
    st = base.status();
  } else {
    std::byte* slot = *base;
    for (size_t i = 0; i < r.chunks.size(); ++i) r.chunks[i].dst = slot + r.chunk_offsets[i];
    const int64_t t0 = NowNanos();
    // Checksums come back with the bytes: taken while copying (host engine) or as each
    // device chunk lands (CUDA engine).
    st = engine_->Capture(r.after.get(), r.device, r.chunks, h.chunk_checksums.data(),
                          [&](std::shared_ptr<StreamMark> done) {
                            // No device copy in flight: every byte is in the slot. Before
                            // fence() can return: a save() right after it must see this
                            // slot as committing (and wait for the commit) rather than as
                            // capturing (and skip).
                            if (!done) tier_->MarkCopied(r.slot);
                            {
                              std::lock_guard lk(mu_);
                              queued_seq_ = r.seq;
                              if (done)
                                pending_marks_.emplace_back(std::move(done), r.stream);
                              else
                                copied_seq_ = r.seq;  // every byte of the shards is copied
                            }
                            cv_.notify_all();
                          });
    r.after.reset();
    for (size_t i = 0; st.ok() && i < h.blobs.size(); ++i) {
      std::memcpy(slot + h.blobs[i].offset, r.blob_bytes[i].data(), h.blobs[i].nbytes);
      h.blobs[i].checksum = Checksum(r.blob_bytes[i].data(), h.blobs[i].nbytes);
    }
    copy_ns = NowNanos() - t0;
  }
  if (st.ok()) tier_->MarkCopied(r.slot);
  {
    std::lock_guard lk(mu_);
    queued_seq_ = r.seq;  // also when the capture failed before queueing
    copied_seq_ = r.seq;
    if (st.ok()) {
      stats_.bytes_copied += h.data_bytes;
      stats_.copy_seconds += NanosToSeconds(copy_ns);
      if (stats_.copy_seconds > 0)
        stats_.copy_gbps = static_cast<double>(stats_.bytes_copied) / stats_.copy_seconds / 1e9;
    } else if (fence_error_.ok()) {
      fence_error_ = st.WithContext(who + ": capture failed");
    }
    cv_.notify_all();
  }
  if (st.ok()) CAIRN_KILL_POINT("capture.copied");
  if (st.ok()) {
    h.created_wall_ns = WallNanos();
    st = tier_->Commit(r.slot, h);
  }
  if (!st.ok()) {
    tier_->Abort(r.slot);
    log_.Warning(who + ": capture failed, version not restorable (older versions are kept): " +
                 st.ToString());
  }
  if (st.ok()) CAIRN_KILL_POINT("capture.published");
  if (st.ok() && replicator_) replicator_->Notify(h.step);
  std::lock_guard lk(mu_);
  if (st.ok()) {
    ++stats_.captured;
    stats_.newest_captured_step = std::max(stats_.newest_captured_step, h.step);
  } else {
    ++stats_.failed;
    if (capture_error_.ok()) capture_error_ = st.WithContext(who + ": capture failed");
  }
  done_seq_ = r.seq;
  cv_.notify_all();
}

std::vector<VersionInfo> Checkpointer::versions() const {
  return tier_->Versions();
}

Stats Checkpointer::stats() const {
  Stats s;
  {
    std::lock_guard lk(mu_);
    s = stats_;
  }
  if (replicator_) {
    ReplicatorStats r = replicator_->stats();
    s.replicated = r.replicated;
    s.replicate_failed = r.failed;
    s.bytes_replicated = r.bytes;
    s.replicate_gbps = r.seconds > 0 ? static_cast<double>(r.bytes) / r.seconds / 1e9 : 0;
    s.replicate_ack_ms = r.last_ack_ms;
    s.replicate_push_ms = r.last_push_ms;
    s.newest_replicated_step = r.newest_replicated;
    s.replicas_received = r.received;
  }
  PersistStats p = persister_->stats();
  s.persisted = p.persisted;
  s.persist_failed = p.failed;
  s.bytes_persisted = p.bytes;
  s.persist_gbps = p.write_seconds > 0 ? static_cast<double>(p.bytes) / p.write_seconds / 1e9 : 0;
  s.persist_round_ms = p.last_round_ms;
  s.persist_max_writer_share = p.max_writer_share;
  s.newest_persisted_step = p.newest_persisted_step;
  s.last_persist_error = p.last_error;
  if (comm_) s.ucx_requests_in_flight = comm_->requests_in_flight();
  return s;
}

Result<int64_t> Checkpointer::flush() {
  uint64_t seq;
  {
    std::lock_guard lk(mu_);
    seq = submitted_seq_;
  }
  auto r = persister_->Flush(seq, last_step_.value_or(-1));
  if (!r.ok()) return r.status().WithContext(Who() + ": flush");
  return r;
}

Status Checkpointer::wait_replicated(double timeout_s) {
  if (!replicator_)
    return Status::FailedPrecondition(Who() +
                                      ": this job does not replicate (one node, or "
                                      "CAIRN_REPLICAS=0)");
  int64_t newest;
  {
    // Let captures in flight settle without taking their errors (fence() reports them).
    std::unique_lock lk(mu_);
    WaitSettled(lk);
    newest = stats_.newest_captured_step;
  }
  if (newest < 0) return Status::NotFound(Who() + ": nothing captured yet");
  return replicator_->WaitReplicated(newest, timeout_s);
}

namespace {

class PinnedView final : public PinnedVersion {
 public:
  explicit PinnedView(std::unique_ptr<HostTier::View> v) : v_(std::move(v)) {}
  const SlotHeader& header() const override { return v_->header(); }
  const std::byte* data() const override { return v_->data(); }
  const std::string& path() const override { return v_->data_path(); }

 private:
  std::unique_ptr<HostTier::View> v_;
};

// This rank's own host tier and the replica tiers it keeps for other ranks.
class TierMemory final : public MemorySource {
 public:
  TierMemory(HostTier* own, ReplicaStore* store, std::vector<int> sources, const Logger* log)
      : own_(own), store_(store), sources_(std::move(sources)), log_(log) {}
  std::vector<HeldVersion> List() override {
    std::vector<HeldVersion> out;
    for (const VersionInfo& v : own_->Versions())
      out.push_back({static_cast<int>(v.rank), v.step, v.world_size});
    for (int s : sources_) {
      auto t = store_->TierFor(s);
      if (!t.ok()) {
        log_->Warning("replicas of rank " + std::to_string(s) +
                      " are not readable: " + t.status().ToString());
        continue;
      }
      for (const VersionInfo& v : (*t)->Versions())
        if (static_cast<int>(v.rank) == s) out.push_back({s, v.step, v.world_size});
    }
    return out;
  }
  Result<std::unique_ptr<PinnedVersion>> Pin(const HeldVersion& v) override {
    HostTier* tier = own_;
    if (std::find(sources_.begin(), sources_.end(), v.source) != sources_.end()) {
      CAIRN_ASSIGN_OR_RETURN(tier, store_->TierFor(v.source));
    }
    CAIRN_ASSIGN_OR_RETURN(auto view, tier->Pin(v.step));
    return std::unique_ptr<PinnedVersion>(new PinnedView(std::move(view)));
  }
  std::string Describe() const override { return "host tier " + own_->dir(); }

 private:
  HostTier* own_;
  ReplicaStore* store_;
  std::vector<int> sources_;
  const Logger* log_;
};

}  // namespace

Result<RestoreReport> Checkpointer::restore(std::span<const ShardSpec> targets,
                                            const RestoreOptions& options) {
  TraceSpan span("restore", "restore");
  {
    // Let captures in flight settle (a failed one is simply not among the versions); their
    // errors stay for fence() / wait_captured() to report.
    std::unique_lock lk(mu_);
    WaitSettled(lk);
  }
  int device = -1;
  for (const ShardSpec& t : targets) {
    CAIRN_RETURN_IF_ERROR(CheckReachable(t, Who() + ": restore target", &device));
  }
  // Device targets: the copies into them come after whatever the stream still has queued.
  if (device >= 0)
    CAIRN_RETURN_IF_ERROR(
        engine_->OrderAfter(device, options.stream).WithContext(Who() + ": restore"));
  std::unordered_set<std::string> seen;
  for (const ShardSpec& t : targets)
    if (!seen.insert(ShardKey(t.meta.name, t.box)).second)
      return Status::InvalidArgument(Who() + ": restore target '" + t.meta.name + "' box " +
                                     t.box.ToString() + " given twice");
  TierMemory memory(tier_.get(), store_.get(), replica_sources_, &log_);
  SoloGroup solo;
  std::unique_ptr<RestoreTransport> transport;
  if (comm_) transport = MakeUcxRestoreTransport(comm_.get());
  RestoreEnv env;
  env.rank = options_.rank;
  env.group = group_ ? static_cast<Group*>(group_.get()) : &solo;
  env.transport = transport.get();
  env.memory = &memory;
  env.pfs_fs =
      options_.pfs_fs ? options_.pfs_fs : (options_.fs ? options_.fs : DefaultFileSystem());
  if (!options_.pfs_root.empty()) env.pfs_job_dir = PfsJobDir(options_.pfs_root, options_.job_id);
  env.engine = engine_.get();
  env.log = &log_;
  env.who = Who();
  env.timeout_s = options_.op_timeout_s;
  env.read_threads = options_.persist_threads;
  for (const ShardSpec& t : targets) env.host_targets &= t.memory == MemoryKind::kHost;
  return Restore(env, targets, options);
}

}  // namespace cairn
