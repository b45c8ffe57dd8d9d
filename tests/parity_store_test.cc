// ParityStore (redundancy/parity_store.h): the parity a holder accumulates piece by piece is
// the parity of the stripe; a record is listed only once every piece is in; a piece that
// fails part way drops its record; a record's meta and parity files are checked (a damaged
// parity is a Corruption naming the file, a damaged meta file is skipped); the newest
// records and the agreed step are kept; and what a killed process left half made is removed
// when the store opens again. Also the plan of a rebuild (recovery/rebuild.h) from the
// holdings of an xor set.
#include <gtest/gtest.h>

#include <fcntl.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/filesystem.h"
#include "core/log.h"
#include "recovery/rebuild.h"
#include "redundancy/parity_store.h"
#include "tests/test_util.h"

namespace cairn {
namespace {

// A published record's parity bytes, as a rebuild sends them (ParityStore::MapParity).
Result<std::vector<std::byte>> ReadParity(ParityStore& store, const ParityRecord& r) {
  CAIRN_ASSIGN_OR_RETURN(auto bytes, store.MapParity(r));
  return std::vector<std::byte>(bytes.get(), bytes.get() + r.parity_bytes);
}

std::vector<std::byte> Bytes(uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

class ParityStoreTest : public ::testing::Test {
 protected:
  testing::TempDir dir_{"parity"};
  Logger log_{"parity test", LogLevel::kError};
  const ErasureScheme xor3_{3, 1};

  // Adds piece j (bytes `piece`) of the record `key`, in two halves.
  Status AddPiece(ParityStore& s, const ParityKey& key, int j, int source,
                  const std::vector<std::byte>& piece, uint64_t stripe_len, int64_t keep = -1) {
    CAIRN_RETURN_IF_ERROR(s.Begin(xor3_, 3, key, j,
                                  {source, piece.size() * 2, "header " + std::to_string(source)},
                                  stripe_len, keep));
    const uint64_t half = piece.size() / 2;
    s.Add(key, j, 0, piece.data(), half);
    s.Add(key, j, half, piece.data() + half, piece.size() - half);
    return s.End(key, j, true);
  }
};

TEST_F(ParityStoreTest, AccumulatedParityIsTheStripesParityAndIsListedOnlyWhenComplete) {
  ParityStore store(dir_.path() + "/node-0", 0, DefaultFileSystem(), &log_, dir_.path());
  const ParityKey key{1, 0, 7};
  auto a = Bytes(10000, 1), b = Bytes(7000, 2);  // the second piece is shorter: zeros after
  ASSERT_TRUE(AddPiece(store, key, 0, 1, a, 10000).ok());
  EXPECT_TRUE(store.List().empty()) << "listed before every piece was in";
  EXPECT_EQ(store.accumulating(), 1u);
  ASSERT_TRUE(AddPiece(store, key, 1, 2, b, 10000).ok());
  EXPECT_EQ(store.accumulating(), 0u);
  auto list = store.List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].key, key);
  EXPECT_EQ(list[0].parity_bytes, 10000u);
  ASSERT_EQ(list[0].pieces.size(), 2u);
  EXPECT_EQ(list[0].pieces[1].source, 2);
  EXPECT_EQ(list[0].pieces[1].header, "header 2");
  auto parity = ReadParity(store, list[0]);
  ASSERT_TRUE(parity.ok()) << parity.status().ToString();
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ((*parity)[i], a[i] ^ (i < b.size() ? b[i] : std::byte{0})) << "byte " << i;
  // The same piece twice is refused (it would cancel itself out of an XOR).
  EXPECT_FALSE(store.Begin(xor3_, 3, {1, 0, 8}, 0, {1, 1, "h"}, 100).ok() &&
               store.Begin(xor3_, 3, {1, 0, 8}, 0, {1, 1, "h"}, 100).ok());
}

TEST_F(ParityStoreTest, AnXorRecordsFirstPieceLandsInTheParityItselfAndTheOthersAddToIt) {
  ParityStore store(dir_.path() + "/node-0", 0, DefaultFileSystem(), &log_, dir_.path());
  const ParityKey key{2, 0, 9};
  auto a = Bytes(9000, 3), b = Bytes(10000, 4);  // the first piece shorter: zeros after
  ASSERT_TRUE(store.Begin(xor3_, 3, key, 1, {2, 18000, "h2"}, 10000).ok());
  std::byte* at = store.InPlace(key, 1);
  ASSERT_NE(at, nullptr) << "an XOR record's first piece is received in place";
  std::memcpy(at, a.data(), a.size());       // as the receives write it
  store.Add(key, 1, 0, b.data(), a.size());  // ignored: the bytes are already there
  ASSERT_TRUE(store.End(key, 1, true).ok());
  ASSERT_TRUE(store.Begin(xor3_, 3, key, 0, {1, 20000, "h1"}, 10000).ok());
  EXPECT_EQ(store.InPlace(key, 0), nullptr) << "only the first piece is the parity so far";
  store.Add(key, 0, 0, b.data(), b.size());
  ASSERT_TRUE(store.End(key, 0, true).ok());
  auto list = store.List();
  ASSERT_EQ(list.size(), 1u);
  auto parity = ReadParity(store, list[0]);
  ASSERT_TRUE(parity.ok()) << parity.status().ToString();
  ASSERT_EQ(parity->size(), 10000u);
  for (size_t i = 0; i < parity->size(); ++i) {
    const std::byte want = (i < a.size() ? a[i] : std::byte{0}) ^ b[i];
    ASSERT_EQ((*parity)[i], want) << "byte " << i;
  }
  // A first piece received in place that fails drops its record, as any piece does.
  ASSERT_TRUE(store.Begin(xor3_, 3, {0, 0, 11}, 0, {1, 100, "h"}, 50).ok());
  ASSERT_NE(store.InPlace({0, 0, 11}, 0), nullptr);
  ASSERT_TRUE(store.End({0, 0, 11}, 0, false).ok());
  EXPECT_EQ(store.InPlace({0, 0, 11}, 0), nullptr);
}

// Reed-Solomon 6 = 4 + 2: each row's record, whichever piece comes first, read back
// (MapParity) is exactly what ErasureCode::Encode computes, whether the first piece landed
// in the parity itself (the record then stores the parity over that piece's coefficient:
// its scale) or was set from a buffer (SetParity, scale 1).
TEST_F(ParityStoreTest, AReedSolomonRecordIsTheEncodingWhicheverPieceComesFirst) {
  ParityStore store(dir_.path() + "/node-0", 0, DefaultFileSystem(), &log_, dir_.path());
  const ErasureScheme rs{6, 2};
  auto code = ErasureCode::Make(rs);
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  const int d = rs.data();
  const uint64_t n = 5000;
  std::vector<std::vector<std::byte>> piece;
  std::vector<const std::byte*> src;
  for (int j = 0; j < d; ++j) piece.push_back(Bytes(n, 20 + static_cast<uint64_t>(j)));
  for (const auto& x : piece) src.push_back(x.data());
  std::vector<std::vector<std::byte>> want(2, std::vector<std::byte>(n));
  std::vector<std::byte*> dst = {want[0].data(), want[1].data()};
  code->Encode(src, n, dst);
  int in_place = 0, scaled = 0;
  for (int row = 0; row < 2; ++row) {
    for (int first = 0; first < 2 * d; ++first) {
      const ParityKey key{0, row, 10 + 2 * d * row + first};
      const bool receive_in_place = first < d;
      for (int i = 0; i < d; ++i) {
        const int j = (first + i) % d;
        ASSERT_TRUE(store.Begin(rs, 6, key, j, {j, n * d, "h"}, n).ok());
        std::byte* at = receive_in_place ? store.InPlace(key, j) : nullptr;
        EXPECT_EQ(at != nullptr, receive_in_place && i == 0)
            << "row " << row << ", piece " << j << " after " << i << " others";
        if (at != nullptr) {
          ++in_place;
          std::memcpy(at, piece[static_cast<size_t>(j)].data(), n);
        } else {
          store.Add(key, j, 0, piece[static_cast<size_t>(j)].data(), n);
        }
        ASSERT_TRUE(store.End(key, j, true).ok());
      }
      bool found = false;
      for (const ParityRecord& r : store.List()) {
        if (r.key != key) continue;
        found = true;
        EXPECT_EQ(r.scale, receive_in_place ? code->Coefficient(first % d, row) : 1);
        scaled += r.scale != 1;
        auto parity = ReadParity(store, r);
        ASSERT_TRUE(parity.ok()) << parity.status().ToString();
        ASSERT_TRUE(*parity == want[static_cast<size_t>(row)])
            << "row " << row << ", piece " << first % d << " first, "
            << (receive_in_place ? "received in place" : "set");
      }
      ASSERT_TRUE(found) << "row " << row << ", piece " << first << " first: no record";
    }
  }
  EXPECT_EQ(in_place, 2 * d);
  EXPECT_EQ(scaled, d - 1);  // row 1's first pieces but piece 0 (row 0 is all ones)
}

TEST_F(ParityStoreTest, APieceThatFailsPartWayDropsItsRecord) {
  ParityStore store(dir_.path() + "/node-0", 0, DefaultFileSystem(), &log_, dir_.path());
  const ParityKey key{0, 0, 3};
  auto a = Bytes(5000, 3);
  ASSERT_TRUE(AddPiece(store, key, 0, 1, a, 5000).ok());
  ASSERT_TRUE(store.Begin(xor3_, 3, key, 1, {2, 10000, "h"}, 5000).ok());
  store.Add(key, 1, 0, a.data(), 100);
  ASSERT_TRUE(store.End(key, 1, false).ok());
  EXPECT_EQ(store.accumulating(), 0u);
  EXPECT_TRUE(store.List().empty());
}

TEST_F(ParityStoreTest, DamagedFilesAreFoundAndNamed) {
  const std::string node = dir_.path() + "/node-0";
  ParityStore store(node, 0, DefaultFileSystem(), &log_, dir_.path());
  const ParityKey key{2, 0, 9};
  ASSERT_TRUE(AddPiece(store, key, 0, 0, Bytes(4096, 4), 4096).ok());
  ASSERT_TRUE(AddPiece(store, key, 1, 1, Bytes(4096, 5), 4096).ok());
  auto list = store.List();
  ASSERT_EQ(list.size(), 1u);
  const std::string base = ParityStore::Dir(node, 0) + "/s2-p0-t9";
  {
    auto f = DefaultFileSystem()->OpenFile(base + ".parity", O_RDWR, 0);
    ASSERT_TRUE(f.ok());
    const char x = 0x5a;
    ASSERT_TRUE(f->WriteAt(&x, 1, 100).ok());
  }
  auto read = ReadParity(store, list[0]);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kCorruption);
  EXPECT_NE(read.status().message().find(base + ".parity"), std::string::npos)
      << read.status().ToString();
  // A damaged record is not a record.
  auto meta = ReadWholeFile(DefaultFileSystem(), base + ".meta", 1 << 20);
  ASSERT_TRUE(meta.ok());
  std::string bad = *meta;
  bad[bad.size() / 2] ^= 1;
  EXPECT_FALSE(DecodeParityRecord(bad, "x").ok());
  ASSERT_TRUE(WriteFileAtomic(DefaultFileSystem(), base + ".meta", bad).ok());
  EXPECT_TRUE(store.List().empty());
}

