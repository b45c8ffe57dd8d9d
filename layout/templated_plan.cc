#include "layout/templated_plan.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "core/checksum.h"
#include "wire/codec.h"

namespace cairn {
namespace {

bool Lists(const std::vector<uint32_t>& sorted, uint32_t v) {
  return std::binary_search(sorted.begin(), sorted.end(), v);
}

}  // namespace

std::vector<WritePiece> WritePiecesOf(const SavePlan& plan, int rank) {
  std::vector<WritePiece> out;
  const auto& list = plan.lists[plan.rank_list[static_cast<size_t>(rank)]];
  std::unordered_map<uint32_t, uint32_t> pos;  // plan shard -> index in the rank's slot
  for (uint32_t j = 0; j < list.size(); ++j) pos.emplace(list[j], j);
  for (size_t i : plan.PiecesOf(rank)) {
    const PlannedPiece& p = plan.pieces[i];
    out.push_back({plan.shards[p.shard].tensor, pos.at(p.shard), p.box, p.src_offset, p.nbytes});
  }
  return out;
}

namespace {

// Whole tensors grouped by the templates listing them (their holders).
using ByHolders = std::map<std::vector<uint32_t>, std::vector<uint32_t>>;

// Bytes of part `index` of tensor g.
uint64_t PartBytes(const TemplatedPlan& p, uint32_t g, uint32_t index) {
  return PartElements(p.tensors[g].global_shape, p.rules[g], index, p.parts[g]) *
         DTypeSize(p.tensors[g].dtype);
}

// 1. Every tensor once, with its rule; templates must agree on the tensors they share
// (their rules may differ: *conflicts lists those tensors, for SettleRules).
bool CatalogueTensors(TemplatedPlan& p, std::vector<uint32_t>* conflicts, std::string* why) {
  std::unordered_map<std::string, uint32_t> ids;
  p.global_ids.resize(p.templates.size());
  for (uint32_t t = 0; t < p.templates.size(); ++t) {
    const LayoutTemplate& lt = p.templates[t];
    for (size_t k = 0; k < lt.tensors.size(); ++k) {
      auto [it, fresh] = ids.emplace(lt.tensors[k].name, static_cast<uint32_t>(p.tensors.size()));
      const uint32_t g = it->second;
      const uint32_t n = lt.rules[k].split() ? lt.parts : 1;
      if (fresh) {
        p.tensors.push_back(lt.tensors[k]);
        p.rules.push_back(lt.rules[k]);
        p.parts.push_back(n);
        p.in_templates.emplace_back();
      } else if (p.tensors[g] == lt.tensors[k] && p.parts[g] == n && !(p.rules[g] == lt.rules[k]) &&
                 lt.rules[k].split() && p.rules[g].split()) {
        if (std::find(conflicts->begin(), conflicts->end(), g) == conflicts->end())
          conflicts->push_back(g);
      } else if (!(p.tensors[g] == lt.tensors[k]) || !(p.rules[g] == lt.rules[k]) ||
                 p.parts[g] != n) {
        *why = "tensor '" + lt.tensors[k].name + "' is " + p.rules[g].ToString() + " of " +
               std::to_string(p.parts[g]) + " in one rank's layout and " + lt.rules[k].ToString() +
               " of " + std::to_string(n) + " in another's (or its dtype or shape differ)";
        return false;
      }
      p.global_ids[t].push_back(g);
      p.in_templates[g].push_back(t);
    }
  }
  return true;
}

// 2. Classes: the distinct (template, index) pairs, i.e. the distinct layouts.
bool ClassifyRanks(TemplatedPlan& p, std::string* why) {
  const size_t world = p.rank_template.size();
  std::unordered_map<uint64_t, uint32_t> class_of;
  p.rank_class.resize(world);
  for (size_t r = 0; r < world; ++r) {
    const uint32_t t = p.rank_template[r], i = p.rank_index[r];
    if (t >= p.templates.size() || i >= p.templates[t].parts || i >= world) {
      *why = "rank " + std::to_string(r) + " names a template or index that does not exist";
      return false;
    }
    auto [it, fresh] = class_of.emplace((static_cast<uint64_t>(t) << 32) | i,
                                        static_cast<uint32_t>(class_of.size()));
    if (fresh) {
      p.class_ranks.emplace_back();
      p.class_template.push_back(t);
      p.class_index.push_back(i);
      if (p.index_classes.size() <= i) p.index_classes.resize(i + 1);
      p.index_classes[i].push_back(it->second);
    }
    p.class_ranks[it->second].push_back(static_cast<uint32_t>(r));
    p.rank_class[r] = it->second;
  }
  return true;
}

// 0. One part count per tensor. A rank whose boxes fit two part counts may have been
// described with another than the other ranks holding its tensors use (the last, shorter
// part of ceil chunks of 800 is often part 3999 of floor chunks of 4000: recognition tries
// the larger count first): each template whose split tensors are split into more or fewer
// parts elsewhere is described again, rank by rank, with the count the most ranks listing
// those tensors use (RecognizeLayout with `parts`), and the templates no rank names any
// more are dropped. False, saying why, when a rank cannot be described so; the plan
// then stays general. Runs only where counts differ, so an agreeing job pays one pass.
bool ReconcileParts(TemplatedPlan& p, std::string* why) {
  const size_t world = p.rank_template.size();
  for (size_t r = 0; r < world; ++r)  // (ClassifyRanks says what is wrong)
    if (p.rank_template[r] >= p.templates.size() ||
        p.rank_index[r] >= p.templates[p.rank_template[r]].parts)
      return true;
  std::vector<uint64_t> ranks_of(p.templates.size(), 0);
  for (uint32_t t : p.rank_template) ++ranks_of[t];
  // Per tensor name, the ranks listing it under each part count.
  std::unordered_map<std::string, std::map<uint32_t, uint64_t>> counts;
  for (size_t t = 0; t < p.templates.size(); ++t) {
    const LayoutTemplate& lt = p.templates[t];
    for (size_t k = 0; k < lt.tensors.size(); ++k)
      if (lt.rules[k].split()) counts[lt.tensors[k].name][lt.parts] += ranks_of[t];
  }
  auto majority = [&](const std::map<uint32_t, uint64_t>& c) {
    return std::max_element(c.begin(), c.end(),
                            [](const auto& a, const auto& b) { return a.second < b.second; })
        ->first;
  };
  // The templates to describe again, and the count each should use.
  std::vector<uint32_t> wanted(p.templates.size(), 0);
  bool any = false;
  for (size_t t = 0; t < p.templates.size(); ++t) {
    const LayoutTemplate& lt = p.templates[t];
    for (size_t k = 0; k < lt.tensors.size() && wanted[t] == 0; ++k) {
      if (!lt.rules[k].split()) continue;
      const auto& c = counts[lt.tensors[k].name];
      if (c.size() < 2) continue;
      if (const uint32_t m = majority(c); m != lt.parts) wanted[t] = m;
    }
    any = any || wanted[t] != 0;
  }
  if (!any) return true;
  std::vector<LayoutTemplate> kept;
  std::unordered_map<std::string, uint32_t> by_encoding;
  std::vector<int64_t> renumbered(p.templates.size(), -1);
  auto keep = [&](LayoutTemplate t) {
    auto [it, fresh] = by_encoding.emplace(EncodeTemplate(t), static_cast<uint32_t>(kept.size()));
    if (fresh) kept.push_back(std::move(t));
    return it->second;
  };
  for (size_t r = 0; r < world; ++r) {
    const uint32_t t = p.rank_template[r];
    if (wanted[t] == 0) {
      if (renumbered[t] < 0) renumbered[t] = keep(p.templates[t]);
      p.rank_template[r] = static_cast<uint32_t>(renumbered[t]);
      continue;
    }
    auto rec = RecognizeLayout(ExpandTemplate(p.templates[t], p.rank_index[r]), static_cast<int>(r),
                               static_cast<int>(world), wanted[t]);
    if (!rec) {
      *why = "rank " + std::to_string(r) + "'s layout is part " + std::to_string(p.rank_index[r]) +
             " of " + std::to_string(p.templates[t].parts) +
             " where the other ranks holding its tensors cut them into " +
             std::to_string(wanted[t]) + ", and no template of " + std::to_string(wanted[t]) +
             " parts describes it";
      return false;
    }
    p.rank_template[r] = keep(std::move(rec->layout_template));
    p.rank_index[r] = rec->index;
  }
  p.templates = std::move(kept);
  return true;
}

// 2b. Each tensor whose templates name different rules: the first of them (in template
// order) that gives every class listing it the boxes its own template's rule gives.
bool SettleRules(TemplatedPlan& p, const std::vector<uint32_t>& conflicts, std::string* why) {
  if (conflicts.empty()) return true;
  std::vector<std::vector<uint32_t>> classes_of(p.templates.size());  // template -> classes
  for (uint32_t c = 0; c < p.class_ranks.size(); ++c) classes_of[p.class_template[c]].push_back(c);
  for (uint32_t g : conflicts) {
    const Shape& shape = p.tensors[g].global_shape;
    // Each template's rule for g.
    std::vector<const SplitRule*> rule_of(p.templates.size(), nullptr);
    std::vector<const SplitRule*> candidates;
    for (uint32_t t : p.in_templates[g]) {
      const LayoutTemplate& lt = p.templates[t];
      const auto& ids = p.global_ids[t];
      const size_t k = static_cast<size_t>(std::find(ids.begin(), ids.end(), g) - ids.begin());
      rule_of[t] = &lt.rules[k];
      if (std::none_of(candidates.begin(), candidates.end(),
                       [&](const SplitRule* r) { return *r == lt.rules[k]; }))
        candidates.push_back(&lt.rules[k]);
    }
    const SplitRule* settled = nullptr;
    for (const SplitRule* r : candidates) {
      bool fits = true;
      for (uint32_t t : p.in_templates[g]) {
        if (*rule_of[t] == *r) continue;
        for (size_t k = 0; k < classes_of[t].size() && fits; ++k) {
          const uint32_t i = p.class_index[classes_of[t][k]];
          fits =
              PartBoxes(shape, *r, i, p.parts[g]) == PartBoxes(shape, *rule_of[t], i, p.parts[g]);
        }
        if (!fits) break;
      }
      if (fits) {
        settled = r;
        break;
      }
    }
    if (settled == nullptr) {
      *why = "tensor '" + p.tensors[g].name + "' is " + candidates[0]->ToString() +
             " in one rank's layout and " + candidates[1]->ToString() +
             " in another's, and no one rule gives every rank its boxes";
      return false;
    }
    p.rules[g] = *settled;
  }
  return true;
}

// 3a. A box several ranks hold and larger than the general planner's slabs (`cut`) would be
// written whole by one of them (data-parallel replicas of large parts, large replicated
// tensors): then the general plan, which cuts and balances them, is better.
bool NoLargeSharedBox(const TemplatedPlan& p, const ByHolders& by_holders, uint64_t cut,
                      std::string* why) {
  for (const auto& [holder_templates, group] : by_holders) {
    size_t holders = 0;
    for (size_t c = 0; c < p.class_ranks.size() && holders < 2; ++c)
      if (Lists(holder_templates, p.class_template[c])) holders += p.class_ranks[c].size();
    for (uint32_t g : group)
      if (holders > 1 && PartBytes(p, g, 0) > cut) {
        *why = "tensor '" + p.tensors[g].name + "' is held whole by several ranks and is " +
               std::to_string(PartBytes(p, g, 0)) + " bytes (the general planner cuts it)";
        return false;
      }
  }
  for (size_t c = 0; c < p.class_ranks.size(); ++c) {
    const uint32_t t = p.class_template[c], i = p.class_index[c];
    for (uint32_t g : p.global_ids[t]) {
      if (!p.rules[g].split() ||
          (p.class_ranks[c].size() == 1 && p.index_classes[i].size() == 1 &&
           p.sharing[g].size() == 1) ||
          PartBytes(p, g, i) <= cut)
        continue;
      uint64_t holders = 0;
      p.ForEachSharing(g, i, [&](uint32_t j) {
        if (j >= p.index_classes.size()) return;
        for (uint32_t c2 : p.index_classes[j])
          if (Lists(p.in_templates[g], p.class_template[c2])) holders += p.class_ranks[c2].size();
      });
      if (holders > 1) {
        *why = "ranks " + std::to_string(p.class_ranks[c][0]) + " and others hold the same part " +
               std::to_string(i) + " of tensor '" + p.tensors[g].name + "', " +
               std::to_string(PartBytes(p, g, i)) +
               " bytes (data-parallel replicas: the general planner cuts and balances it)";
        return false;
      }
    }
  }
  return true;
}

// 3b. Each whole tensor to the least loaded of its holders, largest first.
void AssignWholeWriters(TemplatedPlan& p, const ByHolders& by_holders) {
  for (const auto& [holder_templates, group] : by_holders) {
    using Load = std::pair<uint64_t, uint32_t>;
    std::priority_queue<Load, std::vector<Load>, std::greater<Load>> heap;
    for (size_t c = 0; c < p.class_ranks.size(); ++c)
      if (Lists(holder_templates, p.class_template[c]))
        for (uint32_t r : p.class_ranks[c]) heap.push({p.writer_bytes[r], r});
    std::vector<std::pair<uint64_t, uint32_t>> order;
    for (uint32_t g : group) order.push_back({PartBytes(p, g, 0), g});
    std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    for (auto [bytes, g] : order) {
      Load top = heap.top();
      heap.pop();
      p.whole_writer[g] = static_cast<int>(top.second);
      top.first += bytes;
      p.writer_bytes[top.second] = top.first;
      heap.push(top);
    }
  }
}

// 4. Split parts: counted once each, for their writer.
void CountSplitParts(TemplatedPlan& p) {
  for (size_t c = 0; c < p.class_ranks.size(); ++c) {
    const uint32_t t = p.class_template[c], i = p.class_index[c];
    for (uint32_t g : p.global_ids[t]) {
      if (!p.rules[g].split()) continue;
      // Only the first class holding this part (of the indices sharing it, ascending)
      // counts it: the first class of its smallest index listing g, when there is one.
      uint32_t first = UINT32_MAX;
      if (p.sharing[g].size() == 1 && p.index_classes[i].size() == 1) first = c;  // alone
      auto first_of = [&](uint32_t j) {
        if (first != UINT32_MAX || j >= p.index_classes.size()) return;
        for (uint32_t c2 : p.index_classes[j])
          if (Lists(p.in_templates[g], p.class_template[c2])) {
            first = c2;
            break;
          }
      };
      if (first == UINT32_MAX) first_of(PartRep(p.rules[g], i));
      if (first == UINT32_MAX && p.sharing[g].size() > 1) p.ForEachSharing(g, i, first_of);
      if (first != c) continue;
      const int w = p.SplitWriter(g, i);
      if (w >= 0) p.writer_bytes[static_cast<size_t>(w)] += PartBytes(p, g, i);
    }
  }
}

}  // namespace

std::optional<TemplatedPlan> MakeTemplatedPlan(std::vector<LayoutTemplate> templates,
                                               std::vector<uint32_t> rank_template,
                                               std::vector<uint32_t> rank_index,
                                               std::vector<uint64_t> layout_hashes,
                                               const PlannerConfig* config, std::string* why) {
  TemplatedPlan p;
  p.templates = std::move(templates);
  p.rank_template = std::move(rank_template);
  p.rank_index = std::move(rank_index);
  p.layout_hashes = std::move(layout_hashes);
  const size_t world = p.rank_template.size();
  if (world == 0 || p.rank_index.size() != world || p.layout_hashes.size() != world) {
    *why = "one template, index and hash per rank needed";
    return std::nullopt;
  }
  std::vector<uint32_t> conflicts;
  if (!ReconcileParts(p, why) || !CatalogueTensors(p, &conflicts, why) || !ClassifyRanks(p, why) ||
      !SettleRules(p, conflicts, why))
    return std::nullopt;
  // The indices sharing each part (one offset, 0, unless a rule's cuts leave digits unused).
  std::map<std::pair<std::string, uint32_t>, std::vector<uint32_t>> offsets;  // by rule
  p.sharing.resize(p.tensors.size());
  for (uint32_t g = 0; g < p.tensors.size(); ++g) {
    if (p.rules[g].kind != SplitRule::Kind::kCuts) {
      p.sharing[g] = {0};
      continue;
    }
    auto key = std::pair{p.rules[g].ToString(), p.parts[g]};
    auto it = offsets.find(key);
    if (it == offsets.end())
      it = offsets
               .emplace(std::move(key),
                        SharingOffsets(p.rules[g], p.parts[g],
                                       static_cast<uint32_t>(p.index_classes.size())))
               .first;
    p.sharing[g] = it->second;
  }
  // 3. Whole tensors, grouped by their holders, largest first to the least loaded holder.
  p.writer_bytes.assign(world, 0);
  p.whole_writer.assign(p.tensors.size(), -1);
  ByHolders by_holders;
  for (uint32_t g = 0; g < p.tensors.size(); ++g)
    if (!p.rules[g].split()) by_holders[p.in_templates[g]].push_back(g);
  uint64_t total = 0;
  for (const TensorMeta& t : config ? p.tensors : std::vector<TensorMeta>{})
    total += static_cast<uint64_t>(NumElements(t.global_shape)) * DTypeSize(t.dtype);
  const uint64_t cut =
      config ? std::max<uint64_t>(total / (world * std::max<uint64_t>(config->split_factor, 1)),
                                  std::max<uint64_t>(config->min_piece_bytes, 1))
             : UINT64_MAX;
  if (!NoLargeSharedBox(p, by_holders, cut, why)) return std::nullopt;
  AssignWholeWriters(p, by_holders);
  // 4. Split parts, for their writer (not for a reader of a MANIFEST: no config).
  if (config) CountSplitParts(p);
  return p;
}

int TemplatedPlan::SplitWriter(uint32_t g, uint32_t index) const {
  if (sharing[g].size() == 1) {  // the part of this index alone
    if (index >= index_classes.size()) return -1;
    const auto& classes = index_classes[index];
    uint64_t h = 0;
    for (uint32_t c : classes)
      if (Lists(in_templates[g], class_template[c])) h += class_ranks[c].size();
    if (h == 0) return -1;
    uint64_t k = (static_cast<uint64_t>(g) + index) % h;
    for (uint32_t c : classes) {
      if (!Lists(in_templates[g], class_template[c])) continue;
      if (k < class_ranks[c].size()) return static_cast<int>(class_ranks[c][k]);
      k -= class_ranks[c].size();
    }
    return -1;
  }
  // The classes holding the part, in order (kept while few: one pass instead of two).
  constexpr size_t kFew = 64;
  uint32_t few[kFew];
  size_t nfew = 0;
  bool many = false;
  uint64_t h = 0;
  ForEachSharing(g, index, [&](uint32_t i) {
    if (i >= index_classes.size()) return;
    for (uint32_t c : index_classes[i])
      if (Lists(in_templates[g], class_template[c])) {
        h += class_ranks[c].size();
        if (nfew < kFew)
          few[nfew++] = c;
        else
          many = true;
      }
  });
  if (h == 0) return -1;
  if (!many) {
    uint64_t k = (static_cast<uint64_t>(g) + PartRep(rules[g], index)) % h;
    for (size_t x = 0; x < nfew; ++x) {
      const uint32_t c = few[x];
      if (k < class_ranks[c].size()) return static_cast<int>(class_ranks[c][k]);
      k -= class_ranks[c].size();
    }
    return -1;
  }
  uint64_t k = (static_cast<uint64_t>(g) + PartRep(rules[g], index)) % h;
  int out = -1;
  ForEachSharing(g, index, [&](uint32_t i) {
    if (out >= 0 || i >= index_classes.size()) return;
    for (uint32_t c : index_classes[i]) {
      if (!Lists(in_templates[g], class_template[c])) continue;
      if (k < class_ranks[c].size()) {
        out = static_cast<int>(class_ranks[c][k]);
        return;
      }
      k -= class_ranks[c].size();
    }
  });
  return out;
}

namespace {

// Calls fn(g, split, boxes, writer) for each tensor of template `t` that part `i` holds, in
// slot order: its global id, whether its rule splits it, its non-empty boxes and their
// writer.
template <typename Fn>
void ForEachHeld(const TemplatedPlan& p, uint32_t t, uint32_t i, Fn&& fn) {
  const LayoutTemplate& lt = p.templates[t];
  for (size_t k = 0; k < lt.tensors.size(); ++k) {
    const uint32_t g = p.global_ids[t][k];
    const bool split = lt.rules[k].split();
    std::vector<Box> boxes = PartBoxes(lt.tensors[k].global_shape, lt.rules[k], i, lt.parts);
    if (boxes.empty()) continue;
    fn(g, split, boxes, split ? p.SplitWriter(g, i) : p.whole_writer[g]);
  }
}

}  // namespace

std::vector<WritePiece> TemplatedPlan::PiecesOf(int rank) const {
  std::vector<WritePiece> out;
  uint32_t slot = 0;
  ForEachHeld(
      *this, rank_template[static_cast<size_t>(rank)], rank_index[static_cast<size_t>(rank)],
      [&](uint32_t g, bool, std::vector<Box>& boxes, int w) {
        for (Box& b : boxes) {
          if (w == rank) {
            const uint64_t nbytes = static_cast<uint64_t>(b.numel()) * DTypeSize(tensors[g].dtype);
            out.push_back({g, slot, std::move(b), 0, nbytes});
          }
          ++slot;
        }
      });
  return out;
}

SavePlan TemplatedPlan::Expand() const {
  SavePlan plan;
  plan.tensors = tensors;
  plan.layout_hashes = layout_hashes;
  plan.writer_bytes = writer_bytes;
  plan.rank_list = rank_class;
  const size_t nclasses = class_ranks.size();
  plan.lists.resize(nclasses);
  std::vector<std::vector<int>> writers(nclasses);  // per class, per slot
  std::vector<int64_t> whole_id(tensors.size(), -1);
  struct Key {
    uint32_t g, index, k;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& x) const {
      return static_cast<size_t>((static_cast<uint64_t>(x.g) * 0x9E3779B97F4A7C15ull) ^
                                 (static_cast<uint64_t>(x.index) << 8) ^ x.k);
    }
  };
  std::unordered_map<Key, uint32_t, KeyHash> shared;  // split parts held by several ranks
  for (size_t c = 0; c < nclasses; ++c) {
    const uint32_t i = class_index[c];
    ForEachHeld(
        *this, class_template[c], i, [&](uint32_t g, bool split, std::vector<Box>& boxes, int w) {
          // Held by this class alone: no lookup needed.
          const bool alone = split && index_classes[i].size() == 1 && class_ranks[c].size() == 1 &&
                             sharing[g].size() == 1;
          for (uint32_t b = 0; b < boxes.size(); ++b) {
            auto fresh_id = [&]() {
              PlanShard s;
              s.tensor = g;
              s.nbytes = static_cast<uint64_t>(boxes[b].numel()) * DTypeSize(tensors[g].dtype);
              s.box = boxes[b];
              plan.unique_bytes += s.nbytes;
              plan.shards.push_back(std::move(s));
              return static_cast<uint32_t>(plan.shards.size() - 1);
            };
            uint32_t id;
            if (!split) {
              if (whole_id[g] < 0) whole_id[g] = fresh_id();
              id = static_cast<uint32_t>(whole_id[g]);
            } else if (alone) {
              id = fresh_id();
            } else {
              auto [it, fresh] = shared.emplace(Key{g, PartRep(rules[g], i), b}, 0);
              if (fresh) it->second = fresh_id();
              id = it->second;
            }
            plan.lists[c].push_back(id);
            writers[c].push_back(w);
          }
        });
  }
  for (size_t r = 0; r < rank_class.size(); ++r) {
    const uint32_t c = rank_class[r];
    for (size_t j = 0; j < plan.lists[c].size(); ++j) {
      if (writers[c][j] != static_cast<int>(r)) continue;
      const PlanShard& s = plan.shards[plan.lists[c][j]];
      plan.pieces.push_back({plan.lists[c][j], s.box, 0, s.nbytes, static_cast<int>(r)});
    }
  }
  return plan;
}

