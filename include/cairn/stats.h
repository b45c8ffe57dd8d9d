// Stats: what a Checkpointer counted, grouped by the stage that counts it (the life of a
// version: save -> capture -> replication -> persistence; docs/architecture.md).
// Thread-safety: plain values (Checkpointer::stats() returns a consistent copy).
#pragma once

#include <cstdint>
#include <string>

namespace cairn {

// The training thread's calls.
struct SaveStats {
  uint64_t saves = 0;    // versions accepted by save()
  uint64_t skipped = 0;  // versions skipped because no slot was free
  uint64_t fences = 0;
  double fence_wait_total_s = 0;  // time the training thread spent inside fence()
  double fence_wait_max_s = 0;
  double save_call_total_s = 0;  // time the training thread spent inside save()
  double save_call_max_s = 0;
  // The job's agreement on the versions every rank holds (snapshot/step_agreement.h): the
  // newest step every rank holds (with one rank, the newest captured; -1: none yet), and
  // the saves whose step some rank does not hold (skipped or failed there: no job restores
  // it from memory). A restore from memory finds at least agreed_step while it lasts.
  int64_t agreed_step = -1;
  uint64_t not_held_by_all = 0;
};

// Device/host memory -> a host slot (CAPTURED).
struct CaptureStats {
  uint64_t captured = 0;      // versions that reached CAPTURED
  uint64_t failed = 0;        // versions whose capture failed (slot I/O, copy)
  uint64_t bytes_copied = 0;  // tensor and blob bytes captured
  double copy_seconds = 0;    // time the copy engine spent copying them
  double copy_gbps = 0;       // bytes_copied / copy_seconds / 1e9
  int64_t newest_captured_step = -1;
  std::string copy_engine;  // "host" or "cuda"
  // Host slot mappings the copy engine pinned for device copies (cudaHostRegister), and
  // those the driver refused to pin (copied into through the driver's staging: slower,
  // and a device copy into one blocks the capture thread). Both 0 with the host engine.
  uint64_t slots_pinned = 0;
  uint64_t slots_not_pinned = 0;
};

// A host slot -> other nodes' memory (REPLICATED); zero when the job has one node or
// CAIRN_REPLICAS=0.
struct ReplicationStats {
  uint64_t replicated = 0;  // versions acknowledged by every replica holder
  // Of `replicated`: versions whose replicas carried only the blobs, every box of this rank
  // being held by a rank on another node (data parallel: docs/settings.md).
  uint64_t blobs_only = 0;
  uint64_t failed = 0;  // pushes that failed (holder dead, slow or refusing)
  // Captured versions never pushed: replication was behind (a slow link or holder, a
  // failure) and pushed a newer one instead, or the step agreement passed them over.
  uint64_t passed_over = 0;
  uint64_t bytes = 0;
  double gbps = 0;     // bytes / time in acknowledged pushes
  double ack_ms = 0;   // last data sent -> its acknowledgement, last push
  double push_ms = 0;  // offer -> acknowledgement, last acknowledged push
  // The newest step of this rank that another node holds: what losing this node now would
  // take this rank back to from memory (-1: none; then the PFS).
  int64_t newest_replicated_step = -1;
  uint64_t received = 0;  // versions of other ranks this rank holds
  // Host memory this rank touched, outside the host tier, for what other ranks push it: the
  // windows parity chunks land in before they are added (at most 512 KiB), and the buffer
  // a given-up transfer is drained into (8 MiB, only after a failure). Never released
  // while the checkpointer is open.
  uint64_t staging_bytes = 0;
  // While replication is behind (a push failed since the last acknowledged one, or the one
  // in flight has taken longer than CAIRN_REPLICATE_TIMEOUT_S: a holder dead, cut off or
  // slow): seconds since the last acknowledged push, how many steps were captured after
  // newest_replicated_step (they live on this node only), and why. 0, 0 and "" while
  // replication keeps up. A warning repeats every 30 s meanwhile, and `cairn ls` shows it
  // (docs/guarantees.md, "A link that goes down and comes back").
  double unreplicated_s = 0;
  int64_t unreplicated_steps = 0;
  std::string last_error;
  // Pacing (CAIRN_REPLICATE_SHARE): one step in `every` is replicated (1: every version the
  // link keeps up with), chosen from the measured push and step (moving averages, seconds);
  // the newest captured step is `behind_steps` after newest_replicated_step: what losing
  // this node now would redo.
  int64_t every = 1;
  int64_t behind_steps = 0;
  double push_s = 0;
  double step_s = 0;
};

// Host slots -> the PFS (PERSISTED; CAIRN_PERSIST_EVERY, flush()).
struct PersistStats {
  uint64_t persisted = 0;       // steps committed to the PFS (job-wide rounds)
  uint64_t failed = 0;          // rounds that failed (previous committed step intact)
  uint64_t bytes = 0;           // bytes this rank wrote to the PFS
  double gbps = 0;              // bytes / time this rank spent writing them
  double round_ms = 0;          // duration of the last committed round
  double max_writer_share = 0;  // busiest writer's bytes over the mean, last plan
  // Which save planner made the last plan, and why: "templated: ..." (every rank's layout
  // is a layout template, as in fully sharded jobs: no rank gathered or planned the job's
  // every box; docs/performance.md) or "general: <why>" (gathered and planned job-wide).
  std::string plan;
  int64_t newest_persisted_step = -1;
  std::string last_error;  // of the last failed round ("" if none)
};

struct Stats {
  SaveStats save;
  CaptureStats capture;
  ReplicationStats replication;
  PersistStats persist;
};

}  // namespace cairn
