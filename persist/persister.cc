#include "persist/persister.h"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "core/checksum.h"
#include "core/clock.h"
#include "core/kill_point.h"
#include "core/mutex.h"
#include "core/trace.h"
#include "core/trusted_path.h"
#include "persist/commit.h"
#include "persist/manifest.h"
#include "persist/slot_layout.h"
#include "persist/step_index.h"
#include "wire/codec.h"

namespace cairn {
namespace {

// What a rank brings to a round: its newest mark and the versions it holds.
struct Offer {
  uint64_t newest_mark = 0;
  std::map<int64_t, uint64_t> held;  // step -> layout hash
  std::set<int64_t> kept;            // of those held, the steps the job keeps (HostTier::Keep)
};

std::string EncodeOffer(const Offer& o) {
  wire::PersistOffer w;
  w.set_newest_mark(o.newest_mark);
  for (auto [step, hash] : o.held) {
    auto* h = w.add_held();
    h->set_step(step);
    h->set_layout_hash(hash);
    h->set_kept(o.kept.count(step) > 0);
  }
  return wire::Encode(w);
}

Result<Offer> DecodeOffer(std::string_view b) {
  CAIRN_ASSIGN_OR_RETURN(auto w, wire::Decode<wire::PersistOffer>(b, "persist offer"));
  Offer o;
  o.newest_mark = w.newest_mark();
  for (const auto& h : w.held()) {
    o.held[h.step()] = h.layout_hash();
    if (h.kept()) o.kept.insert(h.step());
  }
  return o;
}

// The step a round persists. With `prefer_kept` (a periodic mark), the newest version every
// rank holds and keeps for the job, if newer than `committed`: the step agreement keeps it
// in its slot anyway, so draining it takes no slot of its own (a drain of another version
// pins a third one beside the agreed version and the one being made redundant, and a
// capture during the drain then finds none). Else `marked` (the consumed mark's version,
// -1 if none) if every rank holds it, else the newest version every rank holds; nullopt if
// there is none.
std::optional<int64_t> ChooseStep(const std::vector<Offer>& offers, int64_t marked,
                                  bool prefer_kept, int64_t committed) {
  auto everywhere = [&](int64_t st, bool kept) {
    for (const Offer& o : offers)
      if (!o.held.count(st) || (kept && !o.kept.count(st))) return false;
    return true;
  };
  if (prefer_kept)
    for (auto it = offers[0].kept.rbegin(); it != offers[0].kept.rend() && *it > committed; ++it)
      if (everywhere(*it, true)) return *it;
  if (marked >= 0 && everywhere(marked, false)) return marked;
  for (auto it = offers[0].held.rbegin(); it != offers[0].held.rend(); ++it)
    if (everywhere(it->first, false)) return it->first;
  return std::nullopt;
}

// Rank 0's verdict on a round: its status, and whether LATEST was left naming the step
// although the round failed.
std::string EncodeOutcome(const Status& st, bool left_published) {
  wire::PersistOutcome w;
  wire::ToWire(st, w.mutable_status());
  w.set_left_published(left_published);
  return wire::Encode(w);
}

Status DecodeOutcome(std::string_view bytes, bool* left_published) {
  auto w = wire::Decode<wire::PersistOutcome>(bytes, "persist outcome");
  if (!w.ok())
    return Status::Internal("undecodable persist outcome from rank 0: " + w.status().message());
  *left_published = w->left_published();
  return wire::FromWire(w->status());
}

}  // namespace

Status DecodePersistMessageForFuzzing(int kind, std::string_view bytes) {
  if (kind == 0) {
    auto o = DecodeOffer(bytes);
    if (!o.ok()) return o.status();
    // What a round does with offers: must not crash on any decoded one.
    (void)ChooseStep({*o, *o}, o->held.empty() ? -1 : o->held.begin()->first, true, -1);
    return Status::OK();
  }
  bool left = false;
  return DecodeOutcome(bytes, &left);
}

Persister::Persister(PersistConfig config, HostTier* tier, Group* group, FileSystem* fs,
                     const Logger* log, std::function<void(uint64_t)> settle)
    : config_(std::move(config)),
      tier_(tier),
      group_(group),
      fs_(fs),
      log_(log),
      settle_(std::move(settle)),
      limiter_(config_.rate_bytes_per_s),
      writers_("cairn-persist", std::clamp(config_.writer.threads, 1, 64) - 1,
               ToThreadPriority(config_.priority)) {
  config_.writer.pool = &writers_;
  thread_ = std::thread([this] { Loop(); });
}

Persister::~Persister() {
  {
    MutexLock lk(mu_);
    stopping_ = true;
    cv_.NotifyAll();
  }
  thread_.join();
}

void Persister::OnSave(uint64_t seq, int64_t step) {
  MutexLock lk(mu_);
  ++saves_;
  if (config_.every > 0 && saves_ % static_cast<uint64_t>(config_.every) == 0) {
    marks_.push_back({++next_mark_, seq, step, /*flush=*/false});
    cv_.NotifyAll();
  }
}

Result<int64_t> Persister::Flush(uint64_t seq, int64_t step) {
  MutexLock lk(mu_);
  const uint64_t id = ++next_mark_;
  marks_.push_back({id, seq, step, /*flush=*/true});
  cv_.NotifyAll();
  cv_.Wait(lk, [&]() CAIRN_REQUIRES(mu_) { return consumed_ >= id; });
  // The round that consumed this mark is the first one whose consumed id reaches it.
  for (const auto& [consumed, result] : results_)
    if (consumed >= id) return result;
  return Status::Internal("flush: the outcome of its round was lost");
}

PersisterStats Persister::stats() const {
  MutexLock lk(mu_);
  return stats_;
}

void Persister::Loop() {
  // Draining is background work: it yields the CPU to the training and capture threads
  // (Linux scheduling policy and nice value are per thread: the writer pool's threads got
  // the same). flush() is unaffected in practice: the training thread waits.
  if (!SetThreadPriority(ToThreadPriority(config_.priority)))
    log_->Info("persist: the drain's CPU priority was refused; writers run at normal priority");
  for (;;) {
    uint64_t newest = 0, seq = 0;
    {
      MutexLock lk(mu_);
      cv_.Wait(lk, [&]() CAIRN_REQUIRES(mu_) { return stopping_ || !marks_.empty(); });
      if (marks_.empty()) return;  // stopping with nothing queued
      newest = marks_.back().id;
      seq = marks_.back().settle_seq;
    }
    Outcome out = Round(newest, seq);
    MutexLock lk(mu_);
    while (!marks_.empty() && marks_.front().id <= out.consumed) marks_.pop_front();
    consumed_ = std::max(consumed_, out.consumed);
    results_.emplace_back(out.consumed, out.step);
    if (results_.size() > 64) results_.erase(results_.begin());
    cv_.NotifyAll();
  }
}

// Pins the newest version held and the one this rank's newest mark asks for (so that a
// capture cannot take the marked version's slot while the ranks agree; pinning every
// version would keep this rank from capturing while it waits for a slow rank), and
// returns the encoded offer of every version held with its layout hash. Layouts are
// computed once per version.
std::string Persister::OfferHeld(uint64_t newest,
                                 std::map<int64_t, std::unique_ptr<HostTier::View>>* pinned) {
  Offer mine;
  mine.newest_mark = newest;
  int64_t marked_step = -1;
  bool flush = false;
  {
    MutexLock lk(mu_);
    for (const Mark& m : marks_)
      if (m.id == newest) {
        marked_step = m.step;
        flush = m.flush;
      }
  }
  const std::vector<VersionInfo> versions = tier_->Versions();
  // The kept versions too: a periodic mark prefers them, and pinning one costs no slot (the
  // job keeps it), but the agreement may let it go while the ranks agree on this round.
  const std::vector<int64_t> kept = tier_->Kept();
  // A periodic mark that will most likely take a kept version pins only those: pinning the
  // newest too held a third slot while the ranks gathered their offers (a slow rank's late
  // offer made the next save skip). Should the round take an unpinned version after all, it
  // pins it once chosen, and fails (the next mark tries again) if a capture took its slot.
  const bool kept_only = !flush && std::any_of(kept.begin(), kept.end(),
                                               [&](int64_t st) { return st > last_committed_; });
  for (const VersionInfo& v : versions) {
    const bool is_kept = std::find(kept.begin(), kept.end(), v.step) != kept.end();
    if (!is_kept && (kept_only || (v.step != versions.front().step && v.step != marked_step)))
      continue;
    if (auto view = tier_->Pin(v.step); view.ok()) {
      (*pinned)[v.step] = std::move(*view);
      if (is_kept) mine.kept.insert(v.step);
    }
  }
  std::map<int64_t, HeldLayout> held;
  for (const VersionInfo& v : versions) {
    auto it = layouts_.find(v.step);
    if (it != layouts_.end() && it->second.created_wall_ns == v.created_wall_ns) {
      held[v.step] = std::move(it->second);
    } else {
      std::unique_ptr<HostTier::View> other;
      const HostTier::View* view = nullptr;
      if (auto p = pinned->find(v.step); p != pinned->end()) {
        view = p->second.get();
      } else {
        auto pin = tier_->Pin(v.step);
        if (!pin.ok()) continue;
        other = std::move(*pin);
        view = other.get();
      }
      HeldLayout l;
      l.created_wall_ns = view->header().created_wall_ns;
      const RankLayout layout = SlotLayout(view->header());
      l.encoded = EncodeRankLayout(layout);
      l.hash = LayoutHash(l.encoded);
      if (config_.planner.templates)
        l.recognized = RecognizeLayout(layout, group_->rank(), group_->size());
      if (l.recognized) {
        l.template_hash = TemplateHash(EncodeTemplate(l.recognized->layout_template));
        l.hash = TemplatedLayoutHash(l.template_hash, l.recognized->index);
      }
      held[v.step] = std::move(l);
    }
    mine.held[v.step] = held[v.step].hash;
  }
  layouts_ = std::move(held);
  return EncodeOffer(mine);
}

namespace {

// Every rank's offer, decoded (a round that cannot gather them fails).
Result<std::vector<Offer>> DecodeOffers(const Result<std::vector<std::string>>& all) {
  if (!all.ok()) return all.status().WithContext("persist round");
  std::vector<Offer> offers;
  for (const std::string& b : *all) {
    CAIRN_ASSIGN_OR_RETURN(Offer o, DecodeOffer(b));
    offers.push_back(std::move(o));
  }
  return offers;
}

void LogOffers(const Logger& log, const std::vector<Offer>& offers, uint64_t consumed) {
  std::string held;
  for (size_t r = 0; r < offers.size(); ++r) {
    held += " rank " + std::to_string(r) + " (mark " + std::to_string(offers[r].newest_mark) + "):";
    for (const auto& [st, h] : offers[r].held)
      held += " " + std::to_string(st) + (offers[r].kept.count(st) ? " (kept)" : "");
  }
  log.Debug("persist round, marks up to " + std::to_string(consumed) + "; held:" + held);
}

}  // namespace

std::unique_ptr<HostTier::View> Persister::PinChosen(
    int64_t step, const HeldLayout& layout,
    std::map<int64_t, std::unique_ptr<HostTier::View>>* pinned) {
  std::unique_ptr<HostTier::View> view;
  if (auto it = pinned->find(step); it != pinned->end()) {
    view = std::move(it->second);
  } else if (auto v = tier_->Pin(step); v.ok()) {
    view = std::move(*v);
  }
  pinned->clear();
  if (view && view->header().created_wall_ns != layout.created_wall_ns) view.reset();
  return view;
}

Persister::Outcome Persister::Round(uint64_t newest, uint64_t seq) {
  TraceSpan span("persist round", "persist");
  Outcome out;
  out.consumed = newest;  // if the collective fails, these marks are given up
  settle_(seq);
  const int me = group_->rank();
  if (first_round_ && me == 0) CollectPfsGarbage(fs_, config_.job_dir, config_.keep, -1, log_);
  first_round_ = false;

  // 1. Agree on the step.
  std::map<int64_t, std::unique_ptr<HostTier::View>> pinned;
  auto gathered = DecodeOffers(group_->AllGather(OfferHeld(newest, &pinned)));
  auto fail = [&](const Status& st) {
    MutexLock lk(mu_);
    ++stats_.rounds;
    ++stats_.failed;
    stats_.last_error = st.ToString();
    log_->Warning("persist: " + st.ToString() +
                  " (training goes on with the memory tiers; the next mark tries again)");
    out.step = st;
    return out;
  };
  if (!gathered.ok()) return fail(gathered.status());
  const std::vector<Offer>& offers = *gathered;
  out.consumed = newest;
  for (const Offer& o : offers) out.consumed = std::min(out.consumed, o.newest_mark);
  int64_t marked = -1;
  bool flush = false;
  {
    MutexLock lk(mu_);
    for (const Mark& m : marks_)
      if (m.id == out.consumed) {
        marked = m.step;
        flush = m.flush;
      }
  }
  const std::optional<int64_t> step = ChooseStep(offers, marked, !flush, last_committed_);
  if (log_->enabled(LogLevel::kDebug)) LogOffers(*log_, offers, out.consumed);
  if (!step) {
    std::string why;
    for (size_t r = 0; r < offers.size() && why.empty(); ++r)
      if (offers[r].held.empty()) why = " (rank " + std::to_string(r) + " holds none)";
    return fail(Status::Unavailable("no captured version is held by every rank" + why));
  }
  if (*step <= last_committed_) {
    MutexLock lk(mu_);
    ++stats_.rounds;
    out.step = last_committed_;  // nothing newer to persist
    return out;
  }
  std::vector<uint64_t> hashes;
  for (const Offer& o : offers) hashes.push_back(o.held.at(*step));
  // Held against reuse from here until written; unless it was pinned for the offer, a
  // capture may have taken its slot since (then this rank reports it, the round fails).
  const HeldLayout& layout = layouts_.at(*step);
  std::unique_ptr<HostTier::View> view = PinChosen(*step, layout, &pinned);

  const int64_t t0 = NowNanos();
  CAIRN_KILL_POINT("persist.agreed");
  auto done = PersistStep(*step, std::move(view), hashes, layout);
  if (!done.ok())
    return fail(done.status().WithContext("persisting step " + std::to_string(*step)));
  last_committed_ = *step;
  // (A capture may have reused the slot since its share was written: nothing to record.)
  Status st = tier_->SetState(*step, VersionState::kPersisted);
  if (!st.ok() && st.code() != StatusCode::kNotFound)
    log_->Warning("persist: step committed, but its slot header: " + st.ToString());
  MutexLock lk(mu_);
  ++stats_.rounds;
  ++stats_.persisted;
  stats_.newest_persisted_step = *step;
  stats_.last_round_ms = NanosToSeconds(NowNanos() - t0) * 1e3;
  log_->Info("persisted step " + std::to_string(*step) + " to " + config_.job_dir + " in " +
             std::to_string(static_cast<int64_t>(stats_.last_round_ms)) + " ms");
  out.step = *step;
  return out;
}

Status Persister::Replan(const std::vector<uint64_t>& hashes, const HeldLayout& my_layout) {
  const int me = group_->rank();
  plan_.reset();
  // Gather 1: template references, or explicit layouts (only the lowest rank of each
  // distinct layout sends it; the others are known by hash).
  LayoutMessage msg;
  if (my_layout.recognized) {
    msg.templated = true;
    msg.template_hash = my_layout.template_hash;
    msg.index = my_layout.recognized->index;
  } else {
    bool first_of_hash = true;
    for (int r = 0; r < me; ++r) first_of_hash = first_of_hash && hashes[r] != hashes[me];
    if (first_of_hash) msg.layout = my_layout.encoded;
  }
  CAIRN_ASSIGN_OR_RETURN(auto gathered, group_->AllGather(EncodeLayoutMessage(msg)));
  CAIRN_ASSIGN_OR_RETURN(std::vector<LayoutMessage> messages, DecodeLayoutMessages(gathered));
  gathered.clear();
  // Gather 2: each distinct template once.
  std::vector<std::string> templates;
  if (AnyTemplated(messages)) {
    CAIRN_ASSIGN_OR_RETURN(
        templates, group_->AllGather(SendsTemplate(messages, me)
                                         ? EncodeTemplate(my_layout.recognized->layout_template)
                                         : std::string()));
  }
  CAIRN_ASSIGN_OR_RETURN(PersistPlan plan,
                         PlanPersist(std::move(messages), templates, hashes, config_.planner));
  if (me == 0 && !plan.why_general.empty())
    log_->Info("persist: the general save planner is used: " + plan.why_general);
  plan_ = std::move(plan);
  MutexLock lk(mu_);
  ++stats_.plans;
  stats_.max_writer_share = plan_->max_writer_share();
  stats_.plan = plan_->Path();
  return Status::OK();
}

Result<int64_t> Persister::PersistStep(int64_t step, std::unique_ptr<HostTier::View> view,
                                       const std::vector<uint64_t>& hashes,
                                       const HeldLayout& my_layout) {
  const int me = group_->rank();

  // 2. Plan, or reuse the plan.
  if (!plan_ || plan_->layout_hashes != hashes) CAIRN_RETURN_IF_ERROR(Replan(hashes, my_layout));

  // 3. Write this rank's pieces and blobs.
  const std::string step_dir = JoinPath(config_.job_dir, StepDirName(step));
  LocationTable table;
  {
    TraceSpan write_span("persist write", "persist");
    table.status = view ? WriteShare(step_dir, *view, plan_->PiecesOf(me), &table)
                        : Status::Unavailable("step " + std::to_string(step) +
                                              " was replaced in the host tier by a newer capture "
                                              "before it could be written");
    if (table.status.ok() && plan_->templated) {
      // Format 2: where the pieces lie goes to this rank's index file, not to rank 0.
      const std::string index = EncodeWriterIndex(table.pieces);
      table.status = WriteFileAtomic(fs_, JoinPath(step_dir, IndexFileName(me)), index);
      table.indexed = true;
      table.index_pieces = static_cast<uint32_t>(table.pieces.size());
      table.index_bytes = index.size();
      table.index_checksum = Checksum(index.data(), index.size());
      table.pieces.clear();
    }
    if (!table.status.ok()) table.status = table.status.WithContext("rank " + std::to_string(me));
  }
  view.reset();  // this rank's share is on the PFS, fsynced: the slot is free to reuse

  // 4. Gather the tables; rank 0 commits.
  CAIRN_ASSIGN_OR_RETURN(auto encoded, group_->AllGather(EncodeLocationTable(table)));
  CAIRN_KILL_POINT("persist.tables_gathered");
  std::string outcome;
  if (me == 0) {
    bool left_published = false;
    Status st = [&]() -> Status {
      std::vector<LocationTable> tables;
      for (const std::string& e : encoded) {
        CAIRN_ASSIGN_OR_RETURN(LocationTable t, DecodeLocationTable(e));
        CAIRN_RETURN_IF_ERROR(t.status);
        tables.push_back(std::move(t));
      }
      CAIRN_ASSIGN_OR_RETURN(
          pb::Manifest m, plan_->templated
                              ? BuildTemplatedManifest(*plan_->templated, tables, config_.job, step,
                                                       config_.writer.chunk_bytes)
                              : BuildManifest(plan_->Full(), tables, config_.job, step,
                                              config_.writer.chunk_bytes));
      m.set_created_wall_ns(WallNanos());
      CAIRN_RETURN_IF_ERROR(fs_->SyncDir(step_dir));
      CAIRN_KILL_POINT("commit.step_synced");
      return CommitStep(fs_, config_.job_dir, step, m, &left_published);
    }();
    if (st.ok()) {
      CollectPfsGarbage(fs_, config_.job_dir, config_.keep, step, log_);
      CAIRN_KILL_POINT("commit.collected");
    } else if (!left_published) {
      Status rm = fs_->RemoveAll(step_dir);
      if (!rm.ok())
        log_->Warning("persist: removing the failed " + step_dir + ": " + rm.ToString());
    }
    outcome = EncodeOutcome(st, left_published);
  }
  // 5. Everyone learns the outcome.
  auto told = group_->Broadcast(0, outcome);
  if (!told.ok()) return told.status();
  bool left_published = false;
  Status st = DecodeOutcome(*told, &left_published);
  // A step LATEST names must never be written again, even if its round failed.
  if (st.ok() || left_published) last_committed_ = step;
  if (!st.ok()) return st;
  CAIRN_KILL_POINT("persist.committed");
  return step;
}

namespace {

// A share's write items: its pieces (from the slot), then its blobs, laid out in the data
// file. The slot's bytes must still be the ones captured before they become the PFS copy:
// where a piece's chunks are the slot's chunks (the planner starts slabs on chunk
// boundaries), the checksums the writer takes must equal the slot's (`expect`: no extra
// pass); other chunks under the pieces are hashed here first.
struct ShareItems {
  struct Expect {
    size_t item, chunk;
    uint32_t slot_chunk;
  };
  std::vector<WriteItem> items;
  std::vector<const SlotShard*> shard_of;  // per piece
  std::vector<Expect> expect;
};

Result<ShareItems> ShareItemsOf(const HostTier::View& view, const std::vector<WritePiece>& mine,
                                uint64_t writer_chunk) {
  const SlotHeader& h = view.header();
  const uint64_t chunk = h.chunk_bytes;
  ShareItems out;
  std::map<uint32_t, const SlotShard*> verify;  // slot chunk -> its shard
  const bool same_chunks = chunk == writer_chunk;
  for (const WritePiece& p : mine) {
    if (p.slot_shard >= h.shards.size() || p.src_offset + p.nbytes > h.shards[p.slot_shard].nbytes)
      return Status::Internal("save plan: a piece outside the host slot's shards");
    const SlotShard& s = h.shards[p.slot_shard];
    out.shard_of.push_back(&s);
    out.items.push_back({view.data() + s.offset + p.src_offset, p.nbytes, 0});
    for (uint64_t k = 0, c = p.src_offset / chunk; c * chunk < p.src_offset + p.nbytes; ++c, ++k) {
      const uint32_t sc = s.first_chunk + static_cast<uint32_t>(c);
      const bool aligned =
          p.src_offset % chunk == 0 &&
          std::min((k + 1) * chunk, p.nbytes) == std::min((k + 1) * chunk, s.nbytes - p.src_offset);
      if (same_chunks && aligned)
        out.expect.push_back({out.items.size() - 1, k, sc});
      else
        verify.emplace(sc, &s);
    }
  }
  for (const auto& [sc, s] : verify) {
    auto [b, e] = h.ChunkRange(*s, sc - s->first_chunk);
    if (Checksum(view.data() + b, e - b) != h.chunk_checksums[sc])
      return Status::Corruption("host slot " + view.data_path() + " tensor '" + s->name +
                                "' bytes [" + std::to_string(b) + ", " + std::to_string(e) +
                                ") no longer match their checksum");
  }
  for (const SlotBlob& b : h.blobs) out.items.push_back({view.data() + b.offset, b.nbytes, 0});
  LayOutItems(out.items, kPfsAlign);
  return out;
}

// Blobs keep the checksum taken at capture; a blob of one chunk is verified by the
// writer's checksum, a longer one is hashed once more. Each goes into the table.
Status RecordBlobs(const HostTier::View& view, const ShareItems& share, size_t pieces,
                   const WriteReport& rep, LocationTable* table) {
  const SlotHeader& h = view.header();
  for (size_t k = 0; k < h.blobs.size(); ++k) {
    const WriteItem& it = share.items[pieces + k];
    const auto& sums = rep.chunk_checksums[pieces + k];
    const uint64_t now = sums.size() == 1 ? sums[0] : Checksum(it.src, it.nbytes);
    if (now != h.blobs[k].checksum)
      return Status::Corruption("host slot " + view.data_path() + " blob '" + h.blobs[k].name +
                                "' no longer matches its checksum");
    table->blobs.push_back({h.blobs[k].name, it.file_offset, it.nbytes, h.blobs[k].checksum});
  }
  return Status::OK();
}

}  // namespace

Status Persister::WriteShare(const std::string& step_dir, const HostTier::View& view,
                             const std::vector<WritePiece>& mine, LocationTable* table) {
  const int me = group_->rank();
  const SlotHeader& h = view.header();
  CAIRN_ASSIGN_OR_RETURN(ShareItems share, ShareItemsOf(view, mine, config_.writer.chunk_bytes));
  // The job's PFS directories: real directories nobody outside their owner and group can
  // write (core/trusted_path.h), checked before this rank writes into them.
  CAIRN_RETURN_IF_ERROR(MakeTrustedDirs(fs_, config_.job_dir, JoinPath(step_dir, "data"),
                                        TreeKind::kShared,
                                        "cairn writes checkpoints only where other users cannot "
                                        "replace them: give CAIRN_PFS_ROOT a directory of your "
                                        "own or your project's"));
  const int64_t t0 = NowNanos();
  CAIRN_ASSIGN_OR_RETURN(WriteReport rep,
                         WriteDataFile(fs_, JoinPath(step_dir, DataFileName(me)), share.items,
                                       config_.writer, &limiter_, log_));
  for (const ShareItems::Expect& e : share.expect)
    if (rep.chunk_checksums[e.item][e.chunk] != h.chunk_checksums[e.slot_chunk])
      return Status::Corruption("host slot " + view.data_path() + " tensor '" +
                                share.shard_of[e.item]->name + "': chunk " +
                                std::to_string(e.slot_chunk - share.shard_of[e.item]->first_chunk) +
                                " no longer matches its checksum");
  CAIRN_RETURN_IF_ERROR(fs_->SyncDir(JoinPath(step_dir, "data")));
  CAIRN_KILL_POINT("persist.share_written");
  {
    MutexLock lk(mu_);
    stats_.bytes += rep.bytes;
    stats_.write_seconds += NanosToSeconds(NowNanos() - t0);
  }
  for (size_t k = 0; k < mine.size(); ++k)
    table->pieces.push_back({share.items[k].file_offset, std::move(rep.chunk_checksums[k])});
  return RecordBlobs(view, share, mine.size(), rep, table);
}

}  // namespace cairn