double TemplatedPlan::max_writer_share() const {
  return MaxWriterShare(writer_bytes);
}

uint64_t TemplatedLayoutHash(uint64_t template_hash, uint32_t index) {
  // 'T', the template's hash, the part: distinct from any encoded layout's hash input.
  char key[1 + sizeof template_hash + sizeof index] = {'T'};
  std::memcpy(key + 1, &template_hash, sizeof template_hash);
  std::memcpy(key + 1 + sizeof template_hash, &index, sizeof index);
  return Checksum(key, sizeof key);
}

std::string EncodeLayoutMessage(const LayoutMessage& m) {
  wire::LayoutMessage w;
  if (m.templated) {
    w.mutable_templated()->set_template_hash(m.template_hash);
    w.mutable_templated()->set_index(m.index);
  } else {
    w.set_layout(m.layout);
  }
  return wire::Encode(w);
}

Result<LayoutMessage> DecodeLayoutMessage(std::string_view bytes) {
  CAIRN_ASSIGN_OR_RETURN(auto w, wire::Decode<wire::LayoutMessage>(bytes, "layout message"));
  LayoutMessage m;
  if (w.has_templated()) {
    m.templated = true;
    m.template_hash = w.templated().template_hash();
    m.index = w.templated().index();
  } else if (w.has_layout()) {
    m.layout = std::move(*w.mutable_layout());
  } else {
    return Status::Corruption("bad layout message: neither a template nor a layout");
  }
  return m;
}

