#include "recovery/tier_memory.h"

#include <algorithm>

namespace cairn {
namespace {

class PinnedView final : public PinnedVersion {
 public:
  explicit PinnedView(std::unique_ptr<HostTier::View> v) : v_(std::move(v)) {}
  const SlotHeader& header() const override { return v_->header(); }
  const std::byte* data() const override { return v_->data(); }
  const std::string& path() const override { return v_->data_path(); }

 private:
  std::unique_ptr<HostTier::View> v_;
};

}  // namespace

std::vector<HeldVersion> TierMemory::List() {
  std::vector<HeldVersion> out;
  for (const VersionInfo& v : own_->Versions())
    out.push_back({static_cast<int>(v.rank), v.step, v.world_size});
  for (int s : sources_) {
    auto t = store_->TierFor(s);
    if (!t.ok()) {
      log_->Warning("replicas of rank " + std::to_string(s) +
                    " are not readable: " + t.status().ToString());
      continue;
    }
    for (const VersionInfo& v : (*t)->Versions())
      if (static_cast<int>(v.rank) == s)
        out.push_back({s, v.step, v.world_size, /*blobs_only=*/v.shards == 0});
  }
  return out;
}

Result<std::unique_ptr<PinnedVersion>> TierMemory::Pin(const HeldVersion& v) {
  HostTier* tier = own_;
  if (std::find(sources_.begin(), sources_.end(), v.source) != sources_.end()) {
    CAIRN_ASSIGN_OR_RETURN(tier, store_->TierFor(v.source));
  }
  CAIRN_ASSIGN_OR_RETURN(auto view, tier->Pin(v.step));
  return std::unique_ptr<PinnedVersion>(new PinnedView(std::move(view)));
}

}  // namespace cairn
