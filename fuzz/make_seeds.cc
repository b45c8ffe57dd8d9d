// Writes the seed corpus of the fuzz targets (fuzz/corpus/<target>/seed-*): valid inputs of
// every parser, made by cairn's own encoders (and a real MANIFEST from a 1-rank flush).
//   build-fuzz/fuzz/fuzz_make_seeds OUT_DIR
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cairn/checkpointer.h"
#include "core/checksum.h"
#include "core/filesystem.h"
#include "layout/layout_wire.h"
#include "layout/save_planner.h"
#include "layout/templated_plan.h"
#include "persist/commit.h"
#include "persist/manifest.h"
#include "persist/step_index.h"
#include "recovery/rebuild.h"
#include "recovery/restore_wire.h"
#include "redundancy/parity_store.h"
#include "snapshot/step_agreement.h"
#include "tiers/slot_header.h"
#include "wire/codec.h"

using namespace cairn;

namespace {

void Put(const std::string& dir, const std::string& target, int n, const std::string& bytes) {
  const std::string d = JoinPath(dir, target);
  (void)DefaultFileSystem()->MakeDirs(d, 0755);
  const std::string path = JoinPath(d, "seed-" + std::to_string(n));
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) std::exit(1);
  std::fclose(f);
}

template <typename T>
void Append(std::string* s, T v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof v);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string out = argv[1];

  // Slot headers: two shards (one 2-D box), a blob, several chunks.
  SlotHeader h;
  h.state = VersionState::kCaptured;
  h.step = 42;
  h.rank = 1;
  h.world_size = 4;
  h.chunk_bytes = 64;
  h.shards.push_back({"layers.0.w", DType::kF32, {8, 16}, {{0, 0}, {4, 16}}, 0, 256, 0, 4});
  h.shards.push_back({"step_count", DType::kI64, {}, {{}, {}}, 256, 8, 4, 1});
  h.blobs.push_back({"rng", 320, 5, 0x1234});
  h.data_bytes = 325;
  h.chunk_checksums = {1, 2, 3, 4, 5};
  // Mode byte 0: the whole header; 1: without its checksum (the target appends it).
  std::string enc = EncodeSlotHeader(h);
  Put(out, "fuzz_slot_header", 0, std::string(1, '\0') + enc);
  Put(out, "fuzz_slot_header", 1, std::string(1, '\1') + enc.substr(0, enc.size() - 8));
  h.shards.pop_back();
  h.chunk_checksums.pop_back();
  h.state = VersionState::kReplicated;
  enc = EncodeSlotHeader(h);
  Put(out, "fuzz_slot_header", 2, std::string(1, '\1') + enc.substr(0, enc.size() - 8));

  // A real MANIFEST: one rank saves two tensors and flushes.
  char tmpl[] = "/tmp/cairn-seeds-XXXXXX";
  if (!::mkdtemp(tmpl)) return 1;
  Options o;
  o.job_id = "seeds";
  o.host_root = std::string(tmpl) + "/host";
  o.pfs_root = std::string(tmpl) + "/pfs";
  o.persist_every = 0;
  o.chunk_bytes = 64 << 10;
  std::vector<float> w(30000, 1.5f);  // 120 KB: two chunks
  std::vector<int64_t> c(1, 7);
  {
    auto ck = Checkpointer::Open(o);
    if (!ck.ok()) {
      std::fprintf(stderr, "make_seeds: %s\n", ck.status().ToString().c_str());
      return 1;
    }
    std::vector<ShardSpec> shards = {
        ShardSpec::Whole({"layers.0.w", DType::kF32, {300, 100}}, w.data()),
        ShardSpec::Whole({"step_count", DType::kI64, {}}, c.data())};
    auto saved = (*ck)->save(1, shards, {{"rng", "abc"}});
    auto flushed = (*ck)->flush();
    if (!saved.ok() || !flushed.ok()) {
      std::fprintf(stderr, "make_seeds: save or flush failed: %s\n",
                   (saved.ok() ? flushed.status() : saved.status()).ToString().c_str());
      return 1;
    }
  }
  auto m = ReadWholeFile(
      DefaultFileSystem(),
      JoinPath(JoinPath(PfsJobDir(o.pfs_root, o.job_id), StepDirName(1)), "MANIFEST"), 1 << 20);
  if (!m.ok()) return 1;
  // Mode byte 0: the whole file; 1: the protobuf payload (the target frames it).
  Put(out, "fuzz_manifest", 0, std::string(1, '\0') + *m);
  Put(out, "fuzz_manifest", 1, std::string(1, '\1') + m->substr(16, m->size() - 24));
  (void)DefaultFileSystem()->RemoveAll(tmpl);

  // Wire records: a rank layout, a location table (first byte picks the parser), an
  // address file.
  RankLayout l;
  l.tensors = {{"embed.weight", DType::kBF16, {64, 32}}, {"b", DType::kF32, {7}}};
  l.shards = {{0, {{0, 0}, {32, 32}}}, {1, Box::Whole({7})}};
  Put(out, "fuzz_wire", 0, std::string(1, '\0') + EncodeRankLayout(l));
  // The same layout with a box far outside its shape, which the decoder's error message
  // describes (describing such a box overflowed int64: a fuzzing find, BoxTest).
  RankLayout hostile = l;
  hostile.shards[1].box = Box{{INT64_MAX - 1}, {INT64_MAX}};
  Put(out, "fuzz_wire", 6, std::string(1, '\0') + EncodeRankLayout(hostile));
  LocationTable t;
  t.pieces = {{4096, {11, 12}}, {0, {13}}};
  t.blobs = {{"rng", 8192, 3, 99}};
  Put(out, "fuzz_wire", 1, std::string(1, '\1') + EncodeLocationTable(t));
  std::string addr = "CAIRNADR";
  Append<uint32_t>(&addr, 1);
  Append<uint32_t>(&addr, 4);
  addr += "0123456789abcdef";
  const std::string ucx = "ucx-worker-address-bytes";
  Append<uint32_t>(&addr, static_cast<uint32_t>(ucx.size()));
  addr += ucx;
  Put(out, "fuzz_wire", 2, std::string(1, '\2') + addr);

  // Format 2: a 3-rank fully sharded step (template, index file "CIX1", layout message), and its
  // MANIFEST for fuzz_manifest.
  LayoutTemplate lt;
  lt.tensors = {
      {"embed.weight", DType::kBF16, {64, 32}}, {"b", DType::kF32, {7}}, {"step", DType::kI64, {}}};
  lt.rules = {{SplitRule::Kind::kFlat, SplitRule::Round::kCeil, 0},
              {SplitRule::Kind::kChunk, SplitRule::Round::kFloor, 0},
              {}};
  lt.parts = 3;
  const std::string tb = EncodeTemplate(lt);
  Put(out, "fuzz_wire", 3, std::string(1, '\3') + tb);
  LayoutMessage msg;
  msg.templated = true;
  msg.template_hash = TemplateHash(tb);
  msg.index = 2;
  Put(out, "fuzz_wire", 5, std::string(1, '\5') + EncodeLayoutMessage(msg));
  std::string plan_why;
  auto tp = MakeTemplatedPlan({lt}, {0, 0, 0}, {0, 1, 2}, {1, 2, 3}, nullptr, &plan_why);
  if (!tp) return 1;
  std::vector<LocationTable> digests(3);
  for (int r = 0; r < 3; ++r) {
    std::vector<LocationTable::Piece> locs;
    uint64_t at = 0;
    for (size_t k = 0; k < tp->PiecesOf(r).size(); ++k) {
      locs.push_back({at, {0x1111u + at}});
      at += 4096;
    }
    const std::string idx = EncodeWriterIndex(locs);
    if (r == 1) Put(out, "fuzz_wire", 4, std::string(1, '\4') + idx);
    digests[r].indexed = true;
    digests[r].index_pieces = static_cast<uint32_t>(locs.size());
    digests[r].index_bytes = idx.size();
    digests[r].index_checksum = Checksum(idx.data(), idx.size());
    digests[r].blobs = {{"rng", at, 3, 99}};
  }
  auto m2 = BuildTemplatedManifest(*tp, digests, "seed", 1, 1 << 20);
  if (!m2.ok()) return 1;
  const std::string e2 = EncodeManifest(*m2);
  Put(out, "fuzz_manifest", 2, std::string(1, '\0') + e2);
  Put(out, "fuzz_manifest", 3, std::string(1, '\1') + e2.substr(16, e2.size() - 24));

  // Flat ranges: ndim, dims (u16), begin, end (i32).
  auto flat = [](std::vector<uint16_t> dims, int32_t b, int32_t e) {
    std::string s(1, static_cast<char>(dims.size()));
    for (uint16_t d : dims) Append(&s, d);
    Append(&s, b);
    Append(&s, e);
    return s;
  };
  Put(out, "fuzz_flat_range", 0, flat({4, 5}, 3, 12));
  Put(out, "fuzz_flat_range", 1, flat({3, 4, 5}, 7, 53));
  Put(out, "fuzz_flat_range", 2, flat({}, 0, 1));
  Put(out, "fuzz_flat_range", 3, flat({6, 7}, 0, 42));
  // Restore messages: an inventory (mode byte 0) and a catalog part with the shard table
  // of a 4-rank job (1, 4).
  restore_internal::Inventory inv;
  inv.layout_hash = 0xabcdef;
  inv.held = {{0, 7, 4}, {2, 7, 4}};  // source, step, world size
  inv.pfs_steps = {5};
  const std::string inv_bytes = restore_internal::EncodeInventory(inv);
  Put(out, "fuzz_restore", 0, std::string("\0\4", 2) + inv_bytes);
  wire::CatalogPart part;
  auto* table = part.mutable_tables()->add_tables();
  table->set_source(2);
  table->set_chunk_bytes(1 << 16);
  table->set_blob_bytes(10);
  AddTensor(TensorMeta{"layers.0.w", DType::kF32, {8, 16}}, table->mutable_tensors());
  for (int64_t x : {4, 0, 4, 16}) table->add_boxes(x);  // box [4:8, 0:16]: offsets, lengths
  table->add_nbytes(4 * 16 * 4);
  Put(out, "fuzz_restore", 1, std::string("\1\4", 2) + wire::Encode(part));
  // The frame every restore message travels in: an OK status, then an inventory; and a
  // frame carrying a failure.
  wire::Checked framed;
  wire::ToWire(Status::OK(), framed.mutable_status());
  framed.set_payload(inv_bytes);
  Put(out, "fuzz_restore", 2, std::string("\2\4", 2) + wire::Encode(framed));
  const Status why = Status::NotFound("rank 3: no version");
  wire::Checked failed;
  wire::ToWire(why, failed.mutable_status());
  Put(out, "fuzz_restore", 3, std::string("\2\4", 2) + wire::Encode(failed));
  // A persist round's offer: newest mark, then (step, layout hash) pairs.
  wire::PersistOffer offer;
  offer.set_newest_mark(3);
  for (int64_t st : {20, 30}) {
    auto* held = offer.add_held();
    held->set_step(st);
    held->set_layout_hash(0x1234u + static_cast<uint64_t>(st));
  }
  Put(out, "fuzz_restore", 4, std::string("\3\0", 2) + wire::Encode(offer));
  // Rank 0's outcome of a round: a failure that left LATEST published.
  wire::PersistOutcome outcome;
  wire::ToWire(why, outcome.mutable_status());
  outcome.set_left_published(true);
  Put(out, "fuzz_restore", 5, std::string("\4\0", 2) + wire::Encode(outcome));
  // A step agreement offer: saves 4..6, the middle one not held.
  AgreeOffer agree;
  agree.first = 4;
  agree.settled = 6;
  agree.steps = {40, 50, 60};
  agree.held = {true, false, true};
  Put(out, "fuzz_restore", 8, std::string("\7\0", 2) + EncodeAgreeOffer(agree));
  // A parity record of stripe 1, row 0 of xor over 3 members (pieces of ranks 1 and 2), and
  // a rebuild inventory holding it.
  ParityRecord parity;
  parity.scheme = {3, 1};
  parity.key = {1, 0, 7};
  parity.world_size = 3;
  parity.parity_bytes = 4096;
  parity.parity_checksum = 0x1234;
  parity.pieces = {{1, 8000, "header of rank 1"}, {2, 7000, "header of rank 2"}};
  Put(out, "fuzz_restore", 9, std::string("\10\0", 2) + EncodeParityRecord(parity));
  RebuildHoldings holdings;
  holdings.own_steps = {7, 6};
  holdings.records.push_back({parity.scheme, parity.key, 3, 4096, {1, 2}, {8000, 7000}, {16, 16}});
  Put(out, "fuzz_restore", 10, std::string("\11\0", 2) + EncodeRebuildHoldings(holdings));
  // A memory restore's layout references (target template 3 of a rank, the saved layouts of
  // ranks 3 and 7 it first holds) and a list of one template.
  LayoutRefs refs;
  refs.target = {true, 0x5eed, 3};
  refs.saved = {{3, {true, 0xfeed, 3}, 1 << 16, 40}, {7, {false, 0, 0}, 1 << 16, 40}};
  Put(out, "fuzz_restore", 6, std::string("\5\4", 2) + restore_internal::EncodeLayoutRefs(refs));
  LayoutTemplate flat4;
  flat4.tensors = {{"layers.0.w", DType::kF32, {8, 16}}, {"step", DType::kI64, {}}};
  flat4.rules = {{SplitRule::Kind::kFlat, SplitRule::Round::kCeil, 0}, {}};
  flat4.parts = 4;
  Put(out, "fuzz_restore", 7,
      std::string("\6\4", 2) + restore_internal::EncodeTemplateList({EncodeTemplate(flat4)}));
  return 0;
}
