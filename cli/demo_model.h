// The model `cairn demo` trains: a synthetic GPT-like network (embedding, layers of
// attention and MLP weights with their norms, a final norm) and its Adam moments, sharded
// over the ranks of a job, trained on pseudo-gradients.
//
// Every element evolves on its own: its gradient at step t is a function of (t, tensor,
// global element index, its weight), so the exact bytes of any element at any step can be
// recomputed by replaying that element alone. That is how a rank checks every value it
// restored, under any layout, without holding the whole model or trusting cairn.
//
// Layouts:
//   "megatron"  tp = ranks per node (tensor parallel inside a node), dp = world / tp. Column
//               parallel weights (embedding rows, qkv, fc1) are split along dim 0, row
//               parallel ones (attention out, fc2) along dim 1, norms are whole on every
//               rank. The Adam moments are sharded over the data-parallel ranks as well
//               (ZeRO-1 / Megatron's distributed optimizer): each rank's part of its
//               parameter shard, split along dim 0. After the optimizer step the ranks of a
//               tensor-parallel shard exchange their updated parts.
//   "zero3"     parameters split along dim 0 over all ranks, moments as flat ranges of each
//               tensor (FSDP / ZeRO-3); used to restore into, not to train.
// Thread-safety: plain value, one thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cairn/box.h"
#include "cairn/checkpointer.h"
#include "cairn/group.h"

namespace cairn::cli {

struct DemoTensor {
  std::string name;
  Shape shape;
  int tp_dim = -1;  // dimension split over the tensor-parallel ranks; -1: whole on each
};

// The tensors of a GPT-like model with `layers` layers of width `dim` and `vocab` tokens.
std::vector<DemoTensor> GptTensors(int layers, int64_t dim, int64_t vocab);

class ShardedModel {
 public:
  // `tp` is the tensor-parallel degree ("megatron" only).
  ShardedModel(std::vector<DemoTensor> tensors, std::string layout, int rank, int world, int tp);

  // Forward and backward of step `step`: a micro-batch of `tokens` activations through every
  // weight this rank holds (y = W x, then W^T y: the FLOPs, not a real network), then the
  // pseudo-gradients of this rank's elements. Reads the parameters only. Returns the
  // "loss" (a function of the outputs, so the work cannot be skipped).
  double Backward(int64_t step, int tokens = 32);
  // The optimizer: moments and parameters of this rank's elements (writes them).
  void OptimizerStep();
  // Exchanges the updated parameter elements with the other ranks of this rank's
  // tensor-parallel shard (every rank of `group` must call it).
  Status GatherParameters(Group* group);

  // What cairn saves and restores: every parameter shard and moment shard.
  std::vector<ShardSpec> Shards();
  // "" when every element this rank holds equals a replay of `step` steps; otherwise the
  // first one that differs (tensor, box, element, got and expected).
  std::string Check(int64_t step) const;

  uint64_t bytes() const;        // parameter and moment bytes this rank holds
  uint64_t model_bytes() const;  // of the whole model (weights + two moments)
  size_t num_tensors() const { return tensors_.size(); }

 private:
  struct Moments {
    Box box;
    std::vector<float> m, v, g;
  };
  struct Held {
    Box param;
    std::vector<float> w;
    std::vector<Moments> moments;
  };
  // The boxes `rank` holds: the parameter box and the moment boxes of every tensor.
  std::vector<std::pair<Box, std::vector<Box>>> BoxesOf(int rank) const;

  std::vector<DemoTensor> tensors_;
  std::string layout_;
  int rank_, world_, tp_;
  std::vector<Held> held_;
  int64_t step_ = 0;  // of the last Backward
};

}  // namespace cairn::cli
