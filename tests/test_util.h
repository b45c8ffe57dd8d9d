// Helpers shared by the tests: unique job ids and self-cleaning directories, so that
// `ctest -j` never sees two tests collide.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cairn/options.h"

namespace cairn::testing {

// A fresh directory (under /dev/shm when it exists, else TMPDIR or /tmp), removed with
// everything in it when the object is destroyed.
class TempDir {
 public:
  explicit TempDir(const std::string& tag);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // Leaves the directory in place (for a failure to be looked at).
  void Keep() { keep_ = true; }

 private:
  std::string path_;
  bool keep_ = false;
};

// A job id no other test (or test process) uses.
std::string UniqueJobId(const std::string& tag);

// Options for one rank whose host tier lives under `root`.
Options TestOptions(const TempDir& root, const std::string& tag);

// Fills `n` bytes with a pattern determined by `seed` (and checks it).
void FillPattern(void* p, size_t n, uint64_t seed);
bool CheckPattern(const void* p, size_t n, uint64_t seed);

// Flips one byte of a file in place.
void CorruptByte(const std::string& path, uint64_t offset);

// The line of /proc/self/smaps that starts with `field` ("Rss:", "VmFlags:") for the
// mapping holding `p`, with a space added at its end ("" when there is none).
std::string SmapsLine(const void* p, const std::string& field);
// The kB of a "Rss:"-like line of SmapsLine (-1 when there is none).
int64_t SmapsKb(const void* p, const std::string& field);

}  // namespace cairn::testing
