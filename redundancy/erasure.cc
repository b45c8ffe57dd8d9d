#include "redundancy/erasure.h"

#include <isa-l/erasure_code.h>

#include <algorithm>
#include <cstring>

#include "core/arith.h"

namespace cairn {
namespace {

// ISA-L takes lengths as int: longer pieces go in blocks of this many bytes.
constexpr uint64_t kBlock = uint64_t{1} << 26;

unsigned char* U(std::byte* p) {
  return reinterpret_cast<unsigned char*>(p);
}
unsigned char* U(const std::byte* p) {
  // ISA-L's sources are `unsigned char*` but only read.
  return reinterpret_cast<unsigned char*>(const_cast<std::byte*>(p));
}

// parity ^= piece, 128 bytes a step through four 32-byte vectors (unaligned loads and
// stores): XOR parity needs no Galois-field tables, where ISA-L's ec_encode_data_update
// multiplies every byte by 1 through its lookup tables. Inlined into an AVX2 function and a
// baseline one (two SSE2 halves a vector), chosen at run time: no ifunc (target_clones),
// whose resolver runs before a sanitizer's runtime is up (TSan crashed at start).
[[gnu::always_inline]] inline void XorIntoBody(std::byte* parity, const std::byte* piece,
                                               uint64_t n) {
  using V = unsigned char __attribute__((vector_size(32)));
  constexpr uint64_t kV = sizeof(V), kStep = 4 * kV;
  uint64_t i = 0;
  for (; i + kStep <= n; i += kStep) {
    V a0, a1, a2, a3, b0, b1, b2, b3;
    std::memcpy(&a0, parity + i, kV);
    std::memcpy(&a1, parity + i + kV, kV);
    std::memcpy(&a2, parity + i + 2 * kV, kV);
    std::memcpy(&a3, parity + i + 3 * kV, kV);
    std::memcpy(&b0, piece + i, kV);
    std::memcpy(&b1, piece + i + kV, kV);
    std::memcpy(&b2, piece + i + 2 * kV, kV);
    std::memcpy(&b3, piece + i + 3 * kV, kV);
    a0 ^= b0;
    a1 ^= b1;
    a2 ^= b2;
    a3 ^= b3;
    std::memcpy(parity + i, &a0, kV);
    std::memcpy(parity + i + kV, &a1, kV);
    std::memcpy(parity + i + 2 * kV, &a2, kV);
    std::memcpy(parity + i + 3 * kV, &a3, kV);
  }
  for (; i < n; ++i) parity[i] ^= piece[i];
}

__attribute__((target("avx2"))) void XorIntoAvx2(std::byte* parity, const std::byte* piece,
                                                 uint64_t n) {
  XorIntoBody(parity, piece, n);
}

void XorIntoBaseline(std::byte* parity, const std::byte* piece, uint64_t n) {
  XorIntoBody(parity, piece, n);
}

void XorInto(std::byte* parity, const std::byte* piece, uint64_t n) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2)
    XorIntoAvx2(parity, piece, n);
  else
    XorIntoBaseline(parity, piece, n);
}

// ec_init_tables of a single coefficient, for each of the 256 (8 KiB, made once): a
// holder multiplies a chunk of 256 KiB in a few microseconds, and making the tables on
// every call cost it about 4% (bench/memory's rs encode ratio).
const unsigned char* TablesOf(unsigned char coef) {
  static const std::vector<unsigned char> all = [] {
    std::vector<unsigned char> t(256 * 32);
    for (int c = 0; c < 256; ++c) {
      unsigned char x = static_cast<unsigned char>(c);
      ec_init_tables(1, 1, &x, t.data() + 32 * c);
    }
    return t;
  }();
  return all.data() + 32 * coef;
}

}  // namespace

std::string ErasureScheme::Describe() const {
  if (m == 1) return "xor k=" + std::to_string(k);
  return "rs k=" + std::to_string(k) + " m=" + std::to_string(m);
}

Status ValidateErasureScheme(const ErasureScheme& s) {
  if (s.m < 1 || s.k <= s.m || s.k > kMaxErasureMembers) {
    return Status::InvalidArgument(
        "an erasure-coded set needs 1 <= m < k <= " + std::to_string(kMaxErasureMembers) +
        " (k members on k nodes, m of them parity per stripe); got k=" + std::to_string(s.k) +
        " m=" + std::to_string(s.m));
  }
  return Status::OK();
}

int StripeDataMember(const ErasureScheme& s, int stripe, int j) {
  return (stripe + j) % s.k;
}

int StripeParityMember(const ErasureScheme& s, int stripe, int p) {
  return (stripe + s.data() + p) % s.k;
}

