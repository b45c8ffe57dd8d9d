#include "snapshot/capture_pipeline.h"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <unordered_set>

#include "core/arith.h"
#include "core/checksum.h"
#include "core/clock.h"
#include "core/kill_point.h"
#include "core/pool.h"
#include "core/trace.h"

namespace cairn {
namespace {

// Slot offsets: cache-line aligned for streaming stores; shards of 1 MiB or more start on
// a 4 KiB page so the PFS writers can hand them to O_DIRECT without a bounce copy.
constexpr uint64_t kShardAlign = 64;
constexpr uint64_t kLargeShardAlign = 4096;
constexpr uint64_t kLargeShard = 1ull << 20;
constexpr size_t kMaxBlobs = 1 << 16;

}  // namespace

std::string ShardKey(const std::string& name, const Box& box) {
  std::string k = name;
  k.push_back('\0');
  for (size_t d = 0; d < box.ndim(); ++d) {
    k.append(reinterpret_cast<const char*>(&box.offsets[d]), sizeof(int64_t));
    k.append(reinterpret_cast<const char*>(&box.lengths[d]), sizeof(int64_t));
  }
  return k;
}

struct CapturePipeline::Request {
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

CapturePipeline::CapturePipeline(CaptureConfig config, CopyEngine* engine, HostTier* tier,
                                 const Logger* log, CaptureHooks hooks)
    : config_(config), engine_(engine), tier_(tier), log_(log), hooks_(std::move(hooks)) {
  capture_stats_.copy_engine = std::string(engine_->name());
  capture_thread_ = std::thread([this] { CaptureLoop(); });
}

CapturePipeline::~CapturePipeline() {
  Stop();
}

void CapturePipeline::Stop() {
  {
    MutexLock lk(mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  if (capture_thread_.joinable()) capture_thread_.join();
}

Status CapturePipeline::CheckReachable(const ShardSpec& s, const std::string& who, int* device) {
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

Result<int> CapturePipeline::Validate(std::span<const ShardSpec> shards, const Blobs& blobs,
                                      const std::string& who) {
  std::unordered_map<std::string_view, const TensorMeta*> metas;  // names live in `shards`
  std::unordered_set<std::string> keys;
  metas.reserve(shards.size());
  keys.reserve(shards.size());
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
  return device;
}

Result<std::unique_ptr<CapturePipeline::Request>> CapturePipeline::Layout(
    int64_t step, std::span<const ShardSpec> shards, const Blobs& blobs, CudaStream stream,
    const std::string& who) {
  // Validate everything before reserving anything.
  CAIRN_ASSIGN_OR_RETURN(const int device, Validate(shards, blobs, who));

  // Lay the version out in a slot and cut it into chunks.
  auto req = std::make_unique<Request>();
  SlotHeader& h = req->header;
  h.step = step;
  h.rank = static_cast<uint32_t>(config_.rank);
  h.world_size = static_cast<uint32_t>(config_.world_size);
  h.node = static_cast<uint32_t>(config_.node);
  h.chunk_bytes = config_.chunk_bytes;
  uint64_t off = 0;
  uint32_t chunk_index = 0;
  h.shards.reserve(shards.size());
  req->chunks.reserve(shards.size());
  req->chunk_offsets.reserve(shards.size());
  for (const ShardSpec& s : shards) {
    SlotShard r;
    r.name = s.meta.name;
    r.dtype = s.meta.dtype;
    r.global_shape = s.meta.global_shape;
    r.box = s.box;
    r.nbytes = s.nbytes();
    r.offset = off = RoundUp(off, r.nbytes >= kLargeShard ? kLargeShardAlign : kShardAlign);
    r.first_chunk = chunk_index;
    r.num_chunks = static_cast<uint32_t>(CeilDiv(r.nbytes, h.chunk_bytes));
    for (uint32_t i = 0; i < r.num_chunks; ++i) {
      const uint64_t b = static_cast<uint64_t>(i) * h.chunk_bytes;
      CopyChunk c;
      c.src = static_cast<const std::byte*>(s.data) + b;
      c.bytes = static_cast<size_t>(std::min(h.chunk_bytes, r.nbytes - b));
      c.device = s.memory == MemoryKind::kDevice;
      c.continues = i > 0;  // the same tensor, and the next bytes of the slot
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
    b.offset = off = RoundUp(off, kShardAlign);
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
  return req;
}

void CapturePipeline::CountSaveCall(int64_t t0) {
  const double dt = NanosToSeconds(NowNanos() - t0);
  save_stats_.save_call_total_s += dt;
  save_stats_.save_call_max_s = std::max(save_stats_.save_call_max_s, dt);
}

Result<SaveOutcome> CapturePipeline::Save(int64_t step, std::span<const ShardSpec> shards,
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
  CAIRN_ASSIGN_OR_RETURN(auto req, Layout(step, shards, blobs, stream, who));
  // A host root too small for every slot is refused here, at the first save of a size,
  // rather than by a capture failing later in the background.
  CAIRN_RETURN_IF_ERROR(tier_->EnsureRoom(req->header.data_bytes).WithContext(who));

  auto slot = tier_->Reserve(step, config_.full_policy, config_.full_wait_s);
  last_step_ = step;
  MutexLock lk(mu_);
  if (!slot.ok()) {
    if (slot.status().code() != StatusCode::kUnavailable) return slot.status().WithContext(who);
    // Skipped, or failed under kRaise: counted alike, and every rank's persister counts the
    // save as it counts every other (the hook below), so the drains stay in step.
    ++save_stats_.skipped;
    ++skips_unwarned_;
    const bool raise = config_.full_policy == FullPolicy::kRaise;
    if (!raise && t0 - skip_warned_ns_ >= 30'000'000'000) {
      const char* policy = config_.full_policy == FullPolicy::kWait ? "wait" : "skip";
      log_->Warning(who + " skipped: " + slot.status().message() + " (CAIRN_FULL_POLICY=" + policy +
                    "; " + std::to_string(skips_unwarned_) + " skipped since the " +
                    (skip_warned_ns_ == 0 ? "start" : "last warning, 30 s or more ago") + ", " +
                    std::to_string(save_stats_.skipped) + " in all)");
      skip_warned_ns_ = t0;
      skips_unwarned_ = 0;
    }
    const uint64_t seq = submitted_seq_;
    CountSaveCall(t0);
    lk.Unlock();
    if (hooks_.on_save) hooks_.on_save(seq, step);
    if (raise) return slot.status().WithContext(who + ": not saved (CAIRN_FULL_POLICY=raise)");
    return SaveOutcome::kSkipped;
  }
  req->slot = *slot;
  req->seq = ++submitted_seq_;
  queue_.push_back(std::move(req));
  ++save_stats_.saves;
  const uint64_t seq = submitted_seq_;
  CountSaveCall(t0);
  lk.Unlock();
  // After unlocking: a woken capture thread must not find the lock still held.
  cv_.NotifyAll();
  if (hooks_.on_save) hooks_.on_save(seq, step);
  return SaveOutcome::kQueued;
}

Status CapturePipeline::Fence(FenceKind kind, CudaStream consumer) {
  TraceSpan span("fence", "api");
  const int64_t t0 = NowNanos();
  MutexLock lk(mu_);
  if (kind == FenceKind::kHost)
    cv_.Wait(lk, [&]() CAIRN_REQUIRES(mu_) { return copied_seq_ >= submitted_seq_; });
  else
    cv_.Wait(lk, [&]() CAIRN_REQUIRES(mu_) { return queued_seq_ >= submitted_seq_; });
  auto marks = std::move(pending_marks_);
  pending_marks_.clear();
  Status st = fence_error_;
  fence_error_ = Status::OK();
  lk.Unlock();
  if (kind != FenceKind::kHost) {
    // The copy stream runs versions in order: the newest mark per (stream, device) covers
    // the older ones, so only those are waited for.
    std::vector<std::pair<CudaStream, int>> ordered;
    for (auto it = marks.rbegin(); it != marks.rend(); ++it) {
      const std::pair<CudaStream, int> key{kind == FenceKind::kOwnStreams ? it->second : consumer,
                                           it->first->device()};
      if (std::find(ordered.begin(), ordered.end(), key) != ordered.end()) continue;
      ordered.push_back(key);
      Status w = engine_->StreamWait(*it->first, key.first);
      if (!w.ok() && st.ok()) st = w.WithContext(Who() + ": fence");
    }
  }
  const double dt = NanosToSeconds(NowNanos() - t0);
  lk.Lock();
  ++save_stats_.fences;
  save_stats_.fence_wait_total_s += dt;
  save_stats_.fence_wait_max_s = std::max(save_stats_.fence_wait_max_s, dt);
  return st;
}

uint64_t CapturePipeline::CopiesDone() const {
  MutexLock lk(mu_);
  return copied_seq_;
}

uint64_t CapturePipeline::submitted() const {
  MutexLock lk(mu_);
  return submitted_seq_;
}

void CapturePipeline::WaitSettled() {
  MutexLock lk(mu_);
  cv_.Wait(lk, [&]() CAIRN_REQUIRES(mu_) { return done_seq_ >= submitted_seq_; });
}

void CapturePipeline::WaitDone(uint64_t seq) {
  MutexLock lk(mu_);
  cv_.Wait(lk, [&]() CAIRN_REQUIRES(mu_) { return done_seq_ >= seq; });
}

void CapturePipeline::RecordFailure(uint64_t seq, Status st) {
  if (!failures_.empty() && failures_.back().first == seq) return;  // its copy failed already
  failures_.emplace_back(seq, std::move(st));
  if (failures_.size() > kFailuresKept) failures_.pop_front();
}

Result<bool> CapturePipeline::WaitSeq(uint64_t seq, bool settled, double timeout_s) {
  MutexLock lk(mu_);
  const bool reached =
      cv_.WaitFor(lk, std::chrono::duration<double>(std::max(0.0, timeout_s)),
                  [&]() CAIRN_REQUIRES(mu_) { return (settled ? done_seq_ : copied_seq_) >= seq; });
  for (const auto& [s, st] : failures_)
    if (s == seq) return st;
  return reached;
}

void CapturePipeline::YieldToCopies(std::chrono::milliseconds max_wait) {
  MutexLock lk(mu_);
  cv_.WaitFor(lk, max_wait, [&]() CAIRN_REQUIRES(mu_) { return copied_seq_ >= submitted_seq_; });
}

Status CapturePipeline::WaitCaptured() {
  MutexLock lk(mu_);
  cv_.Wait(lk, [&]() CAIRN_REQUIRES(mu_) { return done_seq_ >= submitted_seq_; });
  Status st = capture_error_;
  capture_error_ = Status::OK();
  fence_error_ = Status::OK();
  return st;
}

SaveStats CapturePipeline::save_stats() const {
  MutexLock lk(mu_);
  return save_stats_;
}

CaptureStats CapturePipeline::capture_stats() const {
  MutexLock lk(mu_);
  return capture_stats_;
}

void CapturePipeline::CaptureLoop() {
  // save() returns at once rather than yield to the copy it queued.
  (void)SetThreadPriority(ThreadPriority::kBatch);
  for (;;) {
    std::unique_ptr<Request> r;
    {
      MutexLock lk(mu_);
      cv_.Wait(lk, [&]() CAIRN_REQUIRES(mu_) { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued is done
      r = std::move(queue_.front());
      queue_.pop_front();
    }
    Capture(*r);
  }
}

Status CapturePipeline::Copy(Request& r, std::byte* slot, int64_t* copy_ns) {
  SlotHeader& h = r.header;
  for (size_t i = 0; i < r.chunks.size(); ++i) r.chunks[i].dst = slot + r.chunk_offsets[i];
  const int64_t t0 = NowNanos();
  // Checksums come back with the bytes: taken while copying (host engine) or as each
  // device chunk lands (CUDA engine).
  Status st = engine_->Capture(r.after.get(), r.device, r.chunks, h.chunk_checksums.data(),
                               [&](std::shared_ptr<StreamMark> done) {
                                 // No device copy in flight: every byte is in the slot.
                                 // Before fence() can return: a save() right after it must
                                 // see this slot as committing (and wait for the commit)
                                 // rather than as capturing (and skip).
                                 if (!done) tier_->MarkCopied(r.slot);
                                 {
                                   MutexLock lk(mu_);
                                   queued_seq_ = r.seq;
                                   if (done)
                                     pending_marks_.emplace_back(std::move(done), r.stream);
                                   else
                                     copied_seq_ = r.seq;  // every byte of the shards is copied
                                 }
                                 cv_.NotifyAll();
                               });
  r.after.reset();
  for (size_t i = 0; st.ok() && i < h.blobs.size(); ++i) {
    std::memcpy(slot + h.blobs[i].offset, r.blob_bytes[i].data(), h.blobs[i].nbytes);
    h.blobs[i].checksum = Checksum(r.blob_bytes[i].data(), h.blobs[i].nbytes);
  }
  *copy_ns = NowNanos() - t0;
  return st;
}

void CapturePipeline::Capture(Request& r) {
  TraceSpan span("capture copy", "capture");
  SlotHeader& h = r.header;
  const std::string who = Who() + ", step " + std::to_string(h.step);
  int64_t copy_ns = 0;
  auto base = tier_->Prepare(r.slot, h.step, h.data_bytes, h);
  Status st = base.ok() ? Copy(r, *base, &copy_ns) : base.status();
  if (st.ok()) tier_->MarkCopied(r.slot);
  {
    MutexLock lk(mu_);
    queued_seq_ = r.seq;  // also when the capture failed before queueing
    copied_seq_ = r.seq;
    if (st.ok()) {
      capture_stats_.bytes_copied += h.data_bytes;
      capture_stats_.copy_seconds += NanosToSeconds(copy_ns);
      if (capture_stats_.copy_seconds > 0)
        capture_stats_.copy_gbps =
            static_cast<double>(capture_stats_.bytes_copied) / capture_stats_.copy_seconds / 1e9;
    } else {
      if (fence_error_.ok()) fence_error_ = st.WithContext(who + ": capture failed");
      RecordFailure(r.seq, st.WithContext(who + ": capture failed"));
    }
  }
  cv_.NotifyAll();
  if (st.ok()) CAIRN_KILL_POINT("capture.copied");
  if (st.ok()) {
    h.created_wall_ns = WallNanos();
    st = tier_->Commit(r.slot, h);
  }
  if (!st.ok()) {
    tier_->Abort(r.slot);
    log_->Warning(who + ": capture failed, version not restorable (older versions are kept): " +
                  st.ToString());
  }
  if (st.ok()) CAIRN_KILL_POINT("capture.published");
  if (st.ok() && hooks_.on_captured) hooks_.on_captured(h.step);
  {
    MutexLock lk(mu_);
    if (st.ok()) {
      ++capture_stats_.captured;
      capture_stats_.newest_captured_step = std::max(capture_stats_.newest_captured_step, h.step);
    } else {
      ++capture_stats_.failed;
      if (capture_error_.ok()) capture_error_ = st.WithContext(who + ": capture failed");
      RecordFailure(r.seq, st.WithContext(who + ": capture failed"));
    }
    done_seq_ = r.seq;
  }
  cv_.NotifyAll();
}

}  // namespace cairn
