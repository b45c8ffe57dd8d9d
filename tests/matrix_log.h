// What a rank of recovery_child's `matrix` mode printed (tests/recovery_child.cc): the
// steps it reported complete and the newest step it saw persisted. Shared by the crash
// matrix and the node-loss test, which both hold a restore to "the newest step reported
// complete".
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace cairn::testing {

struct MatrixLog {
  std::set<int64_t> complete;    // "complete <step>": captured and replicated, as reported
  int64_t persisted = -1;        // the newest step it saw committed to the PFS
  bool killed_at_point = false;  // "cairn: kill point ...": it died at its kill point
};

inline MatrixLog ParseMatrixLog(const std::string& text) {
  MatrixLog m;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line);
    std::string w;
    in >> w;
    int64_t t = -1, c, rep, p;
    if (w == "complete" && in >> t) {
      m.complete.insert(t);
    } else if (w == "saved" && in >> t >> w >> c >> w >> rep >> w >> p) {
      m.persisted = std::max(m.persisted, p);
    } else if (w == "committed" && in >> t) {
      m.persisted = std::max(m.persisted, t);
    } else if (line.rfind("cairn: kill point ", 0) == 0) {
      m.killed_at_point = true;
    }
  }
  return m;
}

// The newest step every rank reported complete; -1 when none.
inline int64_t NewestCompleteOnEveryRank(const std::vector<MatrixLog>& ranks) {
  int64_t newest = -1;
  if (ranks.empty()) return newest;
  for (int64_t t : ranks[0].complete)
    if (std::all_of(ranks.begin(), ranks.end(),
                    [&](const MatrixLog& r) { return r.complete.count(t) > 0; }))
      newest = std::max(newest, t);
  return newest;
}

}  // namespace cairn::testing
