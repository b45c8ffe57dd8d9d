#include "snapshot/step_agreement.h"

#include <algorithm>
#include <chrono>

#include "core/clock.h"
#include "wire/codec.h"

namespace cairn {

std::string EncodeAgreeOffer(const AgreeOffer& o) {
  wire::AgreeOffer w;
  w.set_settled(o.settled);
  w.set_first(o.first);
  for (int64_t s : o.steps) w.add_steps(s);
  for (bool h : o.held) w.add_held(h);
  w.set_layout_hash(o.layout_hash);
  w.set_pace_every(o.pace_every);
  return wire::Encode(w);
}

Result<AgreeOffer> DecodeAgreeOffer(std::string_view bytes, const std::string& from) {
  CAIRN_ASSIGN_OR_RETURN(auto w, wire::Decode<wire::AgreeOffer>(bytes, "agreement offer"));
  AgreeOffer o;
  o.settled = w.settled();
  o.first = w.first();
  if (w.steps_size() != w.held_size() || o.first == 0 ||
      o.settled + 1 != o.first + static_cast<uint64_t>(w.steps_size()))
    return Status::Corruption("agreement offer from " + from + ": " +
                              std::to_string(w.steps_size()) + " steps and " +
                              std::to_string(w.held_size()) + " flags for saves " +
                              std::to_string(o.first) + ".." + std::to_string(o.settled));
  o.steps.assign(w.steps().begin(), w.steps().end());
  o.held.assign(w.held().begin(), w.held().end());
  o.layout_hash = w.layout_hash();
  o.pace_every = w.pace_every();
  return o;
}

bool CoveredElsewhere(const std::vector<AgreeOffer>& offers, const std::vector<int>& node_of,
                      int me, uint64_t hash) {
  if (hash == 0 || me < 0 || static_cast<size_t>(me) >= node_of.size()) return false;
  for (size_t r = 0; r < offers.size() && r < node_of.size(); ++r)
    if (offers[r].layout_hash == hash && node_of[r] != node_of[static_cast<size_t>(me)])
      return true;
  return false;
}

Result<RoundOutcome> Agree(const std::vector<AgreeOffer>& offers, uint64_t consumed) {
  RoundOutcome out;
  if (offers.empty()) return Status::InvalidArgument("agreement: no offers");
  out.consumed = offers[0].settled;
  for (size_t r = 0; r < offers.size(); ++r) {
    if (offers[r].first != consumed + 1)
      return Status::FailedPrecondition("agreement: rank " + std::to_string(r) +
                                        " offered saves from #" + std::to_string(offers[r].first) +
                                        ", the job has consumed " + std::to_string(consumed));
    out.consumed = std::min(out.consumed, offers[r].settled);
  }
  // Each offer names settled - consumed >= out.consumed - consumed steps (DecodeAgreeOffer).
  for (uint64_t i = 0; i < out.consumed - consumed; ++i) {
    const int64_t step = offers[0].steps[i];
    bool all = true;
    for (size_t r = 0; r < offers.size(); ++r) {
      if (offers[r].steps[i] != step)
        return Status::FailedPrecondition(
            "agreement: save #" + std::to_string(consumed + 1 + i) + " was step " +
            std::to_string(step) + " on rank 0 but step " + std::to_string(offers[r].steps[i]) +
            " on rank " + std::to_string(r) + " (the ranks' saves differ)");
      all = all && offers[r].held[i];
    }
    if (all)
      out.agreed = std::max(out.agreed, step);
    else
      out.dropped.push_back(step);
  }
  return out;
}

StepAgreement::StepAgreement(Group* group, HostTier* tier, const Logger* log,
                             std::function<void(uint64_t)> settle, std::atomic<bool>* cancel,
                             double close_wait_s, double hold_s, AgreementProtection protection)
    : group_(group),
      tier_(tier),
      log_(log),
      settle_(std::move(settle)),
      cancel_(cancel),
      close_wait_s_(close_wait_s),
      hold_s_(hold_s),
      protection_(std::move(protection)) {
  thread_ = std::thread([this] { Loop(); });
}

StepAgreement::~StepAgreement() {
  {
    MutexLock lk(mu_);
    stopping_ = true;
    cv_.NotifyAll();
    // Every rank closes after the same saves: their last rounds end at once. A rank that
    // is gone, or still training, is not waited for long.
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(close_wait_s_ * 1000));
    cv_.WaitUntil(lk, until, [&]() CAIRN_REQUIRES(mu_) { return done_; });
  }
  if (cancel_) cancel_->store(true);
  thread_.join();
}

