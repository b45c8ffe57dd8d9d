#include "layout/load_planner.h"
#include "core/arith.h"
#include "core/box_copy.h"

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

int LoadPlan::HolderFor(const std::vector<int>& holders, int rank) {
  if (holders.empty()) return -1;
  if (std::binary_search(holders.begin(), holders.end(), rank)) return rank;
  return holders[static_cast<size_t>(rank) % holders.size()];
}

namespace {

// Builds a LoadPlan phase by phase: spans and fills per target, spans sorted, the bytes
// needed, then (from the PFS) runs and their readers.
class LoadPlanBuilder {
 public:
  LoadPlanBuilder(const LoadCatalog& cat, const LoadTargets& targets)
      : cat_(cat),
        targets_(targets),
        where_("step " + std::to_string(cat.step) + " (" + cat.where + ")") {}

  Result<LoadPlan> Build() {
    if (cat_.chunk_bytes == 0) return Status::InvalidArgument(where_ + ": chunk size is 0");
    IndexPieces();
    const size_t nclass = targets_.classes.size();
    plan_.members.resize(nclass);
    for (size_t r = 0; r < targets_.class_of_rank.size(); ++r)
      plan_.members[targets_.class_of_rank[r]].push_back(static_cast<int>(r));
    plan_.fills.resize(nclass);
    used_.assign(cat_.tensors.size(), false);
    for (uint32_t c = 0; c < nclass; ++c) {
      const RankLayout& layout = targets_.classes[c];
      const int who_rank = plan_.members[c].empty() ? -1 : plan_.members[c].front();
      const std::string who = "rank " + std::to_string(who_rank) + ", " + where_;
      for (uint32_t ti = 0; ti < layout.shards.size(); ++ti)
        CAIRN_RETURN_IF_ERROR(AddTarget(c, layout, ti, who));
    }
    for (uint32_t t = 0; t < cat_.tensors.size(); ++t)
      if (!used_[t]) plan_.unrestored.push_back(cat_.tensors[t].name);
    SortSpans();
    CountBytesNeeded();
    if (cat_.from_pfs) {
      MakeRuns();
      AssignReaders();
    }
    return std::move(plan_);
  }

 private:
  // Each tensor's saved pieces sorted by their first offset.
  void IndexPieces() {
    index_.resize(cat_.tensors.size());
    for (uint32_t t = 0; t < cat_.tensors.size(); ++t) tensor_ids_.emplace(cat_.tensors[t].name, t);
    for (uint32_t p = 0; p < cat_.pieces.size(); ++p)
      index_[cat_.pieces[p].tensor].pieces.push_back(p);
    for (TensorIndex& ix : index_) {
      auto first0 = [&](uint32_t p) {
        const Box& b = cat_.pieces[p].box;
        return b.ndim() ? b.offsets[0] : 0;
      };
      std::sort(ix.pieces.begin(), ix.pieces.end(),
                [&](uint32_t a, uint32_t b) { return first0(a) < first0(b); });
      for (uint32_t p : ix.pieces) {
        ix.first.push_back(first0(p));
        const Box& b = cat_.pieces[p].box;
        ix.max_len0 = std::max(ix.max_len0, b.ndim() ? b.lengths[0] : 1);
      }
    }
  }