TEST_F(ParityStoreTest, KeepsTheNewestRecordsAndTheAgreedStep) {
  const std::string node = dir_.path() + "/node-0";
  ParityStore store(node, 0, DefaultFileSystem(), &log_, dir_.path(), /*keep=*/2);
  for (int64_t step = 1; step <= 6; ++step) {
    const ParityKey key{0, 0, step};
    // Every sender says step 2 is the one the job agreed on.
    ASSERT_TRUE(AddPiece(store, key, 0, 1, Bytes(100, static_cast<uint64_t>(step)), 100, 2).ok());
    ASSERT_TRUE(AddPiece(store, key, 1, 2, Bytes(100, 9), 100, 2).ok());
  }
  std::vector<int64_t> steps;
  for (const ParityRecord& r : store.List()) steps.push_back(r.key.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 5, 6}));
  // A killed process's half-made record goes when the store opens again.
  ASSERT_TRUE(store.Begin(xor3_, 3, {0, 0, 7}, 0, {1, 200, "h"}, 100).ok());
  const std::string half = ParityStore::Dir(node, 0) + "/s0-p0-t7.parity";
  EXPECT_TRUE(DefaultFileSystem()->Exists(half));
  ParityStore again(node, 0, DefaultFileSystem(), &log_, dir_.path(), 2);
  ASSERT_TRUE(AddPiece(again, {1, 0, 1}, 0, 1, Bytes(10, 1), 10).ok());
  EXPECT_FALSE(DefaultFileSystem()->Exists(half));
  EXPECT_EQ(again.List().size(), 3u);
}

