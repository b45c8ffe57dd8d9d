// TensorMeta and ShardSpec: how a rank describes the pieces of the tensors it holds.
//
// A tensor is named by its fully qualified name and described in its global index space;
// a shard is one rank's Box of it plus where its bytes are (row-major, contiguous).
// Thread-safety: plain values.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "cairn/box.h"
#include "cairn/dtype.h"
#include "cairn/status.h"

namespace cairn {

struct TensorMeta {
  std::string name;  // fully qualified, e.g. "layers.3.attn.qkv.weight"
  DType dtype = DType::kF32;
  Shape global_shape;

  bool operator==(const TensorMeta&) const = default;
};

// A CUDA stream (cudaStream_t) as cairn's headers carry it, so that they need no CUDA
// header. nullptr is the legacy default stream (PyTorch's default stream).
using CudaStream = void*;

enum class MemoryKind : uint8_t {
  kHost = 0,    // ordinary CPU memory
  kDevice = 1,  // CUDA device memory (copied by the CUDA copy engine)
};

struct ShardSpec {
  TensorMeta meta;
  Box box;  // the region of the global tensor this shard holds
  // Row-major contiguous bytes of `box`. Read by save() until fence() returns; written by
  // restore().
  void* data = nullptr;
  MemoryKind memory = MemoryKind::kHost;

  size_t nbytes() const { return static_cast<size_t>(box.numel()) * DTypeSize(meta.dtype); }

  // A shard that holds the whole tensor.
  static ShardSpec Whole(TensorMeta meta, void* data, MemoryKind memory = MemoryKind::kHost);
  // A shard given as a flat row-major element range [begin, end) of the tensor (ZeRO/FSDP
  // flat partitions): normalised into at most 2*ndim-1 box shards whose data pointers walk
  // through `data` in order. InvalidArgument if the range is outside the tensor.
  static Result<std::vector<ShardSpec>> FromFlatRange(const TensorMeta& meta, int64_t begin,
                                                      int64_t end, void* data,
                                                      MemoryKind memory = MemoryKind::kHost);
};

// Longest tensor name cairn accepts.
inline constexpr size_t kMaxTensorNameBytes = 4096;
// Most dimensions a tensor may have.
inline constexpr size_t kMaxTensorRank = 16;

// OK when the name is non-empty, at most kMaxTensorNameBytes long and free of NUL and
// other control characters; InvalidArgument naming the problem otherwise.
Status CheckTensorName(const std::string& name);
// Checks a shard as save() or restore() receives it: name, dtype, rank, box inside the
// global shape, data pointer present when it has bytes. The message names the tensor.
Status CheckShard(const ShardSpec& shard);

}  // namespace cairn