int StripeOfPiece(const ErasureScheme& s, int member, int j) {
  return (member - j + s.k) % s.k;
}

int StripeIndexOf(const ErasureScheme& s, int stripe, int member) {
  return (member - stripe + s.k) % s.k;
}

uint64_t PieceBytes(uint64_t bytes, int d) {
  return CeilDiv(bytes, static_cast<uint64_t>(d));
}

PieceRange PieceOf(uint64_t bytes, int d, int j) {
  uint64_t c = PieceBytes(bytes, d);
  uint64_t off = std::min(bytes, c * static_cast<uint64_t>(j));
  return {off, std::min(c, bytes - off)};
}

Result<ErasureCode> ErasureCode::Make(const ErasureScheme& s) {
  CAIRN_RETURN_IF_ERROR(ValidateErasureScheme(s));
  ErasureCode code;
  code.scheme_ = s;
  const int d = s.data(), rows = s.k;
  code.matrix_.assign(static_cast<size_t>(rows * d), 0);
  if (s.m == 1) {
    for (int j = 0; j < d; ++j) code.matrix_[static_cast<size_t>(j * d + j)] = 1;
    std::fill(code.matrix_.begin() + d * d, code.matrix_.end(), 1);  // XOR
  } else {
    gf_gen_cauchy1_matrix(code.matrix_.data(), rows, d);
    // Scaled so that parity row 0 is all ones and every row starts with a 1 (format 2 of
    // parity records): scaling a column of the Cauchy part, or a whole row of it, scales
    // each square submatrix's determinant by a non-zero factor, so every d x d submatrix of
    // [I; C] stays invertible. A coefficient of 1 is a plain XOR (AddToParity) or no
    // computation at all for a first piece received into the parity (ParityStore::InPlace):
    // row 0 costs what XOR parity costs, and piece 0 is an XOR in every row.
    unsigned char* c = code.matrix_.data() + d * d;
    for (int j = 0; j < d; ++j) {
      const unsigned char inv = gf_inv(c[j]);
      for (int p = 0; p < s.m; ++p) c[p * d + j] = gf_mul(c[p * d + j], inv);
    }
    for (int p = 1; p < s.m; ++p) {
      const unsigned char inv = gf_inv(c[p * d]);
      for (int j = 0; j < d; ++j) c[p * d + j] = gf_mul(c[p * d + j], inv);
    }
  }
  unsigned char* parity_rows = code.matrix_.data() + d * d;
  code.parity_tables_.resize(static_cast<size_t>(32 * d * s.m));
  ec_init_tables(d, s.m, parity_rows, code.parity_tables_.data());
  return code;
}

void ErasureCode::AddToParity(int j, int p, const std::byte* piece, uint64_t n,
                              std::byte* parity) const {
  MultiplyAdd(Coefficient(j, p), piece, n, parity);
}

void ErasureCode::SetParity(int j, int p, const std::byte* piece, uint64_t n,
                            std::byte* parity) const {
  Multiply(Coefficient(j, p), piece, n, parity);
}

void ErasureCode::MultiplyAdd(unsigned char coef, const std::byte* piece, uint64_t n,
                              std::byte* parity) {
  if (coef == 1) {  // XOR parity, parity row 0, piece 0
    XorInto(parity, piece, n);
    return;
  }
  auto* tables = const_cast<unsigned char*>(TablesOf(coef));
  for (uint64_t off = 0; off < n; off += kBlock) {
    int len = static_cast<int>(std::min(kBlock, n - off));
    unsigned char* out = U(parity + off);
    ec_encode_data_update(len, 1, 1, 0, tables, U(piece + off), &out);
  }
}

void ErasureCode::Multiply(unsigned char coef, const std::byte* in, uint64_t n, std::byte* out) {
  if (n == 0) return;  // (an empty version's piece may have no bytes at all: no pointer)
  if (coef == 1) {
    std::memcpy(out, in, n);
    return;
  }
  auto* tables = const_cast<unsigned char*>(TablesOf(coef));
  for (uint64_t off = 0; off < n; off += kBlock) {
    int len = static_cast<int>(std::min(kBlock, n - off));
    unsigned char* src = U(in + off);
    unsigned char* dst = U(out + off);
    ec_encode_data(len, 1, 1, tables, &src, &dst);
  }
}

unsigned char ErasureCode::Divide(unsigned char a, unsigned char b) {
  return gf_mul(a, gf_inv(b));
}

unsigned char ErasureCode::Coefficient(int j, int p) const {
  const int d = scheme_.data();
  return matrix_[static_cast<size_t>((d + p) * d + j)];
}

