#include "layout/save_planner.h"

#include <algorithm>
#include <numeric>
#include <queue>
#include <unordered_map>

#include "core/arith.h"
#include "core/checksum.h"
#include "layout/layout_wire.h"

namespace cairn {
namespace {

Status Bad(const std::string& what) {
  return Status::Corruption("bad layout: " + what);
}

// Key of a unique (tensor, box).
struct ShardKey {
  uint32_t tensor;
  const Box* box;
};
struct ShardKeyHash {
  size_t operator()(const ShardKey& k) const {
    uint64_t h = k.tensor * 0x9E3779B97F4A7C15ull;
    for (size_t d = 0; d < k.box->ndim(); ++d) {
      h = (h ^ static_cast<uint64_t>(k.box->offsets[d])) * 0xff51afd7ed558ccdull;
      h = (h ^ static_cast<uint64_t>(k.box->lengths[d])) * 0xc4ceb9fe1a85ec53ull;
      h ^= h >> 29;
    }
    return static_cast<size_t>(h);
  }
};
struct ShardKeyEq {
  bool operator()(const ShardKey& a, const ShardKey& b) const {
    return a.tensor == b.tensor && *a.box == *b.box;
  }
};

// The first dimension longer than 1, if every dimension before it has length 1 (slabs
// along it are contiguous in row-major order); -1 when the box cannot be cut.
int SplitDim(const Box& b) {
  for (size_t d = 0; d < b.ndim(); ++d)
    if (b.lengths[d] > 1) return static_cast<int>(d);
  return -1;
}

}  // namespace

std::string EncodeRankLayout(const RankLayout& layout) {
  wire::RankLayout w;
  for (const TensorMeta& t : layout.tensors) AddTensor(t, w.mutable_tensors());
  w.mutable_shard_tensor()->Reserve(static_cast<int>(layout.shards.size()));
  for (const RankLayout::Entry& s : layout.shards) {
    w.add_shard_tensor(s.tensor);
    AddBox(s.box, w.mutable_shard_boxes());
  }
  return wire::Encode(w);
}

Result<RankLayout> DecodeRankLayout(std::string_view bytes) {
  CAIRN_ASSIGN_OR_RETURN(auto w, wire::Decode<wire::RankLayout>(bytes, "layout"));
  RankLayout out;
  CAIRN_RETURN_IF_ERROR(TensorsFromWire(w.mutable_tensors(), &out.tensors, "layout"));
  out.shards.resize(static_cast<size_t>(w.shard_tensor_size()));
  size_t at = 0;
  for (size_t k = 0; k < out.shards.size(); ++k) {
    RankLayout::Entry& s = out.shards[k];
    s.tensor = w.shard_tensor(static_cast<int>(k));
    if (s.tensor >= out.tensors.size()) return Bad("shard names no tensor");
    Status st = BoxFromWire(w.shard_boxes(), &at, out.tensors[s.tensor], &s.box);
    if (!st.ok()) return Bad(st.message());
  }
  if (at != static_cast<size_t>(w.shard_boxes_size())) return Bad("box values left over");
  return out;
}

uint64_t LayoutHash(std::string_view encoded) {
  return Checksum(encoded.data(), encoded.size());
}

double SavePlan::max_writer_share() const {
  return MaxWriterShare(writer_bytes);
}

double MaxWriterShare(const std::vector<uint64_t>& writer_bytes) {
  if (writer_bytes.empty()) return 1;
  const uint64_t total = std::accumulate(writer_bytes.begin(), writer_bytes.end(), uint64_t{0});
  if (total == 0) return 1;
  const uint64_t mx = *std::max_element(writer_bytes.begin(), writer_bytes.end());
  return static_cast<double>(mx) * static_cast<double>(writer_bytes.size()) /
         static_cast<double>(total);
}

std::vector<size_t> SavePlan::PiecesOf(int rank) const {
  std::vector<size_t> out;
  auto lo = std::lower_bound(pieces.begin(), pieces.end(), rank,
                             [](const PlannedPiece& p, int r) { return p.writer < r; });
  for (auto it = lo; it != pieces.end() && it->writer == rank; ++it)
    out.push_back(static_cast<size_t>(it - pieces.begin()));
  return out;
}

Result<SavePlan> MakeSavePlan(const std::vector<std::string>& layouts,
                              const PlannerConfig& config) {
  std::vector<uint64_t> hashes(layouts.size());
  for (size_t r = 0; r < layouts.size(); ++r) hashes[r] = LayoutHash(layouts[r]);
  return MakeSavePlan(layouts, hashes, config);
}

namespace {

// Ranks grouped by identical layout: each distinct layout is a candidate list.
struct LayoutGroups {
  std::vector<int> rep;                 // a rank holding each list
  std::vector<std::vector<int>> ranks;  // the ranks holding each list
  std::vector<RankLayout> decoded;      // each list's layout, decoded once
};

// 1. Groups identical layouts (by hash, then bytes) and decodes each distinct one once.
Status GroupLayouts(const std::vector<std::string>& layouts,
                    const std::vector<uint64_t>& layout_hashes, SavePlan* plan, LayoutGroups* g) {
  const int world = static_cast<int>(layouts.size());
  std::unordered_map<uint64_t, std::vector<uint32_t>> by_hash;  // hash -> candidate lists
  for (int r = 0; r < world; ++r) {
    const std::string& mine = layouts[static_cast<size_t>(r)];
    auto& cands = by_hash[layout_hashes[static_cast<size_t>(r)]];
    uint32_t id = UINT32_MAX;
    for (uint32_t c : cands)
      if (mine.empty() || layouts[static_cast<size_t>(g->rep[c])] == mine) id = c;
    if (id == UINT32_MAX) {
      if (mine.empty())
        return Status::InvalidArgument("save plan: rank " + std::to_string(r) +
                                       " sent no layout and no lower rank has its hash");
      id = static_cast<uint32_t>(g->rep.size());
      cands.push_back(id);
      g->rep.push_back(r);
      g->ranks.emplace_back();
    }
    g->ranks[id].push_back(r);
    plan->rank_list[static_cast<size_t>(r)] = id;
  }
  const size_t nlists = g->rep.size();
  g->decoded.resize(nlists);
  for (size_t l = 0; l < nlists; ++l) {
    auto d = DecodeRankLayout(layouts[static_cast<size_t>(g->rep[l])]);
    if (!d.ok())
      return d.status().WithContext("save plan: layout of rank " + std::to_string(g->rep[l]));
    g->decoded[l] = std::move(*d);
  }
  return Status::OK();
}

// 2. Interns tensors by name (refusing ranks that disagree on one) and deduplicates
// (tensor, box) into plan->shards; holders[shard] lists the layouts holding it.
Status InternShards(LayoutGroups& g, SavePlan* plan, std::vector<std::vector<uint32_t>>* holders) {
  const size_t nlists = g.rep.size();
  std::unordered_map<std::string, uint32_t> tensor_ids;
  std::vector<int> tensor_rank;  // the rank whose layout defined each tensor
  std::unordered_map<ShardKey, uint32_t, ShardKeyHash, ShardKeyEq> shard_ids;
  plan->lists.resize(nlists);
  for (size_t l = 0; l < nlists; ++l) {
    RankLayout& lay = g.decoded[l];
    std::vector<uint32_t> global(lay.tensors.size());
    for (size_t t = 0; t < lay.tensors.size(); ++t) {
      auto [it, fresh] =
          tensor_ids.emplace(lay.tensors[t].name, static_cast<uint32_t>(plan->tensors.size()));
      if (fresh) {
        plan->tensors.push_back(lay.tensors[t]);
        tensor_rank.push_back(g.rep[l]);
      } else if (!(plan->tensors[it->second] == lay.tensors[t])) {
        const TensorMeta& a = plan->tensors[it->second];
        const TensorMeta& b = lay.tensors[t];
        return Status::InvalidArgument(
            "save plan: tensor '" + a.name + "' is " + std::string(DTypeName(a.dtype)) + " " +
            ShapeToString(a.global_shape) + " on rank " + std::to_string(tensor_rank[it->second]) +
            " but " + std::string(DTypeName(b.dtype)) + " " + ShapeToString(b.global_shape) +
            " on rank " + std::to_string(g.rep[l]));
      }
      global[t] = it->second;
    }
    plan->lists[l].reserve(lay.shards.size());
    for (RankLayout::Entry& e : lay.shards) {
      e.tensor = global[e.tensor];
      auto [it, fresh] =
          shard_ids.emplace(ShardKey{e.tensor, &e.box}, static_cast<uint32_t>(plan->shards.size()));
      if (fresh) {
        PlanShard s;
        s.tensor = e.tensor;
        s.box = e.box;
        s.nbytes = static_cast<uint64_t>(e.box.numel()) * DTypeSize(plan->tensors[e.tensor].dtype);
        plan->unique_bytes += s.nbytes;
        plan->shards.push_back(std::move(s));
        holders->emplace_back();
      }
      auto& h = (*holders)[it->second];
      if (h.empty() || h.back() != l) h.push_back(static_cast<uint32_t>(l));
      plan->lists[l].push_back(it->second);
    }
  }
  return Status::OK();
}

// 3. Cuts boxes larger than the balance needs into slabs along their first long dimension.
void CutIntoSlabs(const PlannerConfig& config, int world, SavePlan* plan) {
  const uint64_t cut = std::max<uint64_t>(
      plan->unique_bytes /
          (static_cast<uint64_t>(world) * std::max<uint64_t>(config.split_factor, 1)),
      std::max<uint64_t>(config.min_piece_bytes, 1));
  for (uint32_t id = 0; id < plan->shards.size(); ++id) {
    const PlanShard& s = plan->shards[id];
    if (s.nbytes == 0) continue;
    const int d = s.nbytes > cut ? SplitDim(s.box) : -1;
    if (d < 0) {
      plan->pieces.push_back({id, s.box, 0, s.nbytes, -1});
      continue;
    }
    const int64_t rows = s.box.lengths[static_cast<size_t>(d)];
    const uint64_t row_bytes = s.nbytes / static_cast<uint64_t>(rows);
    int64_t per = std::max<int64_t>(1, static_cast<int64_t>(cut / row_bytes));
    if (config.align_bytes > 0 && config.align_bytes % row_bytes == 0) {
      // Aligned slabs, unless that would make them much coarser than the balance needs.
      const int64_t q = static_cast<int64_t>(config.align_bytes / row_bytes);
      const int64_t aligned = RoundUp(per, q);
      if (aligned <= 2 * per) per = aligned;
    }
    for (int64_t r0 = 0; r0 < rows; r0 += per) {
      PlannedPiece p;
      p.shard = id;
      p.box = s.box;
      p.box.offsets[static_cast<size_t>(d)] += r0;
      p.box.lengths[static_cast<size_t>(d)] = std::min(per, rows - r0);
      p.src_offset = static_cast<uint64_t>(r0) * row_bytes;
      p.nbytes = static_cast<uint64_t>(p.box.lengths[static_cast<size_t>(d)]) * row_bytes;
      plan->pieces.push_back(std::move(p));
    }
  }
}

// 4. Assigns pieces, largest first, to the least loaded rank holding them. A rank is in
// exactly one list, so one min-heap of (load, rank) per list holds every rank's load.
void AssignWriters(const std::vector<std::vector<uint32_t>>& holders,
                   const std::vector<std::vector<int>>& ranks, int world, SavePlan* plan) {
  const size_t nlists = ranks.size();
  using Load = std::pair<uint64_t, int>;
  std::vector<std::priority_queue<Load, std::vector<Load>, std::greater<Load>>> heaps(nlists);
  for (size_t l = 0; l < nlists; ++l)
    for (int r : ranks[l]) heaps[l].push({0, r});
  std::vector<uint32_t> order(plan->pieces.size());
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const PlannedPiece& x = plan->pieces[a];
    const PlannedPiece& y = plan->pieces[b];
    if (x.nbytes != y.nbytes) return x.nbytes > y.nbytes;
    return a < b;
  });
  plan->writer_bytes.assign(static_cast<size_t>(world), 0);
  for (uint32_t i : order) {
    PlannedPiece& p = plan->pieces[i];
    uint32_t best = UINT32_MAX;
    for (uint32_t l : holders[p.shard])
      if (best == UINT32_MAX || heaps[l].top() < heaps[best].top()) best = l;
    Load top = heaps[best].top();
    heaps[best].pop();
    p.writer = top.second;
    top.first += p.nbytes;
    plan->writer_bytes[static_cast<size_t>(p.writer)] = top.first;
    heaps[best].push(top);
  }
}

