#include "layout/restore_plan.h"

#include <functional>
#include <utility>

#include "core/arith.h"
#include "layout/templated_plan.h"

namespace cairn {

std::string RestorePlanChoice::Path() const {
  return (route == RestoreRoute::kJobWide ? "general: " : "templated: ") + why;
}

RestorePlanChoice ChooseRestorePlan(const RestoreFacts& f) {
  if (f.from_pfs) {
    if (f.indexed_manifest)
      return {RestoreRoute::kPfsIndex,
              "the step was saved from layout templates (MANIFEST format 2)"};
    return {RestoreRoute::kJobWide, "the step was saved with the general plan"};
  }
  if (!f.templates_on) return {RestoreRoute::kJobWide, "layout templates are off"};
  if (f.source_without_tensors)
    return {RestoreRoute::kJobWide,
            "a saving rank's version is held only as a blobs-only replica (its boxes are its "
            "data-parallel peers')"};
  if (f.every_layout_templated.value_or(true))
    return {RestoreRoute::kMemoryTemplates, "every target and saved layout is a layout template"};
  return {RestoreRoute::kJobWide, "some target or saved layout is no layout template"};
}

Result<RankRestorePlan> PlanOwnTargets(const LoadCatalog& cat, RankLayout mine, int rank,
                                       int world) {
  RankRestorePlan out;
  out.lt.classes = {std::move(mine), RankLayout{}};
  out.lt.class_of_rank.assign(static_cast<size_t>(world), 1);
  out.lt.class_of_rank[static_cast<size_t>(rank)] = 0;
  CAIRN_ASSIGN_OR_RETURN(out.plan, MakeLoadPlan(cat, out.lt));
  return out;
}

Result<RankRestorePlan> PlanJobWide(const LoadCatalog& cat, const std::vector<std::string>& layouts,
                                    const std::vector<uint64_t>& hashes) {
  RankRestorePlan out;
  CAIRN_ASSIGN_OR_RETURN(out.lt, GroupTargets(layouts, hashes));
  CAIRN_ASSIGN_OR_RETURN(out.plan, MakeLoadPlan(cat, out.lt));
  return out;
}

Result<std::vector<const SavedRef*>> IndexSavedRefs(const std::vector<LayoutRefs>& refs,
                                                    int64_t step,
                                                    const std::vector<std::vector<int>>& holders,
                                                    const std::string& who, bool* every_templated) {
  std::vector<const SavedRef*> of_source(holders.size(), nullptr);
  bool templated = true;
  for (const LayoutRefs& r : refs) templated = templated && r.target.templated;
  for (size_t r = 0; r < refs.size(); ++r)
    for (const SavedRef& s : refs[r].saved) {
      if (s.source < 0 || static_cast<size_t>(s.source) >= of_source.size() ||
          holders[s.source].empty() || holders[s.source].front() != static_cast<int>(r) ||
          of_source[s.source])
        return Status::Corruption(who + ": rank " + std::to_string(r) +
                                  " reported the layout of rank " + std::to_string(s.source) +
                                  "'s version of step " + std::to_string(step) +
                                  ", which it is not the first holder of");
      of_source[s.source] = &s;
      templated = templated && s.layout.templated;
    }
  for (const SavedRef* s : of_source) templated = templated && s;
  *every_templated = templated;
  return of_source;
}

namespace {

// The plan of `n` ranks whose layouts `ref_of(r)` names (nullopt: a template is missing
// or the templates disagree).
std::optional<TemplatedPlan> PlanOfRefs(const std::map<uint64_t, LayoutTemplate>& templates,
                                        size_t n,
                                        const std::function<const TemplateRef&(size_t)>& ref_of) {
  std::vector<LayoutTemplate> list;
  std::map<uint64_t, uint32_t> ids;
  std::vector<uint32_t> rank_template(n), rank_index(n);
  std::vector<uint64_t> hashes(n);
  for (size_t r = 0; r < n; ++r) {
    const TemplateRef& ref = ref_of(r);
    auto it = templates.find(ref.hash);
    if (it == templates.end()) return std::nullopt;
    auto [id, fresh] = ids.emplace(ref.hash, static_cast<uint32_t>(list.size()));
    if (fresh) list.push_back(it->second);
    rank_template[r] = id->second;
    rank_index[r] = ref.index;
    hashes[r] = TemplatedLayoutHash(ref.hash, ref.index);
  }
  std::string why;
  return MakeTemplatedPlan(std::move(list), std::move(rank_template), std::move(rank_index),
                           std::move(hashes), nullptr, &why);
}

}  // namespace

Result<std::optional<TemplatedMemoryStep>> MemoryStepFromRefs(
    int64_t step, const std::vector<std::vector<int>>& holders, const std::vector<LayoutRefs>& refs,
    const std::vector<const SavedRef*>& of_source,
    const std::map<uint64_t, LayoutTemplate>& templates) {
  TemplatedMemoryStep ts;
  ts.step = step;
  ts.chunk_bytes = of_source.empty() ? 0 : of_source[0]->chunk_bytes;
  for (const SavedRef* s : of_source)
    if (s->chunk_bytes != ts.chunk_bytes || s->chunk_bytes == 0 || s->chunk_bytes > kMaxChunkBytes)
      return Status::InvalidArgument(
          "ranks saved step " + std::to_string(step) + " with different chunk sizes (" +
          std::to_string(s->chunk_bytes) + " and " + std::to_string(ts.chunk_bytes) + ")");
  auto saved = PlanOfRefs(templates, of_source.size(),
                          [&](size_t s) -> const TemplateRef& { return of_source[s]->layout; });
  auto wanted = PlanOfRefs(templates, refs.size(),
                           [&](size_t r) -> const TemplateRef& { return refs[r].target; });
  if (!saved || !wanted) return std::optional<TemplatedMemoryStep>();
  ts.saved = std::move(*saved);
  ts.targets = std::move(*wanted);
  ts.holders = holders;
  return std::optional<TemplatedMemoryStep>(std::move(ts));
}

}  // namespace cairn
