// cairn::Checkpointer: the one object a training job holds.
//
//   auto ckpt = cairn::Checkpointer::Open(cairn::Options::FromEnvironment().value()).value();
//   ckpt->save(step, shards, blobs);   // returns at once; the copy runs in the background
//   ...forward, backward...
//   ckpt->fence();                     // before optimizer.step(): waits only if still copying
//
// save() reserves a host slot and queues the copy; the capture thread copies the shards'
// bytes into the slot (chunked, checksummed), persists them and publishes the slot header,
// making the version CAPTURED. The shards' memory must not change between save() and the
// point the next fence() orders the writer after. restore() fills target shards from the
// newest (or a given) CAPTURED version after verifying every checksum.
//
// Device (CUDA) shards and streams. save(step, shards, blobs, stream) records a mark on
// `stream`, the stream whose kernels wrote the tensors (default: the legacy default
// stream); the copy waits for that mark, so the version holds exactly what that stream had
// written when save() was called, even if those kernels are still queued or running. The
// host never waits in save(). fence() then makes that same stream wait, on the GPU, for
// the end of the copy (cudaStreamWaitEvent) and returns at once: kernels queued on it
// afterwards (the optimizer step) run only once the copy has read the tensors, and never
// leak into the version. fence(consumer) orders another stream instead. Host shards of the
// same save are copied before fence() returns. fence_host() blocks the calling thread until
// every byte is in host memory: use it before writing saved tensors from the CPU or from a
// stream that fence() did not order. A device shard's device is found from its pointer;
// the device shards of one save must all be on one device.
//
// Thread-safety: save/fence/restore are meant for one training thread; stats() and
// versions() may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/log.h"
#include "core/options.h"
#include "core/status.h"
#include "core/tensor.h"
#include "persist/persister.h"
#include "recovery/restore.h"
#include "snapshot/copy_engine.h"
#include "tiers/host_tier.h"
#include "tiers/replica_store.h"
#include "transport/replicator.h"
#include "transport/ucx_comm.h"
#include "transport/ucx_group.h"

namespace cairn {

enum class SaveOutcome {
  kQueued,   // the version will be captured (check fence() / wait_captured() for errors)
  kSkipped,  // no slot was free under the skip policy; counted in Stats::skipped
};

struct Stats {
  uint64_t saves = 0;     // versions accepted by save()
  uint64_t skipped = 0;   // versions skipped because no slot was free
  uint64_t captured = 0;  // versions that reached CAPTURED
  uint64_t failed = 0;    // versions whose capture failed (slot I/O, copy)
  uint64_t fences = 0;
  double fence_wait_total_s = 0;  // time the training thread spent inside fence()
  double fence_wait_max_s = 0;
  double save_call_total_s = 0;  // time the training thread spent inside save()
  double save_call_max_s = 0;
  uint64_t bytes_copied = 0;  // tensor and blob bytes captured
  double copy_seconds = 0;    // time the copy engine spent copying them
  double copy_gbps = 0;       // bytes_copied / copy_seconds / 1e9
  int64_t newest_captured_step = -1;
  std::string copy_engine;  // "host" or "cuda"
  // Replication (zero when the job has one node or CAIRN_REPLICAS=0).
  uint64_t replicated = 0;        // versions acknowledged by every replica holder
  uint64_t replicate_failed = 0;  // pushes that failed (holder dead, slow or refusing)
  uint64_t bytes_replicated = 0;
  double replicate_gbps = 0;     // bytes_replicated / time in acknowledged pushes
  double replicate_ack_ms = 0;   // last data sent -> its acknowledgement, last push
  double replicate_push_ms = 0;  // offer -> acknowledgement, last acknowledged push
  int64_t newest_replicated_step = -1;
  uint64_t replicas_received = 0;  // versions of other ranks this rank holds
  // Persistence to the PFS (CAIRN_PERSIST_EVERY, flush()).
  uint64_t persisted = 0;               // steps committed to the PFS (job-wide rounds)
  uint64_t persist_failed = 0;          // rounds that failed (previous committed step intact)
  uint64_t bytes_persisted = 0;         // bytes this rank wrote to the PFS
  double persist_gbps = 0;              // bytes_persisted / time this rank spent writing them
  double persist_round_ms = 0;          // duration of the last committed round
  double persist_max_writer_share = 0;  // busiest writer's bytes over the mean, last plan
  int64_t newest_persisted_step = -1;
  std::string last_persist_error;  // of the last failed round ("" if none)
  // UCX requests this rank started and has not yet completed and released (0 without UCX);
  // bounded by the transfers in flight, never growing with the versions saved.
  int64_t ucx_requests_in_flight = 0;
};

class Checkpointer {
 public:
  // Opens this rank's host tier (creating it, or finding the versions a previous process
  // left) and starts the capture thread.
  static Result<std::unique_ptr<Checkpointer>> Open(Options options);
  // Waits for captures in flight to finish, then stops. Files stay for the next process.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Queues a version of `step` made of `shards` (whose bytes are read until the point the
  // next fence orders the writers after) and `blobs` (copied now). Device shards are
  // copied after the work queued on `stream` so far (see the top of this file). Returns at
  // once: no I/O, no copy of tensor bytes, no wait for the GPU on the calling thread. Steps
  // must increase within a process. InvalidArgument naming the tensor for a bad shard
  // (including a device shard whose pointer is not device memory); kSkipped when no slot
  // is free under the skip policy.
  Result<SaveOutcome> save(int64_t step, std::span<const ShardSpec> shards, const Blobs& blobs = {},
                           CudaStream stream = nullptr);
  // Orders every writer of the saved shards after their copy. Host shards: waits until
  // they are copied. Device shards: waits on the host only until their copies are queued
  // (microseconds), then makes the stream given to each save() wait on the GPU for the end
  // of its copy, and returns. Returns the error of a capture that failed since the last
  // fence (the version is then not restorable; older versions are untouched); a device
  // copy that fails after this fence returned is reported by the next one.
  Status fence();
  // As fence(), but the device wait is queued on `consumer` instead of the save's stream.
  Status fence(CudaStream consumer);
  // Blocks until every byte of every queued save is in host memory (for tensors written
  // from the CPU, or from streams no fence ordered).
  Status fence_host();
  // How many of the queued saves have every byte in host memory (their tensors are no
  // longer read by cairn).
  uint64_t copies_done() const;
  // Waits until every queued version is CAPTURED or has failed; returns the first failure
  // since the last call.
  Status wait_captured();

