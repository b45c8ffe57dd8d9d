// StepAgreement: the ranks of a job agree, off the training thread, on the saved steps
// every rank holds, so that the job keeps the same versions on every rank and a restore
// from memory always finds one.
//
// Each rank decides on its own whether a save finds a free slot (skips are local), and
// each rank's ring forgets its old versions on its own: without agreement, rank A may
// evict step 8 while rank B, which skipped 9 and 10, still has 8 as its only version the
// others also hold, and no step is left that every rank holds. Here:
//
//   save() (training thread): records (capture sequence, step) and returns; no collective.
//   the agreement thread, one round at a time over its own Group:
//     1. settles the captures recorded so far (CAPTURED, failed or skipped);
//     2. keeps (HostTier::Keep) `agreed`, the newest step every rank holds, and the steps
//        it is about to offer, and learns which of the offered steps it holds;
//     3. allgathers its offer: how many saves it has settled and, for each save not yet
//        consumed, the step and whether it holds it;
//     4. consumes the saves up to the smallest count offered (the same on every rank, so
//        every rank runs the same rounds): a consumed step every rank holds becomes
//        `agreed` when newer, the others are dropped (no job restores them from memory:
//        their slots are reused first); then keeps `agreed` alone.
//
// Why a step every rank holds survives at every moment: a rank that finished round r keeps
// agreed(r). A rank that has not (every rank has at least entered round r when one
// finishes it) keeps agreed(r-1) and every step it offered held in round r; agreed(r) is
// either agreed(r-1) or one of those. So any two ranks keep a step both hold.
//
// A round that waits longer than `hold_s` for the other ranks (a link cut, a peer's
// endpoint replaced while its message was in flight) stops keeping the steps it offered,
// so a stuck round never holds more than `agreed`'s slot while training goes on (found by
// the link-flap test: a round stuck through a cut kept 5 of 8 slots, and the versions left
// no longer overlapped the partner's replicas).
// A round that fails (a rank died, the ranks saved different steps) ends the agreement:
// the tier goes back to keeping its newest version, and the log says why, once. Closing
// lets the last rounds finish while every rank closes too, and gives them up otherwise.
// Thread-safety: OnSave from the training thread; stats() from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cairn/group.h"
#include "core/log.h"
#include "core/mutex.h"
#include "tiers/host_tier.h"

namespace cairn {

struct AgreementStats {
  uint64_t rounds = 0;           // rounds run
  uint64_t agreed_saves = 0;     // saves consumed (the same on every rank)
  int64_t agreed_step = -1;      // newest step every rank holds (-1: none yet)
  uint64_t not_held_by_all = 0;  // consumed saves whose step some rank does not hold
  uint64_t released = 0;         // rounds stuck so long that their offered steps were let go
  uint64_t held_back = 0;        // rounds that offered no step: a drain pinned the free slot
  bool ended = false;            // a round failed: the tier keeps its newest version again
  std::string error;             // why it ended
};

// What one rank offered in a round, decoded (for the unit tests and the fuzz target).
struct AgreeOffer {
  uint64_t settled = 0;
  uint64_t first = 0;
  std::vector<int64_t> steps;
  std::vector<bool> held;
  uint64_t layout_hash = 0;  // of this rank's newest version (0: none, or not asked)
  int64_t pace_every = 0;    // paced replicas: the pace this rank can afford (0: not paced)
};

// Whether some rank on another node than `me` offered `hash` (data-parallel coverage).
bool CoveredElsewhere(const std::vector<AgreeOffer>& offers, const std::vector<int>& node_of,
                      int me, uint64_t hash);
std::string EncodeAgreeOffer(const AgreeOffer& o);
// Corruption naming `from` unless the bytes are an offer whose steps and flags agree.
Result<AgreeOffer> DecodeAgreeOffer(std::string_view bytes, const std::string& from);

// The outcome of a round from every rank's offer (indexed by rank): the saves consumed,
// the newest step every rank holds among them (-1: none), the steps some rank lacks.
// FailedPrecondition when the offers do not start at `consumed` + 1 or name different
// steps for the same save (the ranks' saves differ).
struct RoundOutcome {
  uint64_t consumed = 0;
  int64_t agreed = -1;
  std::vector<int64_t> dropped;
};
Result<RoundOutcome> Agree(const std::vector<AgreeOffer>& offers, uint64_t consumed);

// With redundancy (replicas or parity on other nodes), a step counts as held only once its
// pushes were acknowledged (REPLICATED), so the agreed step is one every rank's redundancy
// covers: a lost node's ranks can then be restored at the step the survivors keep.
struct AgreementProtection {
  // Waits, bounded and watching the agreement's cancel flag, until this rank's pushes of
  // `step` or of a newer step were tried (Replicator::WaitTried).
  std::function<void(int64_t)> wait_tried;
  // Told every newer agreed step (the holders of parity keep it: ParityStore).
  std::function<void(int64_t)> agreed;
  // Named pushes (parity): with `target`, the rounds name the step every rank pushes, so
  // the members of a parity set push the same steps however far they lag (each rank
  // choosing its own left parity records that never completed, and no step the job could
  // rebuild). Each rank offers the newest step of the round's saves it holds (kept while
  // the ranks agree); the newest every rank offered is the target: every rank calls
  // target(step), waits until its pushes of it were tried (wait_tried), and a second gather
  // agrees on it when every rank's were acknowledged. `ended()` (below) when no more
  // targets will come.
  std::function<void(int64_t)> target;
  // Named pushes: told, after each round, the newest step of the saves it consumed (a step
  // up to it that was not the target is never pushed: Replicator::SetPassed).
  std::function<void(int64_t)> passed;
  // Data-parallel coverage (replicas): with `node_of` (the node of every rank), each offer
  // carries the layout hash (`layout_hash`: persist/slot_layout.h's) of this rank's newest
  // version, and after every round
  // `covered(hash, yes)` says whether some rank on another node offered the same layout
  // (so it holds every box of this rank's versions of that layout: Replicator::SetCovered).
  // `ended()` when no more rounds will tell.
  std::vector<int> node_of;
  std::function<uint64_t(const SlotHeader&)> layout_hash;  // of a version (not 0)
  std::function<void(uint64_t, bool)> covered;
  std::function<void()> ended;
  // Paced replicas (CAIRN_REPLICATE_SHARE, with `target`): one step in how many this rank's
  // pushes can afford (Replicator's pacing). Each offer carries it, and a round names a
  // target only when its step enters a new block of the largest offered, so every rank
  // pushes the same steps, one in that many, and the agreed step is one every rank pushed:
  // the survivors of a lost node keep it, and its replicas are held.
  std::function<int64_t()> pace_every;
};

class StepAgreement {
 public:
  // `settle(seq)` blocks until the captures queued up to sequence `seq` are settled.
  // `group` runs this agreement's collectives only (its own channels) and `*cancel`, when
  // given, is what its receives watch: closing sets it to give a round up. `group`,
  // `tier` and `log` must outlive the agreement.
  StepAgreement(Group* group, HostTier* tier, const Logger* log,
                std::function<void(uint64_t)> settle, std::atomic<bool>* cancel,
                double close_wait_s, double hold_s, AgreementProtection protection = {});
  // Lets the rounds of the saves recorded finish for up to `close_wait_s`, then gives
  // the one in flight up (*cancel) and joins.
  ~StepAgreement();
  StepAgreement(const StepAgreement&) = delete;
  StepAgreement& operator=(const StepAgreement&) = delete;

