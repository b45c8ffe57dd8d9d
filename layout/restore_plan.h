// Restore planning's one entry point: which planner a step goes to and why, and the
// planners themselves once the gathers the route names have run. recovery/restore.cc runs
// the gathers and the transfer; nothing here knows the PFS, UCX or a slot.
//
//   route              gathers (recovery/)                        plan (per rank)
//   kPfsIndex          none: each rank reads the index files      PlanOwnTargets
//                      its targets need (persist/step_index.h)
//   kMemoryTemplates   every rank's template references, then     PlanMemoryAlone
//                      each template once (IndexSavedRefs,        (layout/memory_plan.h)
//                      MemoryStepFromRefs)
//   kJobWide           every target layout and every shard        PlanJobWide: the whole job
//                      table (or the MANIFEST)
//
// ChooseRestorePlan decides; a memory step tried with templates whose layouts turn out not
// all to be templates asks again with every_layout_templated false and goes job-wide. The
// choice's Path() is RestoreReport::plan, as PersistPlan::Path() is the save's.
// Thread-safety: plain functions and values.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cairn/status.h"
#include "layout/layout_template.h"
#include "layout/load_planner.h"
#include "layout/memory_plan.h"
#include "layout/save_planner.h"

namespace cairn {

enum class RestoreRoute { kPfsIndex, kMemoryTemplates, kJobWide };

// What the choice depends on.
struct RestoreFacts {
  bool from_pfs = false;
  bool indexed_manifest = false;  // PFS: the MANIFEST is format 2 (index files per rank)
  bool templates_on = true;       // CAIRN_LAYOUT_TEMPLATES
  // A memory step after its template-reference gather: false when some target or saved
  // layout is no template or the templates disagree. nullopt: not gathered yet.
  std::optional<bool> every_layout_templated;
  // A memory step where some source rank's version is held only as blobs-only replicas
  // (data parallel: its boxes come from other sources' versions), so its layout is in no
  // template the holders can report.
  bool source_without_tensors = false;
};

struct RestorePlanChoice {
  RestoreRoute route = RestoreRoute::kJobWide;
  std::string why;
  // "templated: <why>" for the per-rank routes, "general: <why>" for the job-wide one.
  std::string Path() const;
};

RestorePlanChoice ChooseRestorePlan(const RestoreFacts& facts);

// A plan and the target classes it was made for (PlanOwnTargets, PlanJobWide).
struct RankRestorePlan {
  LoadTargets lt;
  LoadPlan plan;
};

// kPfsIndex: this rank's plan over the pieces its targets meet (`cat`, from the index
// files): its layout as class 0, every other rank of `world` an empty class. Errors as
// MakeLoadPlan's for its own targets.
Result<RankRestorePlan> PlanOwnTargets(const LoadCatalog& cat, RankLayout mine, int rank,
                                       int world);

// kJobWide: every rank's plan, from every rank's encoded target layout and its hash (equal
// layouts form one class). `cat`'s holder lists must be sorted.
Result<RankRestorePlan> PlanJobWide(const LoadCatalog& cat, const std::vector<std::string>& layouts,
                                    const std::vector<uint64_t>& hashes);

// kMemoryTemplates. A rank's part of the first gather: its target layout as a template
// reference, and for each saved version of the step it is the lowest holder of, that
// version's layout as one, its chunk size and the size of its blobs. A layout that is no
// template is `templated` false.
struct TemplateRef {
  bool templated = false;
  uint64_t hash = 0;  // TemplateHash of the encoded template
  uint32_t index = 0;
};
struct SavedRef {
  int32_t source = 0;
  TemplateRef layout;
  uint64_t chunk_bytes = 0;
  uint64_t blob_bytes = 0;  // EncodeBlobs size
};
struct LayoutRefs {
  TemplateRef target;
  std::vector<SavedRef> saved;
};

// Every source's reference, from its first holder (`holders`: per source rank of the
// step, the ranks holding its version, ascending). Corruption (naming `who`) when a rank
// reports a version it is not the first holder of. *every_templated: every target and
// every source has a template reference (else the job-wide route).
Result<std::vector<const SavedRef*>> IndexSavedRefs(const std::vector<LayoutRefs>& refs,
                                                    int64_t step,
                                                    const std::vector<std::vector<int>>& holders,
                                                    const std::string& who, bool* every_templated);

// After the second gather (`templates`, by hash): the step's saved plan, target plan and
// chunk size. nullopt: a template is missing or the templates disagree (job-wide route).
// InvalidArgument when the sources saved with different chunk sizes.
Result<std::optional<TemplatedMemoryStep>> MemoryStepFromRefs(
    int64_t step, const std::vector<std::vector<int>>& holders, const std::vector<LayoutRefs>& refs,
    const std::vector<const SavedRef*>& of_source,
    const std::map<uint64_t, LayoutTemplate>& templates);

}  // namespace cairn