  // Waits until the newest captured version is REPLICATED (OK), or its replication has
  // been tried and failed (Unavailable naming the holder), at most `timeout_s`.
  // FailedPrecondition when this job does not replicate.
  Status wait_replicated(double timeout_s);
  // Collective (every rank must call it): persists the newest version every rank holds to
  // <CAIRN_PFS_ROOT>/<job> now, and waits until it is committed. Returns the step that
  // LATEST names afterwards; the round's error otherwise (the previous committed step
  // stays intact). Captures still in flight are waited for first.
  Result<int64_t> flush();

  // The job's collectives (nullptr when the job has one rank).
  Group* group() { return group_.get(); }

  // Collective when the job has more than one rank (every rank calls it, with its own
  // targets): fills `targets` from the newest version every rank can restore (or
  // options.step), taken from the nearest tier that has it: this rank's host tier, the
  // memory of the ranks holding replicas (over UCX), or the PFS (each byte read once by
  // the job and passed on over UCX). The targets may have another layout or world size
  // than the saved version (resharding by box overlap). Every chunk read is verified; a
  // version that fails is skipped with a warning (listed in RestoreReport::skipped) for
  // the next older one. Errors name the rank, step, tensor and file.
  Result<RestoreReport> restore(std::span<const ShardSpec> targets,
                                const RestoreOptions& options = {});

  // Restorable versions in the host tier, newest first.
  std::vector<VersionInfo> versions() const;
  Stats stats() const;
  const Options& options() const { return options_; }
  const std::string& host_dir() const { return tier_->dir(); }

 private:
  struct Request;
  Checkpointer(Options options, std::unique_ptr<CopyEngine> engine);
  // Waits (holding mu_ in `lk`) until every queued capture is CAPTURED or failed.
  void WaitSettled(std::unique_lock<std::mutex>& lk);
  void CaptureLoop();
  void Capture(Request& r);
  std::string Who() const;
  // CheckShard, and that the copy engine can reach the shard's memory. For a device shard,
  // `*device` receives its device (from the pointer; cached by address).
  Status CheckReachable(const ShardSpec& s, const std::string& who, int* device = nullptr);
  // fence(), fence(consumer) and fence_host().
  Status Fence(bool host, bool own_streams, CudaStream consumer);

  Options options_;
  Logger log_;
  std::unique_ptr<CopyEngine> engine_;  // outlives tier_ (the tier unregisters slots)
  std::unique_ptr<HostTier> tier_;
  std::unique_ptr<UcxComm> comm_;
  std::unique_ptr<UcxGroup> group_;
  std::unique_ptr<ReplicaStore> store_;
  std::unique_ptr<Replicator> replicator_;
  std::unique_ptr<Group> persist_group_;  // the persister's own collectives
  std::unique_ptr<Persister> persister_;
  std::vector<int> replica_sources_;  // ranks whose replicas this rank holds

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Request>> queue_;
  bool stopping_ = false;
  uint64_t submitted_seq_ = 0;
  uint64_t queued_seq_ = 0;  // host bytes copied and device copies queued
  uint64_t copied_seq_ = 0;  // every byte in the slot
  uint64_t done_seq_ = 0;
  // End marks of device copies queued since the last fence, with their save's stream.
  std::vector<std::pair<std::shared_ptr<StreamMark>, CudaStream>> pending_marks_;
  std::unordered_map<const void*, int> device_of_;  // training thread only
  Status fence_error_;
  Status capture_error_;
  std::optional<int64_t> last_step_;
  bool warned_skip_ = false;
  Stats stats_;
  std::thread capture_thread_;
};

}  // namespace cairn
