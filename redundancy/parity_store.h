// ParityStore: the parity this rank holds for the erasure-coded set it belongs to
// (redundancy/erasure.h), in host memory that outlives the process.
//
// Under <node_dir>/parity/rank-<holder>/, one record per (stripe, parity row, step):
//   s<stripe>-p<row>-t<step>.parity  the parity bytes, accumulated in place (a mapped file)
//                                    while the stripe's d data pieces arrive, one per member;
//   s<stripe>-p<row>-t<step>.meta    written last (WriteFileAtomic) once every piece was
//                                    added: the scheme, the step, the job's world size, the
//                                    parity's length and checksum, and for each data piece its
//                                    source rank, the byte count of that rank's version and
//                                    its slot header (tiers/FORMAT.md), all under a checksum.
// A record without a meta file that decodes is not a record: List() skips it, and opening
// the store removes what a killed process left half made. A damaged parity file is found by
// its checksum when read (MapParity). Of each (stripe, row), the step the job agreed on (the
// newest a sender announced) is kept, and the newest `keep` records newer than it; publishing
// a record removes the others, and so does the first piece of a record that announces a newer
// agreed step, before that record takes its memory. An unfinished record holds pieces
// whose senders were told they are kept, so it is dropped only once the job agreed on a newer
// step, or (a bound on memory, with a warning) when six newer ones of its stripe started.
// A contribution that fails part way leaves bytes added to the parity that no one can take
// out again: its record is dropped.
// Thread-safety: every method takes the store's lock; Begin/Add/End for one record come from
// one thread (the replicator's service thread).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cairn/status.h"
#include "core/filesystem.h"
#include "core/log.h"
#include "core/mutex.h"
#include "redundancy/erasure.h"
#include "tiers/mapped_file.h"

namespace cairn {

struct ParityKey {
  int stripe = 0;
  int row = 0;  // which of the stripe's m parity rows
  int64_t step = -1;
  auto operator<=>(const ParityKey&) const = default;
};

// One data piece of a record: the rank whose version it is cut from, that version's data
// bytes, and its encoded slot header (empty until the piece was added).
struct ParityPiece {
  int source = -1;
  uint64_t data_bytes = 0;
  std::string header;
};

// A published record, as List() reads it back.
struct ParityRecord {
  ErasureScheme scheme;
  ParityKey key;
  uint32_t world_size = 0;
  uint64_t parity_bytes = 0;
  uint64_t parity_checksum = 0;  // of the bytes stored
  // The parity is the bytes stored times this (GF(2^8); format 3): a record whose first
  // piece was received into it (InPlace) stores the parity divided by that piece's
  // coefficient, so that piece costs no computation. MapParity multiplies it back.
  unsigned char scale = 1;
  std::vector<ParityPiece> pieces;  // by data index j (0 .. d-1)
};

// The meta file's bytes and back (for the fuzz target: Corruption naming `from` for
// anything that is not a record).
std::string EncodeParityRecord(const ParityRecord& r);
Result<ParityRecord> DecodeParityRecord(std::string_view bytes, const std::string& from);

class ParityStore {
 public:
  // `node_dir` is <host_root>/<job>/node-<n>; `host_root` the top of its private tree.
  ParityStore(std::string node_dir, int holder_rank, FileSystem* fs, const Logger* log,
              std::string host_root, int keep = 4);
  ~ParityStore();
  ParityStore(const ParityStore&) = delete;
  ParityStore& operator=(const ParityStore&) = delete;

  static std::string Dir(const std::string& node_dir, int holder_rank);

  // Starts adding data piece j (of `piece_bytes` bytes, from `piece.source`'s version of
  // `piece.data_bytes` bytes) to the record `key` of `scheme` in a job of `world_size`
  // ranks, creating the record (its parity zeroed) or growing it. FailedPrecondition when
  // that piece was already added or the record was made for another scheme or world.
  // `keep_step` is the step the job agreed on as the sender knows it: the newest such step
  // of a (stripe, row) is kept however many newer records are published.
  Status Begin(const ErasureScheme& scheme, uint32_t world_size, const ParityKey& key, int j,
               const ParityPiece& piece, uint64_t piece_bytes, int64_t keep_step = -1);
  // Adds bytes [offset, offset + n) of the piece begun for (key, j).
  void Add(const ParityKey& key, int j, uint64_t offset, const std::byte* bytes, uint64_t n);
  // Where the piece begun for (key, j) may be received in place: the record's parity bytes
  // (the piece's byte i at [i]), when it is the record's first piece; null otherwise. The
  // record then stores its parity divided by that piece's coefficient c in the record's row
  // (ParityRecord::scale = c; c is 1 for XOR parity, Reed-Solomon's row 0 and piece 0 of
  // every row), and each later piece is added times its coefficient over c: the first piece
  // costs no computation and no copy. Its bytes are then not Add()ed. Valid until End(key,
  // j), which must come only once nothing can land there any more (a receive given up is
  // cancelled first).
  std::byte* InPlace(const ParityKey& key, int j);
  // Ends the piece begun for (key, j): `ok` records it, publishing the record once all d
  // pieces are in; not ok drops the record. The publish error, or OK.
  Status End(const ParityKey& key, int j, bool ok);

  // The published records, oldest first; records that do not decode are skipped with a
  // warning.
  std::vector<ParityRecord> List();
  // The parity bytes of a published record, checked against its checksum (Corruption
  // naming the file otherwise), in a read-only mapping of the record's file (its first
  // parity_bytes bytes, unmapped when the last copy of the pointer goes): what a rebuild
  // sends from, with no copy into fresh memory; for a record whose scale is not 1, in fresh
  // memory, the stored bytes times the scale.
  Result<std::shared_ptr<const std::byte>> MapParity(const ParityRecord& r);

  // Unfinished records (for tests and stats).
  size_t accumulating() const;

 private:
  struct Accumulating {
    ParityRecord record;
    std::unique_ptr<MappedFile> file;
    std::vector<bool> added;  // by j
    std::optional<int> open;  // the piece being added
    bool in_place = false;    // the open piece lands in the parity itself (InPlace)
    unsigned char scale = 1;  // ParityRecord::scale
    const ErasureCode* code = nullptr;
    int64_t started_ns = 0;
  };
  std::string Base(const ParityKey& k) const;
  Result<const ErasureCode*> CodeFor(const ErasureScheme& s) CAIRN_REQUIRES(mu_);
  void Drop(const ParityKey& k, const std::string& why) CAIRN_REQUIRES(mu_);
  Status Publish(Accumulating& a) CAIRN_REQUIRES(mu_);
  // Removes the published records of (stripe, row) that no restore can need any more.
  void Prune(int stripe, int row) CAIRN_REQUIRES(mu_);
  void RemoveRecord(const ParityKey& k) CAIRN_REQUIRES(mu_);
  std::vector<ParityRecord> ListLocked() CAIRN_REQUIRES(mu_);

  const std::string dir_;
  const std::string host_root_;
  FileSystem* const fs_;
  const Logger* const log_;
  const int keep_;
  mutable Mutex mu_;
  bool dir_ready_ CAIRN_GUARDED_BY(mu_) = false;
  std::map<ParityKey, Accumulating> accumulating_ CAIRN_GUARDED_BY(mu_);
  std::map<std::pair<int, int>, std::unique_ptr<ErasureCode>> codes_ CAIRN_GUARDED_BY(mu_);
  // The newest agreed step announced for each (stripe, row).
  std::map<std::pair<int, int>, int64_t> keep_step_ CAIRN_GUARDED_BY(mu_);
};

}  // namespace cairn
