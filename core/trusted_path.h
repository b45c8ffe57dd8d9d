// Trust in what cairn finds on disk: a directory or file counts as cairn's own only if no
// other user could have made or changed it.
//
// The host tier keeps versions in files under a root where any user may create names
// (/dev/shm by default). Another user who made the root or the job directory first, or who
// put a file or a link inside, could otherwise have a restore load their bytes, and
// through the Python layer's blobs run their code. These checks refuse such directories
// and files with an error naming the path, its owner and its mode. docs/guarantees.md has
// the trust model.
//
// Two kinds of tree:
//  - private (the host tier, the rendezvous directory): every directory from the top
//    down is a real directory (not a link), owned by this user (the effective uid) or
//    root, and writable by neither group nor others unless sticky;
//  - shared (the PFS tier's own directories): real directories that others (the world)
//    cannot write unless sticky; a group that can write is trusted as a project group.
// In both, every ancestor of the top (links followed) must be unwritable by others
// unless sticky, or another user could swap the top for their own.
// Thread-safety: stateless.
#pragma once

#include <cstdint>
#include <string>

#include "core/filesystem.h"

namespace cairn {

enum class TreeKind { kPrivate, kShared };

// Creates `dir` and its missing parents (mode 0700) and checks the tree as above: the
// ancestors of `top` before anything is created, then every directory from `top` down to
// `dir` (`dir` is `top` or below it). FailedPrecondition naming the first directory that
// fails, its owner and mode, followed by `remedy` (what the user can do).
Status MakeTrustedDirs(FileSystem* fs, const std::string& top, const std::string& dir,
                       TreeKind kind, const std::string& remedy);

// Opens `path` with open(2) `flags` and `mode`, never following a link, and checks the file
// opened: a regular file owned by this user with no permission bits for group or others.
// FailedPrecondition naming the path, its owner and mode otherwise (a link: "is a symbolic
// link"); NotFound when it does not exist (and `flags` do not create it).
Result<File> OpenOwnFile(FileSystem* fs, const std::string& path, int flags, mode_t mode);

// ReadWholeFile of a file OpenOwnFile accepts.
Result<std::string> ReadOwnFile(FileSystem* fs, const std::string& path, uint64_t max_bytes);

// "uid 1001 (mallory)", or "uid 1001" when the user database does not know it.
std::string DescribeOwner(uint32_t uid);
// The permission bits in octal: "0700", "1777".
std::string DescribeMode(uint32_t mode);

}  // namespace cairn
