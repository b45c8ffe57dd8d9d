#include "layout/memory_plan.h"

#include <algorithm>
#include <map>
#include <set>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace cairn {
namespace {

bool Lists(const std::vector<uint32_t>& templates, uint32_t t) {
  return std::find(templates.begin(), templates.end(), t) != templates.end();
}

bool Meet(const Box& a, const Box& b) {
  auto r = Intersect(a, b);
  return r && !r->empty();
}

// Calls fn(class) for each class of `p` holding part `index` of tensor `g` (each class
// whose template lists it, when it is whole; of every index sharing the part, when its
// rule's cuts leave digits unused).
template <typename Fn>
void ForEachClassHolding(const TemplatedPlan& p, uint32_t g, uint32_t index, Fn&& fn) {
  if (!p.rules[g].split()) {
    for (uint32_t c = 0; c < p.class_ranks.size(); ++c)
      if (Lists(p.in_templates[g], p.class_template[c])) fn(c);
    return;
  }
  p.ForEachSharing(g, index, [&](uint32_t i) {
    if (i >= p.index_classes.size()) return;
    for (uint32_t c : p.index_classes[i])
      if (Lists(p.in_templates[g], p.class_template[c])) fn(c);
  });
}

class MemoryPlanner {
 public:
  MemoryPlanner(const TemplatedMemoryStep& s, int rank) : s_(s), rank_(rank) {
    for (uint32_t g = 0; g < s.saved.tensors.size(); ++g)
      saved_ids_.emplace(s.saved.tensors[g].name, g);
    for (uint32_t h = 0; h < s.targets.tensors.size(); ++h)
      target_ids_.emplace(s.targets.tensors[h].name, h);
  }

  Result<MemoryPlanAlone> Plan() {
    const TemplatedPlan& T = s_.targets;
    if (rank_ < 0 || rank_ >= T.world_size())
      return Status::InvalidArgument("rank " + std::to_string(rank_) + " is not in the job");
    Needs();
    Sends();
    MemoryPlanAlone out;
    LoadCatalog& cat = out.cat;
    cat.step = s_.step;
    cat.chunk_bytes = s_.chunk_bytes;
    cat.where = "host memory";
    cat.tensors = s_.saved.tensors;
    cat.pieces.reserve(pieces_.size());
    for (auto& [key, piece] : pieces_) {
      const std::vector<int>& holders = Holders(key.first, piece.second);
      if (holders.empty()) continue;  // no rank holds it: the coverage check says so
      // (Built in place: GCC 14 warns, wrongly, about a local LoadPiece's vector.)
      LoadPiece& p = cat.pieces.emplace_back();
      p.tensor = key.first;
      p.holders = holders;
      p.nbytes =
          static_cast<uint64_t>(piece.first.numel()) * DTypeSize(cat.tensors[p.tensor].dtype);
      p.box = std::move(piece.first);
    }
    // Class 0: this rank (and the ranks of its layout it sends to); one class per other
    // layout it sends to; everyone else one empty class.
    LoadTargets& lt = out.lt;
    auto layout_of = [&](uint32_t c) {
      return ExpandTemplate(T.templates[T.class_template[c]], T.class_index[c]);
    };
    std::unordered_map<uint32_t, uint32_t> cls;
    cls.emplace(T.rank_class[static_cast<size_t>(rank_)], 0);
    lt.classes.push_back(layout_of(T.rank_class[static_cast<size_t>(rank_)]));
    lt.class_of_rank.assign(static_cast<size_t>(T.world_size()), UINT32_MAX);
    lt.class_of_rank[static_cast<size_t>(rank_)] = 0;
    for (int t : receivers_) {
      auto [it, fresh] =
          cls.emplace(T.rank_class[static_cast<size_t>(t)], static_cast<uint32_t>(cls.size()));
      if (fresh) lt.classes.push_back(layout_of(it->first));
      lt.class_of_rank[static_cast<size_t>(t)] = it->second;
    }
    const auto empty = static_cast<uint32_t>(lt.classes.size());
    lt.classes.emplace_back();
    for (uint32_t& c : lt.class_of_rank)
      if (c == UINT32_MAX) c = empty;
    lt.checked_classes = 1;
    CAIRN_ASSIGN_OR_RETURN(out.plan, MakeLoadPlan(cat, lt));
    return out;
  }

 private:
  using Key = std::pair<uint32_t, std::vector<int64_t>>;  // saved tensor, offsets + lengths

  // The ranks holding part `index` of saved tensor `g` in memory: the holders of every
  // source rank that saved it, ascending.
  const std::vector<int>& Holders(uint32_t g, uint32_t index) {
    const TemplatedPlan& S = s_.saved;
    const uint32_t i = PartRep(S.rules[g], index);
    const uint64_t key = (static_cast<uint64_t>(g) << 32) | i;
    auto it = holders_.find(key);
    if (it != holders_.end()) return it->second;
    std::vector<int> h;
    ForEachClassHolding(S, g, i, [&](uint32_t c) {
      for (uint32_t src : S.class_ranks[c])
        if (src < s_.holders.size())
          h.insert(h.end(), s_.holders[src].begin(), s_.holders[src].end());
    });
    std::sort(h.begin(), h.end());
    h.erase(std::unique(h.begin(), h.end()), h.end());
    return holders_.emplace(key, std::move(h)).first->second;
  }