Result<std::vector<LayoutMessage>> DecodeLayoutMessages(const std::vector<std::string>& messages) {
  std::vector<LayoutMessage> out(messages.size());
  for (size_t r = 0; r < messages.size(); ++r) {
    auto m = DecodeLayoutMessage(messages[r]);
    if (!m.ok()) return m.status().WithContext("save plan: rank " + std::to_string(r));
    out[r] = std::move(*m);
  }
  return out;
}

bool AnyTemplated(const std::vector<LayoutMessage>& messages) {
  return std::any_of(messages.begin(), messages.end(),
                     [](const LayoutMessage& m) { return m.templated; });
}

bool SendsTemplate(const std::vector<LayoutMessage>& messages, int rank) {
  const LayoutMessage& mine = messages[static_cast<size_t>(rank)];
  if (!mine.templated) return false;
  for (int r = 0; r < rank; ++r) {
    const LayoutMessage& other = messages[static_cast<size_t>(r)];
    if (other.templated && other.template_hash == mine.template_hash) return false;
  }
  return true;
}

std::vector<WritePiece> PersistPlan::PiecesOf(int rank) const {
  return templated ? templated->PiecesOf(rank) : WritePiecesOf(*full, rank);
}

const SavePlan& PersistPlan::Full() {
  if (!full) full = templated->Expand();
  return *full;
}

