#include "cairn/prepare.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "core/filesystem.h"
#include "core/host_pages.h"
#include "core/pool.h"
#include "core/trace.h"
#include "tiers/host_tier.h"

namespace cairn {

Result<std::optional<HeldBlob>> NewestHeldBlob(const Options& options, std::string_view name) {
  const std::string dir =
      HostTier::RankDir(options.host_root, options.job_id, options.node, options.rank);
  CAIRN_ASSIGN_OR_RETURN(auto got, HostTier::NewestBlob(DefaultFileSystem(), dir, name));
  if (!got) return std::optional<HeldBlob>();
  return std::optional<HeldBlob>(HeldBlob{got->first, std::move(got->second)});
}

struct Prefault::State {
  std::atomic<bool> stop{false};
  uint64_t bytes = 0;  // written by the thread, read after join
  std::thread thread;
};

Prefault::Prefault(std::vector<ShardSpec> targets, const Options& options)
    : state_(std::make_unique<State>()) {
  if (!options.trace_path.empty()) Trace::Enable(options.rank);
  const bool huge = RestoreWantsHugePages(options.restore_huge_pages);
  std::erase_if(targets, [](const ShardSpec& t) {
    return t.memory != MemoryKind::kHost || t.data == nullptr || t.nbytes() == 0;
  });
  if (targets.empty()) return;
  State* s = state_.get();
  s->thread = std::thread([s, huge, targets = std::move(targets)] {
    (void)pthread_setname_np(pthread_self(), "cairn-prefault");
    SetThreadPriority(ThreadPriority::kLow);
    TraceSpan span("prefault restore targets", "restore");
    constexpr uint64_t kPiece = 1 << 20;
    for (const ShardSpec& t : targets) {
      auto* data = static_cast<std::byte*>(t.data);
      const uint64_t n = t.nbytes();
      if (huge) AdviseHugePagesIfFresh(data, n);
      for (uint64_t lo = 0; lo < n; lo += kPiece) {
        if (s->stop.load(std::memory_order_relaxed)) return;
        const uint64_t hi = std::min(n, lo + kPiece);
        PopulatePages(data, lo, hi, true);
        s->bytes += hi - lo;
      }
    }
  });
}

Prefault::~Prefault() {
  Stop();
}

uint64_t Prefault::Wait() {
  if (state_->thread.joinable()) state_->thread.join();
  return state_->bytes;
}

uint64_t Prefault::Stop() {
  state_->stop.store(true, std::memory_order_relaxed);
  return Wait();
}

}  // namespace cairn
