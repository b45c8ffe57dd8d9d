#include "recovery/restore.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <cstdio>
#include <cstdlib>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "core/arith.h"
#include "core/box_copy.h"
#include "core/checksum.h"
#include "core/clock.h"
#include "core/mutex.h"
#include "core/trace.h"
#include "layout/layout_template.h"
#include "layout/load_planner.h"
#include "layout/memory_plan.h"
#include "layout/restore_plan.h"
#include "layout/save_planner.h"
#include "persist/manifest.h"
#include "persist/pfs_reader.h"
#include "persist/slot_layout.h"
#include "persist/step_index.h"
#include "recovery/restore_agree.h"
#include "recovery/restore_transfer.h"
#include "recovery/restore_wire.h"

namespace cairn {
namespace {

using namespace restore_internal;  // NOLINT: this file drives the restore's phases

RankLayout LayoutOf(std::span<const ShardSpec> targets) {
  RankLayout l;
  std::unordered_map<std::string, uint32_t> ids;
  for (const ShardSpec& t : targets) {
    auto [it, fresh] = ids.emplace(t.meta.name, static_cast<uint32_t>(l.tensors.size()));
    if (fresh) l.tensors.push_back(t.meta);
    l.shards.push_back({it->second, t.box});
  }
  return l;
}

}  // namespace

void AppendRegionCopies(const std::byte* src, uint64_t src_lo, const Box& src_box, std::byte* dst,
                        const Box& dst_box, const Box& region, size_t elem,
                        std::vector<CopyChunk>* out) {
  ForEachRegionBlock(src_box, dst_box, region, elem, [&](uint64_t so, uint64_t dof, uint64_t n) {
    out->push_back({src ? src + (so - src_lo) : nullptr, dst + dof, static_cast<size_t>(n)});
  });
}

namespace {

// What one attempt at the chosen step builds: the catalog of where its bytes are, what this
// rank pinned, the target layouts and the plan.
struct ChosenStep {
  Choice choice;
  MemoryCatalog sources;  // where the bytes of the step are, and its blobs
  std::vector<std::unique_ptr<PinnedVersion>> pinned;  // this rank's own version first
  pb::Manifest manifest;                               // PFS steps
  std::string step_dir;                                // PFS steps
  std::vector<std::string> layouts;                    // per rank ("" when sent by a lower rank)
  std::vector<uint64_t> hashes;                        // per rank
  std::unordered_map<std::string, uint32_t> tensor_ids;
  std::map<std::pair<uint32_t, std::vector<int64_t>>, uint32_t> piece_ids;
  LoadTargets lt;
  LoadPlan plan;
  // This rank planned alone: a format-2 PFS step, from the index files its targets need
  // (p.manifest then holds only those pieces), or a memory step from layout templates
  // (p.sources.cat then holds only the pieces it needs or sends).
  bool planned_alone = false;
  std::string plan_path;    // RestoreReport::plan
  uint64_t job_needed = 0;  // planned_alone: the bytes every rank's targets needed, summed
};

// The restore collective on one rank: discovery, agreement, planning, transfer, outcome,
// repeated past steps that fail verification (docs/architecture.md, recovery/restore.h).
class Restorer {
 public:
  Restorer(const RestoreEnv& env, std::span<const ShardSpec> targets, const RestoreOptions& options)
      : env_(env),
        targets_(targets),
        options_(options),
        who_(env.who),
        layout_(EncodeRankLayout(LayoutOf(targets))),
        layout_hash_(LayoutHash(layout_)),
        have_pfs_(env.pfs_fs && !env.pfs_job_dir.empty()) {}

  Result<RestoreReport> Run();

