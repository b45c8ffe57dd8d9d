// Erasure-coded sets (redundancy/erasure.h): the rotated stripe layout puts every member's
// d pieces in d different stripes and its m parities in the others, never two pieces of one
// stripe on a member; parity added piece by piece as pieces arrive equals ISA-L's encoding
// of the whole stripe; and for every scheme up to k = 8 and every pattern of up to m lost
// members, every member's version comes back byte for byte from the survivors' pieces,
// with versions of different sizes (short pieces counted as zeros) and empty ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "redundancy/erasure.h"

namespace cairn {
namespace {

std::vector<ErasureScheme> Schemes() {
  std::vector<ErasureScheme> out;
  for (int k = 2; k <= 8; ++k) {
    for (int m = 1; m < k && m <= 3; ++m) out.push_back({k, m});
  }
  return out;
}

TEST(ErasureScheme, RefusesImpossibleSets) {
  EXPECT_FALSE(ValidateErasureScheme({1, 1}).ok());
  EXPECT_FALSE(ValidateErasureScheme({4, 4}).ok());
  EXPECT_FALSE(ValidateErasureScheme({4, 0}).ok());
  EXPECT_FALSE(ValidateErasureScheme({kMaxErasureMembers + 1, 1}).ok());
  EXPECT_TRUE(ValidateErasureScheme({2, 1}).ok());
  EXPECT_FALSE(ErasureCode::Make({3, 3}).ok());
  EXPECT_EQ(ErasureScheme({4, 1}).Describe(), "xor k=4");
  EXPECT_EQ(ErasureScheme({6, 2}).Describe(), "rs k=6 m=2");
}

TEST(ErasureScheme, EveryMemberHoldsDataInDStripesAndParityInM) {
  for (const ErasureScheme& s : Schemes()) {
    const int d = s.data();
    std::vector<int> data_count(static_cast<size_t>(s.k)), parity_count(static_cast<size_t>(s.k));
    for (int stripe = 0; stripe < s.k; ++stripe) {
      std::set<int> members;
      for (int j = 0; j < d; ++j) {
        int member = StripeDataMember(s, stripe, j);
        members.insert(member);
        ++data_count[static_cast<size_t>(member)];
        EXPECT_EQ(StripeOfPiece(s, member, j), stripe);
        EXPECT_EQ(StripeIndexOf(s, stripe, member), j);
      }
      for (int p = 0; p < s.m; ++p) {
        int member = StripeParityMember(s, stripe, p);
        members.insert(member);
        ++parity_count[static_cast<size_t>(member)];
        EXPECT_EQ(StripeIndexOf(s, stripe, member), d + p);
      }
      EXPECT_EQ(members.size(), static_cast<size_t>(s.k)) << s.Describe() << " stripe " << stripe;
    }
    for (int i = 0; i < s.k; ++i) {
      EXPECT_EQ(data_count[static_cast<size_t>(i)], d);
      EXPECT_EQ(parity_count[static_cast<size_t>(i)], s.m);
    }
  }
}

TEST(ErasureScheme, PiecesCoverAVersionOnce) {
  for (uint64_t bytes : {uint64_t{0}, uint64_t{1}, uint64_t{5}, uint64_t{6}, uint64_t{1000003}}) {
    for (int d = 1; d <= 7; ++d) {
      uint64_t next = 0;
      for (int j = 0; j < d; ++j) {
        PieceRange r = PieceOf(bytes, d, j);
        EXPECT_EQ(r.offset, std::min(bytes, next));
        EXPECT_LE(r.length, PieceBytes(bytes, d));
        next = r.offset + r.length;
      }
      EXPECT_EQ(next, bytes) << bytes << " in " << d;
    }
  }
}

std::vector<std::byte> Random(uint64_t n, std::mt19937_64& rng) {
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

// One set's versions, their parity computed piece by piece as a holder would, and every
// loss pattern of up to m members decoded back.
TEST(ErasureCode, EveryLossPatternTheSchemeCoversComesBackByteForByte) {
  std::mt19937_64 rng(7);
  for (const ErasureScheme& s : Schemes()) {
    auto made = ErasureCode::Make(s);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    const ErasureCode& code = *made;
    const int d = s.data(), k = s.k;
    // Versions of different sizes, one empty, none a multiple of d.
    std::vector<std::vector<std::byte>> version(static_cast<size_t>(k));
    for (int i = 0; i < k; ++i)
      version[static_cast<size_t>(i)] = Random(i == 1 ? 0 : 997 + 61 * i, rng);
    auto piece = [&](int member, int j) {
      const auto& v = version[static_cast<size_t>(member)];
      PieceRange r = PieceOf(v.size(), d, j);
      return std::pair<const std::byte*, uint64_t>{v.data() + r.offset, r.length};
    };
    // The stripes' lengths and parity, as the holders build them.
    std::vector<uint64_t> len(static_cast<size_t>(k));
    std::vector<std::vector<std::vector<std::byte>>> parity(static_cast<size_t>(k));
    for (int st = 0; st < k; ++st) {
      for (int j = 0; j < d; ++j) {
        len[static_cast<size_t>(st)] =
            std::max(len[static_cast<size_t>(st)], piece(StripeDataMember(s, st, j), j).second);
      }
      for (int p = 0; p < s.m; ++p) {
        // As a holder: pieces in any order (here starting at j = stripe), the first one
        // setting the row (SetParity), the others adding into it.
        std::vector<std::byte> par(len[static_cast<size_t>(st)]);
        for (int i = 0; i < d; ++i) {
          const int j = (st + i) % d;
          auto [ptr, n] = piece(StripeDataMember(s, st, j), j);
          if (i == 0)
            code.SetParity(j, p, ptr, n, par.data());
          else
            code.AddToParity(j, p, ptr, n, par.data());
        }
        parity[static_cast<size_t>(st)].push_back(std::move(par));
      }
      // Equal to encoding the zero-padded stripe at once.
      std::vector<std::vector<std::byte>> padded(static_cast<size_t>(d));
      std::vector<const std::byte*> src;
      for (int j = 0; j < d; ++j) {
        auto [ptr, n] = piece(StripeDataMember(s, st, j), j);
        padded[static_cast<size_t>(j)].assign(len[static_cast<size_t>(st)], std::byte{0});
        if (n > 0) std::memcpy(padded[static_cast<size_t>(j)].data(), ptr, n);
        src.push_back(padded[static_cast<size_t>(j)].data());
      }
      std::vector<std::vector<std::byte>> whole(
          static_cast<size_t>(s.m), std::vector<std::byte>(len[static_cast<size_t>(st)]));
      std::vector<std::byte*> dst;
      for (auto& w : whole) dst.push_back(w.data());
      code.Encode(src, len[static_cast<size_t>(st)], dst);
      for (int p = 0; p < s.m; ++p) {
        EXPECT_EQ(whole[static_cast<size_t>(p)],
                  parity[static_cast<size_t>(st)][static_cast<size_t>(p)])
            << s.Describe() << " stripe " << st << " parity " << p;
      }
      // Every pattern of up to m lost members, and one of m + 1 refused.
      if (len[static_cast<size_t>(st)] == 0) continue;  // nothing to lose
      for (uint32_t lost = 1; lost < (1u << k); ++lost) {
        int count = std::popcount(lost);
        if (count > s.m + 1) continue;
        std::vector<const std::byte*> pieces(static_cast<size_t>(k));
        std::vector<std::vector<std::byte>> out(static_cast<size_t>(d));
        std::vector<std::byte*> outp(static_cast<size_t>(d), nullptr);
        for (int idx = 0; idx < k; ++idx) {
          int member = idx < d ? StripeDataMember(s, st, idx) : StripeParityMember(s, st, idx - d);
          if (lost & (1u << member)) {
            if (idx < d) {
              out[static_cast<size_t>(idx)].assign(len[static_cast<size_t>(st)], std::byte{0x5a});
              outp[static_cast<size_t>(idx)] = out[static_cast<size_t>(idx)].data();
            }
            continue;
          }
          pieces[static_cast<size_t>(idx)] =
              idx < d ? padded[static_cast<size_t>(idx)].data()
                      : parity[static_cast<size_t>(st)][static_cast<size_t>(idx - d)].data();
        }
        Status st_decode = code.Decode(pieces, len[static_cast<size_t>(st)], outp);
        if (count > s.m) {
          EXPECT_FALSE(st_decode.ok()) << s.Describe() << " lost mask " << lost;
          continue;
        }
        ASSERT_TRUE(st_decode.ok()) << s.Describe() << ": " << st_decode.ToString();
        for (int j = 0; j < d; ++j) {
          if (outp[static_cast<size_t>(j)] == nullptr) continue;
          EXPECT_EQ(out[static_cast<size_t>(j)], padded[static_cast<size_t>(j)])
              << s.Describe() << " stripe " << st << " lost mask " << lost << " piece " << j;
        }
      }
    }
  }
}

// Parity format 2: Reed-Solomon's row 0 is XOR and every row starts with 1 (what lets a
// holder XOR those pieces in, or receive them into the parity); the rest of a row is
// neither 0 nor repeated (decoding every loss pattern, above, is what proves the code).
TEST(ErasureCode, TheFirstParityRowIsAllOnesAndEveryRowStartsWithOne) {
  for (const ErasureScheme& s : Schemes()) {
    auto code = ErasureCode::Make(s);
    ASSERT_TRUE(code.ok()) << code.status().ToString();
    for (int j = 0; j < s.data(); ++j) EXPECT_EQ(code->Coefficient(j, 0), 1) << s.Describe();
    for (int p = 1; p < s.m; ++p) {
      EXPECT_EQ(code->Coefficient(0, p), 1) << s.Describe();
      std::set<int> seen;
      for (int j = 0; j < s.data(); ++j) {
        EXPECT_NE(code->Coefficient(j, p), 0) << s.Describe();
        EXPECT_TRUE(seen.insert(code->Coefficient(j, p)).second)
            << s.Describe() << " row " << p << " repeats " << int{code->Coefficient(j, p)};
      }
    }
  }
}

TEST(ErasureCode, DecodeRefusesAWantedPieceThatIsPresent) {
  auto code = ErasureCode::Make({4, 1});
  ASSERT_TRUE(code.ok());
  std::vector<std::byte> a(64), b(64), c(64), p(64), out(64);
  std::vector<const std::byte*> pieces{a.data(), b.data(), c.data(), p.data()};
  std::vector<std::byte*> outs{out.data(), nullptr, nullptr};
  EXPECT_FALSE(code->Decode(pieces, 64, outs).ok());
}

// Pieces of most of a megabyte, of a length no vector width divides (the test above uses
// pieces of a few hundred bytes, inside one vector loop's warm-up): every lost data piece of
// xor k=4 and of rs k=6 m=2 (one lost, decoded through the all-ones row, and two lost) comes
// back as encoded.
TEST(ErasureCode, LongPiecesComeBackAcrossTheDecodersBlocks) {
  constexpr uint64_t kLen = 3 * (uint64_t{1} << 18) + 77;
  std::mt19937_64 rng(5);
  for (const ErasureScheme scheme : {ErasureScheme{4, 1}, ErasureScheme{6, 2}}) {
    auto code = ErasureCode::Make(scheme);
    ASSERT_TRUE(code.ok());
    const int d = scheme.data(), m = scheme.m;
    std::vector<std::vector<std::byte>> data,
        parity(static_cast<size_t>(m), std::vector<std::byte>(kLen));
    for (int j = 0; j < d; ++j) data.push_back(Random(kLen, rng));
    std::vector<const std::byte*> in;
    std::vector<std::byte*> out;
    for (auto& v : data) in.push_back(v.data());
    for (auto& v : parity) out.push_back(v.data());
    code->Encode(in, kLen, out);
    for (int lost = 1; lost <= m; ++lost) {
      for (int first = 0; first + lost <= d; ++first) {
        std::vector<const std::byte*> pieces;
        for (auto& v : data) pieces.push_back(v.data());
        for (auto& v : parity) pieces.push_back(v.data());
        std::vector<std::vector<std::byte>> back(static_cast<size_t>(d));
        std::vector<std::byte*> outs(static_cast<size_t>(d), nullptr);
        for (int j = first; j < first + lost; ++j) {
          pieces[static_cast<size_t>(j)] = nullptr;
          back[static_cast<size_t>(j)].resize(kLen);
          outs[static_cast<size_t>(j)] = back[static_cast<size_t>(j)].data();
        }
        ASSERT_TRUE(code->Decode(pieces, kLen, outs).ok());
        for (int j = first; j < first + lost; ++j)
          EXPECT_EQ(back[static_cast<size_t>(j)], data[static_cast<size_t>(j)])
              << scheme.Describe() << ": piece " << j << " of " << lost << " lost";
      }
    }
  }
}

}  // namespace
}  // namespace cairn