// 5. Orders the pieces by writer, then by the writer's slot order.
void SortByWriter(SavePlan* plan) {
  const size_t nlists = plan->lists.size();
  std::unordered_map<uint64_t, uint32_t> pos;  // (list << 32 | shard) -> position
  pos.reserve(plan->pieces.size());
  for (const PlannedPiece& p : plan->pieces) {
    const uint32_t l = plan->rank_list[static_cast<size_t>(p.writer)];
    pos.emplace((static_cast<uint64_t>(l) << 32) | p.shard, 0);
  }
  for (size_t l = 0; l < nlists; ++l)
    for (uint32_t j = 0; j < plan->lists[l].size(); ++j) {
      auto it = pos.find((static_cast<uint64_t>(l) << 32) | plan->lists[l][j]);
      if (it != pos.end()) it->second = j;
    }
  auto key = [&](const PlannedPiece& p) {
    const uint32_t l = plan->rank_list[static_cast<size_t>(p.writer)];
    return std::tuple(p.writer, pos[(static_cast<uint64_t>(l) << 32) | p.shard], p.src_offset);
  };
  std::vector<std::tuple<int, uint32_t, uint64_t>> keys(plan->pieces.size());
  for (size_t i = 0; i < plan->pieces.size(); ++i) keys[i] = key(plan->pieces[i]);
  std::vector<uint32_t> order(plan->pieces.size());
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return keys[a] < keys[b]; });
  std::vector<PlannedPiece> sorted;
  sorted.reserve(plan->pieces.size());
  for (uint32_t i : order) sorted.push_back(std::move(plan->pieces[i]));
  plan->pieces = std::move(sorted);
}

}  // namespace

Result<SavePlan> MakeSavePlan(const std::vector<std::string>& layouts,
                              const std::vector<uint64_t>& layout_hashes,
                              const PlannerConfig& config) {
  const int world = static_cast<int>(layouts.size());
  if (world == 0 || layout_hashes.size() != layouts.size())
    return Status::InvalidArgument("save plan: need one layout and one hash per rank");
  SavePlan plan;
  plan.layout_hashes = layout_hashes;
  plan.rank_list.resize(static_cast<size_t>(world));
  LayoutGroups groups;
  CAIRN_RETURN_IF_ERROR(GroupLayouts(layouts, layout_hashes, &plan, &groups));
  std::vector<std::vector<uint32_t>> holders;  // per unique shard: lists holding it
  CAIRN_RETURN_IF_ERROR(InternShards(groups, &plan, &holders));
  CutIntoSlabs(config, world, &plan);
  AssignWriters(holders, groups.ranks, world, &plan);
  SortByWriter(&plan);
  return plan;
}

}  // namespace cairn
