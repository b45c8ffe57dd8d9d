#include "recovery/load_planner.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <unordered_map>
#include <utility>

namespace cairn {
namespace {

// Bytes [lo, hi) of `box`'s row-major bytes that hold `region` (its first to its last
// element; everything in between for a region that is not contiguous).
std::pair<uint64_t, uint64_t> ByteHull(const Box& box, const Box& region, size_t elem) {
  const uint64_t lo = BoxByteOffset(box, region, elem);
  Box last = region;
  for (size_t d = 0; d < last.ndim(); ++d) {
    last.offsets[d] += last.lengths[d] - 1;
    last.lengths[d] = 1;
  }
  return {lo, BoxByteOffset(box, last, elem) + elem};
}

// Saved pieces of one tensor sorted by their first offset, for overlap queries.
struct TensorIndex {
  std::vector<uint32_t> pieces;  // sorted by box.offsets[0]
  std::vector<int64_t> first;    // offsets[0] of each, same order
  int64_t max_len0 = 0;
};

}  // namespace

int LoadPlan::HolderFor(const LoadPiece& p, int rank) {
  if (p.holders.empty()) return -1;
  if (std::binary_search(p.holders.begin(), p.holders.end(), rank)) return rank;
  return p.holders[static_cast<size_t>(rank) % p.holders.size()];
}

Result<LoadPlan> MakeLoadPlan(const LoadCatalog& cat, const LoadTargets& targets) {
  const std::string where = "step " + std::to_string(cat.step) + " (" + cat.where + ")";
  if (cat.chunk_bytes == 0) return Status::InvalidArgument(where + ": chunk size is 0");
  std::unordered_map<std::string, uint32_t> tensor_ids;
  for (uint32_t t = 0; t < cat.tensors.size(); ++t) tensor_ids.emplace(cat.tensors[t].name, t);
  std::vector<TensorIndex> index(cat.tensors.size());
  for (uint32_t p = 0; p < cat.pieces.size(); ++p) index[cat.pieces[p].tensor].pieces.push_back(p);
  for (TensorIndex& ix : index) {
    auto first0 = [&](uint32_t p) {
      const Box& b = cat.pieces[p].box;
      return b.ndim() ? b.offsets[0] : 0;
    };
    std::sort(ix.pieces.begin(), ix.pieces.end(),
              [&](uint32_t a, uint32_t b) { return first0(a) < first0(b); });
    for (uint32_t p : ix.pieces) {
      ix.first.push_back(first0(p));
      const Box& b = cat.pieces[p].box;
      ix.max_len0 = std::max(ix.max_len0, b.ndim() ? b.lengths[0] : 1);
    }
  }

  LoadPlan plan;
  const size_t nclass = targets.classes.size();
  plan.members.resize(nclass);
  for (size_t r = 0; r < targets.class_of_rank.size(); ++r)
    plan.members[targets.class_of_rank[r]].push_back(static_cast<int>(r));
  plan.fills.resize(nclass);
  std::unordered_map<uint64_t, uint32_t> span_of;  // (piece << 32 | class) -> span
  std::vector<std::pair<uint32_t, std::pair<uint64_t, uint64_t>>> hulls;  // exact, per piece
  std::vector<bool> used(cat.tensors.size(), false);
  for (uint32_t c = 0; c < nclass; ++c) {
    const RankLayout& layout = targets.classes[c];
    const int who_rank = plan.members[c].empty() ? -1 : plan.members[c].front();
    const std::string who = "rank " + std::to_string(who_rank) + ", " + where;
    for (uint32_t ti = 0; ti < layout.shards.size(); ++ti) {
      const TensorMeta& meta = layout.tensors[layout.shards[ti].tensor];
      const Box& tbox = layout.shards[ti].box;
      auto it = tensor_ids.find(meta.name);
      if (it == tensor_ids.end())
        return Status::NotFound(who + ": tensor '" + meta.name + "' was not saved");
      const TensorMeta& saved = cat.tensors[it->second];
      if (saved.dtype != meta.dtype)
        return Status::InvalidArgument(who + ": tensor '" + meta.name + "' was saved as " +
                                       std::string(DTypeName(saved.dtype)) + " but the target is " +
                                       std::string(DTypeName(meta.dtype)));
      if (saved.global_shape != meta.global_shape)
        return Status::InvalidArgument(who + ": tensor '" + meta.name + "' was saved with shape " +
                                       ShapeToString(saved.global_shape) + " but the target has " +
                                       ShapeToString(meta.global_shape));
      used[it->second] = true;
      const size_t elem = DTypeSize(meta.dtype);
      const TensorIndex& ix = index[it->second];
      size_t begin = 0, end = ix.pieces.size();
      if (tbox.ndim() > 0) {
        const int64_t lo = tbox.offsets[0] - ix.max_len0 + 1;
        const int64_t hi = tbox.offsets[0] + tbox.lengths[0];
        begin = static_cast<size_t>(std::lower_bound(ix.first.begin(), ix.first.end(), lo) -
                                    ix.first.begin());
        end = static_cast<size_t>(std::lower_bound(ix.first.begin(), ix.first.end(), hi) -
                                  ix.first.begin());
      }
      int64_t covered = 0;
      for (size_t k = begin; k < end; ++k) {
        const uint32_t p = ix.pieces[k];
        const LoadPiece& piece = cat.pieces[p];
        auto region = Intersect(piece.box, tbox);
        if (!region || region->empty()) continue;
        covered += region->numel();
        auto [lo, hi] = ByteHull(piece.box, *region, elem);
        hulls.push_back({p, {lo, hi}});
        const uint64_t clo = lo / cat.chunk_bytes * cat.chunk_bytes;
        const uint64_t chi =
            std::min(piece.nbytes, (hi + cat.chunk_bytes - 1) / cat.chunk_bytes * cat.chunk_bytes);
        const uint64_t key = (static_cast<uint64_t>(p) << 32) | c;
        auto [sit, fresh] = span_of.emplace(key, static_cast<uint32_t>(plan.spans.size()));
        if (fresh) {
          plan.spans.push_back({p, c, clo, chi, -1});
        } else {
          LoadPlan::Span& s = plan.spans[sit->second];
          s.lo = std::min(s.lo, clo);
          s.hi = std::max(s.hi, chi);
        }
        plan.fills[c].push_back({sit->second, ti, std::move(*region)});
      }
      if (covered < tbox.numel()) {
        std::string saved_boxes;
        for (size_t k = 0; k < ix.pieces.size() && k < 4; ++k)
          saved_boxes += " " + cat.pieces[ix.pieces[k]].box.ToString();
        if (ix.pieces.size() > 4) saved_boxes += " ...";
        return Status::InvalidArgument(
            who + ": tensor '" + meta.name + "' box " + tbox.ToString() +
            " is not fully covered by the saved boxes (saved:" + saved_boxes + ")");
      }
    }
  }
  for (uint32_t t = 0; t < cat.tensors.size(); ++t)
    if (!used[t]) plan.unrestored.push_back(cat.tensors[t].name);

  // Spans sorted by (piece, class); fills follow.
  std::vector<uint32_t> order(plan.spans.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const auto& x = plan.spans[a];
    const auto& y = plan.spans[b];
    return x.piece != y.piece ? x.piece < y.piece : x.cls < y.cls;
  });
  std::vector<uint32_t> new_index(order.size());
  std::vector<LoadPlan::Span> sorted(order.size());
  for (uint32_t i = 0; i < order.size(); ++i) {
    new_index[order[i]] = i;
    sorted[i] = plan.spans[order[i]];
  }
  plan.spans = std::move(sorted);
  for (auto& fills : plan.fills)
    for (auto& f : fills) f.span = new_index[f.span];
  plan.spans_of_class.resize(nclass);
  plan.piece_first_span.assign(cat.pieces.size() + 1, 0);
  for (uint32_t i = 0; i < plan.spans.size(); ++i) {
    plan.spans_of_class[plan.spans[i].cls].push_back(i);
    plan.piece_first_span[plan.spans[i].piece + 1] = i + 1;
  }
  for (size_t p = 1; p < plan.piece_first_span.size(); ++p)
    plan.piece_first_span[p] = std::max(plan.piece_first_span[p], plan.piece_first_span[p - 1]);