void StepAgreement::OnSave(uint64_t seq, int64_t step) {
  MutexLock lk(mu_);
  saves_.emplace_back(seq, step);
  cv_.NotifyAll();
  if (holding_since_ns_ != 0 &&
      NowNanos() - holding_since_ns_ > static_cast<int64_t>(hold_s_ * 1e9)) {
    // The round is stuck: keep only the agreed step, as between rounds.
    holding_since_ns_ = 0;
    round_keep_.clear();
    ++stats_.released;
    KeepLocked({});
    log_->Info("agreement: a round has waited " + std::to_string(hold_s_) +
               " s for the other ranks; the steps it offered may be reused again");
  }
}

void StepAgreement::OnReplicated(int64_t step) {
  MutexLock lk(mu_);
  if (step <= promised_) return;
  promised_ = step;
  KeepLocked({});
}

std::vector<int64_t> StepAgreement::KeepLocked(const std::vector<int64_t>& drop) {
  return tier_->Keep(KeepSetLocked(), drop);
}

std::vector<int64_t> StepAgreement::KeepSetLocked() const {
  std::vector<int64_t> keep = round_keep_;
  // The agreed step stays kept after a failed round too, for good (no rank will agree on a
  // newer one): it is the one step every rank knows the others hold, and the one whose
  // parity and replicas their holders keep. Two ASan crash-matrix failures (2026-11-28)
  // came from dropping it: survivors that had agreed on 16 after promising 15 kept only 15,
  // whose parity one set's holders had dropped for 16; and a survivor that had agreed on 9
  // promised 12 (never pushed everywhere) and let 9 go, which every other rank held.
  if (agreed_ >= 0) keep.push_back(agreed_);
  // The newest step a wait_replicated() here succeeded for, until the ranks agree on it or
  // on a newer one (docs/guarantees.md: a restore is no older than the newest step every
  // rank saw replicated). With 2 slots it would leave none to capture into beside the
  // agreed step: not kept there.
  // With 4 slots or more it stays kept until a newer promise replaces it, also once the
  // agreement passed it: an agreed step is one every rank captured, not one every rank saw
  // replicated, and a node lost then must still find the promised step on the survivors
  // (tests/RELIABILITY.md: the flat crash matrix under ASan, trial 21). Rounds offer one
  // step fewer then, so that a slot stays free to capture into.
  const bool promise_kept = promised_ > agreed_ || stats_.ended || KeepsPromisePastAgreement();
  if (promised_ >= 0 && promise_kept && tier_->num_slots() >= 3) keep.push_back(promised_);
  std::sort(keep.begin(), keep.end());
  keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
  return keep;
}

bool StepAgreement::KeepsPromisePastAgreement() const {
  return tier_->num_slots() >= 4;
}

AgreementStats StepAgreement::stats() const {
  MutexLock lk(mu_);
  return stats_;
}

uint64_t StepAgreement::NewestLayoutHash() {
  std::optional<SlotHeader> h = tier_->NewestHeader();
  if (!h) return 0;
  if (h->created_wall_ns != hashed_created_ns_) {
    hashed_created_ns_ = h->created_wall_ns;
    hashed_ = protection_.layout_hash(*h);
  }
  return hashed_;
}

void StepAgreement::End(const Status& why) {
  MutexLock lk(mu_);
  holding_since_ns_ = 0;
  round_keep_.clear();
  stats_.ended = true;
  KeepLocked({});  // the agreed and the promised step, if any
  if (protection_.ended) protection_.ended();
  stats_.error = why.ToString();
  // Closing gives the round in flight up here and on the other ranks: not news.
  if (stopping_)
    log_->Info("agreement on the versions every rank holds ended at close: " + why.ToString());
  else
    log_->Warning(
        "agreement on the versions every rank holds ended: " + why.ToString() +
        "; from now on each rank keeps the last agreed step, the newest it saw replicated "
        "and its own newest versions, and a restore from memory may find no step every "
        "rank holds");
}

