// bench/idle_pages: how much slower memory is to touch again after it was left idle, on this
// machine. A host slot is used once every `slots` saves; on some virtual machines (the AMD
// PVM guests, 2026-11: a paravirtual hypervisor with shadow page tables and the kernel's
// DAMON sampling pages) pages left alone for tens of seconds lose what made them fast to
// reach, and the next pass over them pays a trap per page again, as a first use does.
//
// One region of --bytes, a file of /dev/shm mapped, allocated and pre-faulted as a host
// tier does it (MappedFile). For each idle time: the region is written by user space and
// read by the kernel (written into a tmpfs file: the copy a TCP send makes from user
// memory) right after a full pass (the warm reference), then again after sleeping that
// long. The two arms alternate, so the ratio is taken in the same minute. Prints a line per
// idle time, then one JSON line.
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "cli/args.h"
#include "core/clock.h"
#include "core/filesystem.h"
#include "tiers/mapped_file.h"

namespace {

using cairn::NanosToSeconds;
using cairn::NowNanos;
using cairn::bench::Round;

struct Pass {
  double write_gbps = 0;
  double kernel_read_gbps = 0;
};

// A user-space write of the whole region, then a kernel read of it (written into `sink`).
Pass Touch(std::byte* region, uint64_t n, cairn::File& sink, int fill) {
  Pass p;
  int64_t t0 = NowNanos();
  std::memset(region, fill, n);
  p.write_gbps = static_cast<double>(n) / NanosToSeconds(NowNanos() - t0) / 1e9;
  t0 = NowNanos();
  for (uint64_t done = 0; done < n;) {
    const uint64_t k = std::min<uint64_t>(n - done, 1 << 20);
    if (cairn::Status st = sink.WriteAt(region + done, k, done); !st.ok()) {
      std::fprintf(stderr, "idle_pages: %s\n", st.ToString().c_str());
      std::exit(1);
    }
    done += k;
  }
  p.kernel_read_gbps = static_cast<double>(n) / NanosToSeconds(NowNanos() - t0) / 1e9;
  return p;
}

int Fail(const cairn::Status& st) {
  std::fprintf(stderr, "idle_pages: %s\n", st.ToString().c_str());
  return 1;
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

  // The region is a host slot's file, mapped as a tier maps it; the sink a plain file
  // beside it. Both are unlinked at once: the mapping and the descriptor keep them.
  char dir_tmpl[] = "/dev/shm/cairn-bench-idle-XXXXXX";
  if (::mkdtemp(dir_tmpl) == nullptr) {
    std::perror("idle_pages: mkdtemp in /dev/shm");
    return 1;
  }
  const std::string dir = dir_tmpl;
  cairn::FileSystem* fs = cairn::DefaultFileSystem();
  auto slot = cairn::MappedFile::Open(fs, dir + "/slot");
  auto sink = fs->OpenFile(dir + "/sink", O_RDWR | O_CREAT | O_EXCL, 0600);
  (void)fs->RemoveAll(dir);
  if (!slot.ok()) return Fail(slot.status());
  if (!sink.ok()) return Fail(sink.status());
  if (cairn::Status st = (*slot)->Resize(n); !st.ok()) return Fail(st);
  if (cairn::Status st = (*slot)->Prefault(); !st.ok()) return Fail(st);
  if (cairn::Status st = sink->Allocate(n); !st.ok()) return Fail(st);
  std::byte* region = (*slot)->data();

  // First use, then a pass so that the warm reference is warm.
  const Pass first = Touch(region, n, *sink, 1);
  (void)Touch(region, n, *sink, 2);
  std::printf("first use: write %.2f GB/s, kernel read %.2f GB/s\n", first.write_gbps,
              first.kernel_read_gbps);
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  double worst_write = 1e9, worst_read = 1e9;
  int fill = 3;
  for (int s : idle) {
    const Pass warm = Touch(region, n, *sink, fill++);
    std::this_thread::sleep_for(std::chrono::seconds(s));
    const Pass after = Touch(region, n, *sink, fill++);
    const double w = after.write_gbps / warm.write_gbps;
    const double r = after.kernel_read_gbps / warm.kernel_read_gbps;
    worst_write = std::min(worst_write, w);
    worst_read = std::min(worst_read, r);
    std::printf(
        "idle %3d s: write %6.2f GB/s (warm %6.2f, %.2f)  kernel read %6.2f GB/s (warm %6.2f, "
        "%.2f)\n",
        s, after.write_gbps, warm.write_gbps, w, after.kernel_read_gbps, warm.kernel_read_gbps, r);
    std::fflush(stdout);
    rows.push_back({{"idle_s", s},
                    {"write_gbps", Round(after.write_gbps, 2)},
                    {"warm_write_gbps", Round(warm.write_gbps, 2)},
                    {"kernel_read_gbps", Round(after.kernel_read_gbps, 2)},
                    {"warm_kernel_read_gbps", Round(warm.kernel_read_gbps, 2)}});
  }
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