 private:
  // 1. Every rank's inventory (rank 0 adds the committed PFS steps).
  Result<std::vector<Inventory>> Discover();
  // 2. The step and tier to restore; an error naming what is held when there is none.
  Result<Choice> Agree(const std::vector<Inventory>& inv);
  // 3. Pins this rank's copies of a memory step (an error to pass on in the next gather).
  Status Pin(ChosenStep& p);
  // Gathers the target layouts and, for a memory step, the shard tables (of the versions
  // pinned, or `pin_st`); for a PFS step catalogs the MANIFEST read.
  Result<bool> Catalog(const std::vector<Inventory>& inv, ChosenStep& p, const Status& pin_st);
  // A memory step whose saved and target layouts are all templates: two small gathers,
  // then each rank plans alone (layout/memory_plan.h). false: some layout is no
  // template, or they disagree; the general catalog is needed.
  Result<bool> PlanMemoryFromTemplates(const std::vector<Inventory>& inv, ChosenStep& p,
                                       const Status& pin_st);
  // Its two gathers: every rank's template references (target; the saved versions it is
  // the lowest holder of), then each template once; fills *out and the blob providers.
  // false: some layout is no template, or the templates disagree.
  Result<bool> GatherTemplates(const std::vector<Inventory>& inv, ChosenStep& p,
                               const Status& pin_st, TemplatedMemoryStep* out);
  // Gather 1: every rank's references; *my_templates gets the templates this rank named.
  Result<std::vector<LayoutRefs>> GatherLayoutRefs(const ChosenStep& p, const Status& pin_st,
                                                   const std::vector<std::vector<int>>& holders,
                                                   std::map<uint64_t, std::string>* my_templates);
  // Gather 2: each template named once, sent by the first rank naming it.
  Result<std::map<uint64_t, LayoutTemplate>> GatherTemplateBodies(
      const std::vector<LayoutRefs>& refs, const std::map<uint64_t, std::string>& my_templates);
  // After planning alone: every rank's status, and (unless options_.partial) that every
  // saved tensor is some rank's target. `skip_corrupt`: a Corruption skips the step (PFS).
  // `targeted`: the tensors some rank's targets name, where every rank knows them (a memory
  // restore planned from templates: the targets' templates list them); when they cover the
  // saved tensors, the gather carries only each rank's status, not a bit per saved tensor
  // (at 10,000 ranks of 10,000 tensors, 12.5 MB into every rank).
  Result<bool> CheckAlone(ChosenStep& p, Status st, const std::vector<std::string>& saved_names,
                          bool skip_corrupt,
                          const std::unordered_set<std::string_view>* targeted = nullptr);
  // The error for saved tensors no rank restores.
  Status Unrestored(const ChosenStep& p, const std::vector<std::string>& names, size_t count) const;
  // Rank 0 reads the chosen PFS step's MANIFEST as it is and broadcasts it (false:
  // unreadable, step skipped).
  Result<bool> FetchManifest(ChosenStep& p);
  Status Plan(ChosenStep& p);
  // A format-2 step: this rank's pieces from the index files its targets need, a plan
  // of its own reads, and a job-wide check that every saved tensor is some rank's target
  // (false: an index file is corrupt somewhere, step skipped).
  Result<bool> PlanFromIndex(ChosenStep& p);
  // Skips a step that cannot be read (every rank calls it alike).
  void Skip(ChosenStep& p, const Status& why);
  // 4. Moves this rank's bytes and blobs; the status of the attempt.
  Status Transfer(ChosenStep& p, Attempt& a, RestoreReport& r);
  // 5. A job that grew: ranks whose number saved nothing get rank 0's blobs (collective,
  // only when the saved world is smaller than this one).
  Status ShareBlobsWithNewRanks(const ChosenStep& p, RestoreReport& r);
  Status ExchangeBlobs(ChosenStep& p, Attempt& a, std::string* blob_bytes);
  // 5. Every rank's outcome: OK, the first non-checksum error, or (false) a checksum
  // failure somewhere, after which the step is excluded and agreement runs again.
  Result<bool> Outcome(const Status& st, ChosenStep& p, RestoreReport& r);
  void Describe(const ChosenStep& p, RestoreReport& r) const;