void StepAgreement::Loop() {
  for (;;) {
    uint64_t seq = 0;
    std::vector<int64_t> window;
    {
      MutexLock lk(mu_);
      cv_.Wait(lk, [&]() CAIRN_REQUIRES(mu_) { return stopping_ || !saves_.empty(); });
      if (saves_.empty()) break;  // stopping with every save consumed
      seq = saves_.back().first;
      for (const auto& [q, step] : saves_) window.push_back(step);
    }
    if (!Round(seq, window)) break;
  }
  MutexLock lk(mu_);
  done_ = true;
  cv_.NotifyAll();
}

bool StepAgreement::Round(uint64_t seq, const std::vector<int64_t>& window) {
  settle_(seq);
  const bool named = static_cast<bool>(protection_.target);
  AgreeOffer mine;
  if (named) {
    // Named pushes: offer the newest step of the window this rank holds, kept while the
    // ranks agree (with the agreed step: two slots, as below).
    MutexLock lk(mu_);
    int64_t newest = -1;
    for (const VersionInfo& v : tier_->Versions())
      if (std::find(window.begin(), window.end(), v.step) != window.end())
        newest = std::max(newest, v.step);
    round_keep_.clear();
    if (newest >= 0) round_keep_.push_back(newest);
    // While a drain pins a version the job no longer keeps (it took the agreed step, and
    // the ranks agreed on a newer one since), keeping a third step would leave no slot to
    // capture into: the round offers none, and the next one after the drain catches up.
    // (On a 2-vCPU machine a drain outlasted the iteration and the save after it skipped.)
    if (newest >= 0) {
      const HostTier::Room room = tier_->RoomIfKept(KeepSetLocked());
      if (room.free == 0 && room.pinned_unkept > 0) {
        round_keep_.clear();
        newest = -1;
        ++stats_.held_back;
      }
    }
    const std::vector<int64_t> held = KeepLocked({});
    if (std::find(held.begin(), held.end(), newest) == held.end()) newest = -1;
    holding_since_ns_ = NowNanos();
    mine.first = consumed_ + 1;
    mine.settled = consumed_ + window.size();
    mine.steps = window;
    for (int64_t st : window) mine.held.push_back(st == newest);
  } else {
    // What this round offers as held: the newest steps of the window this rank holds, as
    // many as leave a slot free; with redundancy, only the newest step of the window its
    // pushes covered (REPLICATED), so a
    // round keeps at most two slots (that step and the agreed one) however far the
    // acknowledgements lag the saves (keeping the whole window made the fourth of four quick
    // saves find no slot with 2 replicas and 3 slots). The ranks replicate the same steps
    // when they lag (ChooseReplicationStep), so their newest covered steps meet.
    std::vector<int64_t> offer = window;
    if (protection_.wait_tried) {
      protection_.wait_tried(*std::max_element(window.begin(), window.end()));
      int64_t newest = -1;
      for (const VersionInfo& v : tier_->Versions())
        if (v.state == VersionState::kReplicated &&
            std::find(window.begin(), window.end(), v.step) != window.end())
          newest = std::max(newest, v.step);
      offer = newest >= 0 ? std::vector<int64_t>{newest} : std::vector<int64_t>{};
      // And the step a wait_replicated() here succeeded for, when in the window: where every
      // rank saw the same step replicated, the ranks agree on it even when their newest
      // covered steps do not meet (under load they drift apart; the crash matrix under ASan
      // lost a step every rank had seen replicated while the agreed one lagged 4 behind).
      MutexLock lk(mu_);
      if (promised_ >= 0 && promised_ != newest &&
          std::find(window.begin(), window.end(), promised_) != window.end())
        offer.push_back(promised_);
    } else {
      // At most slots - 2 (at least 1) of the window's newest steps this rank holds: with
      // the agreed step kept too, one slot stays free to capture into while the round runs.
      // (A round stuck on a dead rank with 2 saves in its window kept all 3 slots: every
      // save was skipped until the hold ended, and nothing new was captured to push: the
      // killed-partner test's CI failures, twice.)
      int spare = tier_->num_slots() - 2;
      {
        MutexLock lk(mu_);
        if (promised_ >= 0 && KeepsPromisePastAgreement()) --spare;
      }
      const size_t most = static_cast<size_t>(std::max(1, spare));
      if (offer.size() > most) {
        std::vector<int64_t> held_now;
        for (const VersionInfo& v : tier_->Versions())
          if (std::find(window.begin(), window.end(), v.step) != window.end())
            held_now.push_back(v.step);
        std::sort(held_now.rbegin(), held_now.rend());
        if (held_now.size() > most) held_now.resize(most);
        offer = std::move(held_now);
      }
    }
    // Kept from here on: a step offered as held cannot be reused while the ranks agree.
    std::vector<int64_t> held;
    {
      MutexLock lk(mu_);
      round_keep_ = offer;
      // (No hold-back here as for named pushes: a replica push pins an unkept version as a
      // matter of course, and holding the round back then cost the crash matrices under
      // ASan the step every rank saw replicated.)
      held = KeepLocked({});
      holding_since_ns_ = NowNanos();
    }
    std::sort(offer.begin(), offer.end());
    std::erase_if(held,
                  [&](int64_t st) { return !std::binary_search(offer.begin(), offer.end(), st); });
    mine.first = consumed_ + 1;
    mine.settled = consumed_ + window.size();
    mine.steps = window;
    for (int64_t st : window) mine.held.push_back(std::binary_search(held.begin(), held.end(), st));
  }
  const bool coverage =
      protection_.covered && protection_.layout_hash && !protection_.node_of.empty();
  if (coverage) mine.layout_hash = NewestLayoutHash();
  if (named && protection_.pace_every)
    mine.pace_every = std::max<int64_t>(1, protection_.pace_every());
  auto all = group_->AllGather(EncodeAgreeOffer(mine));
  if (!all.ok()) {
    End(all.status());
    return false;
  }
  std::vector<AgreeOffer> offers;
  for (size_t r = 0; r < all->size(); ++r) {
    auto o = DecodeAgreeOffer((*all)[r], "rank " + std::to_string(r));
    if (!o.ok()) {
      End(o.status());
      return false;
    }
    offers.push_back(std::move(*o));
  }
  auto out = Agree(offers, consumed_);
  if (!out.ok()) {
    End(out.status());
    return false;
  }
  if (coverage && mine.layout_hash != 0)
    protection_.covered(mine.layout_hash, CoveredElsewhere(offers, protection_.node_of,
                                                           group_->rank(), mine.layout_hash));
  // Named pushes: the newest step of the window every rank holds is pushed by every rank
  // now, and agreed once every rank's pushes of it were acknowledged (a second gather).
  int64_t agreed_now = out->agreed;
  // Paced replicas: a target only when the step enters a new block of the largest pace
  // offered (the same on every rank: the same offers, the same rounds); the agreed step
  // otherwise stays the last one every rank pushed.
  int64_t every = 1;
  for (const AgreeOffer& o : offers) every = std::max(every, o.pace_every);
  const bool due = every <= 1 || last_target_ < 0 || out->agreed / every > last_target_ / every;
  if (named && out->agreed >= 0 && !due) agreed_now = -1;
  if (named && out->agreed >= 0 && due) {
    const int64_t target = out->agreed;
    last_target_ = target;
    protection_.target(target);
    protection_.wait_tried(target);
    bool pushed = false;
    for (const VersionInfo& v : tier_->Versions())
      pushed = pushed || (v.step == target && (v.state == VersionState::kReplicated ||
                                               v.state == VersionState::kReplicatedPersisted));
    auto flags = group_->AllGather(pushed ? "1" : "0");
    if (!flags.ok()) {
      End(flags.status());
      return false;
    }
    for (const std::string& f : *flags) pushed = pushed && f == "1";
    agreed_now = pushed ? target : -1;
  }
  const uint64_t newly = out->consumed - consumed_;
  if (named && protection_.passed && newly > 0) {
    int64_t newest = -1;
    for (uint64_t i = 0; i < newly && i < window.size(); ++i) newest = std::max(newest, window[i]);
    if (newest >= 0) protection_.passed(newest);
  }
  consumed_ = out->consumed;
  MutexLock lk(mu_);
  // (A plain store on the other side: no lock of its own under ours.)
  if (protection_.agreed && agreed_now > agreed_) protection_.agreed(agreed_now);
  agreed_ = std::max(agreed_, agreed_now);
  holding_since_ns_ = 0;
  round_keep_.clear();
  KeepLocked(out->dropped);
  for (uint64_t i = 0; i < newly && !saves_.empty(); ++i) saves_.pop_front();
  ++stats_.rounds;
  stats_.agreed_saves = consumed_;
  stats_.agreed_step = agreed_;
  // (Named pushes offer only the newest step held: the others are not "not held".)
  if (!named) stats_.not_held_by_all += out->dropped.size();
  return true;
}

}  // namespace cairn
