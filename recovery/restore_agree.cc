#include "recovery/restore_agree.h"

#include <algorithm>
#include <functional>
#include <map>

namespace cairn::restore_internal {

bool MemoryComplete(const std::vector<Inventory>& inv, int64_t step) {
  uint32_t world = 0;
  std::set<int> sources;
  for (const Inventory& i : inv)
    for (const HeldVersion& v : i.held) {
      if (v.step != step) continue;
      if (world != 0 && v.world_size != world) return false;  // two different jobs' steps
      world = v.world_size;
      sources.insert(v.source);
    }
  if (world == 0) return false;
  for (uint32_t s = 0; s < world; ++s)
    if (!sources.count(static_cast<int>(s))) return false;
  return true;
}

std::optional<Choice> Choose(const std::vector<Inventory>& inv, std::optional<int64_t> want,
                             const std::set<std::pair<int64_t, bool>>& excluded) {
  std::set<int64_t, std::greater<>> steps;
  std::set<int64_t> on_pfs;
  for (const Inventory& i : inv) {
    for (const HeldVersion& v : i.held) steps.insert(v.step);
    for (int64_t s : i.pfs_steps) {
      steps.insert(s);
      on_pfs.insert(s);
    }
  }
  for (int64_t s : steps) {
    if (want && s != *want) continue;
    if (!excluded.count({s, false}) && MemoryComplete(inv, s)) return Choice{s, false};
    if (!excluded.count({s, true}) && on_pfs.count(s)) return Choice{s, true};
  }
  return std::nullopt;
}

std::string DescribeInventory(const std::vector<Inventory>& inv) {
  std::map<int64_t, std::set<int>> mem;
  uint32_t world = 0;
  for (const Inventory& i : inv)
    for (const HeldVersion& v : i.held) {
      mem[v.step].insert(v.source);
      world = std::max(world, v.world_size);
    }
  std::string s = "in memory:";
  if (mem.empty()) s += " nothing";
  for (auto it = mem.rbegin(); it != mem.rend(); ++it)
    s += " step " + std::to_string(it->first) + " (" + std::to_string(it->second.size()) + " of " +
         std::to_string(world) + " ranks)";
  s += "; on the PFS:";
  bool any = false;
  for (const Inventory& i : inv)
    for (int64_t p : i.pfs_steps) {
      s += " " + std::to_string(p);
      any = true;
    }
  if (!any) s += " nothing";
  return s;
}

}  // namespace cairn::restore_internal
