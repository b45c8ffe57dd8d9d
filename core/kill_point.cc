#include "core/kill_point.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "core/mutex.h"

namespace cairn {

const std::vector<std::string>& KillPointNames() {
  static const std::vector<std::string> names = {
      // Capture (api/checkpointer.cc, snapshot/host_copy_engine.cc, tiers/host_tier.cc;
      // the tier.* points also run when a replica is received).
      "tier.invalidated",     // slot header rewritten as CAPTURING, nothing copied yet
      "capture.copy_chunk",   // a chunk of the shards copied into the slot
      "capture.copied",       // every byte copied; fence() may return
      "tier.data_persisted",  // slot bytes flushed, header not yet CAPTURED
      "atomic.tmp_synced",    // WriteFileAtomic: temporary written and fsynced, not renamed
      "atomic.renamed",       // WriteFileAtomic: renamed, directory not yet fsynced
      "tier.published",       // header CAPTURED on disk, not yet known in memory
      "capture.published",    // CAPTURED, the replicator not yet told
      // Replication (transport/replicator.cc).
      "replicate.offered",    // sender: offer sent
      "replicate.ready",      // holder: slot prepared, receives posted, "ok" not yet sent
      "replicate.data_sent",  // sender: every byte sent, acknowledgement not yet received
      "replicate.received",   // holder: every byte arrived, not yet verified
      "replicate.verified",   // holder: every chunk verified, replica not yet published
      "replicate.published",  // holder: replica published, acknowledgement not yet sent
      "replicate.acked",      // sender: acknowledged, not yet recorded REPLICATED
      "tier.state_recorded",  // a REPLICATED / PERSISTED stage written into a slot header
      // Persist and commit (persist/persister.cc, writer.cc, commit.cc).
      "persist.agreed",         // ranks agreed on the step to persist
      "persist.piece_written",  // a piece of this rank's data file written
      "persist.file_synced",    // this rank's data file fsynced
      "persist.share_written",  // data directory fsynced, location table not yet sent
      "persist.tables_gathered",
      "commit.step_synced",  // rank 0: step directory fsynced, MANIFEST not yet written
      "commit.manifest_written",
      "commit.latest_written",  // LATEST names the new step
      "commit.collected",       // older steps garbage-collected, outcome not yet broadcast
      "persist.committed",      // outcome known, slot header not yet PERSISTED
  };
  return names;
}

#if defined(CAIRN_KILL_POINTS)
namespace {

struct KillPoints {
  std::string target;
  long nth = 0;
  std::string census;
  Mutex mu;
  std::map<std::string, long> reached;
};

KillPoints& State() {
  static KillPoints* kp = [] {
    auto* k = new KillPoints;  // never destroyed: points may be reached during exit
    if (const char* at = std::getenv("CAIRN_KILL_AT")) {
      const char* colon = std::strrchr(at, ':');
      if (colon) {
        k->target.assign(at, static_cast<size_t>(colon - at));
        k->nth = std::atol(colon + 1);
      }
      if (!colon || k->nth < 1) {
        std::fprintf(stderr, "cairn: CAIRN_KILL_AT='%s' is not <name>:<n> (n >= 1)\n", at);
        std::_Exit(2);
      }
      bool known = false;
      for (const std::string& n : KillPointNames()) known = known || n == k->target;
      if (!known) {
        std::fprintf(stderr, "cairn: CAIRN_KILL_AT names no kill point: '%s'\n", k->target.c_str());
        std::_Exit(2);
      }
    }
    if (const char* c = std::getenv("CAIRN_KILL_CENSUS")) {
      k->census = c;
      std::atexit([] {
        KillPoints& s = State();
        MutexLock lk(s.mu);
        if (FILE* f = std::fopen(s.census.c_str(), "w")) {
          for (const auto& [name, n] : s.reached) std::fprintf(f, "%s %ld\n", name.c_str(), n);
          std::fclose(f);
        }
      });
    }
    return k;
  }();
  return *kp;
}

}  // namespace

void ReachKillPoint(const char* name) {
  KillPoints& s = State();
  if (s.target.empty() && s.census.empty()) return;
  long n;
  {
    MutexLock lk(s.mu);
    n = ++s.reached[name];
  }
  if (n == s.nth && s.target == name) {
    char line[160];
    const int len = std::snprintf(line, sizeof line, "cairn: kill point %s #%ld\n", name, n);
    if (len > 0) (void)!::write(2, line, static_cast<size_t>(len));
    ::kill(::getpid(), SIGKILL);
    for (;;) ::pause();
  }
}
#endif

}  // namespace cairn