  const RestoreEnv& env_;
  std::span<const ShardSpec> targets_;
  const RestoreOptions& options_;
  const std::string who_;
  const std::string layout_;
  const uint64_t layout_hash_;
  const bool have_pfs_;
  const int64_t t0_ = NowNanos();
  std::vector<HeldVersion> held_;                // this rank's, at the last discovery
  std::vector<std::string> skipped_;             // newer versions passed over, and why
  std::set<std::pair<int64_t, bool>> excluded_;  // (step, from_pfs) that failed
};

Result<std::vector<Inventory>> Restorer::Discover() {
  TraceSpan span("restore discover", "restore");
  Inventory mine;
  mine.layout_hash = layout_hash_;
  mine.held = env_.memory ? env_.memory->List() : std::vector<HeldVersion>{};
  held_ = mine.held;
  Status local_st;
  if (env_.rank == 0 && have_pfs_ && env_.pfs_fs->Exists(env_.pfs_job_dir)) {
    auto steps = ListCommittedSteps(env_.pfs_fs, env_.pfs_job_dir);
    if (!steps.ok())
      env_.log->Warning("cannot list " + env_.pfs_job_dir + ": " + steps.status().ToString());
    else
      mine.pfs_steps = std::move(*steps);
  }
  CAIRN_ASSIGN_OR_RETURN(auto gathered, GatherChecked(env_.group, local_st, EncodeInventory(mine)));
  std::vector<Inventory> inv;
  for (const std::string& b : gathered) {
    CAIRN_ASSIGN_OR_RETURN(Inventory i, DecodeInventory(b));
    inv.push_back(std::move(i));
  }
  return inv;
}

Result<Choice> Restorer::Agree(const std::vector<Inventory>& inv) {
  auto choice = Choose(inv, options_.step, excluded_);
  if (choice) return *choice;
  std::string why;
  for (const auto& s : skipped_) why += "\n  skipped: " + s;
  const std::string what =
      options_.step ? "step " + std::to_string(*options_.step) + " is not" : "no version is";
  if (!skipped_.empty())
    return Status::Corruption(who_ + ": " + what + " restorable by every rank any more (" +
                              DescribeInventory(inv) +
                              "); the targets may be partly written:" + why);
  return Status::NotFound(
      who_ + ": " + what + " restorable by every rank (" + DescribeInventory(inv) +
      "; this rank: " + (env_.memory ? env_.memory->Describe() : "no memory tier") +
      (have_pfs_ ? ", PFS " + env_.pfs_job_dir : ", no PFS") + ")");
}

Status Restorer::Pin(ChosenStep& p) {
  TraceSpan span("restore pin", "restore");
  for (const HeldVersion& v : held_) {
    if (v.step != p.choice.step) continue;
    auto pv = env_.memory->Pin(v);
    if (!pv.ok()) return pv.status().WithContext(who_);
    // This rank's own version first: it is the one read locally.
    if (v.source == env_.rank)
      p.pinned.insert(p.pinned.begin(), std::move(*pv));
    else
      p.pinned.push_back(std::move(*pv));
  }
  return Status::OK();
}

Result<bool> Restorer::Catalog(const std::vector<Inventory>& inv, ChosenStep& p,
                               const Status& pin_st) {
  TraceSpan span("restore catalog", "restore");
  const int64_t step = p.choice.step;
  p.sources.cat.step = step;
  p.sources.cat.from_pfs = p.choice.from_pfs;
  if (!p.choice.from_pfs) p.sources.cat.where = "host memory";
  // Each distinct target layout travels once: from the lowest rank that has it.
  bool send_layout = true;
  for (size_t r = 0; r < inv.size(); ++r) {
    p.hashes.push_back(inv[r].layout_hash);
    if (r < static_cast<size_t>(env_.rank) && inv[r].layout_hash == layout_hash_)
      send_layout = false;
  }
  const std::string part = EncodeCatalogPart(send_layout ? std::string_view(layout_) : "",
                                             p.choice.from_pfs ? nullptr : &p.pinned);
  CAIRN_ASSIGN_OR_RETURN(auto all, GatherChecked(env_.group, pin_st, part));
  uint32_t saved_world = 0;  // of the job that saved the chosen step (one world: Choose)
  for (const Inventory& i : inv)
    for (const HeldVersion& v : i.held)
      if (v.step == step) saved_world = std::max(saved_world, v.world_size);
  for (size_t r = 0; r < all.size(); ++r) {
    auto got = DecodeCatalogPart(all[r], static_cast<int>(r));
    if (!got.ok()) return got.status().WithContext(who_);
    p.layouts.push_back(std::move(*got->mutable_layout()));
    if (!p.choice.from_pfs)
      CAIRN_RETURN_IF_ERROR(AddTables(static_cast<int>(r), *got->mutable_tables(), saved_world,
                                      &p.sources, &p.tensor_ids, &p.piece_ids)
                                .WithContext(who_));
  }
  if (p.choice.from_pfs) {
    p.sources.cat.where = p.step_dir;
    CatalogFromManifest(p.manifest, &p.sources.cat);
  }
  return true;
}

void Restorer::Skip(ChosenStep& p, const Status& why) {
  env_.log->Warning("skipping step " + std::to_string(p.choice.step) +
                    " on the PFS: " + why.ToString());
  skipped_.push_back(why.message());
  excluded_.insert({p.choice.step, true});
}

Result<bool> Restorer::FetchManifest(ChosenStep& p) {
  const int64_t step = p.choice.step;
  p.step_dir = JoinPath(env_.pfs_job_dir, StepDirName(step));
  std::string encoded;
  Status read_st;
  if (env_.rank == 0) {
    auto m = ReadManifestFile(env_.pfs_fs, p.step_dir);
    if (m.ok())
      encoded = EncodeManifest(*m);
    else
      read_st = m.status();
  }
  wire::Checked frame;
  wire::ToWire(read_st, frame.mutable_status());
  frame.set_payload(std::move(encoded));
  CAIRN_ASSIGN_OR_RETURN(std::string got, env_.group->Broadcast(0, wire::Encode(frame)));
  auto back = wire::Decode<wire::Checked>(got, "manifest from rank 0");
  if (!back.ok()) return back.status().WithContext(who_);
  Status st0 = wire::FromWire(back->status());
  if (!st0.ok()) {
    // An unreadable MANIFEST: skip the step like a corrupt one.
    Skip(p, st0);
    return false;
  }
  CAIRN_ASSIGN_OR_RETURN(p.manifest, DecodeManifest(back->payload()));
  return true;
}

Result<bool> Restorer::PlanFromIndex(ChosenStep& p) {
  p.planned_alone = true;
  const pb::Manifest saved = std::move(p.manifest);
  std::vector<std::pair<std::string, Box>> want;
  for (const ShardSpec& t : targets_) want.push_back({t.meta.name, t.box});
  const int blob_rank = env_.rank < static_cast<int>(saved.world_size()) ? env_.rank : -1;
  const int64_t plan_t0 = NowNanos();
  Status st = [&]() -> Status {
    CAIRN_ASSIGN_OR_RETURN(p.manifest, PartialManifest(saved, want, blob_rank,
                                                       FileIndexReader(env_.pfs_fs, p.step_dir)));
    p.sources.cat.step = p.choice.step;
    p.sources.cat.from_pfs = true;
    p.sources.cat.where = p.step_dir;
    CatalogFromManifest(p.manifest, &p.sources.cat);
    CAIRN_ASSIGN_OR_RETURN(RankRestorePlan own, PlanOwnTargets(p.sources.cat, LayoutOf(targets_),
                                                               env_.rank, env_.group->size()));
    p.lt = std::move(own.lt);
    p.plan = std::move(own.plan);
    return Status::OK();
  }();
  Trace::Record("restore plan", "restore", plan_t0, NowNanos());
  p.sources.cat.where = p.step_dir;
  std::vector<std::string> names;
  for (const pb::Tensor& t : saved.tensors()) names.push_back(t.name());
  return CheckAlone(p, std::move(st), names, /*skip_corrupt=*/true);
}

Result<bool> Restorer::CheckAlone(ChosenStep& p, Status st,
                                  const std::vector<std::string>& saved_names, bool skip_corrupt,
                                  const std::unordered_set<std::string_view>* targeted) {
  if (!st.ok()) st = st.WithContext(who_ + ", step " + std::to_string(p.choice.step));
  // Every rank knows `targeted` alike, so every rank takes the same branch here (whatever
  // its options_.partial).
  const bool known =
      targeted && std::all_of(saved_names.begin(), saved_names.end(),
                              [&](const std::string& n) { return targeted->contains(n); });
  // Otherwise: the saved tensors this rank's targets name (runs of their indices).
  const auto count = static_cast<uint32_t>(saved_names.size());
  std::string named;
  if (!known) {
    std::unordered_map<std::string_view, uint32_t> ids;
    for (uint32_t i = 0; i < count; ++i) ids.emplace(saved_names[i], i);
    std::vector<uint32_t> mine;
    for (const ShardSpec& t : targets_)
      if (auto it = ids.find(t.meta.name); it != ids.end()) mine.push_back(it->second);
    std::sort(mine.begin(), mine.end());
    mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
    named = EncodeTargeted(mine, count);
  }
  auto all = GatherChecked(env_.group, st, named);
  if (!all.ok()) {
    if (!skip_corrupt || all.status().code() != StatusCode::kCorruption) return all.status();
    Skip(p, all.status());
    return false;
  }
  if (options_.partial || known) return true;
  // How many ranks name each index, from the runs' starts and ends.
  std::vector<int64_t> starts(static_cast<size_t>(count) + 1, 0);
  for (size_t r = 0; r < all->size(); ++r) {
    CAIRN_ASSIGN_OR_RETURN(auto runs, DecodeTargeted((*all)[r], count, static_cast<int>(r)));
    for (auto [b, e] : runs) ++starts[b], --starts[e];
  }
  std::vector<std::string> missing;
  size_t unnamed = 0;
  int64_t naming = 0;
  for (uint32_t i = 0; i < count; ++i) {
    naming += starts[i];
    if (naming > 0) continue;
    if (unnamed++ < 5) missing.push_back(saved_names[i]);
  }
  if (unnamed == 0) return true;
  return Unrestored(p, missing, unnamed);
}

Status Restorer::Unrestored(const ChosenStep& p, const std::vector<std::string>& names,
                            size_t count) const {
  std::string list;
  for (size_t i = 0; i < names.size() && i < 5; ++i) list += (i ? ", '" : "'") + names[i] + "'";
  if (count > 5) list += " and " + std::to_string(count - 5) + " more";
  return Status::InvalidArgument(who_ + ", step " + std::to_string(p.choice.step) + " (" +
                                 p.sources.cat.where + "): saved tensor(s) " + list +
                                 " are in no rank's targets (RestoreOptions::partial allows "
                                 "that)");
}

Status Restorer::Plan(ChosenStep& p) {
  TraceSpan span("restore plan", "restore");
  for (auto& piece : p.sources.cat.pieces) std::sort(piece.holders.begin(), piece.holders.end());
  const int64_t plan_t0 = NowNanos();
  auto plan = PlanJobWide(p.sources.cat, p.layouts, p.hashes);
  Trace::Record("restore plan", "restore", plan_t0, NowNanos());
  if (!plan.ok()) return plan.status();
  p.lt = std::move(plan->lt);
  p.plan = std::move(plan->plan);
  const auto& unrestored = p.plan.unrestored;
  if (unrestored.empty() || options_.partial) return Status::OK();
  return Unrestored(p, unrestored, unrestored.size());
}

namespace {

// Whether some source rank's version of `step` is held only as blobs-only replicas.
bool SourceWithoutTensors(const std::vector<Inventory>& inv, int64_t step) {
  std::map<int, bool> whole;  // source -> some holder has its tensors
  for (const Inventory& i : inv)
    for (const HeldVersion& v : i.held)
      if (v.step == step) whole[v.source] = whole[v.source] || !v.blobs_only;
  for (const auto& [source, yes] : whole)
    if (!yes) return true;
  return false;
}

// Per source rank of `step` (the saved job's world: Choose made it one), the ranks holding
// its version, lowest first.
std::vector<std::vector<int>> FindHolders(const std::vector<Inventory>& inv, int64_t step) {
  uint32_t saved_world = 0;
  for (const Inventory& i : inv)
    for (const HeldVersion& v : i.held)
      if (v.step == step) saved_world = std::max(saved_world, v.world_size);
  std::vector<std::vector<int>> holders(saved_world);
  for (size_t r = 0; r < inv.size(); ++r)
    for (const HeldVersion& v : inv[r].held)
      if (v.step == step && !v.blobs_only && v.source >= 0 &&
          static_cast<uint32_t>(v.source) < saved_world &&
          (holders[v.source].empty() || holders[v.source].back() != static_cast<int>(r)))
        holders[v.source].push_back(static_cast<int>(r));
  return holders;
}

}  // namespace

Result<std::vector<LayoutRefs>> Restorer::GatherLayoutRefs(
    const ChosenStep& p, const Status& pin_st, const std::vector<std::vector<int>>& holders,
    std::map<uint64_t, std::string>* my_templates) {
  const uint32_t saved_world = static_cast<uint32_t>(holders.size());
  LayoutRefs mine;
  auto refer = [&](const RankLayout& l, int r, int w, TemplateRef* ref) {
    if (!env_.templates) return;
    auto rec = RecognizeLayout(l, r, w);
    if (!rec) return;
    std::string enc = EncodeTemplate(rec->layout_template);
    *ref = {true, TemplateHash(enc), rec->index};
    my_templates->emplace(ref->hash, std::move(enc));
  };
  refer(LayoutOf(targets_), env_.rank, env_.group->size(), &mine.target);
  std::set<int> reported;
  for (const auto& pv : p.pinned) {
    const SlotHeader& h = pv->header();
    const int src = static_cast<int>(h.rank);
    if (src >= static_cast<int>(saved_world) || holders[src].empty() ||
        holders[src].front() != env_.rank || !reported.insert(src).second)
      continue;
    SavedRef s;
    s.source = src;
    s.chunk_bytes = h.chunk_bytes;
    s.blob_bytes = EncodeBlobs(h, pv->data()).size();
    refer(SlotLayout(h), src, static_cast<int>(saved_world), &s.layout);
    mine.saved.push_back(s);
  }
  CAIRN_ASSIGN_OR_RETURN(auto all, GatherChecked(env_.group, pin_st, EncodeLayoutRefs(mine)));
  std::vector<LayoutRefs> refs(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    auto d = DecodeLayoutRefs(all[r]);
    if (!d.ok()) return d.status().WithContext(who_ + ": from rank " + std::to_string(r));
    refs[r] = std::move(*d);
  }
  return refs;
}

Result<std::map<uint64_t, LayoutTemplate>> Restorer::GatherTemplateBodies(
    const std::vector<LayoutRefs>& refs, const std::map<uint64_t, std::string>& my_templates) {
  std::map<uint64_t, int> first;
  for (size_t r = 0; r < refs.size(); ++r) {
    first.emplace(refs[r].target.hash, static_cast<int>(r));
    for (const SavedRef& s : refs[r].saved) first.emplace(s.layout.hash, static_cast<int>(r));
  }
  std::vector<std::string> send;
  for (const auto& [hash, enc] : my_templates)
    if (first.at(hash) == env_.rank) send.push_back(enc);
  CAIRN_ASSIGN_OR_RETURN(auto lists,
                         GatherChecked(env_.group, Status::OK(), EncodeTemplateList(send)));
  std::map<uint64_t, LayoutTemplate> templates;
  for (size_t r = 0; r < lists.size(); ++r) {
    auto list = DecodeTemplateList(lists[r]);
    if (!list.ok()) return list.status().WithContext(who_ + ": from rank " + std::to_string(r));
    for (const std::string& enc : *list) {
      auto t = DecodeTemplate(enc);
      if (!t.ok()) return t.status().WithContext(who_ + ": from rank " + std::to_string(r));
      templates.emplace(TemplateHash(enc), std::move(*t));
    }
  }
  return templates;
}

Result<bool> Restorer::GatherTemplates(const std::vector<Inventory>& inv, ChosenStep& p,
                                       const Status& pin_st, TemplatedMemoryStep* out) {
  std::vector<std::vector<int>> holders = FindHolders(inv, p.choice.step);
  // Gather 1: template references (this rank's targets; the versions it is the lowest
  // holder of).
  std::map<uint64_t, std::string> my_templates;
  CAIRN_ASSIGN_OR_RETURN(auto refs, GatherLayoutRefs(p, pin_st, holders, &my_templates));
  bool templated = false;
  CAIRN_ASSIGN_OR_RETURN(auto of_source,
                         IndexSavedRefs(refs, p.choice.step, holders, who_, &templated));
  if (!templated) return false;
  // Gather 2: each template once, from the first rank naming it.
  CAIRN_ASSIGN_OR_RETURN(auto templates, GatherTemplateBodies(refs, my_templates));
  CAIRN_ASSIGN_OR_RETURN(auto step,
                         MemoryStepFromRefs(p.choice.step, holders, refs, of_source, templates));
  if (!step) return false;
  *out = std::move(*step);
  // Blobs: every holder of a source can provide them; the first one sends.
  p.sources.blob_providers.resize(holders.size());
  for (size_t s = 0; s < holders.size(); ++s)
    for (int h : holders[s]) p.sources.blob_providers[s].push_back({h, of_source[s]->blob_bytes});
  return true;
}

Result<bool> Restorer::PlanMemoryFromTemplates(const std::vector<Inventory>& inv, ChosenStep& p,
                                               const Status& pin_st) {
  TraceSpan span("restore plan from templates", "restore");
  TemplatedMemoryStep ts;
  CAIRN_ASSIGN_OR_RETURN(bool templated, GatherTemplates(inv, p, pin_st, &ts));
  if (!templated) return false;
  p.planned_alone = true;
  const int64_t plan_t0 = NowNanos();
  Status st = [&]() -> Status {
    CAIRN_ASSIGN_OR_RETURN(MemoryPlanAlone mp, PlanMemoryAlone(ts, env_.rank));
    p.sources.cat = std::move(mp.cat);
    p.lt = std::move(mp.lt);
    p.plan = std::move(mp.plan);
    return Status::OK();
  }();
  Trace::Record("restore plan", "restore", plan_t0, NowNanos());
  p.sources.cat.where = "host memory";
  for (uint32_t t = 0; t < p.sources.cat.tensors.size(); ++t)
    p.tensor_ids.emplace(p.sources.cat.tensors[t].name, t);
  for (uint32_t i = 0; i < p.sources.cat.pieces.size(); ++i) {
    const LoadPiece& piece = p.sources.cat.pieces[i];
    std::vector<int64_t> key = piece.box.offsets;
    key.insert(key.end(), piece.box.lengths.begin(), piece.box.lengths.end());
    p.piece_ids.emplace(std::make_pair(piece.tensor, std::move(key)), i);
  }
  std::vector<std::string> names;
  for (const TensorMeta& t : ts.saved.tensors) names.push_back(t.name);
  // The tensors some rank's targets name: the target plan's (its templates are those the
  // ranks' targets name, MemoryStepFromRefs).
  std::unordered_set<std::string_view> targeted;
  for (const TensorMeta& m : ts.targets.tensors) targeted.insert(m.name);
  // (A Corruption here is an error: memory versions that fail verification are skipped
  // after the transfer.)
  CAIRN_RETURN_IF_ERROR(
      CheckAlone(p, std::move(st), names, /*skip_corrupt=*/false, &targeted).status());
  return true;
}

Status Restorer::ExchangeBlobs(ChosenStep& p, Attempt& a, std::string* blob_bytes) {
  Status st;
  const auto& providers = p.sources.blob_providers;
  // Senders: every rank whose blobs this rank provides.
  for (size_t t = 0; t < providers.size() && t < p.lt.class_of_rank.size(); ++t) {
    const auto& prov = providers[t];
    if (prov.empty() || static_cast<int>(t) == env_.rank) continue;
    bool t_has = false;
    for (auto [h, n] : prov) t_has |= h == static_cast<int>(t);
    if (t_has || prov.front().first != env_.rank) continue;
    for (const auto& pv : p.pinned)
      if (pv->header().rank == t) {
        std::string enc = EncodeBlobs(pv->header(), pv->data());
        auto* buf = a.Staging(enc.size());
        std::memcpy(buf, enc.data(), enc.size());
        Status s = env_.transport->Send(static_cast<int>(t), kBlobSeq, buf, enc.size());
        if (!s.ok() && st.ok()) st = s;
        break;
      }
  }
  if (static_cast<size_t>(env_.rank) < providers.size()) {
    const auto& prov = providers[static_cast<size_t>(env_.rank)];
    bool mine_held = false;
    for (auto [h, n] : prov) mine_held |= h == env_.rank;
    if (mine_held) {
      *blob_bytes = EncodeBlobs(p.pinned.front()->header(), p.pinned.front()->data());
    } else if (!prov.empty()) {
      blob_bytes->resize(prov.front().second);
      Status s = env_.transport->PostRecv(prov.front().first, kBlobSeq, blob_bytes->data(),
                                          blob_bytes->size());
      if (!s.ok() && st.ok()) st = s;
    }
  }
  return st;
}

Status Restorer::Transfer(ChosenStep& p, Attempt& a, RestoreReport& r) {
  for (const auto& pv : p.pinned) {
    for (const SlotShard& s : pv->header().shards) {
      auto tid = p.tensor_ids.find(s.name);
      if (tid == p.tensor_ids.end()) continue;
      std::vector<int64_t> key = s.box.offsets;
      key.insert(key.end(), s.box.lengths.begin(), s.box.lengths.end());
      auto pid = p.piece_ids.find({tid->second, key});
      if (pid != p.piece_ids.end()) a.local.emplace(pid->second, std::make_pair(pv.get(), &s));
    }
  }
  // Blobs of the same rank number: received from a holder, or read from the PFS.
  std::string blob_bytes;
  Status st;
  if (!p.choice.from_pfs) {
    TraceSpan span("restore blobs", "restore");
    st = ExchangeBlobs(p, a, &blob_bytes);
  }
  if (st.ok()) {
    TraceSpan span("restore transfer", "restore");
    st = a.Run();
  }
  if (st.ok() && p.choice.from_pfs && env_.rank < static_cast<int>(p.manifest.world_size())) {
    Blobs b;
    st = ReadRankBlobs(env_.pfs_fs, p.step_dir, p.manifest, env_.rank, &b);
    if (st.ok()) r.blobs = std::move(b);
  } else if (st.ok() && !blob_bytes.empty()) {
    st = DecodeBlobs(blob_bytes, &r.blobs)
             .WithContext(who_ + ": blobs of step " + std::to_string(p.choice.step));
  }
  if (st.ok() && !a.corrupt.ok()) st = a.corrupt;
  return st;
}

Status Restorer::ShareBlobsWithNewRanks(const ChosenStep& p, RestoreReport& r) {
  const size_t saved_world =
      p.choice.from_pfs ? p.manifest.world_size() : p.sources.blob_providers.size();
  r.blobs_rank = saved_world == 0 || static_cast<size_t>(env_.rank) < saved_world ? env_.rank : -1;
  if (saved_world == 0 || saved_world >= static_cast<size_t>(env_.group->size()))
    return Status::OK();
  CAIRN_ASSIGN_OR_RETURN(std::string bytes,
                         env_.group->Broadcast(0, env_.rank == 0 ? EncodeBlobs(r.blobs) : ""));
  if (r.blobs_rank >= 0) return Status::OK();
  Blobs b;
  CAIRN_RETURN_IF_ERROR(DecodeBlobs(bytes, &b).WithContext(who_ + ": blobs of rank 0, step " +
                                                           std::to_string(p.choice.step)));
  r.blobs = std::move(b);
  r.blobs_rank = 0;
  return Status::OK();
}

Result<bool> Restorer::Outcome(const Status& st, ChosenStep& p, RestoreReport& r) {
  TraceSpan span("restore outcome", "restore");
  wire::RestoreOutcome mine;
  wire::ToWire(st, mine.mutable_status());
  mine.set_pfs_bytes_read(r.pfs_bytes_read);
  mine.set_needed_bytes(p.planned_alone ? p.plan.unique_bytes_needed : 0);
  auto gathered = env_.group->AllGather(wire::Encode(mine));
  if (!gathered.ok()) {
    // This rank's own failure (a link cut mid-transfer) is what the user needs first; the
    // collective after it fails for the same reason.
    if (st.ok()) return gathered.status();
    return Status(st.code(), st.message() + " (then the ranks could not compare outcomes: " +
                                 gathered.status().message() + ")");
  }
  auto& outcomes = *gathered;
  Status first_bad, first_corrupt;
  uint64_t job_pfs = 0, job_needed = 0;
  for (size_t k = 0; k < outcomes.size(); ++k) {
    auto o = wire::Decode<wire::RestoreOutcome>(outcomes[k],
                                                "restore outcome from rank " + std::to_string(k));
    const Status s = o.ok() ? wire::FromWire(o->status()) : o.status();
    const uint64_t n = o.ok() ? o->pfs_bytes_read() : 0;
    const uint64_t needed = o.ok() ? o->needed_bytes() : 0;
    job_pfs += n;
    job_needed += needed;
    if (s.code() == StatusCode::kCorruption) {
      if (first_corrupt.ok()) first_corrupt = s;
    } else if (!s.ok() && first_bad.ok()) {
      first_bad = s;
    }
  }
  if (!first_bad.ok()) return first_bad;
  if (!first_corrupt.ok()) {
    const int64_t step = p.choice.step;
    env_.log->Warning("skipping step " + std::to_string(step) + " in " +
                      (p.choice.from_pfs ? "the PFS" : "memory") + ": " + first_corrupt.message() +
                      "; trying the next older version");
    skipped_.push_back(first_corrupt.message());
    excluded_.insert({step, p.choice.from_pfs});
    return false;
  }
  r.job_pfs_bytes_read = job_pfs;
  p.job_needed = job_needed;
  return true;
}

void Restorer::Describe(const ChosenStep& p, RestoreReport& r) const {
  r.step = p.choice.step;
  r.skipped = skipped_;
  r.tier = p.choice.from_pfs ? "pfs" : r.bytes_received > 0 ? "peer" : "host";
  for (const ShardSpec& t : targets_) r.bytes += t.nbytes();
  const uint32_t c = p.lt.class_of_rank[static_cast<size_t>(env_.rank)];
  for (const LoadPlan::Fill& f : p.plan.fills[c]) {
    const LoadPiece& piece = p.sources.cat.pieces[p.plan.spans[f.span].piece];
    if (!(f.region == targets_[f.target].box) || !(f.region == piece.box)) r.resharded = true;
  }
  if (p.choice.from_pfs) {
    // PFS pieces are slabs of the saved shards: compare with the shards ranks held.
    std::set<std::pair<uint32_t, std::vector<int64_t>>> saved;
    for (const pb::Shard& s : p.manifest.shards()) {
      std::vector<int64_t> key(s.offsets().begin(), s.offsets().end());
      key.insert(key.end(), s.lengths().begin(), s.lengths().end());
      saved.insert({s.tensor(), std::move(key)});
    }
    r.resharded = false;
    std::unordered_map<std::string, uint32_t> ids;
    for (int i = 0; i < p.manifest.tensors_size(); ++i) ids[p.manifest.tensors(i).name()] = i;
    for (const ShardSpec& t : targets_) {
      std::vector<int64_t> key = t.box.offsets;
      key.insert(key.end(), t.box.lengths.begin(), t.box.lengths.end());
      if (!saved.count({ids[t.meta.name], key})) r.resharded = true;
    }
  }
  r.job_unique_bytes_needed = p.planned_alone ? p.job_needed : p.plan.unique_bytes_needed;
  r.plan = p.plan_path;
  r.seconds = NanosToSeconds(NowNanos() - t0_);
}

Result<RestoreReport> Restorer::Run() {
  for (;;) {
    CAIRN_ASSIGN_OR_RETURN(std::vector<Inventory> inv, Discover());
    ChosenStep p;
    CAIRN_ASSIGN_OR_RETURN(p.choice, Agree(inv));
    if (p.choice.from_pfs) {
      CAIRN_ASSIGN_OR_RETURN(bool readable, FetchManifest(p));
      if (!readable) continue;
    }
    // Which planner (layout/restore_plan.h); the gathers it needs run here.
    RestoreFacts facts;
    facts.from_pfs = p.choice.from_pfs;
    facts.indexed_manifest =
        p.choice.from_pfs && p.manifest.format_version() == kTemplatedManifestVersion;
    facts.templates_on = env_.templates;
    RestorePlanChoice how = ChooseRestorePlan(facts);
    if (how.route == RestoreRoute::kPfsIndex) {
      // No target layouts gathered, no job-wide plan: each rank reads what it needs.
      CAIRN_ASSIGN_OR_RETURN(bool usable, PlanFromIndex(p));
      if (!usable) continue;
    } else {
      const Status pin_st = p.choice.from_pfs ? Status::OK() : Pin(p);
      // A source held only as blobs-only replicas (data parallel) has no holder to report
      // its layout: the job-wide catalog takes its boxes from the other sources' versions.
      const bool blobs_only = !p.choice.from_pfs && SourceWithoutTensors(inv, p.choice.step);
      if (blobs_only) {
        facts.source_without_tensors = true;
        how = ChooseRestorePlan(facts);
      }
      if (how.route == RestoreRoute::kMemoryTemplates) {
        CAIRN_ASSIGN_OR_RETURN(bool alone, PlanMemoryFromTemplates(inv, p, pin_st));
        facts.every_layout_templated = alone;
        how = ChooseRestorePlan(facts);
      }
      if (how.route == RestoreRoute::kJobWide) {
        CAIRN_ASSIGN_OR_RETURN(bool usable, Catalog(inv, p, pin_st));
        if (!usable) continue;
        Status planned = Plan(p);
        if (!planned.ok() && blobs_only && planned.code() == StatusCode::kInvalidArgument) {
          // The ranks whose boxes a blobs-only replica left to others no longer hold them
          // (a layout that changed while the replicas were pushed): an older step, or the
          // PFS. Every rank planned the same catalog, so every rank skips it alike.
          env_.log->Warning("skipping step " + std::to_string(p.choice.step) +
                            " in host memory: " + planned.ToString());
          skipped_.push_back(planned.message());
          excluded_.insert({p.choice.step, false});
          continue;
        }
        CAIRN_RETURN_IF_ERROR(planned);
      }
    }
    p.plan_path = how.Path();
    RestoreReport r;
    Attempt a(env_, targets_, p.sources.cat, p.plan);
    a.manifest = p.choice.from_pfs ? &p.manifest : nullptr;
    a.step_dir = p.step_dir;
    a.report = &r;
    a.who = who_ + ", step " + std::to_string(p.choice.step);
    a.cls = p.lt.class_of_rank[static_cast<size_t>(env_.rank)];
    const Status st = Transfer(p, a, r);
    CAIRN_ASSIGN_OR_RETURN(bool done, Outcome(st, p, r));
    if (!done) continue;
    CAIRN_RETURN_IF_ERROR(ShareBlobsWithNewRanks(p, r));
    Describe(p, r);
    return r;
  }
}

}  // namespace

Result<RestoreReport> Restore(const RestoreEnv& env, std::span<const ShardSpec> targets,
                              const RestoreOptions& options) {
  return Restorer(env, targets, options).Run();
}

}  // namespace cairn
