// Preparing a restart's restore while the job connects.
//
// A restarted process usually restores next, and part of what its restore costs is making
// memory: an optimizer's state that does not exist yet is allocated, and the kernel hands
// each of its fresh pages over zeroed, one fault per 4 KiB (70 MB of AdamW state: 34 ms on
// this project's VMs, most of a memory restore; docs/performance.md, "Time to resume
// against dcp.load"). Checkpointer::Open spends about as long waiting for the other ranks
// to connect. These two calls let a caller move that work into the wait, before Open:
//
//   auto layout = cairn::NewestHeldBlob(options, "my.layout");  // what to allocate
//   ...allocate the targets the layout describes...
//   cairn::Prefault warm(targets, options);   // faults them in on a thread of its own
//   auto ckpt = cairn::Checkpointer::Open(options);
//   warm.Stop();                              // before the restore fills them
//
// cairn.torch does this for an optimizer without state (python/cairn/torch.py).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/options.h"
#include "cairn/status.h"
#include "cairn/tensor.h"

namespace cairn {

struct HeldBlob {
  int64_t step = 0;   // of the version it belongs to
  std::string bytes;  // its checksum verified
};

// The blob `name` of the newest restorable version in this rank's own host tier
// (options: host_root, job_id, node, rank), read without opening the tier: no lock taken,
// nothing changed, nothing sent, so it may run while another process is still closing the
// tier. nullopt when the tier holds no restorable version or the newest has no such blob.
// Only files of this user are read (a header or slot file of another user is an error);
// a blob whose bytes do not match its checksum is Corruption naming the file. The restore
// that follows decides the step on its own: a caller checks that what it prepared
// matches the blobs the restore returns.
Result<std::optional<HeldBlob>> NewestHeldBlob(const Options& options, std::string_view name);

// Faults in the host memory of `targets` (device targets are left alone) on a thread of
// its own at nice 10, 1 MiB at a time (MADV_POPULATE_WRITE, after MADV_HUGEPAGE on fresh
// memory where options.restore_huge_pages asks for huge pages, as a restore would): the
// open's own work goes first, and on a machine with idle cores none of it waits. The memory
// must stay allocated until Stop() returns (the destructor stops). Bytes already there are
// left as they were; fresh memory reads as zeros. Never an error: it only moves page
// faults earlier.
class Prefault {
 public:
  Prefault(std::vector<ShardSpec> targets, const Options& options);
  ~Prefault();
  Prefault(const Prefault&) = delete;
  Prefault& operator=(const Prefault&) = delete;

  // Waits until every target is faulted in; returns the bytes faulted in. (The thread
  // runs at nice 10: a caller that must not wait for it on a busy machine uses Stop().)
  uint64_t Wait();
  // Stops at the next MiB and waits for the thread: the memory is the caller's again (a
  // restore faults in what is left itself). Returns the bytes faulted in.
  uint64_t Stop();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace cairn
