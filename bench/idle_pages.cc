// bench/idle_pages: how much slower memory is to touch again after it was left idle, on this
// machine. A host slot is used once every `slots` saves; on some virtual machines (the AMD
// PVM guests, 2026-11: a paravirtual hypervisor with shadow page tables and the kernel's
// DAMON sampling pages) pages left alone for tens of seconds lose what made them fast to
// reach, and the next pass over them pays a trap per page again, as a first use does.
//
// One region of --bytes, a file of /dev/shm mapped shared as a host slot is. For each idle
// time: the region is written by user space and read by the kernel (pwrite into a tmpfs
// file, the copy a TCP send makes from user memory) right after a full pass (the warm
// reference), then again after sleeping that long. The two arms alternate, so the ratio is
// taken in the same minute. Prints a line per idle time, then one JSON line.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "cli/args.h"
#include "core/clock.h"

namespace {

using cairn::NanosToSeconds;
using cairn::NowNanos;

// A tmpfs file of `n` bytes mapped shared (created and unlinked at once), or nullptr.
std::byte* MapShm(uint64_t n, int* fd_out, const char* what) {
  char path[] = "/dev/shm/cairn-bench-idle-XXXXXX";
  const int fd = ::mkstemp(path);
  if (fd < 0) return nullptr;
  ::unlink(path);
  if (::posix_fallocate(fd, 0, static_cast<off_t>(n)) != 0) {
    std::fprintf(stderr, "idle_pages: no room for the %s in /dev/shm\n", what);
    ::close(fd);
    return nullptr;
  }
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return nullptr;
  }
  *fd_out = fd;
  return static_cast<std::byte*>(p);
}

struct Pass {
  double write_gbps = 0;
  double kernel_read_gbps = 0;
};

Pass Touch(std::byte* region, uint64_t n, int sink, int fill) {
  Pass p;
  int64_t t0 = NowNanos();
  std::memset(region, fill, n);
  p.write_gbps = static_cast<double>(n) / NanosToSeconds(NowNanos() - t0) / 1e9;
  t0 = NowNanos();
  for (uint64_t done = 0; done < n;) {
    const ssize_t k = ::pwrite(sink, region + done, std::min<uint64_t>(n - done, 1 << 20),
                               static_cast<off_t>(done));
    if (k <= 0) {
      std::perror("idle_pages: pwrite");
      std::exit(1);
    }
    done += static_cast<uint64_t>(k);
  }
  p.kernel_read_gbps = static_cast<double>(n) / NanosToSeconds(NowNanos() - t0) / 1e9;
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  std::string bytes_arg = "1G", idle_arg = "0,5,10,20,40";
  CLI::App app(
      "How much slower a host slot's memory is to write (user space) and to read from the "
      "kernel (as a TCP send does) after it was left idle, against the same memory right "
      "after a pass over it. Prints a line per idle time, then one JSON line.",
      "bench_idle_pages");
  app.add_option("--bytes", bytes_arg, "region size (K/M/G suffix)")->capture_default_str();
  app.add_option("--idle", idle_arg, "idle times in seconds, comma-separated")
      ->capture_default_str();
  if (auto rc = cairn::cli::Parse(app, argc, argv)) return *rc;
  const uint64_t n = cairn::bench::ParseSizes(bytes_arg).at(0);
  std::vector<int> idle;
  for (const std::string& item : cairn::bench::SplitList(idle_arg)) {
    char* end = nullptr;
    const long s = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || s < 0 || s > 3600) {
      std::fprintf(stderr, "idle_pages: --idle wants seconds from 0 to 3600, not '%s'\n",
                   item.c_str());
      return 2;
    }
    idle.push_back(static_cast<int>(s));
  }

  int region_fd = -1, sink_fd = -1;
  std::byte* region = MapShm(n, &region_fd, "region");
  std::byte* sink_map = MapShm(n, &sink_fd, "sink");
  if (region == nullptr || sink_map == nullptr) return 1;
  ::munmap(sink_map, n);  // the sink is written through its descriptor only

  // First use, then a pass so that the warm reference is warm.
  const Pass first = Touch(region, n, sink_fd, 1);
  (void)Touch(region, n, sink_fd, 2);
  std::printf("first use: write %.2f GB/s, kernel read %.2f GB/s\n", first.write_gbps,
              first.kernel_read_gbps);
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  double worst_write = 1e9, worst_read = 1e9;
  int fill = 3;
  for (int s : idle) {
    const Pass warm = Touch(region, n, sink_fd, fill++);
    std::this_thread::sleep_for(std::chrono::seconds(s));
    const Pass after = Touch(region, n, sink_fd, fill++);
    const double w = after.write_gbps / warm.write_gbps;
    const double r = after.kernel_read_gbps / warm.kernel_read_gbps;
    worst_write = std::min(worst_write, w);
    worst_read = std::min(worst_read, r);
    std::printf(
        "idle %3d s: write %6.2f GB/s (warm %6.2f, %.2f)  kernel read %6.2f GB/s (warm %6.2f, "
        "%.2f)\n",
        s, after.write_gbps, warm.write_gbps, w, after.kernel_read_gbps, warm.kernel_read_gbps, r);
    std::fflush(stdout);
    using cairn::bench::Round;
    rows.push_back({{"idle_s", s},
                    {"write_gbps", Round(after.write_gbps, 2)},
                    {"warm_write_gbps", Round(warm.write_gbps, 2)},
                    {"kernel_read_gbps", Round(after.kernel_read_gbps, 2)},
                    {"warm_kernel_read_gbps", Round(warm.kernel_read_gbps, 2)}});
  }
  ::munmap(region, n);
  ::close(region_fd);
  ::close(sink_fd);
  using cairn::bench::Round;
  nlohmann::ordered_json j{{"bench", "idle_pages"},
                           {"bytes", n},
                           {"first_use_write_gbps", Round(first.write_gbps, 2)},
                           {"first_use_kernel_read_gbps", Round(first.kernel_read_gbps, 2)},
                           {"idle", rows},
                           {"worst_write_vs_warm", Round(worst_write, 3)},
                           {"worst_kernel_read_vs_warm", Round(worst_read, 3)}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}