  // Bytes needed: the union of the exact hulls, per piece.
  std::sort(hulls.begin(), hulls.end());
  for (size_t i = 0; i < hulls.size();) {
    const uint32_t p = hulls[i].first;
    uint64_t lo = hulls[i].second.first, hi = hulls[i].second.second;
    size_t j = i + 1;
    for (; j < hulls.size() && hulls[j].first == p; ++j) {
      if (hulls[j].second.first <= hi) {
        hi = std::max(hi, hulls[j].second.second);
      } else {
        plan.unique_bytes_needed += hi - lo;
        lo = hulls[j].second.first;
        hi = hulls[j].second.second;
      }
    }
    plan.unique_bytes_needed += hi - lo;
    i = j;
  }

  if (!cat.from_pfs) return plan;
  // Runs: the spans of a piece merged where they touch or overlap.
  for (uint32_t p = 0; p < cat.pieces.size(); ++p) {
    const uint32_t b = plan.piece_first_span[p], e = plan.piece_first_span[p + 1];
    if (b == e) continue;
    std::vector<uint32_t> by_lo;
    for (uint32_t s = b; s < e; ++s) by_lo.push_back(s);
    std::sort(by_lo.begin(), by_lo.end(),
              [&](uint32_t x, uint32_t y) { return plan.spans[x].lo < plan.spans[y].lo; });
    for (uint32_t s : by_lo) {
      LoadPlan::Span& sp = plan.spans[s];
      if (!plan.runs.empty() && plan.runs.back().piece == p && sp.lo <= plan.runs.back().hi) {
        plan.runs.back().hi = std::max(plan.runs.back().hi, sp.hi);
      } else {
        plan.runs.push_back({p, sp.lo, sp.hi, -1});
      }
      sp.run = static_cast<int32_t>(plan.runs.size() - 1);
    }
  }
  // Readers. First the writer of each piece, when its class needs the run, up to a fair
  // share of the job's reads (so it streams through its own file front to back); the
  // rest largest first to the least loaded rank of a class that needs it.
  std::vector<std::vector<uint32_t>> classes_of_run(plan.runs.size());
  for (const LoadPlan::Span& s : plan.spans) {
    auto& v = classes_of_run[static_cast<size_t>(s.run)];
    if (v.empty() || v.back() != s.cls) v.push_back(s.cls);
  }
  std::vector<uint64_t> load(targets.class_of_rank.size(), 0);
  uint64_t total = 0, biggest = 0, readers = 0;
  for (const LoadPlan::Run& r : plan.runs) {
    total += r.hi - r.lo;
    biggest = std::max(biggest, r.hi - r.lo);
  }
  for (uint32_t c = 0; c < nclass; ++c)
    if (!plan.spans_of_class[c].empty()) readers += plan.members[c].size();
  const uint64_t cap = std::max(biggest, total / std::max<uint64_t>(readers, 1) / 10 * 11);
  for (LoadPlan::Run& r : plan.runs) {
    const int w = cat.pieces[r.piece].writer;
    if (w < 0 || static_cast<size_t>(w) >= load.size() ||
        load[static_cast<size_t>(w)] + (r.hi - r.lo) > cap)
      continue;
    const auto& cls = classes_of_run[&r - plan.runs.data()];
    if (std::find(cls.begin(), cls.end(), targets.class_of_rank[static_cast<size_t>(w)]) ==
        cls.end())
      continue;
    r.reader = w;
    load[static_cast<size_t>(w)] += r.hi - r.lo;
  }
  using Load = std::pair<uint64_t, int>;
  std::vector<std::priority_queue<Load, std::vector<Load>, std::greater<>>> heaps(nclass);
  for (uint32_t c = 0; c < nclass; ++c)
    for (int m : plan.members[c]) heaps[c].push({load[static_cast<size_t>(m)], m});
  std::vector<uint32_t> by_size;
  for (uint32_t i = 0; i < plan.runs.size(); ++i)
    if (plan.runs[i].reader < 0) by_size.push_back(i);
  std::stable_sort(by_size.begin(), by_size.end(), [&](uint32_t a, uint32_t b) {
    return plan.runs[a].hi - plan.runs[a].lo > plan.runs[b].hi - plan.runs[b].lo;
  });
  for (uint32_t r : by_size) {
    uint32_t best = classes_of_run[r].front();
    for (uint32_t c : classes_of_run[r])
      if (heaps[c].top() < heaps[best].top()) best = c;
    Load l = heaps[best].top();
    heaps[best].pop();
    plan.runs[r].reader = l.second;
    l.first += plan.runs[r].hi - plan.runs[r].lo;
    heaps[best].push(l);
  }
  plan.pfs_bytes_to_read = total;
  return plan;
}

