// Persister: drains captured versions from the host tier to the parallel filesystem.
//
// Every `every`-th save() (counted identically on every rank, skipped saves included) and
// every flush() queue a *mark*. A background thread turns marks into *rounds*; a round is
// collective over the Group, so every rank runs the same rounds in the same order:
//   1. settle the captures queued so far, pin the newest version held, the one the
//      newest mark asks for and those the job keeps (HostTier::Kept: the step agreement's
//      agreed step and the one being made redundant), and allgather (newest mark, held
//      steps with their layout hashes, which are kept). The round consumes the marks up
//      to the smallest newest mark (the same on every rank). A periodic mark persists the
//      newest step every rank keeps, if newer than the last committed: the agreement holds
//      its slot anyway, so the drain takes no slot of its own (draining another version
//      would pin a third slot beside the kept ones, and a capture during the drain would
//      find none). Otherwise, and for flush(), the round persists the mark's step if every
//      rank holds it, else the newest step every rank holds, unless it was already
//      committed (a rank whose copy of it was reused meanwhile, possible only when the
//      step is none of the pinned ones, makes the round fail; the next mark tries again);
//   2. plan (SavePlanner), reusing the cached plan when every layout hash is unchanged
//      (otherwise one more allgather carries the layouts);
//   3. each rank writes its planned boxes and its blobs to step-<N>/data/<rank>.bin,
//      checking the host slot's bytes against their checksums, fsyncs; writers hold
//      back while a capture is copying (WriterOptions::yield); the slot is unpinned
//      once this rank's file is fsynced, before the commit;
//   4. the location tables are gathered; rank 0 writes MANIFEST (temporary name, fsync,
//      rename, directory fsync), then LATEST the same way, then collects garbage;
//   5. rank 0 broadcasts the outcome; every rank records PERSISTED in the slot header, or
//      the failure in its stats and log. A failed step is removed and never retried: the
//      next mark tries a newer version. Training never waits for any of this, but the
//      destructor and flush() do: with a dead rank, a round waits CAIRN_OP_TIMEOUT_S.
// Thread-safety: OnSave/Flush from the training thread; stats() from any thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "cairn/group.h"
#include "cairn/status.h"
#include "core/filesystem.h"
#include "core/log.h"
#include "core/mutex.h"
#include "layout/save_planner.h"
#include "layout/templated_plan.h"
#include "persist/commit.h"
#include "persist/writer.h"
#include "tiers/host_tier.h"

namespace cairn {

struct PersistConfig {
  std::string job;
  std::string job_dir;  // <pfs_root>/<job>
  int every = 10;       // a mark every `every` saves; 0: only flush()
  int keep = 3;         // committed steps kept on the PFS (older ones are deleted)
  WriterOptions writer;
  uint64_t rate_bytes_per_s = 0;  // 0: unlimited
  BackgroundPriority priority = BackgroundPriority::kLow;
  PlannerConfig planner;
};

struct PersisterStats {
  uint64_t rounds = 0;          // rounds run (each persists one step, or finds nothing new)
  uint64_t persisted = 0;       // steps committed
  uint64_t failed = 0;          // rounds that failed (the step is not on the PFS)
  uint64_t plans = 0;           // plans computed (the others reused the cache)
  uint64_t bytes = 0;           // bytes this rank wrote
  double write_seconds = 0;     // time this rank spent writing and fsyncing them
  double last_round_ms = 0;     // duration of the last committed round
  double max_writer_share = 0;  // of the last plan
  std::string plan;             // which planner made the last plan, and why (PersistPlan::Path)
  int64_t newest_persisted_step = -1;
  std::string last_error;  // of the last failed round
};

class Persister {
 public:
  // `settle(seq)` blocks until every capture queued up to sequence `seq` is CAPTURED or
  // has failed. `group` and `tier` must outlive the Persister.
  Persister(PersistConfig config, HostTier* tier, Group* group, FileSystem* fs, const Logger* log,
            std::function<void(uint64_t)> settle);
  // Runs the rounds of marks already queued (every rank has the same ones), then stops.
  ~Persister();
  Persister(const Persister&) = delete;
  Persister& operator=(const Persister&) = delete;

  // After every save() of `step` by the training thread (queued or skipped); `seq` is the
  // capture sequence queued so far.
  void OnSave(uint64_t seq, int64_t step);
  // Collective: queues a mark for `step` (the last one saved) and waits for the round that
  // consumes it. Returns the step committed by that round, or the round's error.
  Result<int64_t> Flush(uint64_t seq, int64_t step);

