#include "persist/slot_layout.h"

#include <string>
#include <unordered_map>

namespace cairn {

RankLayout SlotLayout(const SlotHeader& h) {
  RankLayout l;
  std::unordered_map<std::string, uint32_t> ids;
  l.shards.reserve(h.shards.size());
  for (const SlotShard& s : h.shards) {
    auto [it, fresh] = ids.emplace(s.name, static_cast<uint32_t>(l.tensors.size()));
    if (fresh) l.tensors.push_back(TensorMeta{s.name, s.dtype, s.global_shape});
    l.shards.push_back({it->second, s.box});
  }
  return l;
}

}  // namespace cairn
