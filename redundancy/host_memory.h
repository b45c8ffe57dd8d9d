// What a node's host memory holds for cairn, and how many slots a budget allows
// (CAIRN_HOST_MEMORY; issue 34, "Slots the memory allows").
//
// Per rank, in versions of CAIRN_SLOT_BYTES each (and their headers, VersionFootprint): its own
// ring of `slots`; with replicas, each of its `replicas` holders keeps as many of its versions
// (ReplicaStore: one ring of `slots` per source, on another node); with xor or rs parity, each node
// holds parity worth m / (k - m) of a version per parity record, and a holder keeps at most
// kParityRecordsKept records of a stripe (the agreed step's, the newest, the one being
// made), and stages the chunks of pieces it adds in kParityStagingBytes of windows.
// Summed over a node's ranks, that is an upper bound of what cairn holds in that node's host
// memory while no node is lost; a rebuild after a loss lands in the replica store (one ring
// per lost rank, on top).
#pragma once

#include <cstdint>
#include <string>

#include "cairn/options.h"
#include "cairn/status.h"

namespace cairn {

// The parity records of a stripe a holder keeps at most: the agreed step's, the newest one
// published after it (ParityStore's keep of 1), and the one being made. The agreement names
// one step per round for every member to push (snapshot/step_agreement.h), so no other
// record is made while the job keeps agreeing. While rounds agree on every step they name,
// a holder drops the agreed step's record as the next one starts (ParityStore::Begin), so
// it holds 2: the third is held only after a round that did not agree.
inline constexpr int kParityRecordsKept = 3;

// Parity pieces travel in messages of this many bytes (Replicator): each lands in one of
// the holder's two windows and is added into the parity from there (a record's first piece
// lands in the parity itself). The windows are what a holder stages outside its host tier,
// so they are small: 8 MiB chunks (a replica's) made them a third of a 4 MiB state under
// xor over 4 nodes (bench/memory).
inline constexpr uint64_t kParityChunkBytes = uint64_t{256} << 10;
// What a holder of parity stages outside its host tier: its two windows.
inline constexpr uint64_t kParityStagingBytes = 2 * kParityChunkBytes;

struct HostMemoryPlan {
  int slots = 0;                // own slots per rank
  int nodes = 1;                // the job's nodes
  int node_losses = 0;          // node losses every version survives in memory
  double versions_held = 0;     // host bytes per node over one version of each of its ranks
  uint64_t bytes_per_node = 0;  // the upper bound at `slots`
  std::string summary;          // one line: what is kept, what is covered, what it costs
};

// What one version of `slot_bytes` maps: its data and its header file (checksums and
// tensor table), counted as a page and 1/1024 of the data.
constexpr uint64_t VersionFootprint(uint64_t slot_bytes) {
  return slot_bytes + 4096 + slot_bytes / 1024;
}

// Host bytes per node at `slots` own slots, for the redundancy `o` names in a job of
// `nodes` nodes of o.local_world_size ranks, each version o.slot_bytes.
uint64_t HostBytesPerNode(const Options& o, int nodes, int slots);

// With o.host_memory set: the most own slots, from 2 (3 with parity: the step agreement
// keeps 2 while a round runs) up to o.slots, whose host bytes per
// node fit in it, and the one-line summary. InvalidArgument naming CAIRN_HOST_MEMORY and
// what the fewest slots would need when even they do not fit, or naming CAIRN_SLOT_BYTES when the
// version size is not set.
Result<HostMemoryPlan> PlanHostMemory(const Options& o);

}  // namespace cairn
