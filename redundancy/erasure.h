// Erasure-coded sets: k ranks on k different nodes protect each other's versions with
// parity instead of full replicas (SCR's XOR and Reed-Solomon sets are the prior art).
//
// A set has k members; a stripe has d = k - m data pieces and m parity pieces, each on a
// different member. Every member's version (its bytes, `image`) is cut into d pieces of
// ceil(bytes / d) bytes (the last one shorter or empty), and the k stripes of a version are
// rotated so that every member holds data in d stripes and parity in m:
//
//   stripe s:  data piece j (0 <= j < d) is piece j of member (s + j) mod k,
//              parity p (0 <= p < m) is held by member (s + d + p) mod k.
//
// A stripe's pieces have the length of its longest data piece; shorter ones count as ending
// in zeros, so members may hold versions of different sizes. Each member then holds parity
// worth m/d of the longest member's bytes per version (xor over 4 members: a third), and any
// m members of a set can be lost: for each stripe, the pieces of at most m lost members are
// decoded from any d of the survivors' pieces.
//
// The code: m = 1 is plain XOR (a parity row of ones); m >= 2 is Reed-Solomon over GF(2^8)
// with a Cauchy matrix (every d x d submatrix of [I; C] is invertible) scaled so that its
// first parity row is all ones and every parity row starts with 1 (a coefficient of 1 is a
// plain XOR: rs's row 0 costs what XOR parity costs); both computed by Intel ISA-L
// (ec_encode_data and friends; runtime dispatch to SSE, AVX2 or AVX-512), XOR by cairn.
// Thread-safety: an ErasureCode is immutable after Make(); its methods may run concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cairn/status.h"

namespace cairn {

struct ErasureScheme {
  int k = 0;  // members of a set (on k different nodes), parity included
  int m = 1;  // parity pieces per stripe: the members a set may lose
  int data() const { return k - m; }
  // "xor k=4" or "rs k=6 m=2", for messages.
  std::string Describe() const;
};

// The largest set: GF(2^8) codes allow up to 255 pieces; cairn's sets are nodes of one
// group, and encoding and decoding costs grow with k.
inline constexpr int kMaxErasureMembers = 64;

// OK when 1 <= m < k <= kMaxErasureMembers; InvalidArgument saying why otherwise.
Status ValidateErasureScheme(const ErasureScheme& s);

// The rotated stripe layout above, for a valid scheme.
int StripeDataMember(const ErasureScheme& s, int stripe, int j);
int StripeParityMember(const ErasureScheme& s, int stripe, int p);
// The stripe that piece j of `member`'s version belongs to ((member - j) mod k).
int StripeOfPiece(const ErasureScheme& s, int member, int j);
// The index, among the stripe's d + m pieces (data 0..d-1, then parity d..d+m-1), of what
// `member` holds in `stripe`.
int StripeIndexOf(const ErasureScheme& s, int stripe, int member);

// Piece j of a version of `bytes` bytes cut into `d` pieces: [offset, offset + length).
struct PieceRange {
  uint64_t offset = 0;
  uint64_t length = 0;
};
PieceRange PieceOf(uint64_t bytes, int d, int j);
// The length every piece of a version of `bytes` bytes is padded to (ceil(bytes / d)).
uint64_t PieceBytes(uint64_t bytes, int d);

class ErasureCode {
 public:
  static Result<ErasureCode> Make(const ErasureScheme& s);
  const ErasureScheme& scheme() const { return scheme_; }

  // Adds data piece j (`n` bytes; what follows counts as zeros) into parity row p, a buffer
  // of at least n bytes that started zeroed: after every data piece of a stripe was added
  // once, it holds the stripe's parity p. What a parity holder runs as pieces arrive.
  void AddToParity(int j, int p, const std::byte* piece, uint64_t n, std::byte* parity) const;
  // As AddToParity for the first piece of a stripe: sets bytes [0, n) of parity row p to
  // piece j's share (their previous content, zeros, is not read), so a holder reads and
  // writes the row once less per stripe.
  void SetParity(int j, int p, const std::byte* piece, uint64_t n, std::byte* parity) const;

  // The coefficient of data piece j in parity row p (1: the piece is XORed in).
  unsigned char Coefficient(int j, int p) const;

  // GF(2^8) arithmetic on whole buffers, for parity stored scaled (ParityStore: a record
  // whose first piece landed in the parity itself holds the parity divided by that piece's
  // coefficient). `parity` += `piece` x `coef` (1: an XOR), n bytes.
  static void MultiplyAdd(unsigned char coef, const std::byte* piece, uint64_t n,
                          std::byte* parity);
  // `out` = `in` x `coef`, n bytes; `out` must not overlap `in`.
  static void Multiply(unsigned char coef, const std::byte* in, uint64_t n, std::byte* out);
  // a / b (b != 0).
  static unsigned char Divide(unsigned char a, unsigned char b);
  // Parity row p of the encoding matrix (d coefficients): what ISA-L is given for it.
  std::span<const unsigned char> ParityRow(int p) const;

  // Every parity row of one stripe at once from its d data pieces of `len` bytes each:
  // what ISA-L's ec_encode_data computes (the reference the benchmark compares against).
  void Encode(std::span<const std::byte* const> data, uint64_t len,
              std::span<std::byte* const> parity) const;

  // Rebuilds lost data pieces of one stripe. `pieces` has d + m entries (data 0..d-1, then
  // parity): a piece of `len` bytes, or null where lost. `out` has d entries: for each lost
  // data piece one wants back, a buffer of `len` bytes (null: not wanted). InvalidArgument
  // when more than m pieces are lost or a wanted piece is not lost. An empty stripe (len 0)
  // needs nothing.
  Status Decode(std::span<const std::byte* const> pieces, uint64_t len,
                std::span<std::byte* const> out) const;

 private:
  ErasureCode() = default;
  ErasureScheme scheme_;
  // The (d + m) x d encoding matrix: identity over the parity rows.
  std::vector<unsigned char> matrix_;
  // ec_init_tables of all parity rows (Encode).
  std::vector<unsigned char> parity_tables_;
};

}  // namespace cairn