std::span<const unsigned char> ErasureCode::ParityRow(int p) const {
  const size_t d = static_cast<size_t>(scheme_.data());
  return {matrix_.data() + (d + static_cast<size_t>(p)) * d, d};
}

void ErasureCode::Encode(std::span<const std::byte* const> data, uint64_t len,
                         std::span<std::byte* const> parity) const {
  const int d = scheme_.data(), m = scheme_.m;
  std::vector<unsigned char*> src(static_cast<size_t>(d)), dst(static_cast<size_t>(m));
  auto* tables = const_cast<unsigned char*>(parity_tables_.data());
  for (uint64_t off = 0; off < len; off += kBlock) {
    int n = static_cast<int>(std::min(kBlock, len - off));
    for (int j = 0; j < d; ++j) src[static_cast<size_t>(j)] = U(data[static_cast<size_t>(j)] + off);
    for (int p = 0; p < m; ++p)
      dst[static_cast<size_t>(p)] = U(parity[static_cast<size_t>(p)] + off);
    ec_encode_data(n, d, m, tables, src.data(), dst.data());
  }
}

Status ErasureCode::Decode(std::span<const std::byte* const> pieces, uint64_t len,
                           std::span<std::byte* const> out) const {
  const int d = scheme_.data(), total = scheme_.k;
  if (pieces.size() != static_cast<size_t>(total) || out.size() != static_cast<size_t>(d)) {
    return Status::InvalidArgument("erasure decode: " + std::to_string(pieces.size()) +
                                   " pieces and " + std::to_string(out.size()) + " outputs for " +
                                   scheme_.Describe());
  }
  if (len == 0) return Status::OK();  // an empty stripe: nothing to rebuild
  // The first d pieces present, and the lost data pieces wanted back.
  std::vector<int> survivors, wanted;
  for (int i = 0; i < total && static_cast<int>(survivors.size()) < d; ++i) {
    if (pieces[static_cast<size_t>(i)] != nullptr) survivors.push_back(i);
  }
  if (static_cast<int>(survivors.size()) < d) {
    auto lost = std::count(pieces.begin(), pieces.end(), nullptr);
    return Status::InvalidArgument("erasure decode: " + std::to_string(lost) +
                                   " pieces of a stripe lost, more than " + scheme_.Describe() +
                                   " covers");
  }
  for (int j = 0; j < d; ++j) {
    if (out[static_cast<size_t>(j)] == nullptr) continue;
    if (pieces[static_cast<size_t>(j)] != nullptr) {
      return Status::InvalidArgument("erasure decode: data piece " + std::to_string(j) +
                                     " is present, not lost");
    }
    wanted.push_back(j);
  }
  if (wanted.empty()) return Status::OK();
  // B: the survivors' rows of the encoding matrix; its inverse maps the survivors' pieces
  // back to the data pieces, row j giving data piece j.
  std::vector<unsigned char> b(static_cast<size_t>(d * d)), inv(static_cast<size_t>(d * d));
  for (int r = 0; r < d; ++r) {
    std::memcpy(&b[static_cast<size_t>(r * d)], &matrix_[static_cast<size_t>(survivors[r] * d)],
                static_cast<size_t>(d));
  }
  if (gf_invert_matrix(b.data(), inv.data(), d) != 0) {
    return Status::Internal("erasure decode: the survivors' matrix of " + scheme_.Describe() +
                            " is singular");
  }
  const int rows = static_cast<int>(wanted.size());
  std::vector<unsigned char> decode_rows(static_cast<size_t>(rows * d));
  for (int r = 0; r < rows; ++r) {
    std::memcpy(&decode_rows[static_cast<size_t>(r * d)], &inv[static_cast<size_t>(wanted[r] * d)],
                static_cast<size_t>(d));
  }
  std::vector<unsigned char> tables(static_cast<size_t>(32 * d * rows));
  ec_init_tables(d, rows, decode_rows.data(), tables.data());
  std::vector<unsigned char*> src(static_cast<size_t>(d)), dst(static_cast<size_t>(rows));
  for (uint64_t off = 0; off < len; off += kBlock) {
    int n = static_cast<int>(std::min(kBlock, len - off));
    for (int r = 0; r < d; ++r) {
      src[static_cast<size_t>(r)] = U(pieces[static_cast<size_t>(survivors[r])] + off);
    }
    for (int r = 0; r < rows; ++r) {
      dst[static_cast<size_t>(r)] = U(out[static_cast<size_t>(wanted[r])] + off);
    }
    ec_encode_data(n, d, rows, tables.data(), src.data(), dst.data());
  }
  return Status::OK();
}

}  // namespace cairn