std::string PersistPlan::Path() const {
  if (templated) return "templated: every rank's layout is a layout template";
  return "general: " +
         (why_general.empty() ? std::string("no rank's layout is a layout template") : why_general);
}

double PersistPlan::max_writer_share() const {
  return templated ? templated->max_writer_share() : full->max_writer_share();
}

Result<PersistPlan> PlanPersist(const std::vector<std::string>& messages,
                                const std::vector<std::string>& template_bytes,
                                const std::vector<uint64_t>& hashes, const PlannerConfig& config) {
  CAIRN_ASSIGN_OR_RETURN(auto msgs, DecodeLayoutMessages(messages));
  return PlanPersist(std::move(msgs), template_bytes, hashes, config);
}

Result<PersistPlan> PlanPersist(std::vector<LayoutMessage> msgs,
                                const std::vector<std::string>& template_bytes,
                                const std::vector<uint64_t>& hashes, const PlannerConfig& config) {
  const size_t world = msgs.size();
  if (world == 0 || hashes.size() != world)
    return Status::InvalidArgument("save plan: need one layout message and one hash per rank");
  const bool any_templated = AnyTemplated(msgs);
  const bool all_templated =
      std::all_of(msgs.begin(), msgs.end(), [](const LayoutMessage& m) { return m.templated; });
  // The templates, decoded once each, numbered by their lowest rank.
  std::vector<LayoutTemplate> templates;
  std::vector<uint32_t> rank_template(world, 0), rank_index(world, 0);
  if (any_templated) {
    if (template_bytes.size() != world)
      return Status::InvalidArgument("save plan: templates gathered from " +
                                     std::to_string(template_bytes.size()) + " of " +
                                     std::to_string(world) + " ranks");
    std::unordered_map<uint64_t, uint32_t> by_hash;
    for (size_t r = 0; r < world; ++r) {
      if (!msgs[r].templated) continue;
      auto it = by_hash.find(msgs[r].template_hash);
      if (it == by_hash.end()) {
        if (template_bytes[r].empty())
          return Status::InvalidArgument("save plan: rank " + std::to_string(r) +
                                         " sent no template and no lower rank has its hash");
        if (TemplateHash(template_bytes[r]) != msgs[r].template_hash)
          return Status::Corruption("save plan: rank " + std::to_string(r) +
                                    "'s template does not match its hash");
        auto t = DecodeTemplate(template_bytes[r]);
        if (!t.ok()) return t.status().WithContext("save plan: rank " + std::to_string(r));
        it = by_hash.emplace(msgs[r].template_hash, static_cast<uint32_t>(templates.size())).first;
        templates.push_back(std::move(*t));
      }
      rank_template[r] = it->second;
      rank_index[r] = msgs[r].index;
      if (rank_index[r] >= templates[it->second].parts)
        return Status::InvalidArgument("save plan: rank " + std::to_string(r) + " is part " +
                                       std::to_string(rank_index[r]) + " of a template of " +
                                       std::to_string(templates[it->second].parts));
    }
  }
  PersistPlan out;
  out.layout_hashes = hashes;
  const bool cuts = std::any_of(templates.begin(), templates.end(), [](const LayoutTemplate& t) {
    return std::any_of(t.rules.begin(), t.rules.end(),
                       [](const SplitRule& r) { return r.kind == SplitRule::Kind::kCuts; });
  });
  const size_t distinct =
      cuts ? std::unordered_set<uint64_t>(hashes.begin(), hashes.end()).size() : 0;
  if (all_templated && cuts && distinct < config.cut_template_min_layouts) {
    out.why_general = std::to_string(distinct) + " distinct layouts, fewer than the " +
                      std::to_string(config.cut_template_min_layouts) +
                      " from which templates with cuts are used";
  } else if (all_templated) {
    auto tp =
        MakeTemplatedPlan(templates, rank_template, rank_index, hashes, &config, &out.why_general);
    if (tp) {
      out.templated = std::move(*tp);
      return out;
    }
  } else if (any_templated) {
    out.why_general = "some ranks' layouts are not templates";
  }
  // The general planner, from every distinct layout (templated ones expanded once).
  std::vector<std::string> layouts(world);
  std::unordered_map<uint64_t, bool> seen;
  for (size_t r = 0; r < world; ++r) {
    if (!msgs[r].templated) {
      layouts[r] = std::move(msgs[r].layout);
    } else if (seen.emplace(hashes[r], true).second) {
      layouts[r] = EncodeRankLayout(ExpandTemplate(templates[rank_template[r]], rank_index[r]));
    }
  }
  CAIRN_ASSIGN_OR_RETURN(SavePlan plan, MakeSavePlan(layouts, hashes, config));
  out.full = std::move(plan);
  return out;
}

}  // namespace cairn
