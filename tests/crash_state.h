// The state the crash test's child saves and the parent restores: three tensors (a whole
// one, a row block of a matrix, a flat range of a 3-d tensor) whose every byte at step t is
// a function of t, so any restored version can be checked bit for bit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cairn/tensor.h"
#include "tests/test_util.h"

namespace cairn::testing {

struct CrashState {
  explicit CrashState(size_t bytes) : a(bytes / 2), b(bytes / 8), c(bytes / 16 + 13) {}
  std::vector<uint8_t> a;
  std::vector<float> b;
  std::vector<double> c;

  static uint64_t Seed(int64_t t, int which) { return static_cast<uint64_t>(t) * 3 + which; }
  void Fill(int64_t t) {
    FillPattern(a.data(), a.size(), Seed(t, 1));
    FillPattern(b.data(), b.size() * 4, Seed(t, 2));
    FillPattern(c.data(), c.size() * 8, Seed(t, 3));
  }
  bool Holds(int64_t t) const {
    return CheckPattern(a.data(), a.size(), Seed(t, 1)) &&
           CheckPattern(b.data(), b.size() * 4, Seed(t, 2)) &&
           CheckPattern(c.data(), c.size() * 8, Seed(t, 3));
  }
  // The tensors "a", "b", "c", their names prefixed with `prefix`.
  std::vector<ShardSpec> Shards(const std::string& prefix = "") {
    std::vector<ShardSpec> s;
    s.push_back(
        ShardSpec::Whole({prefix + "a", DType::kU8, {static_cast<int64_t>(a.size())}}, a.data()));
    // b: rows [4, 4 + n/64) of a (n/64 + 8) x 64 matrix.
    ShardSpec bs;
    bs.meta = {prefix + "b", DType::kF32, {static_cast<int64_t>(b.size() / 64 + 8), 64}};
    bs.box = Box{{4, 0}, {static_cast<int64_t>(b.size() / 64), 64}};
    bs.data = b.data();
    s.push_back(bs);
    // c: a flat range of a larger 3-d tensor.
    const int64_t n = static_cast<int64_t>(c.size());
    auto f = ShardSpec::FromFlatRange({prefix + "c", DType::kF64, {3, 7, n / 7 + 1}}, 5, 5 + n,
                                      c.data());
    for (auto& x : *f) s.push_back(x);
    return s;
  }
};

}  // namespace cairn::testing