  // After every save() of `step` (queued or skipped); `seq` is the capture sequence
  // queued so far. Releases the steps a round stuck for more than `hold_s` keeps.
  void OnSave(uint64_t seq, int64_t step);
  // After a wait_replicated() that succeeded: `step`, replicated, is kept until the ranks
  // agree on it or a newer step (and after a failed round, until a newer one is promised;
  // the agreed step is then kept too, for good).
  void OnReplicated(int64_t step);
  AgreementStats stats() const;

 private:
  void Loop();
  // One round over the saves recorded (the newest with sequence `seq`); false when the
  // agreement ended.
  bool Round(uint64_t seq, const std::vector<int64_t>& window);
  void End(const Status& why);
  // Keeps the round's steps, the agreed one and the promised one (HostTier::Keep); returns
  // those held.
  std::vector<int64_t> KeepLocked(const std::vector<int64_t>& drop) CAIRN_REQUIRES(mu_);
  // The steps KeepLocked keeps, sorted, once each.
  std::vector<int64_t> KeepSetLocked() const CAIRN_REQUIRES(mu_);
  // Whether the promised step stays kept once the agreement passed it (4 slots or more).
  bool KeepsPromisePastAgreement() const;

  Group* group_;
  HostTier* tier_;
  const Logger* log_;
  std::function<void(uint64_t)> settle_;
  std::atomic<bool>* cancel_;
  const double close_wait_s_;
  const double hold_s_;
  const AgreementProtection protection_;

  // The layout hash of this rank's newest version (coverage), cached per version.
  uint64_t NewestLayoutHash();

  // Agreement thread only.
  uint64_t consumed_ = 0;
  int64_t last_target_ = -1;        // named pushes: the last step the rounds named
  int64_t hashed_created_ns_ = -1;  // the version whose layout hash is cached
  uint64_t hashed_ = 0;

  mutable Mutex mu_;
  CondVar cv_;
  // The saves not yet consumed: (capture sequence, step) of saves consumed_+1, ...
  std::deque<std::pair<uint64_t, int64_t>> saves_ CAIRN_GUARDED_BY(mu_);
  bool stopping_ CAIRN_GUARDED_BY(mu_) = false;
  bool done_ CAIRN_GUARDED_BY(mu_) = false;  // the thread has returned
  int64_t agreed_ CAIRN_GUARDED_BY(mu_) = -1;
  // The newest step a wait_replicated() succeeded for (OnReplicated; -1: none).
  int64_t promised_ CAIRN_GUARDED_BY(mu_) = -1;
  // The steps the round in flight keeps (its offer).
  std::vector<int64_t> round_keep_ CAIRN_GUARDED_BY(mu_);
  // When the round in flight started keeping its offered steps (0: none kept by a round).
  int64_t holding_since_ns_ CAIRN_GUARDED_BY(mu_) = 0;
  AgreementStats stats_ CAIRN_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace cairn
