// SlotHeader: the durable description of one version held in a host slot.
//
// Written (atomically, after the slot's data is persisted) to "slot-<k>.hdr" beside the
// data file "slot-<k>". It records the step, the state, the shard table (where each
// shard's bytes lie in the data file) and an XXH3 checksum per chunk of every shard, so a
// restarted process can tell a complete version from a torn one and verify every byte.
// The format is described in tiers/FORMAT.md. Thread-safety: plain value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/box.h"
#include "cairn/dtype.h"
#include "cairn/status.h"
#include "cairn/version.h"
#include "core/arith.h"

namespace cairn {

inline constexpr uint32_t kSlotHeaderVersion = 1;
// Largest header file cairn will read (guards against hostile sizes).
inline constexpr uint64_t kMaxSlotHeaderBytes = 1ull << 30;

struct SlotShard {
  std::string name;
  DType dtype = DType::kF32;
  Shape global_shape;
  Box box;
  uint64_t offset = 0;  // byte offset of the shard's row-major bytes in the data file
  uint64_t nbytes = 0;
  uint32_t first_chunk = 0;  // index into SlotHeader::chunk_checksums
  uint32_t num_chunks = 0;   // ceil(nbytes / chunk_bytes)

  bool operator==(const SlotShard&) const = default;
};

struct SlotBlob {
  std::string name;
  uint64_t offset = 0;
  uint64_t nbytes = 0;
  uint64_t checksum = 0;

  bool operator==(const SlotBlob&) const = default;
};

struct SlotHeader {
  VersionState state = VersionState::kCapturing;
  int64_t step = 0;
  int64_t created_wall_ns = 0;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint32_t node = 0;
  uint64_t data_bytes = 0;   // bytes of the data file this version uses
  uint64_t chunk_bytes = 0;  // chunk size of the checksums
  std::vector<SlotShard> shards;
  std::vector<SlotBlob> blobs;
  std::vector<uint64_t> chunk_checksums;

  bool operator==(const SlotHeader&) const = default;

  // Byte range [begin, end) of chunk `i` (0-based within the shard) of `s`.
  std::pair<uint64_t, uint64_t> ChunkRange(const SlotShard& s, uint32_t i) const;
};

// Serialises a header (little-endian, ending in an XXH3 of everything before it).
std::string EncodeSlotHeader(const SlotHeader& h);

// Parses and validates a header: magic, format version, trailing checksum, counts that fit
// the bytes present, names, dtypes, boxes inside shapes, shard and blob ranges inside
// data_bytes, chunk tables consistent with chunk_bytes. Corruption saying what is wrong
// otherwise (the caller adds the file name). Never allocates more than `bytes` implies.
Result<SlotHeader> DecodeSlotHeader(std::string_view bytes);

}  // namespace cairn