TEST_F(ParityStoreTest, ARecordOlderThanANewlyAgreedStepGoesBeforeTheNextRecordTakesMemory) {
  // The steady state of named pushes: the job agreed on 4 and pushes 5, agrees on 5 and
  // pushes 6. While 6 is being made the holder needs 5 (agreed: every member keeps it, and
  // its parity is complete in every set) and 6, not 4.
  ParityStore store(dir_.path() + "/node-0", 0, DefaultFileSystem(), &log_, dir_.path(),
                    /*keep=*/1);
  for (int64_t step : {4, 5}) {
    const ParityKey key{0, 0, step};
    ASSERT_TRUE(AddPiece(store, key, 0, 1, Bytes(100, 1), 100, step - 1).ok());
    ASSERT_TRUE(AddPiece(store, key, 1, 2, Bytes(100, 2), 100, step - 1).ok());
  }
  auto steps = [&] {
    std::vector<int64_t> out;
    for (const ParityRecord& r : store.List()) out.push_back(r.key.step);
    return out;
  };
  EXPECT_EQ(steps(), (std::vector<int64_t>{4, 5}));
  // The first piece of 6 says the job agreed on 5.
  ASSERT_TRUE(store.Begin(xor3_, 3, {0, 0, 6}, 0, {1, 200, "h"}, 100, 5).ok());
  EXPECT_EQ(steps(), (std::vector<int64_t>{5}));
  EXPECT_FALSE(DefaultFileSystem()->Exists(ParityStore::Dir(dir_.path() + "/node-0", 0) +
                                           "/s0-p0-t4.parity"));
  ASSERT_TRUE(store.End({0, 0, 6}, 0, true).ok());
  ASSERT_TRUE(AddPiece(store, {0, 0, 6}, 1, 2, Bytes(100, 3), 100, 5).ok());
  EXPECT_EQ(steps(), (std::vector<int64_t>{5, 6}));
  // A record of another stripe announcing no newer step removes nothing.
  ASSERT_TRUE(AddPiece(store, {1, 0, 6}, 0, 1, Bytes(100, 4), 100, 5).ok());
  EXPECT_EQ(steps().size(), 2u);
}