  // The spans and fills of target `ti` of class `c`; an error naming `who` if the step
  // lacks its tensor, disagrees on its dtype or shape, or does not cover its box.
  Status AddTarget(uint32_t c, const RankLayout& layout, uint32_t ti, const std::string& who) {
    const TensorMeta& meta = layout.tensors[layout.shards[ti].tensor];
    const Box& tbox = layout.shards[ti].box;
    const bool checked = c < targets_.checked_classes;
    auto it = tensor_ids_.find(meta.name);
    if (!checked && (it == tensor_ids_.end() || !(cat_.tensors[it->second] == meta)))
      return Status::OK();  // the receiver's own plan says what is wrong
    if (it == tensor_ids_.end())
      return Status::NotFound(who + ": tensor '" + meta.name + "' was not saved");
    const TensorMeta& saved = cat_.tensors[it->second];
    if (saved.dtype != meta.dtype)
      return Status::InvalidArgument(who + ": tensor '" + meta.name + "' was saved as " +
                                     std::string(DTypeName(saved.dtype)) + " but the target is " +
                                     std::string(DTypeName(meta.dtype)));
    if (saved.global_shape != meta.global_shape)
      return Status::InvalidArgument(who + ": tensor '" + meta.name + "' was saved with shape " +
                                     ShapeToString(saved.global_shape) + " but the target has " +
                                     ShapeToString(meta.global_shape));
    if (checked) used_[it->second] = true;
    const size_t elem = DTypeSize(meta.dtype);
    const TensorIndex& ix = index_[it->second];
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
      const LoadPiece& piece = cat_.pieces[p];
      auto region = Intersect(piece.box, tbox);
      if (!region || region->empty()) continue;
      covered += region->numel();
      auto [lo, hi] = ByteHull(piece.box, *region, elem);
      if (checked) hulls_.push_back({p, {lo, hi}});
      const uint64_t clo = lo / cat_.chunk_bytes * cat_.chunk_bytes;
      const uint64_t chi = std::min(piece.nbytes, RoundUp(hi, cat_.chunk_bytes));
      const uint64_t key = (static_cast<uint64_t>(p) << 32) | c;
      auto [sit, fresh] = span_of_.emplace(key, static_cast<uint32_t>(plan_.spans.size()));
      if (fresh) {
        plan_.spans.push_back({p, c, clo, chi, -1});
      } else {
        LoadPlan::Span& s = plan_.spans[sit->second];
        s.lo = std::min(s.lo, clo);
        s.hi = std::max(s.hi, chi);
      }
      plan_.fills[c].push_back({sit->second, ti, std::move(*region)});
    }
    if (checked && covered < tbox.numel()) {
      std::string saved_boxes;
      for (size_t k = 0; k < ix.pieces.size() && k < 4; ++k)
        saved_boxes += " " + cat_.pieces[ix.pieces[k]].box.ToString();
      if (ix.pieces.size() > 4) saved_boxes += " ...";
      return Status::InvalidArgument(
          who + ": tensor '" + meta.name + "' box " + tbox.ToString() +
          " is not fully covered by the saved boxes (saved:" + saved_boxes + ")");
    }
    return Status::OK();
  }