  // Adds saved piece `b` (part `index` of tensor `g`); false when it was there already.
  bool Add(uint32_t g, const Box& b, uint32_t index) {
    Key k{g, b.offsets};
    k.second.insert(k.second.end(), b.lengths.begin(), b.lengths.end());
    return pieces_.emplace(std::move(k), std::make_pair(b, index)).second;
  }

  // The saved pieces this rank's targets meet.
  void Needs() {
    const TemplatedPlan& S = s_.saved;
    const TemplatedPlan& T = s_.targets;
    const uint32_t c = T.rank_class[static_cast<size_t>(rank_)];
    const LayoutTemplate& lt = T.templates[T.class_template[c]];
    for (size_t k = 0; k < lt.tensors.size(); ++k) {
      const TensorMeta& meta = lt.tensors[k];
      auto sid = saved_ids_.find(meta.name);
      if (sid == saved_ids_.end() || !(S.tensors[sid->second] == meta)) continue;
      const uint32_t g = sid->second;
      for (const Box& box : PartBoxes(meta.global_shape, lt.rules[k], T.class_index[c], lt.parts)) {
        if (!S.rules[g].split()) {
          Add(g, Box::Whole(meta.global_shape), 0);
          continue;
        }
        for (uint32_t j : PartsMeeting(meta.global_shape, S.rules[g], S.parts[g], box,
                                       static_cast<uint32_t>(S.index_classes.size())))
          for (const Box& b : PartBoxes(meta.global_shape, S.rules[g], j, S.parts[g]))
            if (Meet(b, box)) Add(g, b, j);
      }
    }
  }

  // The pieces this rank holds that other ranks' targets meet and get from it.
  void Sends() {
    const TemplatedPlan& S = s_.saved;
    std::set<Key> seen;
    for (size_t src = 0; src < s_.holders.size(); ++src) {
      const auto& h = s_.holders[src];
      if (!std::binary_search(h.begin(), h.end(), rank_)) continue;
      const uint32_t c = S.rank_class[src], t = S.class_template[c], i = S.class_index[c];
      const LayoutTemplate& lt = S.templates[t];
      for (size_t k = 0; k < lt.tensors.size(); ++k) {
        const uint32_t g = S.global_ids[t][k];
        for (const Box& b : PartBoxes(lt.tensors[k].global_shape, lt.rules[k], i, lt.parts)) {
          Key key{g, b.offsets};
          key.second.insert(key.second.end(), b.lengths.begin(), b.lengths.end());
          if (seen.insert(std::move(key)).second && SendsTo(g, b, i)) Add(g, b, i);
        }
      }
    }
  }

  // Whether some other rank's targets meet piece `b` of saved tensor `g` (part `index`)
  // and get it from this rank; those ranks become receivers.
  bool SendsTo(uint32_t g, const Box& b, uint32_t index) {
    const TemplatedPlan& T = s_.targets;
    auto tid = target_ids_.find(s_.saved.tensors[g].name);
    if (tid == target_ids_.end() || !(T.tensors[tid->second] == s_.saved.tensors[g])) return false;
    const uint32_t h = tid->second;
    const std::vector<int>& holders = Holders(g, index);
    bool any = false;
    auto consider = [&](uint32_t c) {
      for (uint32_t t : T.class_ranks[c]) {
        const int r = static_cast<int>(t);
        if (r != rank_ && LoadPlan::HolderFor(holders, r) == rank_) {
          receivers_.insert(r);
          any = true;
        }
      }
    };
    if (!T.rules[h].split()) {
      ForEachClassHolding(T, h, 0, consider);
      return any;
    }
    const Shape& shape = T.tensors[h].global_shape;
    for (uint32_t j : PartsMeeting(shape, T.rules[h], T.parts[h], b,
                                   static_cast<uint32_t>(T.index_classes.size()))) {
      bool meets = false;
      for (const Box& x : PartBoxes(shape, T.rules[h], j, T.parts[h])) meets = meets || Meet(x, b);
      if (meets) ForEachClassHolding(T, h, j, consider);
    }
    return any;
  }

  const TemplatedMemoryStep& s_;
  const int rank_;
  std::unordered_map<std::string_view, uint32_t> saved_ids_, target_ids_;
  std::unordered_map<uint64_t, std::vector<int>> holders_;  // (tensor << 32 | part) -> ranks
  std::map<Key, std::pair<Box, uint32_t>> pieces_;          // -> (box, part)
  std::set<int> receivers_;
};

}  // namespace

Result<MemoryPlanAlone> PlanMemoryAlone(const TemplatedMemoryStep& step, int rank) {
  return MemoryPlanner(step, rank).Plan();
}

}  // namespace cairn
