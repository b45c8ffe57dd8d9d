// Helpers the benchmark programs share: size lists, pre-faulted memory, medians.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/options.h"

namespace cairn::bench {

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

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

inline double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

}  // namespace cairn::bench
