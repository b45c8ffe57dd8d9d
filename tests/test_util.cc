#include "tests/test_util.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "core/clock.h"
#include "core/filesystem.h"

namespace cairn::testing {
namespace {

std::atomic<int> counter{0};

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

TempDir::TempDir(const std::string& tag) {
  std::string base = "/dev/shm";
  struct stat st;
  if (::stat(base.c_str(), &st) != 0) {
    const char* t = std::getenv("TMPDIR");
    base = t ? t : "/tmp";
  }
  std::string templ = base + "/cairn-test-" + tag + "-XXXXXX";
  if (!::mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed for " + templ);
  path_ = templ;
}

TempDir::~TempDir() {
  if (!keep_) (void)DefaultFileSystem()->RemoveAll(path_);
}

std::string UniqueJobId(const std::string& tag) {
  return tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
         std::to_string(WallNanos() % 1000000007);
}

Options TestOptions(const TempDir& root, const std::string& tag) {
  Options o;
  o.job_id = UniqueJobId(tag);
  o.host_root = root.path();
  o.pfs_root = root.path() + "/pfs";
  o.log_level = LogLevel::kError;
  o.copy_engine = CopyEngineKind::kHost;
  return o;
}

void FillPattern(void* p, size_t n, uint64_t seed) {
  auto* b = static_cast<unsigned char*>(p);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = Mix(seed ^ (i * 0x100000001b3ull));
    std::memcpy(b + i, &v, 8);
  }
  uint64_t v = Mix(seed ^ (i * 0x100000001b3ull));
  std::memcpy(b + i, &v, n - i);
}

bool CheckPattern(const void* p, size_t n, uint64_t seed) {
  auto* b = static_cast<const unsigned char*>(p);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = Mix(seed ^ (i * 0x100000001b3ull));
    if (std::memcmp(b + i, &v, 8) != 0) return false;
  }
  uint64_t v = Mix(seed ^ (i * 0x100000001b3ull));
  return std::memcmp(b + i, &v, n - i) == 0;
}

std::string SmapsLine(const void* p, const std::string& field) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {  // a mapping's first line
      inside = lo <= at && at < hi;
    } else if (inside && line.rfind(field, 0) == 0) {
      return line + " ";
    }
  }
  return "";
}

int64_t SmapsKb(const void* p, const std::string& field) {
  const std::string line = SmapsLine(p, field);
  return line.empty() ? -1 : std::strtoll(line.c_str() + field.size(), nullptr, 10);
}

void CorruptByte(const std::string& path, uint64_t offset) {
  int fd = ::open(path.c_str(), O_RDWR);
  if (fd < 0) throw std::runtime_error("open " + path);
  unsigned char c = 0;
  if (::pread(fd, &c, 1, static_cast<off_t>(offset)) != 1) throw std::runtime_error("pread");
  c ^= 0x5a;
  if (::pwrite(fd, &c, 1, static_cast<off_t>(offset)) != 1) throw std::runtime_error("pwrite");
  ::close(fd);
}

}  // namespace cairn::testing