  void SortSpans() {
    const size_t nclass = targets_.classes.size();
    // Spans sorted by (piece, class); fills follow.
    std::vector<uint32_t> order(plan_.spans.size());
    for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      const auto& x = plan_.spans[a];
      const auto& y = plan_.spans[b];
      return x.piece != y.piece ? x.piece < y.piece : x.cls < y.cls;
    });
    std::vector<uint32_t> new_index(order.size());
    std::vector<LoadPlan::Span> sorted(order.size());
    for (uint32_t i = 0; i < order.size(); ++i) {
      new_index[order[i]] = i;
      sorted[i] = plan_.spans[order[i]];
    }
    plan_.spans = std::move(sorted);
    for (auto& fills : plan_.fills)
      for (auto& f : fills) f.span = new_index[f.span];
    plan_.spans_of_class.resize(nclass);
    plan_.piece_first_span.assign(cat_.pieces.size() + 1, 0);
    for (uint32_t i = 0; i < plan_.spans.size(); ++i) {
      plan_.spans_of_class[plan_.spans[i].cls].push_back(i);
      plan_.piece_first_span[plan_.spans[i].piece + 1] = i + 1;
    }
    for (size_t p = 1; p < plan_.piece_first_span.size(); ++p)
      plan_.piece_first_span[p] =
          std::max(plan_.piece_first_span[p], plan_.piece_first_span[p - 1]);
  }

  void CountBytesNeeded() {
    // Bytes needed: the union of the exact hulls_, per piece.
    std::sort(hulls_.begin(), hulls_.end());
    for (size_t i = 0; i < hulls_.size();) {
      const uint32_t p = hulls_[i].first;
      uint64_t lo = hulls_[i].second.first, hi = hulls_[i].second.second;
      size_t j = i + 1;
      for (; j < hulls_.size() && hulls_[j].first == p; ++j) {
        if (hulls_[j].second.first <= hi) {
          hi = std::max(hi, hulls_[j].second.second);
        } else {
          plan_.unique_bytes_needed += hi - lo;
          lo = hulls_[j].second.first;
          hi = hulls_[j].second.second;
        }
      }
      plan_.unique_bytes_needed += hi - lo;
      i = j;
    }
  }

  void MakeRuns() {
    // Runs: the spans of a piece merged where they touch or overlap.
    for (uint32_t p = 0; p < cat_.pieces.size(); ++p) {
      const uint32_t b = plan_.piece_first_span[p], e = plan_.piece_first_span[p + 1];
      if (b == e) continue;
      std::vector<uint32_t> by_lo;
      for (uint32_t s = b; s < e; ++s) by_lo.push_back(s);
      std::sort(by_lo.begin(), by_lo.end(),
                [&](uint32_t x, uint32_t y) { return plan_.spans[x].lo < plan_.spans[y].lo; });
      for (uint32_t s : by_lo) {
        LoadPlan::Span& sp = plan_.spans[s];
        if (!plan_.runs.empty() && plan_.runs.back().piece == p && sp.lo <= plan_.runs.back().hi) {
          plan_.runs.back().hi = std::max(plan_.runs.back().hi, sp.hi);
        } else {
          plan_.runs.push_back({p, sp.lo, sp.hi, -1});
        }
        sp.run = static_cast<int32_t>(plan_.runs.size() - 1);
      }
    }
  }

  void AssignReaders() {
    const size_t nclass = targets_.classes.size();
    // Readers. First the writer of each piece, when its class needs the run, up to a fair
    // share of the job's reads (so it streams through its own file front to back); the
    // rest largest first to the least loaded rank of a class that needs it.
    std::vector<std::vector<uint32_t>> classes_of_run(plan_.runs.size());
    for (const LoadPlan::Span& s : plan_.spans) {
      auto& v = classes_of_run[static_cast<size_t>(s.run)];
      if (v.empty() || v.back() != s.cls) v.push_back(s.cls);
    }
    std::vector<uint64_t> load(targets_.class_of_rank.size(), 0);
    uint64_t total = 0, biggest = 0, readers = 0;
    for (const LoadPlan::Run& r : plan_.runs) {
      total += r.hi - r.lo;
      biggest = std::max(biggest, r.hi - r.lo);
    }
    for (uint32_t c = 0; c < nclass; ++c)
      if (!plan_.spans_of_class[c].empty()) readers += plan_.members[c].size();
    const uint64_t cap = std::max(biggest, total / std::max<uint64_t>(readers, 1) / 10 * 11);
    for (LoadPlan::Run& r : plan_.runs) {
      const int w = cat_.pieces[r.piece].writer;
      if (w < 0 || static_cast<size_t>(w) >= load.size() ||
          load[static_cast<size_t>(w)] + (r.hi - r.lo) > cap)
        continue;
      const auto& cls = classes_of_run[&r - plan_.runs.data()];
      if (std::find(cls.begin(), cls.end(), targets_.class_of_rank[static_cast<size_t>(w)]) ==
          cls.end())
        continue;
      r.reader = w;
      load[static_cast<size_t>(w)] += r.hi - r.lo;
    }
    using Load = std::pair<uint64_t, int>;
    std::vector<std::priority_queue<Load, std::vector<Load>, std::greater<>>> heaps(nclass);
    for (uint32_t c = 0; c < nclass; ++c)
      for (int m : plan_.members[c]) heaps[c].push({load[static_cast<size_t>(m)], m});
    std::vector<uint32_t> by_size;
    for (uint32_t i = 0; i < plan_.runs.size(); ++i)
      if (plan_.runs[i].reader < 0) by_size.push_back(i);
    std::stable_sort(by_size.begin(), by_size.end(), [&](uint32_t a, uint32_t b) {
      return plan_.runs[a].hi - plan_.runs[a].lo > plan_.runs[b].hi - plan_.runs[b].lo;
    });
    for (uint32_t r : by_size) {
      uint32_t best = classes_of_run[r].front();
      for (uint32_t c : classes_of_run[r])
        if (heaps[c].top() < heaps[best].top()) best = c;
      Load l = heaps[best].top();
      heaps[best].pop();
      plan_.runs[r].reader = l.second;
      l.first += plan_.runs[r].hi - plan_.runs[r].lo;
      heaps[best].push(l);
    }
    plan_.pfs_bytes_to_read = total;
  }

  const LoadCatalog& cat_;
  const LoadTargets& targets_;
  const std::string where_;
  std::unordered_map<std::string, uint32_t> tensor_ids_;
  std::vector<TensorIndex> index_;
  LoadPlan plan_;
  std::unordered_map<uint64_t, uint32_t> span_of_;  // (piece << 32 | class) -> span
  std::vector<std::pair<uint32_t, std::pair<uint64_t, uint64_t>>> hulls_;  // exact, per piece
  std::vector<bool> used_;
};

}  // namespace

Result<LoadPlan> MakeLoadPlan(const LoadCatalog& cat, const LoadTargets& targets) {
  return LoadPlanBuilder(cat, targets).Build();
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
  // Gets are in span order, which is piece order; so are puts, per receiver.
  std::unordered_map<int, uint32_t> next;
  for (RankLoad::Get& g : out.gets)
    if (g.how == RankLoad::How::kRecv) g.seq = next[g.from]++;
  next.clear();
  for (uint32_t p = 0; p < cat.pieces.size(); ++p) {
    const LoadPiece& piece = cat.pieces[p];
    if (!std::binary_search(piece.holders.begin(), piece.holders.end(), rank)) continue;
    for (uint32_t s = plan.piece_first_span[p]; s < plan.piece_first_span[p + 1]; ++s)
      for (int t : plan.members[plan.spans[s].cls])
        if (t != rank && LoadPlan::HolderFor(piece, t) == rank)
          out.puts.push_back({t, s, next[t]++});
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