RankLoad ForRank(const LoadPlan& plan, const LoadCatalog& cat, int rank) {
  RankLoad out;
  if (rank < 0) return out;
  uint32_t cls = UINT32_MAX;
  for (uint32_t c = 0; c < plan.members.size(); ++c)
    if (std::binary_search(plan.members[c].begin(), plan.members[c].end(), rank)) cls = c;
  if (cls != UINT32_MAX) {
    for (uint32_t s : plan.spans_of_class[cls]) {
      const LoadPlan::Span& sp = plan.spans[s];
      RankLoad::Get g{s, RankLoad::How::kLocal, rank};
      const int from = cat.from_pfs ? plan.runs[static_cast<size_t>(sp.run)].reader
                                    : LoadPlan::HolderFor(cat.pieces[sp.piece], rank);
      if (from != rank) {
        g.how = RankLoad::How::kRecv;
        g.from = from;
      } else if (cat.from_pfs) {
        g.how = RankLoad::How::kPfs;
      }
      out.gets.push_back(g);
    }
  }
  if (cat.from_pfs) {
    for (uint32_t r = 0; r < plan.runs.size(); ++r) {
      if (plan.runs[r].reader != rank) continue;
      out.my_runs.push_back(r);
      const uint32_t p = plan.runs[r].piece;
      for (uint32_t s = plan.piece_first_span[p]; s < plan.piece_first_span[p + 1]; ++s) {
        if (plan.spans[s].run != static_cast<int32_t>(r)) continue;
        for (int t : plan.members[plan.spans[s].cls])
          if (t != rank) out.puts.push_back({t, s});
      }
    }
    return out;
  }
  for (uint32_t p = 0; p < cat.pieces.size(); ++p) {
    const LoadPiece& piece = cat.pieces[p];
    if (!std::binary_search(piece.holders.begin(), piece.holders.end(), rank)) continue;
    for (uint32_t s = plan.piece_first_span[p]; s < plan.piece_first_span[p + 1]; ++s)
      for (int t : plan.members[plan.spans[s].cls])
        if (t != rank && LoadPlan::HolderFor(piece, t) == rank) out.puts.push_back({t, s});
  }
  return out;
}

Result<LoadTargets> GroupTargets(const std::vector<std::string>& encoded,
                                 const std::vector<uint64_t>& hashes) {
  LoadTargets out;
  std::unordered_map<uint64_t, uint32_t> ids;
  for (size_t r = 0; r < hashes.size(); ++r) {
    auto [it, fresh] = ids.emplace(hashes[r], static_cast<uint32_t>(out.classes.size()));
    if (fresh) {
      if (r >= encoded.size() || LayoutHash(encoded[r]) != hashes[r])
        return Status::Corruption("target layout of rank " + std::to_string(r) +
                                  " does not match its hash");
      auto l = DecodeRankLayout(encoded[r]);
      if (!l.ok()) return l.status().WithContext("target layout of rank " + std::to_string(r));
      out.classes.push_back(std::move(*l));
    }
    out.class_of_rank.push_back(it->second);
  }
  return out;
}

}  // namespace cairn