TEST(ParityRecord, RoundTripsAndRefusesWhatCannotBe) {
  ParityRecord r;
  r.scheme = {4, 2};
  r.key = {3, 1, 42};
  r.world_size = 8;
  r.parity_bytes = 1000;
  r.parity_checksum = 77;
  r.scale = 142;
  r.pieces = {{3, 1999, "a"}, {4, 2000, "bb"}};
  auto back = DecodeParityRecord(EncodeParityRecord(r), "x");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->key, r.key);
  EXPECT_EQ(back->scale, 142);
  EXPECT_EQ(back->pieces[1].header, "bb");
  r.pieces[0].data_bytes = 5000;  // a piece longer than the parity
  EXPECT_FALSE(DecodeParityRecord(EncodeParityRecord(r), "x").ok());
  r.pieces[0].data_bytes = 1;
  r.pieces[0].source = 8;  // outside the job
  EXPECT_FALSE(DecodeParityRecord(EncodeParityRecord(r), "x").ok());
}

// An xor set of 3 one-rank nodes: rank 2 lost everything; steps 5 and 6 have parity, but
// only step 5's parity is complete on both survivors.
TEST(RebuildPlan, DecodesALostRankFromTheSurvivorsPiecesAndParity) {
  const ErasureScheme s{3, 1};
  auto record = [&](int stripe, int64_t step) {
    RebuildHoldings::Record r;
    r.scheme = s;
    r.key = {stripe, 0, step};
    r.world_size = 3;
    r.parity_bytes = 50;
    for (int j = 0; j < 2; ++j) {
      r.sources.push_back(StripeDataMember(s, stripe, j));
      r.data_bytes.push_back(100);
      r.header_bytes.push_back(10);
    }
    return r;
  };
  std::vector<RebuildHoldings> all(3);
  all[0].own_steps = {6, 5};
  all[1].own_steps = {6, 5};
  // Parity of stripe s lives on member (s + 2) % 3: stripe 1 on rank 0, stripe 2 on rank 1.
  all[0].records = {record(1, 5)};
  all[1].records = {record(2, 5), record(2, 6)};
  RebuildPlan plan = PlanRebuild(all);
  ASSERT_EQ(plan.step, 5) << "step 6 lacks stripe 1's parity";
  ASSERT_EQ(plan.targets.size(), 1u);
  const RebuildTarget& t = plan.targets[0];
  EXPECT_EQ(t.source, 2);
  ASSERT_EQ(t.stripes.size(), 2u);  // rank 2's pieces 0 and 1
  for (const auto& stripe : t.stripes) EXPECT_EQ(stripe.index.size(), 2u);
  // Each stripe is decoded by a survivor holding one of its shares, the two stripes by
  // different survivors; rank 2 receives its own bytes once (the decoded pieces and its
  // header), not every piece of its stripes.
  ASSERT_NE(t.stripes[0].decoder, t.stripes[1].decoder);
  uint64_t to_lost = 0;
  for (const RebuildTransfer& x : plan.transfers) {
    EXPECT_NE(x.sender, 2);
    if (x.receiver == 2) {
      EXPECT_TRUE(x.kind == RebuildTransfer::Kind::kDecoded ||
                  x.kind == RebuildTransfer::Kind::kHeader);
      if (x.kind == RebuildTransfer::Kind::kDecoded) to_lost += x.bytes;
    } else {
      EXPECT_TRUE(x.kind == RebuildTransfer::Kind::kData ||
                  x.kind == RebuildTransfer::Kind::kParity);
    }
  }
  EXPECT_EQ(to_lost, 100u);
  for (const auto& stripe : t.stripes) {
    bool holds_a_share = false;
    for (uint32_t seq : stripe.seq)
      for (const RebuildTransfer& x : plan.transfers)
        if (x.seq == seq) {
          EXPECT_EQ(x.receiver, stripe.decoder);
          holds_a_share |= x.sender == stripe.decoder;
        }
    EXPECT_TRUE(holds_a_share) << "the decoder reads its own share in place";
  }
  // Every rank holding step 6 itself: nothing to rebuild.
  all[2].own_steps = {6};
  EXPECT_EQ(PlanRebuild(all).step, -1);
  // Two members lost: xor cannot decode, nothing planned, both named.
  all[2].own_steps.clear();
  all[1].own_steps.clear();
  plan = PlanRebuild(all);
  EXPECT_EQ(plan.step, -1);
  EXPECT_EQ(plan.not_rebuildable.size(), 2u);
}

}  // namespace
}  // namespace cairn
