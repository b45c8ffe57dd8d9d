// Kill points: named places in the capture, replication, persist and commit paths where a
// test build can kill its own process with SIGKILL, exactly there, so the crash matrix
// (tests/crash_matrix.cc) can prove that a process dying at any step leaves nothing torn
// restorable. Compiled only when CMake's CAIRN_KILL_POINTS is ON (the ASan build and
// scripts/crash_matrix.sh); otherwise CAIRN_KILL_POINT expands to nothing.
//
// In a kill-point build two variables drive them (read once, at the first point reached):
//   CAIRN_KILL_AT=<name>:<n>   the n-th time this process reaches point <name>, it prints
//                              "cairn: kill point <name> #<n>" to stderr and SIGKILLs itself
//   CAIRN_KILL_CENSUS=<path>   at a normal exit, writes "<name> <times reached>" lines to
//                              <path> (how the matrix learns which points a run reaches)
// Thread-safety: points may be reached from any thread.
#pragma once

#include <string>
#include <vector>

namespace cairn {

// Every kill point compiled into cairn, in the order a version meets them.
const std::vector<std::string>& KillPointNames();

#if defined(CAIRN_KILL_POINTS)
void ReachKillPoint(const char* name);
#define CAIRN_KILL_POINT(name) ::cairn::ReachKillPoint(name)
#else
#define CAIRN_KILL_POINT(name) ((void)0)
#endif

}  // namespace cairn
