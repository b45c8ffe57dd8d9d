// cairn::Checkpointer: the one object a training job holds (the public surface; the
// implementation lives behind it, so this header needs no UCX, CUDA or thread headers).
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

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cairn/group.h"
#include "cairn/options.h"
#include "cairn/restore.h"
#include "cairn/save.h"
#include "cairn/stats.h"
#include "cairn/status.h"
#include "cairn/tensor.h"
#include "cairn/version.h"

namespace cairn {

class Checkpointer {
 public:
  // Opens this rank's host tier (creating it, or finding the versions a previous process
  // left) and starts the capture thread.
  static Result<std::unique_ptr<Checkpointer>> Open(Options options);
  // Waits for captures in flight to finish, then stops. Files stay for the next process.
  ~Checkpointer();
  Checkpointer(Checkpointer&&) = delete;
  Checkpointer& operator=(Checkpointer&&) = delete;
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
  // they are copied. Device shards: waits on the host only until their copies are all
  // queued (they are queued a window at a time, so this lasts until the last window of the
  // version is in flight: most of the copy's time, while the GPU runs the work queued
  // before the fence), then makes the stream given to each save() wait on the GPU for the
  // end of its copy, and returns. Returns the error of a capture that failed since the last
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
  // Waits at most `timeout_s` for the n-th queued save of this process (counted from 1, as
  // copies_done() counts them): until every byte of it is in host memory (`settled`
  // false) or it is CAPTURED or failed (`settled` true). Returns true then, false when the
  // time ran out first, or its capture error. Takes no error away from fence() or
  // wait_captured(). Any thread.
  Result<bool> wait_save(uint64_t n, bool settled, double timeout_s);

  // Waits until the newest captured version is REPLICATED (OK), or its replication has
  // been tried and failed (Unavailable naming the holder), at most `timeout_s`.
  // FailedPrecondition when this job does not replicate.
  Status wait_replicated(double timeout_s);
  // Waits at most `timeout_s` until `step`, or a newer step of this rank, is held by its
  // replica holders: true then, false when the time ran out first; Unavailable naming the
  // holder when its push was tried and failed; FailedPrecondition when this job does not
  // replicate. Unlike wait_replicated(timeout_s), it asks the job to keep nothing. Any
  // thread.
  Result<bool> wait_replicated(int64_t step, double timeout_s);
  // Waits at most `timeout_s` until the next save() finds a free host slot (a drain, a
  // replica push or a round of the step agreement holds some for a while): call it before
  // a save that must not be skipped under the skip policy, such as a run's last.
  // Unavailable saying what holds the slots otherwise.
  Status wait_for_slot(double timeout_s);
  // Collective (every rank must call it): persists the newest version every rank holds to
  // <CAIRN_PFS_ROOT>/<job> now, and waits until it is committed. Returns the step that
  // LATEST names afterwards; the round's error otherwise (the previous committed step
  // stays intact). Captures still in flight are waited for first.
  Result<int64_t> flush();

  // The job's collectives (nullptr when the job has one rank).
  Group* group();

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
  const Options& options() const;
  const std::string& host_dir() const;

 private:
  class Impl;
  friend struct CheckpointerInternals;  // api/open_with.h: the seams tests use
  explicit Checkpointer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cairn
