#include "recovery/rebuild.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>

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
// false when the live ranks' pieces do not suffice. Each stripe's decoder is the live rank
// among its d providers with the fewest stripes to decode so far (*load).
bool PlanTarget(int r, int64_t t, const std::set<int>& lost, const std::vector<Held>& records,
                std::map<int, int>* load, RebuildTarget* out,
                std::vector<RebuildTransfer>* transfers, uint32_t* seq) {
  RebuildTarget target;
  target.source = r;
  std::vector<RebuildTransfer> mine;
  uint32_t next = *seq;
  // The seqs of a transfer of `bytes` (one per chunk) from `next`; false when they run out.
  bool seqs_left = true;
  auto reserve = [&](uint64_t bytes) {
    const uint32_t first = next;
    if (RebuildChunks(bytes) >= UINT32_MAX - uint64_t{next})
      seqs_left = false;
    else
      next += static_cast<uint32_t>(RebuildChunks(bytes));
    return first;
  };
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
    std::vector<RebuildTransfer> shares;
    for (int i = 0; i < d && static_cast<int>(shares.size()) < d; ++i) {
      const int q = ref->sources[static_cast<size_t>(i)];
      if (i == j || lost.contains(q)) continue;
      RebuildTransfer x;
      x.kind = RebuildTransfer::Kind::kData;
      x.sender = q;
      x.piece = i;
      x.data_bytes = ref->data_bytes[static_cast<size_t>(i)];
      x.offset = PieceOf(x.data_bytes, d, i).offset;
      x.bytes = PieceOf(x.data_bytes, d, i).length;
      x.key = ref->key;
      stripe.index.push_back(i);
      shares.push_back(x);
    }
    std::optional<RebuildTransfer> header;  // the lost rank's slot header, from a parity holder
    for (const auto& [row, h] : rows) {
      if (static_cast<int>(shares.size()) >= d) break;
      RebuildTransfer x;
      x.kind = RebuildTransfer::Kind::kParity;
      x.sender = h.holder;
      x.key = h.rec->key;
      x.bytes = h.rec->parity_bytes;
      stripe.index.push_back(d + row);
      shares.push_back(x);
      if (!header && target.header_bytes == 0) {
        header = x;
        header->kind = RebuildTransfer::Kind::kHeader;
        header->receiver = r;
        header->piece = j;
        header->bytes = h.rec->header_bytes[static_cast<size_t>(j)];
      }
    }
    if (static_cast<int>(shares.size()) < d) return false;
    // The decoder: the provider with the fewest stripes so far (the first of them on a tie).
    int decoder = shares[0].sender;
    for (const RebuildTransfer& x : shares)
      if ((*load)[x.sender] < (*load)[decoder]) decoder = x.sender;
    ++(*load)[decoder];
    stripe.decoder = decoder;
    for (RebuildTransfer& x : shares) {
      x.receiver = decoder;  // the decoder's own share is read where it lies, not sent
      x.seq = reserve(x.bytes);
      stripe.seq.push_back(x.seq);
    }
    if (header) {
      header->seq = reserve(header->bytes);
      target.header_seq = header->seq;
      target.header_bytes = header->bytes;
      mine.push_back(*header);
    }
    mine.insert(mine.end(), shares.begin(), shares.end());
    // The decoded piece, from the decoder to the lost rank (none for an empty piece).
    const PieceRange piece = PieceOf(target.data_bytes, d, j);
    if (piece.length > 0) {
      RebuildTransfer dx;
      dx.kind = RebuildTransfer::Kind::kDecoded;
      dx.sender = decoder;
      dx.receiver = r;
      dx.seq = reserve(piece.length);
      dx.piece = j;
      dx.data_bytes = target.data_bytes;
      dx.offset = piece.offset;
      dx.bytes = piece.length;
      stripe.decoded_seq = dx.seq;
      mine.push_back(dx);
    }
    target.stripes.push_back(std::move(stripe));
  }
  if (target.header_bytes == 0 || !seqs_left) return false;
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
    std::map<int, int> load;
    bool ok = true;
    for (int r : lost) {
      RebuildTarget target;
      if (!PlanTarget(r, t, lost, records, &load, &target, &transfers, &seq)) {
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
  // 3. gather: this rank's shares to their stripes' decoders, the pieces of the stripes it
  // decodes from the others, and the headers and pieces of the versions it rebuilds
  phase.reset();
  phase.emplace("rebuild transfers", "restore");
  std::unique_ptr<HostTier::View> pinned;
  Status pin_error;
  bool pinned_tried = false;
  std::vector<std::shared_ptr<const std::byte>> mapped;  // parity being sent, the same
  auto find_record = [&](const ParityKey& key) -> const ParityRecord* {
    for (const ParityRecord& p : records)
      if (p.key == key) return &p;
    return nullptr;
  };
  // Where this rank's share `x` (data, parity or header) lies, or null and why not.
  auto share = [&](const RebuildTransfer& x, Status* why) -> const std::byte* {
    if (x.kind == RebuildTransfer::Kind::kData) {
      if (!pinned_tried) {
        pinned_tried = true;
        auto p = env.own->Pin(plan.step);
        if (p.ok())
          pinned = std::move(*p);
        else
          pin_error = p.status();
      }
      if (!pinned) {
        *why = pin_error;
        return nullptr;
      }
      if (pinned->header().data_bytes != x.data_bytes) {
        *why =
            Status::Corruption("this rank's version of step " + std::to_string(plan.step) +
                               " has " + std::to_string(pinned->header().data_bytes) +
                               " bytes, the parity was made from " + std::to_string(x.data_bytes));
        return nullptr;
      }
      return pinned->data() + x.offset;
    }
    const ParityRecord* rec = find_record(x.key);
    if (!rec) {
      *why = Status::NotFound("parity record gone");
      return nullptr;
    }
    if (x.kind == RebuildTransfer::Kind::kParity) {
      auto bytes = env.parity->MapParity(*rec);
      if (!bytes.ok()) {
        *why = bytes.status();
        return nullptr;
      }
      mapped.push_back(std::move(*bytes));
      return mapped.back().get();
    }
    // `records` outlives Finish
    return reinterpret_cast<const std::byte*>(
        rec->pieces[static_cast<size_t>(x.piece)].header.data());
  };
  Status send_error;
  std::vector<std::byte> zeros;  // what is sent for a share or piece that cannot be had
  std::set<uint32_t> zeroed;     // the transfers sent as zeros (said once each)
  // Sends chunk `c` of `x` from `src` (where that chunk's bytes lie); `ticket` (optional)
  // for WaitSend.
  auto send_one = [&](const RebuildTransfer& x, uint64_t c, const std::byte* src,
                      uint64_t* ticket) {
    Status st = env.transport->Send(x.receiver, x.seq + static_cast<uint32_t>(c), src,
                                    RebuildChunkLen(x.bytes, c), ticket);
    if (!st.ok() && send_error.ok()) send_error = st;
  };
  // Sends chunks [first_chunk, first_chunk + chunks) of `x` from `buf`, or zeros (and says
  // why) without one.
  auto send_chunks = [&](const RebuildTransfer& x, const std::byte* buf, const Status& why,
                         uint64_t first_chunk, uint64_t chunks) {
    if (!buf) {
      // The receiver waits for these bytes: zeros, which fail the rebuilder's verification.
      if (env.log && zeroed.insert(x.seq).second)
        env.log->Warning(env.who + ": rebuild of step " + std::to_string(plan.step) +
                         ": sending rank " + std::to_string(x.receiver) +
                         " zeros: " + why.message());
      if (zeros.empty()) zeros.resize(kRebuildChunkBytes);  // once: sends may be reading it
    }
    for (uint64_t c = first_chunk; c < first_chunk + chunks; ++c)
      send_one(x, c, buf ? buf + c * kRebuildChunkBytes : zeros.data(), nullptr);
  };
  // This rank's shares for other decoders (and headers for rebuilders), sent chunk by chunk
  // a few chunks ahead of its own decoding below: all at once, they would queue on its link
  // before the pieces it decodes, which the rebuilder waits for.
  struct Outgoing {
    const RebuildTransfer* x;
    const std::byte* buf;
    Status why;
  };
  std::vector<Outgoing> outgoing;
  for (const RebuildTransfer& x : plan.transfers) {
    if (x.sender != env.rank || x.receiver == env.rank || x.kind == RebuildTransfer::Kind::kDecoded)
      continue;
    Outgoing o{&x, nullptr, Status()};
    o.buf = share(x, &o.why);
    outgoing.push_back(o);
  }
  uint64_t sent_upto = 0;  // chunks [0, sent_upto) of every outgoing share are sent
  auto send_ahead = [&](uint64_t upto) {
    for (const Outgoing& o : outgoing) {
      const uint64_t chunks = RebuildChunks(o.x->bytes);
      if (sent_upto < chunks)
        send_chunks(*o.x, o.buf, o.why, sent_upto, std::min(upto, chunks) - sent_upto);
    }
    sent_upto = std::max(sent_upto, upto);
  };
  send_ahead(kRebuildSendAhead);
  std::map<uint32_t, const RebuildTransfer*> by_seq;
  for (const RebuildTransfer& x : plan.transfers) by_seq[x.seq] = &x;
  Status recv_error;
  // Posts the receive of chunk `c` of `x` into `dst` (where that chunk's bytes go); its
  // ticket.
  auto post_one = [&](const RebuildTransfer& x, uint64_t c, std::byte* dst) {
    uint64_t ticket = 0;
    Status st = env.transport->PostRecv(x.sender, x.seq + static_cast<uint32_t>(c), dst,
                                        RebuildChunkLen(x.bytes, c), &ticket);
    if (!st.ok() && recv_error.ok()) recv_error = st;
    return ticket;
  };
  // Posts the receives of every chunk of `x` into `buf`.
  auto post = [&](const RebuildTransfer& x, std::byte* buf) {
    for (uint64_t c = 0; c < RebuildChunks(x.bytes); ++c)
      (void)post_one(x, c, buf + c * kRebuildChunkBytes);
  };
  // The stripes this rank decodes: its own share read where it lies when it fills the
  // stripe; every other share received chunk by chunk into a ring of kRebuildRing chunks
  // (a chunk's slot takes the next chunk once that one is decoded, so a survivor's memory
  // for a rebuild does not grow with the state: whole shares took d x the lost piece), all
  // rings in one mapping whose pages are made in one call (a fault per 4 KiB page of the
  // pieces was a fifth of a 64 MiB rebuild's transfer time), the decoded chunks' ring after
  // them.
  struct Decoding {
    const RebuildTarget* target;
    const RebuildTarget::Stripe* stripe;
    std::unique_ptr<restore_internal::StagingBuffer> scratch;
    uint64_t chunks = 0;                         // RebuildChunks(stripe->len)
    uint64_t ring = 0;                           // chunks each ring holds (all of them: no wrap)
    std::vector<const RebuildTransfer*> x;       // per share: its transfer
    std::vector<const std::byte*> whole;         // per share: the share where it lies, or null
    std::vector<std::byte*> rings;               // per share without `whole`: its ring
    std::vector<std::vector<uint64_t>> tickets;  // per share, per chunk (0: not received)
    size_t own = 0;                              // this rank's share (index), if it has one
    const std::byte* own_at = nullptr;           // ... where it lies (null: unreadable)
    std::byte* out = nullptr;                    // the decoded chunks' ring
    std::vector<uint64_t> out_tickets;           // per ring slot: the send of its chunk
    uint64_t posted = 0;  // receives of chunks [0, posted) of every received share are posted
    Status error;         // why this rank's own share, or the decoding, failed
    uint64_t At(uint64_t c) const { return (c % ring) * kRebuildChunkBytes; }
  };
  std::vector<Decoding> decoding;
  // Posts the receives of the chunks [dec.posted, upto) of every share `dec` receives, into
  // their rings (or, with `sink`, into it: what is left after a failure, so that the
  // senders' messages are taken as before and not left waiting).
  auto post_upto = [&](Decoding& dec, uint64_t upto, std::byte* sink) {
    for (; dec.posted < std::min(upto, dec.chunks); ++dec.posted) {
      const uint64_t c = dec.posted;
      for (size_t i = 0; i < dec.x.size(); ++i) {
        const RebuildTransfer& x = *dec.x[i];
        if (x.sender == env.rank || c >= RebuildChunks(x.bytes)) continue;
        dec.tickets[i][c] = post_one(x, c, sink ? sink : dec.rings[i] + dec.At(c));
      }
    }
  };
  for (const RebuildTarget& t : plan.targets)
    for (const auto& stripe : t.stripes) {
      if (stripe.decoder != env.rank) continue;
      Decoding dec{};
      dec.target = &t;
      dec.stripe = &stripe;
      dec.chunks = RebuildChunks(stripe.len);
      dec.ring = std::min<uint64_t>(dec.chunks, kRebuildRing);
      const uint64_t ring_bytes =
          dec.ring == dec.chunks ? stripe.len : dec.ring * kRebuildChunkBytes;
      dec.own = stripe.index.size();
      uint64_t buffers = 1;  // the decoded chunks'
      for (size_t i = 0; i < stripe.index.size(); ++i) {
        const RebuildTransfer& x = *by_seq.at(stripe.seq[i]);
        dec.x.push_back(&x);
        dec.tickets.emplace_back(dec.chunks, 0);
        dec.whole.push_back(nullptr);
        if (x.sender == env.rank) {
          dec.own = i;
          dec.own_at = share(x, &dec.error);
          // Read in place when it covers the stripe (a shorter piece is padded with zeros).
          if (x.bytes >= stripe.len) {
            dec.whole.back() = dec.own_at;
            continue;
          }
        }
        ++buffers;
      }
      dec.scratch = std::make_unique<restore_internal::StagingBuffer>(buffers * ring_bytes,
                                                                      /*populate=*/true);
      std::byte* next = dec.scratch->data();
      for (size_t i = 0; i < stripe.index.size(); ++i) {
        dec.rings.push_back(dec.whole[i] ? nullptr : next);
        if (!dec.whole[i]) next += ring_bytes;
      }
      dec.out = next;
      dec.out_tickets.assign(dec.ring, 0);
      decoding.push_back(std::move(dec));
    }
  for (Decoding& dec : decoding) post_upto(dec, dec.ring, nullptr);
  // The versions this rank rebuilds.
  struct Incoming {
    const RebuildTarget* target;
    std::string header;
    HostTier* tier = nullptr;
    int slot = -1;
    Result<std::byte*> mem = Status::Internal("slot not prepared");
    std::vector<std::byte> sink;  // receives the pieces when no slot could be had
    ~Incoming() {
      if (tier && slot >= 0) tier->Abort(slot);
    }
  };
  // (One per rank: a lost rank is rebuilt by the rank of its number.) Its slot is reserved
  // and its pages made (a fresh slot of 64 MiB took 25-30 ms to fault in) while the
  // decoders gather their first chunks, then the pieces are received in place.
  std::vector<std::unique_ptr<Incoming>> incoming;
  for (const RebuildTarget& t : plan.targets) {
    if (t.source != env.rank) continue;
    incoming.push_back(std::make_unique<Incoming>());
    Incoming& in = *incoming.back();
    in.target = &t;
    in.header.resize(t.header_bytes);
    post(*by_seq.at(t.header_seq), reinterpret_cast<std::byte*>(in.header.data()));
    auto tier = env.store->TierFor(t.source);
    auto slot = tier.ok() ? (*tier)->Reserve(plan.step, FullPolicy::kSkip) : tier.status();
    if (slot.ok()) {
      in.tier = *tier;
      in.slot = *slot;
      // What the CAPTURING header names until the version is published with the one sent.
      SlotHeader base;
      base.rank = static_cast<uint32_t>(t.source);
      base.world_size = static_cast<uint32_t>(env.world_size);
      in.mem = in.tier->Prepare(in.slot, plan.step, t.data_bytes, base);
    } else {
      in.mem = slot.status();
    }
    std::byte* data = nullptr;
    if (in.mem.ok()) {
      data = *in.mem;
    } else {
      in.sink.resize(t.data_bytes);
      data = in.sink.data();
    }
    for (const auto& stripe : t.stripes) {
      if (stripe.decoded_seq == 0) continue;
      const RebuildTransfer& dx = *by_seq.at(stripe.decoded_seq);
      post(dx, data + dx.offset);
    }
  }
  // 4. decode and forward, chunk by chunk as the shares arrive (the chunks of this rank's
  // stripes in turn)
  std::map<std::pair<int, int>, ErasureCode> codes;
  Status wait_error;
  std::vector<std::byte> sink;  // after a failed wait: the chunks no ring takes any more
  for (uint64_t c = 0;; ++c) {
    send_ahead(c + kRebuildSendAhead);
    bool any = false;
    for (Decoding& dec : decoding) {
      const RebuildTarget& t = *dec.target;
      const auto& stripe = *dec.stripe;
      if (c >= dec.chunks) continue;
      any = true;
      const uint64_t at = c * kRebuildChunkBytes, n = RebuildChunkLen(stripe.len, c);
      for (const auto& tickets : dec.tickets)
        if (tickets[c] != 0 && wait_error.ok())
          wait_error = env.transport->WaitRecv(tickets[c], env.timeout_s);
      // The decoded chunk's slot is free once the chunk it held last has left.
      uint64_t& sent = dec.out_tickets[c % dec.ring];
      if (sent != 0 && wait_error.ok()) wait_error = env.transport->WaitSend(sent, env.timeout_s);
      sent = 0;
      if (!wait_error.ok()) break;
      Status& st = dec.error;
      if (st.ok()) {
        auto it = codes.find({t.scheme.k, t.scheme.m});
        if (it == codes.end()) {
          auto code = ErasureCode::Make(t.scheme);
          if (code.ok())
            it = codes.emplace(std::make_pair(t.scheme.k, t.scheme.m), std::move(*code)).first;
          else
            st = code.status();
        }
        if (st.ok()) {
          std::vector<const std::byte*> pieces(static_cast<size_t>(t.scheme.k), nullptr);
          for (size_t i = 0; i < stripe.index.size(); ++i) {
            const std::byte* p = dec.whole[i] ? dec.whole[i] + at : dec.rings[i] + dec.At(c);
            if (!dec.whole[i]) {
              // A share shorter than its stripe: its bytes (this rank's own copied in), then
              // zeros.
              std::byte* slot = dec.rings[i] + dec.At(c);
              const uint64_t have = std::min(n, RebuildChunkLen(dec.x[i]->bytes, c));
              if (i == dec.own) std::memcpy(slot, dec.own_at + at, have);
              if (have < n) std::memset(slot + have, 0, n - have);
            }
            pieces[static_cast<size_t>(stripe.index[i])] = p;
          }
          std::vector<std::byte*> out(static_cast<size_t>(t.scheme.data()), nullptr);
          out[static_cast<size_t>(stripe.j)] = dec.out + dec.At(c);
          st = it->second.Decode(pieces, n, out);
        }
      }
      if (stripe.decoded_seq != 0) {
        const RebuildTransfer& dx = *by_seq.at(stripe.decoded_seq);
        if (c < RebuildChunks(dx.bytes)) {
          if (st.ok()) {
            send_one(dx, c, dec.out + dec.At(c), &sent);
          } else {
            send_chunks(dx, nullptr, st, c, 1);  // zeros (and why), which fail verification
          }
        }
      }
      // Chunk c is decoded: its slots take chunk c + ring.
      post_upto(dec, c + 1 + dec.ring, nullptr);
    }
    if (!any || !wait_error.ok()) break;
  }
  if (!wait_error.ok()) {
    // The chunks not yet posted are taken into a sink (Finish gives them up with the rest).
    sink.resize(kRebuildChunkBytes);
    for (Decoding& dec : decoding) post_upto(dec, UINT64_MAX, sink.data());
  }
  send_ahead(UINT64_MAX);  // the rest (every chunk, after a failed wait too: others wait)
  Status done = env.transport->Finish(env.timeout_s);
  if (done.ok()) done = wait_error;
  if (!send_error.ok()) done = send_error;
  if (!recv_error.ok()) done = recv_error;
  if (!done.ok()) {
    report.error = "rebuild transfers of step " + std::to_string(plan.step) + ": " + done.message();
    if (env.log && !(incoming.empty() && decoding.empty()))
      env.log->Warning(env.who + ": " + report.error);
    report.seconds = NanosToSeconds(NowNanos() - t0);
    return report;
  }
  // 5. verify and publish
  phase.reset();
  phase.emplace("rebuild verify publish", "restore");
  for (auto& inp : incoming) {
    Incoming& in = *inp;
    const RebuildTarget& t = *in.target;
    auto fail = [&](const Status& why) {
      report.error = "rank " + std::to_string(t.source) + "'s step " + std::to_string(plan.step) +
                     " not rebuilt from parity (" + t.scheme.Describe() + "): " + why.message();
      if (env.log) env.log->Warning(env.who + ": " + report.error);
    };
    Status st = in.mem.status();
    if (!st.ok()) {
      fail(st);
      continue;
    }
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
    st = ReplicaStore::Verify(*header, *in.mem);
    if (st.ok()) {
      in.tier->MarkCopied(in.slot);
      st = in.tier->Commit(in.slot, *header);
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