  PersisterStats stats() const;

 private:
  struct Mark {
    uint64_t id = 0;
    uint64_t settle_seq = 0;
    int64_t step = -1;   // the version this mark asks for (the same on every rank)
    bool flush = false;  // flush() asks for exactly `step`; a periodic mark takes a kept one
  };
  struct Outcome {
    uint64_t consumed = 0;  // marks up to this id are done
    Result<int64_t> step = Status::Internal("no round yet");
  };
  void Loop();
  // Pins the versions held against reuse while the ranks agree (into *pinned), updates
  // layouts_, and returns this rank's encoded offer for the round of marks up to `newest`.
  std::string OfferHeld(uint64_t newest,
                        std::map<int64_t, std::unique_ptr<HostTier::View>>* pinned);
  // Runs one round for the marks queued (newest id `newest`, captures up to `seq`).
  Outcome Round(uint64_t newest, uint64_t seq);
  struct HeldLayout;
  // The chosen step's view: the one pinned for the offer (the others in *pinned released),
  // else pinned now; null when the slot no longer holds that version.
  std::unique_ptr<HostTier::View> PinChosen(
      int64_t step, const HeldLayout& layout,
      std::map<int64_t, std::unique_ptr<HostTier::View>>* pinned);
  // Steps 2-5 of a round for `step`: `view` pins this rank's copy (nullptr if it was lost
  // since the offer: the round then fails on every rank), `my_layout` is its layout.
  // The pin is released as soon as this rank's data file is written and fsynced: the
  // commit that follows (the gather, rank 0's manifest and LATEST) waits on the slowest
  // rank and on fsyncs, and a slot held through it is one a capture cannot take.
  Result<int64_t> PersistStep(int64_t step, std::unique_ptr<HostTier::View> view,
                              const std::vector<uint64_t>& layout_hashes,
                              const HeldLayout& my_layout);
  // Re-plans from every rank's layout (the exchange in layout/templated_plan.h).
  Status Replan(const std::vector<uint64_t>& layout_hashes, const HeldLayout& my_layout);
  // Writes this rank's planned pieces and its blobs to its data file in `step_dir`, after
  // checking the slot's bytes still match their checksums; fills *table.
  Status WriteShare(const std::string& step_dir, const HostTier::View& view,
                    const std::vector<WritePiece>& mine, LocationTable* table);

  PersistConfig config_;
  HostTier* tier_;
  Group* group_;
  FileSystem* fs_;
  const Logger* log_;
  std::function<void(uint64_t)> settle_;
  RateLimiter limiter_;
  Pool writers_;  // with the drain thread, the writers of its data files (drain priority)
  struct HeldLayout {
    int64_t created_wall_ns = 0;  // tells a version from a later one of the same step
    uint64_t hash = 0;            // LayoutHash(encoded), or TemplatedLayoutHash
    std::string encoded;          // EncodeRankLayout
    std::optional<RecognizedLayout> recognized;  // its template, when it is one
    uint64_t template_hash = 0;
  };
  std::map<int64_t, HeldLayout> layouts_;  // of the versions held at the last offer
  std::optional<PersistPlan> plan_;        // cached; used only by the drain thread
  int64_t last_committed_ = -1;            // the same on every rank (from the broadcast outcome)
  bool first_round_ = true;

  mutable Mutex mu_;
  CondVar cv_;
  std::deque<Mark> marks_ CAIRN_GUARDED_BY(mu_);
  uint64_t saves_ CAIRN_GUARDED_BY(mu_) = 0;
  uint64_t next_mark_ CAIRN_GUARDED_BY(mu_) = 0;
  uint64_t consumed_ CAIRN_GUARDED_BY(mu_) = 0;
  std::vector<std::pair<uint64_t, Result<int64_t>>> results_
      CAIRN_GUARDED_BY(mu_);  // recent round outcomes
  bool stopping_ CAIRN_GUARDED_BY(mu_) = false;
  PersisterStats stats_ CAIRN_GUARDED_BY(mu_);
  std::thread thread_;
};

// The decoders of what ranks send each other in a persist round, for the fuzz targets:
// `kind` 0 is a rank's offer (newest mark, held steps and layout hashes), 1 rank 0's
// outcome of the round. OK when the bytes decode (and an outcome carries OK), an error
// otherwise; never a crash.
Status DecodePersistMessageForFuzzing(int kind, std::string_view bytes);

}  // namespace cairn
