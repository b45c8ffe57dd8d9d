// PfsRunReader: reads the PFS runs one rank of a restore was planned to read, and passes
// them on (recovery/restore.cc, step 5 of an attempt from the PFS).
//
// Every run of this rank is read once, in file order, in chunk-sized preads on a few
// reader threads, each chunk verified right after its read while it is still in cache.
// A run lands in its target when it is exactly this rank's target region, else in a
// small pool of staging buffers that is reused (fresh memory costs more than the copy).
// As each run completes, the calling thread sends it on to the ranks that need it (packed
// down to their regions when that is smaller) and this rank's targets are filled from it
// (by the reader that completed it, for host targets); its buffer goes back to the pool
// once those sends completed.
// Thread-safety: Run() once, on the attempt's thread; the readers are a pool of its own.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "core/mutex.h"
#include "core/pool.h"
#include "recovery/restore_transfer.h"

namespace cairn::restore_internal {

class PfsRunReader {
 public:
  explicit PfsRunReader(Attempt& attempt) : a_(attempt) {}
  PfsRunReader(const PfsRunReader&) = delete;
  PfsRunReader& operator=(const PfsRunReader&) = delete;

  // Reads, verifies, fills and sends every run of this rank. The first read or I/O error
  // is returned (the bytes still go out, so no peer waits for them); a checksum mismatch
  // is noted in the attempt instead.
  Status Run();

 private:
  // A staging buffer for a run's bytes and the packed copies sent from it.
  struct Slot {
    std::unique_ptr<StagingBuffer> run;
    std::vector<std::unique_ptr<StagingBuffer>> packs;
  };
  // One chunk-sized read of run k.
  struct Item {
    size_t k;
    uint64_t off;  // from the run's lo
    uint64_t n;
  };

  // Orders this rank's runs by file position, opens their files, and finds each run's
  // spans, sends, and direct target.
  Status Prepare();
  // One chunk-sized read: reads, verifies; the read that completes its run packs and fills
  // it (host targets) and marks it ready. A task of the readers' pool.
  void Read(const Item& it);
  // Packs and fills of run k with memcpy (by the reader that completed it, so they run
  // beside the next reads and the calling thread's sends).
  Status CopyRun(size_t k);
  // Gives the slot of the oldest run whose sends are in flight back once they completed.
  void ReleaseOldest();
  // Queues the reads of as many further runs as there are buffers for.
  void StartMore();
  // Waits for run k, keeping the sends of earlier runs moving meanwhile.
  void WaitReady(size_t k);
  // Packs and fills of run k unless a reader did them, then its sends.
  void PassOn(size_t k);
  void Note(const Status& st) {
    if (!st.ok() && out_.ok()) out_ = st;
  }

  static constexpr size_t kPoolSize = 3;  // a run being read, one being sent, one spare

  Attempt& a_;
  std::map<uint32_t, File> files_;  // by manifest file index
  size_t nruns_ = 0;
  std::vector<std::vector<uint32_t>> spans_of_run_;
  std::vector<std::vector<const RankLoad::Put*>> puts_of_run_;
  std::vector<std::byte*> target_of_;  // runs read straight into a target
  uint64_t biggest_ = 0;               // the largest run read into a staging buffer

  // The calling thread's pool and sends.
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<Slot*> free_slots_;
  std::vector<Slot*> slot_of_;
  std::vector<std::vector<uint64_t>> tickets_;
  std::deque<size_t> sent_;  // runs whose sends are in flight, oldest first
  size_t started_ = 0;
  Status out_;  // the first send or copy error of the calling thread
  // By run: where its bytes land; by span: its packed bytes. Written by the calling thread
  // before the run's reads are queued, read by the readers after.
  std::vector<std::byte*> bufs_;
  std::vector<std::byte*> pack_buf_;
  TaskGroup* reads_ = nullptr;  // the reads queued on Run()'s pool of read_threads threads

  Mutex mu_;
  CondVar cv_;
  Status st_ CAIRN_GUARDED_BY(mu_);                   // the first read error
  Status copy_st_ CAIRN_GUARDED_BY(mu_);              // the first error of a reader's copies
  std::vector<uint64_t> left_ CAIRN_GUARDED_BY(mu_);  // by run: reads not done
  // Bytes, not vector<bool>: neighbouring flags are written by different threads.
  std::vector<uint8_t> ready_ CAIRN_GUARDED_BY(mu_);  // read, and (host) packed and filled
  // By run: a reader did the packs and fills. Set before ready_, read once ready_ is seen.
  std::vector<uint8_t> copied_;
};

}  // namespace cairn::restore_internal
