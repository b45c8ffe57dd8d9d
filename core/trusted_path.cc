#include "core/trusted_path.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <vector>

namespace cairn {
namespace {

bool Sticky(uint32_t mode) {
  return (mode & S_ISVTX) != 0;
}

// The directories a path names, outermost first: "/a/b" -> "/", "/a", "/a/b"; "x/y" ->
// "x", "x/y".
std::vector<std::string> Prefixes(const std::string& path) {
  std::vector<std::string> out;
  const bool absolute = !path.empty() && path[0] == '/';
  if (absolute) out.push_back("/");
  std::string cur = absolute ? "" : ".";
  size_t i = 0;
  while (i < path.size()) {
    const size_t j = path.find('/', i);
    const std::string part = path.substr(i, j == std::string::npos ? std::string::npos : j - i);
    i = j == std::string::npos ? path.size() : j + 1;
    if (part.empty() || part == ".") continue;
    cur = cur == "." ? part : cur + "/" + part;
    out.push_back(cur);
  }
  return out;
}

Status Refuse(const std::string& path, const FileInfo& info, const std::string& why,
              const std::string& remedy) {
  return Status::FailedPrecondition(path + " (" + DescribeOwner(info.uid) + ", mode " +
                                    DescribeMode(info.mode) + ") " + why + "; " + remedy);
}

// Why `info` (of lstat) is not a directory of `kind` that only trusted users can change;
// "" when it is one.
std::string UntrustedDir(const FileInfo& info, TreeKind kind) {
  const uint32_t me = ::geteuid();
  if (S_ISLNK(info.mode)) return "is a symbolic link";
  if (!S_ISDIR(info.mode)) return "is not a directory";
  if (kind == TreeKind::kShared) {
    if ((info.mode & S_IWOTH) && !Sticky(info.mode)) return "can be written by any user";
    return "";
  }
  if (info.uid != me && info.uid != 0)
    return "belongs to another user (this process runs as " + DescribeOwner(me) + ")";
  if ((info.mode & (S_IWGRP | S_IWOTH)) && !Sticky(info.mode))
    return "can be written by other users";
  return "";
}

}  // namespace

std::string DescribeOwner(uint32_t uid) {
  std::string out = "uid " + std::to_string(uid);
  struct passwd pw;
  struct passwd* found = nullptr;
  char buf[4096];
  if (::getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found)
    out += std::string(" (") + found->pw_name + ")";
  return out;
}

std::string DescribeMode(uint32_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", mode & 07777u);
  return buf;
}

Status MakeTrustedDirs(FileSystem* fs, const std::string& top, const std::string& dir,
                       TreeKind kind, const std::string& remedy) {
  if (top.empty() || dir.compare(0, top.size(), top) != 0 ||
      (dir.size() > top.size() && dir[top.size()] != '/' && top.back() != '/'))
    return Status::Internal("MakeTrustedDirs: " + dir + " is not under " + top);
  // The ancestors of `top`, links followed: another user who can write one could replace
  // everything below it.
  const std::vector<std::string> up = Prefixes(top);
  for (size_t i = 0; i + 1 < up.size(); ++i) {
    auto info = fs->Stat(up[i]);
    if (!info.ok()) {
      if (info.status().code() == StatusCode::kNotFound) break;  // made below, by us
      return info.status();
    }
    if ((info->mode & S_IWOTH) && !Sticky(info->mode))
      return Refuse(up[i], *info, "can be written by any user, who could replace " + top, remedy);
  }
  // From `top` down: what exists is checked before anything is made below it, then the
  // whole chain again once the missing directories are made (mode 0700).
  const std::vector<std::string> down = Prefixes(dir);  // up's ancestors, then top and below
  auto check = [&](bool stop_at_missing) -> Status {
    for (size_t i = up.empty() ? 0 : up.size() - 1; i < down.size(); ++i) {
      auto info = fs->LinkStat(down[i]);
      if (!info.ok() && stop_at_missing && info.status().code() == StatusCode::kNotFound)
        return Status::OK();
      if (!info.ok()) return info.status();
      const std::string why = UntrustedDir(*info, kind);
      if (!why.empty()) return Refuse(down[i], *info, why, remedy);
    }
    return Status::OK();
  };
  CAIRN_RETURN_IF_ERROR(check(true));
  CAIRN_RETURN_IF_ERROR(fs->MakeDirs(dir, 0700));
  return check(false);
}

Result<File> OpenOwnFile(FileSystem* fs, const std::string& path, int flags, mode_t mode) {
  // O_NONBLOCK: a FIFO put there must not block the open (it is refused below).
  auto opened = fs->OpenFile(path, flags | O_NOFOLLOW | O_NONBLOCK, mode);
  if (!opened.ok()) {
    if (opened.status().error_number() == ELOOP) {
      auto link = fs->LinkStat(path);
      if (link.ok())
        return Refuse(path, *link, "is a symbolic link",
                      "cairn opens only its own files; remove the link");
    }
    return opened.status();
  }
  File f = std::move(*opened);
  CAIRN_ASSIGN_OR_RETURN(FileInfo info, fs->FileStat(f.fd()));
  const uint32_t me = ::geteuid();
  std::string why;
  if (!S_ISREG(info.mode))
    why = "is not a regular file";
  else if (info.uid != me)
    why = "is not a file of this user (" + DescribeOwner(me) + ")";
  else if ((info.mode & 077) != 0)
    why = "can be read or written by other users";
  if (!why.empty())
    return Refuse(path, info, why,
                  "cairn reads and writes only files that it made for this user; refusing it");
  const int fl = ::fcntl(f.fd(), F_GETFL);
  if (fl >= 0) (void)::fcntl(f.fd(), F_SETFL, fl & ~O_NONBLOCK);
  return f;
}

Result<std::string> ReadOwnFile(FileSystem* fs, const std::string& path, uint64_t max_bytes) {
  CAIRN_ASSIGN_OR_RETURN(File f, OpenOwnFile(fs, path, O_RDONLY, 0));
  return ReadAll(f, max_bytes);
}

}  // namespace cairn
