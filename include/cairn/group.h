// Group: the collectives cairn's planners and recovery use, over small byte messages.
//
// An interface, so that the planners (persist/, recovery/) run collectives without linking
// UCX: production uses the UCX implementation (transport/ucx_group.h), unit tests may give an
// in-process one.
// Every rank of the group must call the same collectives in the same order.
// Thread-safety: one collective at a time per Group object.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "cairn/status.h"

namespace cairn {

class Group {
 public:
  virtual ~Group() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Returns once every rank has entered the barrier; Unavailable naming the rank that
  // failed or timed out otherwise.
  virtual Status Barrier() = 0;
  // Every rank contributes `mine`; on success returns all contributions indexed by rank.
  virtual Result<std::vector<std::string>> AllGather(std::string_view mine) = 0;
  // Returns `root`'s `data` on every rank (`data` is ignored on the others).
  virtual Result<std::string> Broadcast(int root, std::string_view data) = 0;
};

// The group of a job with one rank: every collective returns at once.
class SoloGroup final : public Group {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Status Barrier() override { return Status::OK(); }
  Result<std::vector<std::string>> AllGather(std::string_view mine) override {
    return std::vector<std::string>{std::string(mine)};
  }
  Result<std::string> Broadcast(int, std::string_view data) override { return std::string(data); }
};

}  // namespace cairn
