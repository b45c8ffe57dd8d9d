// Helpers the benchmark programs share: size lists, pre-faulted memory, medians.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cairn/options.h"
#include "cairn/tensor.h"
#include "core/clock.h"

#include <nlohmann/json.hpp>

namespace cairn::bench {

// This program's own path, to launch it again as a rank ("" when unreadable). Not
// /proc/self/exe: inside a network namespace that names the `ip` that runs it.
inline std::string SelfPath() {
  char self[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  return n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string();
}

// This process's peak resident memory so far, in KiB (getrusage's ru_maxrss).
inline long MaxRssKb() {
  struct rusage u {};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

// "a,b,c" -> {"a", "b", "c"} (empty items dropped).
inline std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  size_t p = 0;
  while (p <= s.size()) {
    size_t q = s.find(',', p);
    if (q == std::string::npos) q = s.size();
    if (q > p) out.push_back(s.substr(p, q - p));
    p = q + 1;
  }
  return out;
}

// "256M,1G" -> byte counts; exits with a message on a bad item.
inline std::vector<uint64_t> ParseSizes(const std::string& list) {
  std::vector<uint64_t> out;
  for (const std::string& item : SplitList(list)) {
    auto v = ParseByteCount(item, "--sizes");
    if (!v.ok()) {
      std::fprintf(stderr, "%s\n", v.status().message().c_str());
      std::exit(2);
    }
    out.push_back(*v);
  }
  return out;
}

// Memory that is already faulted in (first touch is slow here and must never be timed).
struct Buffer {
  explicit Buffer(size_t n) : size(n) {
    p = static_cast<std::byte*>(::mmap(nullptr, n, PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0));
    if (p == MAP_FAILED) {
      std::perror("mmap");
      std::exit(1);
    }
    for (size_t i = 0; i < n; i += 4096) p[i] = std::byte{static_cast<unsigned char>(i >> 12)};
  }
  ~Buffer() { ::munmap(p, size); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  std::byte* p;
  size_t size;
};

// `x` rounded to `digits` decimals, for the JSON lines (nlohmann-json prints the shortest
// form that reads back the same double). Infinity and NaN stay as they are.
inline double Round(double x, int digits) {
  if (!std::isfinite(x)) return x;
  const double f = std::pow(10.0, digits);
  return std::round(x * f) / f;
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

inline double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

// memcpy of `n` bytes split over `threads` threads; seconds.
inline double TimedMemcpy(std::byte* dst, const std::byte* src, size_t n, int threads) {
  const int64_t t0 = NowNanos();
  if (threads <= 1) {
    std::memcpy(dst, src, n);
  } else {
    std::vector<std::thread> ts;
    const size_t part = (n / static_cast<size_t>(threads) + 4095) & ~size_t{4095};
    for (int i = 0; i < threads; ++i) {
      const size_t b = std::min(n, part * static_cast<size_t>(i));
      const size_t e = std::min(n, b + part);
      ts.emplace_back([=] { std::memcpy(dst + b, src + b, e - b); });
    }
    for (auto& t : ts) t.join();
  }
  return NanosToSeconds(NowNanos() - t0);
}

// The forward/backward stand-in: `reps` passes of multiply-adds over `w` (64 Ki floats,
// 256 KiB, stays in L2).
inline float g_compute_sink = 0;
// noinline: the same machine code wherever it is called from (timings must compare).
[[gnu::noinline]] inline void Compute(std::vector<float>& w, int64_t reps) {
  float a = 0.999f, b = 0.001f;
  for (int64_t r = 0; r < reps; ++r) {
    for (size_t i = 0; i < w.size(); ++i) w[i] = w[i] * a + b;
    a = 2.0f - a;  // keep values bounded and the loop un-foldable
  }
  g_compute_sink += w[w.size() / 2];
}

// The `reps` for which Compute(w, reps) takes about `target_s`: a rough estimate, then two
// passes over the median of five timed runs (single runs vary by +-25% on a shared VM).
inline int64_t CalibrateCompute(std::vector<float>& w, double target_s) {
  int64_t reps = 16;
  for (;;) {
    const int64_t t0 = NowNanos();
    Compute(w, reps);
    const double s = NanosToSeconds(NowNanos() - t0);
    if (s > 0.05) {
      reps = static_cast<int64_t>(static_cast<double>(reps) * target_s / s);
      break;
    }
    reps *= 2;
  }
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<double> ct;
    for (int i = 0; i < 5; ++i) {
      const int64_t t0 = NowNanos();
      Compute(w, reps);
      ct.push_back(NanosToSeconds(NowNanos() - t0));
    }
    reps = std::max<int64_t>(
        1, static_cast<int64_t>(static_cast<double>(reps) * target_s / Median(ct)));
  }
  return reps;
}

// A data-parallel model state: `tensors` fp32 tensors [rows, 1024] splitting `bytes`, in
// pre-faulted memory, and the shards that describe them.
struct TensorState {
  explicit TensorState(uint64_t bytes, int tensors = 8) {
    for (int i = 0; i < tensors; ++i) {
      bufs.push_back(std::make_unique<Buffer>(bytes / static_cast<uint64_t>(tensors)));
      TensorMeta m{"layers." + std::to_string(i) + ".weight",
                   DType::kF32,
                   {static_cast<int64_t>(bytes / static_cast<uint64_t>(tensors) / 4 / 1024), 1024}};
      shards.push_back(ShardSpec::Whole(m, bufs.back()->p));
    }
  }
  // The optimizer step: one float changes every `stride` bytes.
  void Touch(int64_t step, size_t stride) {
    for (auto& b : bufs)
      for (size_t off = static_cast<size_t>(step % 16) * 4; off < b->size; off += stride)
        reinterpret_cast<float*>(b->p + off)[0] += 1.0f;
  }
  // The tensors' bytes, for RawWrite.
  std::vector<std::pair<const std::byte*, uint64_t>> Parts() const {
    std::vector<std::pair<const std::byte*, uint64_t>> p;
    for (const auto& b : bufs) p.emplace_back(b->p, b->size);
    return p;
  }
  std::vector<std::unique_ptr<Buffer>> bufs;
  std::vector<ShardSpec> shards;
};

// The raw write reference: `parts` laid end to end into `path` with sequential 4 MiB
// pwrite(2)s (O_DIRECT if `direct`: the parts must then be page aligned), then fsync; the
// file is removed afterwards. Seconds from the first write to the end of the fsync.
inline double RawWrite(const std::string& path,
                       const std::vector<std::pair<const std::byte*, uint64_t>>& parts,
                       bool direct) {
  constexpr uint64_t kIo = 4ull << 20;
  const int fd = ::open(path.c_str(),
                        O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | (direct ? O_DIRECT : 0), 0600);
  if (fd < 0) {
    std::perror(("open " + path).c_str());
    std::exit(1);
  }
  const int64_t t0 = NowNanos();
  uint64_t at = 0;
  for (const auto& [src, bytes] : parts) {
    for (uint64_t off = 0; off < bytes; off += kIo) {
      const size_t n = static_cast<size_t>(std::min(kIo, bytes - off));
      if (::pwrite(fd, src + off, n, static_cast<off_t>(at + off)) != static_cast<ssize_t>(n)) {
        std::perror(("write " + path).c_str());
        std::exit(1);
      }
    }
    at += bytes;
  }
  if (::fsync(fd) != 0) std::perror("fsync");
  const double s = NanosToSeconds(NowNanos() - t0);
  ::close(fd);
  ::unlink(path.c_str());
  return s;
}

}  // namespace cairn::bench
