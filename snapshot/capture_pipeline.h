// CapturePipeline: the way from save() to a CAPTURED version in this rank's host tier.
//
//   save()  (training thread): checks the shards, lays the version out in a slot (cut into
//           chunks), records a mark on the training stream for device shards, reserves a
//           slot and queues the request; no copy, no I/O.
//   capture thread: Prepare the slot, copy the chunks in (checksums as they land), copy
//           the blobs, MarkCopied, Commit (CAPTURED), then tell the next stages (hooks).
//   fence() (training thread): waits until the copies are queued (device) or done (host),
//           then orders the consumer streams after the end of the device copies.
//
// Versions are captured one at a time, in the order of save(). Sequence numbers count the
// saves that were queued (1, 2, ...): `queued` (host bytes copied, device copies queued),
// `copied` (every byte in the slot) and `done` (CAPTURED or failed) follow `submitted`.
// Thread-safety: Save/Fence/CheckReachable are for the training thread; the waits and
// stats() may be called from any thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cairn/options.h"
#include "cairn/restore.h"
#include "cairn/save.h"
#include "cairn/stats.h"
#include "cairn/status.h"
#include "cairn/tensor.h"
#include "core/log.h"
#include "core/mutex.h"
#include "snapshot/copy_engine.h"
#include "tiers/host_tier.h"

namespace cairn {

struct CaptureConfig {
  int rank = 0;
  int world_size = 1;
  int node = 0;
  uint64_t chunk_bytes = 4ull << 20;
  FullPolicy full_policy = FullPolicy::kSkip;
  double full_wait_s = 5;  // kWait
};

// What the pipeline tells the stages after it (called without its lock held).
struct CaptureHooks {
  // After save() queued (or skipped) a version; `seq` is the newest queued sequence number.
  std::function<void(uint64_t seq, int64_t step)> on_save;
  // On the capture thread, once a version is CAPTURED.
  std::function<void(int64_t step)> on_captured;
};

// A key unique to (tensor name, box), for finding a box given twice.
std::string ShardKey(const std::string& name, const Box& box);

enum class FenceKind {
  kOwnStreams,  // device copies: each save's own stream waits for its copy's end
  kConsumer,    // device copies: one given stream waits for them
  kHost,        // the calling thread waits until every byte is in host memory
};

class CapturePipeline {
 public:
  // Starts the capture thread. `engine`, `tier` and `log` must outlive the pipeline.
  CapturePipeline(CaptureConfig config, CopyEngine* engine, HostTier* tier, const Logger* log,
                  CaptureHooks hooks);
  // Stop() if not yet stopped.
  ~CapturePipeline();
  CapturePipeline(const CapturePipeline&) = delete;
  CapturePipeline& operator=(const CapturePipeline&) = delete;

  // Captures everything queued, then joins the capture thread.
  void Stop();

  Result<SaveOutcome> Save(int64_t step, std::span<const ShardSpec> shards, const Blobs& blobs,
                           CudaStream stream);
  Status Fence(FenceKind kind, CudaStream consumer = nullptr);
  uint64_t CopiesDone() const;
  // Waits until every queued version is CAPTURED or failed; returns (and clears) the first
  // capture error since the last call.
  Status WaitCaptured();
  // Waits until every queued version is settled without taking the errors.
  void WaitSettled();
  // Waits until the version of sequence number `seq` is settled.
  void WaitDone(uint64_t seq);
  // Waits at most `timeout_s` until the version of sequence number `seq` has every byte in
  // its slot (`settled` false) or is CAPTURED or failed (`settled` true): true then, false
  // when the time ran out, or its capture error (kept for the newest kFailuresKept
  // failures). Takes no error from fence() or WaitCaptured().
  Result<bool> WaitSeq(uint64_t seq, bool settled, double timeout_s);
  // Waits up to `max_wait` while a copy is in flight (drains hold back for captures).
  void YieldToCopies(std::chrono::milliseconds max_wait);
  uint64_t submitted() const;
  std::optional<int64_t> last_step() const { return last_step_; }  // training thread

  // CheckShard, and that the engine can reach the shard's memory; `*device` receives the
  // device of a device shard (from the pointer, cached by address).
  Status CheckReachable(const ShardSpec& s, const std::string& who, int* device = nullptr);

  SaveStats save_stats() const;
  CaptureStats capture_stats() const;

 private:
  struct Request;
  std::string Who() const { return "rank " + std::to_string(config_.rank); }
  // Checks the shards (reachable, one device, one meta per name, no box twice) and the
  // blob names; the device of the device shards (-1: none).
  Result<int> Validate(std::span<const ShardSpec> shards, const Blobs& blobs,
                       const std::string& who);
  // The version laid out in a slot: header, chunks, blob bytes (no slot yet).
  Result<std::unique_ptr<Request>> Layout(int64_t step, std::span<const ShardSpec> shards,
                                          const Blobs& blobs, CudaStream stream,
                                          const std::string& who);
  void CaptureLoop();
  void Capture(Request& r);
  // The copy itself; returns its status and the copy time.
  Status Copy(Request& r, std::byte* slot, int64_t* copy_ns);
  void CountSaveCall(int64_t t0) CAIRN_REQUIRES(mu_);
  // Keeps the error of save `seq` for WaitSeq (once: a copy and a commit may both fail it).
  void RecordFailure(uint64_t seq, Status st) CAIRN_REQUIRES(mu_);

  const CaptureConfig config_;
  CopyEngine* const engine_;
  HostTier* const tier_;
  const Logger* const log_;
  const CaptureHooks hooks_;

  mutable Mutex mu_;
  CondVar cv_;
  std::deque<std::unique_ptr<Request>> queue_ CAIRN_GUARDED_BY(mu_);
  bool stopping_ CAIRN_GUARDED_BY(mu_) = false;
  uint64_t submitted_seq_ CAIRN_GUARDED_BY(mu_) = 0;
  uint64_t queued_seq_ CAIRN_GUARDED_BY(mu_) = 0;  // host bytes copied, device copies queued
  uint64_t copied_seq_ CAIRN_GUARDED_BY(mu_) = 0;  // every byte in the slot
  uint64_t done_seq_ CAIRN_GUARDED_BY(mu_) = 0;
  // End marks of device copies queued since the last fence, with their save's stream.
  std::vector<std::pair<std::shared_ptr<StreamMark>, CudaStream>> pending_marks_
      CAIRN_GUARDED_BY(mu_);
  Status fence_error_ CAIRN_GUARDED_BY(mu_);
  Status capture_error_ CAIRN_GUARDED_BY(mu_);
  // The errors of the newest failed captures, by sequence number (WaitSeq).
  static constexpr size_t kFailuresKept = 64;
  std::deque<std::pair<uint64_t, Status>> failures_ CAIRN_GUARDED_BY(mu_);
  SaveStats save_stats_ CAIRN_GUARDED_BY(mu_);
  CaptureStats capture_stats_ CAIRN_GUARDED_BY(mu_);

  // Training thread only.
  std::unordered_map<const void*, int> device_of_;
  std::optional<int64_t> last_step_;
  // Skips are warned about at most every 30 s, with the count since the last warning.
  int64_t skip_warned_ns_ = 0;
  uint64_t skips_unwarned_ = 0;

  std::thread capture_thread_;
};

}  // namespace cairn
