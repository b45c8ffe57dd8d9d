#include "recovery/rebuild.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "core/clock.h"
#include "core/trace.h"
#include "recovery/restore_transfer.h"
#include "wire/codec.h"

namespace cairn {
namespace {

// A record and the rank that holds it.
struct Held {
  int holder;
  const RebuildHoldings::Record* rec;
};

bool SameStripe(const RebuildHoldings::Record& a, const RebuildHoldings::Record& b) {
  return a.scheme.k == b.scheme.k && a.scheme.m == b.scheme.m && a.key.stripe == b.key.stripe &&
         a.key.step == b.key.step && a.world_size == b.world_size &&
         a.parity_bytes == b.parity_bytes && a.sources == b.sources && a.data_bytes == b.data_bytes;
}

// The rebuild of `r` at step `t`, its transfers appended to *transfers (seq from *seq);
// false when the live ranks' pieces do not suffice.
bool PlanTarget(int r, int64_t t, const std::set<int>& lost, const std::vector<Held>& records,
                RebuildTarget* out, std::vector<RebuildTransfer>* transfers, uint32_t* seq) {
  RebuildTarget target;
  target.source = r;
  std::vector<RebuildTransfer> mine;
  uint32_t next = *seq;
  bool have_scheme = false;
  for (int j = 0; !have_scheme || j < target.scheme.data(); ++j) {
    // The first record naming r as piece j of a stripe at step t: the reference, and every
    // parity row of the same stripe made from the same pieces.
    const RebuildHoldings::Record* ref = nullptr;
    std::map<int, Held> rows;
    for (const Held& h : records) {
      const auto& rec = *h.rec;
      if (rec.key.step != t || j >= rec.scheme.data() || rec.sources[static_cast<size_t>(j)] != r)
        continue;
      if (have_scheme && (rec.scheme.k != target.scheme.k || rec.scheme.m != target.scheme.m))
        continue;
      if (!ref) ref = &rec;
      if (SameStripe(rec, *ref)) rows.emplace(rec.key.row, h);
    }
    if (!ref) return false;
    if (!have_scheme) {
      target.scheme = ref->scheme;
      target.data_bytes = ref->data_bytes[static_cast<size_t>(j)];
      have_scheme = true;
    }
    const int d = target.scheme.data();
    RebuildTarget::Stripe stripe;
    stripe.j = j;
    stripe.len = ref->parity_bytes;
    // The other members' own versions first, then parity rows, d in all.
    for (int i = 0; i < d && static_cast<int>(stripe.index.size()) < d; ++i) {
      const int q = ref->sources[static_cast<size_t>(i)];
      if (i == j || lost.contains(q)) continue;
      RebuildTransfer x;
      x.kind = RebuildTransfer::Kind::kData;
      x.sender = q;
      x.rebuilder = r;
      x.seq = next++;
      x.piece = i;
      x.data_bytes = ref->data_bytes[static_cast<size_t>(i)];
      x.offset = PieceOf(x.data_bytes, d, i).offset;
      x.bytes = PieceOf(x.data_bytes, d, i).length;
      x.key = ref->key;
      stripe.index.push_back(i);
      stripe.seq.push_back(x.seq);
      mine.push_back(x);
    }
    for (const auto& [row, h] : rows) {
      if (static_cast<int>(stripe.index.size()) >= d) break;
      RebuildTransfer x;
      x.kind = RebuildTransfer::Kind::kParity;
      x.sender = h.holder;
      x.rebuilder = r;
      x.seq = next++;
      x.key = h.rec->key;
      x.bytes = h.rec->parity_bytes;
      stripe.index.push_back(d + row);
      stripe.seq.push_back(x.seq);
      mine.push_back(x);
      if (target.header_bytes == 0 && target.header_seq == 0) {
        RebuildTransfer hx = x;
        hx.kind = RebuildTransfer::Kind::kHeader;
        hx.seq = next++;
        hx.piece = j;
        hx.bytes = h.rec->header_bytes[static_cast<size_t>(j)];
        target.header_seq = hx.seq;
        target.header_bytes = hx.bytes;
        mine.push_back(hx);
      }
    }
    if (static_cast<int>(stripe.index.size()) < d || target.header_bytes == 0) return false;
    target.stripes.push_back(std::move(stripe));
  }
  *out = std::move(target);
  transfers->insert(transfers->end(), mine.begin(), mine.end());
  *seq = next;
  return true;
}

}  // namespace

std::string EncodeRebuildHoldings(const RebuildHoldings& h) {
  wire::RebuildInventory w;
  for (int64_t s : h.own_steps) w.add_own_steps(s);
  for (const auto& r : h.records) {
    auto* x = w.add_records();
    x->set_k(static_cast<uint32_t>(r.scheme.k));
    x->set_m(static_cast<uint32_t>(r.scheme.m));
    x->set_stripe(static_cast<uint32_t>(r.key.stripe));
    x->set_row(static_cast<uint32_t>(r.key.row));
    x->set_step(r.key.step);
    x->set_world_size(r.world_size);
    x->set_parity_bytes(r.parity_bytes);
    for (size_t j = 0; j < r.sources.size(); ++j) {
      x->add_sources(r.sources[j]);
      x->add_data_bytes(r.data_bytes[j]);
      x->add_header_bytes(r.header_bytes[j]);
    }
  }
  return wire::Encode(w);
}

Result<RebuildHoldings> DecodeRebuildHoldings(std::string_view bytes, const std::string& from) {
  CAIRN_ASSIGN_OR_RETURN(auto w, wire::Decode<wire::RebuildInventory>(bytes, "rebuild inventory"));
  RebuildHoldings h;
  h.own_steps.assign(w.own_steps().begin(), w.own_steps().end());
  for (const auto& x : w.records()) {
    RebuildHoldings::Record r;
    r.scheme = {static_cast<int>(std::min<uint32_t>(x.k(), 1u << 16)),
                static_cast<int>(std::min<uint32_t>(x.m(), 1u << 16))};
    auto bad = [&](const std::string& why) {
      return Status::Corruption("rebuild inventory from " + from + ": " + why);
    };
    if (!ValidateErasureScheme(r.scheme).ok()) return bad("no erasure scheme");
    const int d = r.scheme.data();
    if (x.stripe() >= x.k() || x.row() >= x.m() || x.step() < 0 || x.world_size() == 0 ||
        x.parity_bytes() > kMaxFileOffset || x.sources_size() != d || x.data_bytes_size() != d ||
        x.header_bytes_size() != d)
      return bad("a parity record out of range");
    r.key = {static_cast<int>(x.stripe()), static_cast<int>(x.row()), x.step()};
    r.world_size = x.world_size();
    r.parity_bytes = x.parity_bytes();
    for (int j = 0; j < d; ++j) {
      const int src = x.sources(j);
      const uint64_t n = x.data_bytes(j), hb = x.header_bytes(j);
      if (src < 0 || static_cast<uint32_t>(src) >= r.world_size || n > kMaxFileOffset ||
          PieceBytes(n, d) > r.parity_bytes || hb == 0 || hb > kMaxSlotHeaderBytes)
        return bad("a parity record's piece out of range");
      r.sources.push_back(src);
      r.data_bytes.push_back(n);
      r.header_bytes.push_back(hb);
    }
    h.records.push_back(std::move(r));
  }
  return h;
}

RebuildPlan PlanRebuild(const std::vector<RebuildHoldings>& all) {
  RebuildPlan plan;
  const int world = static_cast<int>(all.size());
  std::set<int64_t, std::greater<>> steps;
  std::vector<std::set<int64_t>> own(all.size());
  std::vector<Held> records;
  for (int r = 0; r < world; ++r) {
    const RebuildHoldings& h = all[static_cast<size_t>(r)];
    own[static_cast<size_t>(r)].insert(h.own_steps.begin(), h.own_steps.end());
    steps.insert(h.own_steps.begin(), h.own_steps.end());
    for (const auto& rec : h.records) {
      if (rec.world_size != static_cast<uint32_t>(world)) continue;  // another job's sets
      records.push_back({r, &rec});
      steps.insert(rec.key.step);
    }
  }
  bool first = true;
  for (int64_t t : steps) {
    std::set<int> lost;
    for (int r = 0; r < world; ++r)
      if (!own[static_cast<size_t>(r)].contains(t)) lost.insert(r);
    if (lost.empty()) return plan;  // the newest step every rank holds: nothing to rebuild
    std::vector<RebuildTarget> targets;
    std::vector<RebuildTransfer> transfers;
    uint32_t seq = 1;
    bool ok = true;
    for (int r : lost) {
      RebuildTarget target;
      if (!PlanTarget(r, t, lost, records, &target, &transfers, &seq)) {
        ok = false;
        if (first) plan.not_rebuildable.push_back(r);
        continue;
      }
      targets.push_back(std::move(target));
    }
    first = false;
    if (!ok) continue;
    plan.step = t;
    plan.lost.assign(lost.begin(), lost.end());
    plan.targets = std::move(targets);
    plan.transfers = std::move(transfers);
    return plan;
  }
  return plan;
}

Result<RebuildReport> RebuildLost(const RebuildEnv& env) {
  TraceSpan span("rebuild", "restore");
  const int64_t t0 = NowNanos();
  RebuildReport report;
  std::optional<TraceSpan> phase;  // the phases, in the trace under "rebuild"
  // 1. inventory
  phase.emplace("rebuild inventory", "restore");
  RebuildHoldings mine;
  for (const VersionInfo& v : env.own->Versions()) mine.own_steps.push_back(v.step);
  std::vector<ParityRecord> records = env.parity ? env.parity->List() : std::vector<ParityRecord>{};
  for (const ParityRecord& p : records) {
    RebuildHoldings::Record r;
    r.scheme = p.scheme;
    r.key = p.key;
    r.world_size = p.world_size;
    r.parity_bytes = p.parity_bytes;
    for (const ParityPiece& piece : p.pieces) {
      r.sources.push_back(piece.source);
      r.data_bytes.push_back(piece.data_bytes);
      r.header_bytes.push_back(piece.header.size());
    }
    mine.records.push_back(std::move(r));
  }
  CAIRN_ASSIGN_OR_RETURN(std::vector<std::string> gathered,
                         env.group->AllGather(EncodeRebuildHoldings(mine)));
  std::vector<RebuildHoldings> all;
  for (size_t r = 0; r < gathered.size(); ++r) {
    CAIRN_ASSIGN_OR_RETURN(RebuildHoldings h,
                           DecodeRebuildHoldings(gathered[r], "rank " + std::to_string(r)));
    all.push_back(std::move(h));
  }
  // 2. plan
  phase.reset();
  phase.emplace("rebuild plan", "restore");
  const RebuildPlan plan = PlanRebuild(all);
  if (plan.step < 0) {
    if (!plan.not_rebuildable.empty() && env.log && env.rank == 0) {
      std::string who;
      for (int r : plan.not_rebuildable) who += (who.empty() ? "" : ", ") + std::to_string(r);
      env.log->Warning("rebuild: the versions of rank(s) " + who +
                       " are lost and their sets do not hold enough pieces to decode them "
                       "(more nodes of a set lost than its parity covers, or parity not yet "
                       "complete): the restore uses an older step or the PFS");
    }
    return report;
  }
  report.step = plan.step;
  report.lost = plan.lost;
  // 3. transfer: this rank's sends, then its receives
  phase.reset();
  phase.emplace("rebuild transfers", "restore");
  std::unique_ptr<HostTier::View> pinned;
  Status pin_error;
  bool pinned_tried = false;
  std::vector<std::vector<std::byte>> keep;              // bytes being sent, alive until Finish
  std::vector<std::shared_ptr<const std::byte>> mapped;  // parity being sent, the same
  auto find_record = [&](const ParityKey& key) -> const ParityRecord* {
    for (const ParityRecord& p : records)
      if (p.key == key) return &p;
    return nullptr;
  };
  Status send_error;
  for (const RebuildTransfer& x : plan.transfers) {
    if (x.sender != env.rank) continue;
    const void* buf = nullptr;
    Status why;
    if (x.kind == RebuildTransfer::Kind::kData) {
      if (!pinned_tried) {
        pinned_tried = true;
        auto p = env.own->Pin(plan.step);
        if (p.ok())
          pinned = std::move(*p);
        else
          pin_error = p.status();
      }
      if (!pinned)
        why = pin_error;
      else if (pinned->header().data_bytes != x.data_bytes)
        why =
            Status::Corruption("this rank's version of step " + std::to_string(plan.step) +
                               " has " + std::to_string(pinned->header().data_bytes) +
                               " bytes, the parity was made from " + std::to_string(x.data_bytes));
      else
        buf = pinned->data() + x.offset;
    } else {
      const ParityRecord* rec = find_record(x.key);
      if (!rec) {
        why = Status::NotFound("parity record gone");
      } else if (x.kind == RebuildTransfer::Kind::kParity) {
        auto bytes = env.parity->MapParity(*rec);
        if (bytes.ok()) {
          mapped.push_back(std::move(*bytes));
          buf = mapped.back().get();
        } else {
          why = bytes.status();
        }
      } else {
        buf = rec->pieces[static_cast<size_t>(x.piece)].header.data();  // `records` outlives Finish
      }
    }
    if (!buf) {
      // The rebuilder waits for these bytes: zeros, which fail its verification.
      if (env.log)
        env.log->Warning(env.who + ": rebuild of rank " + std::to_string(x.rebuilder) + "'s step " +
                         std::to_string(plan.step) + ": sending zeros: " + why.message());
      keep.emplace_back(x.bytes);
      buf = keep.back().data();
    }
    Status st = env.transport->Send(x.rebuilder, x.seq, buf, x.bytes);
    if (!st.ok() && send_error.ok()) send_error = st;
  }
  // The pieces of the versions this rank rebuilds, each stripe's in buffers of its length
  // (a data piece shorter than its stripe ends in zeros).
  struct Incoming {
    const RebuildTarget* target;
    // The received pieces, in one mapping whose pages are made in one call (a fault per 4 KiB
    // page of 192 MiB of pieces was a fifth of a 64 MiB rebuild's transfer time).
    std::unique_ptr<restore_internal::StagingBuffer> scratch;
    std::vector<std::vector<std::byte*>> pieces;  // [stripe][received], in the scratch
    std::string header;
    // The slot the version is decoded into, reserved and its pages made on a thread of its
    // own while the pieces arrive (a fresh slot of 64 MiB took 25-30 ms to fault in, which
    // the transfers, waiting on the network, leave room for).
    std::thread preparing;
    HostTier* tier = nullptr;
    int slot = -1;
    Result<std::byte*> mem = Status::Internal("slot not prepared");
    // Joins the thread; the slot, if it was reserved, stays reserved (Commit or Abort).
    void Join() {
      if (preparing.joinable()) preparing.join();
    }
    ~Incoming() {
      Join();
      if (tier && slot >= 0) tier->Abort(slot);
    }
  };
  std::vector<std::unique_ptr<Incoming>> incoming;  // (not moved: a thread holds each)
  for (const RebuildTarget& t : plan.targets) {
    if (t.source != env.rank) continue;
    auto inp = std::make_unique<Incoming>();
    Incoming& in = *inp;
    in.target = &t;
    in.header.resize(t.header_bytes);
    in.preparing = std::thread([&env, &in, step = plan.step] {
      const RebuildTarget& t = *in.target;
      auto tier = env.store->TierFor(t.source);
      if (!tier.ok()) {
        in.mem = tier.status();
        return;
      }
      auto slot = (*tier)->Reserve(step, FullPolicy::kSkip);
      if (!slot.ok()) {
        in.mem = slot.status();
        return;
      }
      in.tier = *tier;
      in.slot = *slot;
      // What the CAPTURING header names until the version is published with the one sent.
      SlotHeader base;
      base.rank = static_cast<uint32_t>(t.source);
      base.world_size = static_cast<uint32_t>(env.world_size);
      in.mem = in.tier->Prepare(in.slot, step, t.data_bytes, base);
    });
    uint64_t total = 0;
    for (const auto& stripe : t.stripes) total += stripe.index.size() * stripe.len;
    in.scratch = std::make_unique<restore_internal::StagingBuffer>(total, /*populate=*/true);
    // Not zeroed: the transfer fills each piece, up to its length (the tail is zeroed below).
    std::byte* next = in.scratch->data();
    for (const auto& stripe : t.stripes) {
      in.pieces.emplace_back();
      for (size_t i = 0; i < stripe.index.size(); ++i, next += stripe.len)
        in.pieces.back().push_back(next);
    }
    incoming.push_back(std::move(inp));
  }
  std::map<uint32_t, const RebuildTransfer*> by_seq;
  for (const RebuildTransfer& x : plan.transfers) by_seq[x.seq] = &x;
  Status recv_error;
  for (auto& inp : incoming) {
    Incoming& in = *inp;
    const RebuildTarget& t = *in.target;
    for (size_t s = 0; s < t.stripes.size(); ++s) {
      const auto& stripe = t.stripes[s];
      for (size_t i = 0; i < stripe.index.size(); ++i) {
        const RebuildTransfer& x = *by_seq.at(stripe.seq[i]);
        std::byte* buf = in.pieces[s][i];
        if (x.bytes < stripe.len) std::memset(buf + x.bytes, 0, stripe.len - x.bytes);
        Status st = env.transport->PostRecv(x.sender, x.seq, buf, std::min(x.bytes, stripe.len));
        if (!st.ok() && recv_error.ok()) recv_error = st;
      }
    }
    const RebuildTransfer& hx = *by_seq.at(t.header_seq);
    Status st = env.transport->PostRecv(hx.sender, hx.seq, in.header.data(), in.header.size());
    if (!st.ok() && recv_error.ok()) recv_error = st;
  }
  Status done = env.transport->Finish(env.timeout_s);
  if (!send_error.ok()) done = send_error;
  if (!recv_error.ok()) done = recv_error;
  if (!done.ok()) {
    report.error = "rebuild transfers of step " + std::to_string(plan.step) + ": " + done.message();
    if (env.log && !incoming.empty()) env.log->Warning(env.who + ": " + report.error);
    report.seconds = NanosToSeconds(NowNanos() - t0);
    return report;
  }
  // 4. decode, verify, publish
  phase.reset();
  phase.emplace("rebuild decode verify publish", "restore");
  for (auto& inp : incoming) {
    Incoming& in = *inp;
    const RebuildTarget& t = *in.target;
    auto fail = [&](const Status& why) {
      report.error = "rank " + std::to_string(t.source) + "'s step " + std::to_string(plan.step) +
                     " not rebuilt from parity (" + t.scheme.Describe() + "): " + why.message();
      if (env.log) env.log->Warning(env.who + ": " + report.error);
    };
    auto code = ErasureCode::Make(t.scheme);
    if (!code.ok()) {
      fail(code.status());
      continue;
    }
    // The header first: the version is decoded straight into the slot it is published in.
    auto header = DecodeSlotHeader(in.header);
    if (!header.ok()) {
      fail(header.status());
      continue;
    }
    if (header->step != plan.step || header->data_bytes != t.data_bytes) {
      fail(Status::Corruption("the slot header names step " + std::to_string(header->step) +
                              " of " + std::to_string(header->data_bytes) + " bytes"));
      continue;
    }
    // Published like a replica: the restore that follows finds it in this rank's memory.
    in.Join();
    Status st = in.mem.status();
    if (!st.ok()) {
      fail(st);
      continue;
    }
    HostTier* ht = in.tier;
    const int slot = in.slot;
    std::byte* const data = *in.mem;
    const int d = t.scheme.data();
    std::vector<std::byte> tail;  // a stripe's piece longer than what is left of the version
    for (size_t s = 0; s < t.stripes.size() && st.ok(); ++s) {
      const auto& stripe = t.stripes[s];
      std::vector<const std::byte*> pieces(static_cast<size_t>(t.scheme.k), nullptr);
      for (size_t i = 0; i < stripe.index.size(); ++i)
        pieces[static_cast<size_t>(stripe.index[i])] = in.pieces[s][i];
      const PieceRange r = PieceOf(t.data_bytes, d, stripe.j);
      std::byte* dst = nullptr;
      if (r.length == stripe.len) {
        dst = data + r.offset;
      } else {
        tail.resize(stripe.len);
        dst = tail.data();
      }
      std::vector<std::byte*> out(static_cast<size_t>(d), nullptr);
      out[static_cast<size_t>(stripe.j)] = dst;
      st = code->Decode(pieces, stripe.len, out);
      if (st.ok() && dst == tail.data() && r.length > 0)
        std::memcpy(data + r.offset, tail.data(), r.length);
    }
    if (st.ok()) st = ReplicaStore::Verify(*header, data);
    if (st.ok()) {
      ht->MarkCopied(slot);
      st = ht->Commit(slot, *header);
    }
    if (!st.ok()) {
      fail(st);  // ~Incoming aborts the slot
      continue;
    }
    in.slot = -1;  // published
    report.rebuilt_here.push_back(t.source);
    if (env.log)
      env.log->Info(env.who + ": rebuilt rank " + std::to_string(t.source) + "'s step " +
                    std::to_string(plan.step) + " (" + std::to_string(t.data_bytes) +
                    " bytes) from parity (" + t.scheme.Describe() + ")");
  }
  report.seconds = NanosToSeconds(NowNanos() - t0);
  return report;
}

}  // namespace cairn
