#include "transport/rendezvous.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/trusted_path.h"

namespace cairn {
namespace {

constexpr char kAddrMagic[8] = {'C', 'A', 'I', 'R', 'N', 'A', 'D', 'R'};

std::string Hex(const unsigned char* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s.push_back(d[p[i] >> 4]);
    s.push_back(d[p[i] & 15]);
  }
  return s;
}

}  // namespace

Result<std::string> RandomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open /dev/urandom");
  ssize_t n = ::read(fd, raw.data(), raw.size());
  ::close(fd);
  if (n != static_cast<ssize_t>(raw.size())) return Status::IOError("short read of /dev/urandom");
  return Hex(reinterpret_cast<const unsigned char*>(raw.data()), raw.size());
}

std::string Rendezvous::AddressPath(int rank) const {
  return JoinPath(dir_, "rank-" + std::to_string(rank) + ".addr");
}

Status Rendezvous::MakeDir() {
  return MakeTrustedDirs(fs_, dir_, dir_, TreeKind::kPrivate,
                         "the rendezvous directory holds the job token and the ranks' "
                         "addresses, so only this user may write it: set "
                         "CAIRN_RENDEZVOUS_DIR to a directory of your own")
      .WithContext("rendezvous directory " + dir_);
}

Result<std::string> Rendezvous::LoadOrCreateToken() {
  CAIRN_RETURN_IF_ERROR(MakeDir());
  const std::string path = JoinPath(dir_, "token");
  for (int attempt = 0; attempt < 2; ++attempt) {
    // Checked on the file opened (never through a link): this user's own, 0600.
    auto read = ReadOwnFile(fs_, path, 4096);
    if (read.ok()) {
      if (read->size() != kTokenHexBytes)
        return Status::Corruption("job token " + path +
                                  " is malformed; delete it to make a new one");
      return std::move(*read);
    }
    if (read.status().code() == StatusCode::kFailedPrecondition)
      return Status::FailedPrecondition("job token: " + read.status().message() +
                                        " (it must be a 0600 file of this user)");
    if (read.status().code() != StatusCode::kNotFound) return read.status();
    if (rank_ != 0)
      return Status::NotFound("job token " + path + " is not there yet (rank 0 makes it)");
    // Create it atomically: a complete temporary file hard-linked into place, so racing
    // ranks all end up reading the one that won.
    CAIRN_ASSIGN_OR_RETURN(std::string token, RandomHex(kTokenHexBytes / 2));
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    CAIRN_RETURN_IF_ERROR(WriteFileAtomic(fs_, tmp, token));
    Status linked = fs_->Link(tmp, path);
    (void)fs_->Unlink(tmp);
    if (!linked.ok() && linked.error_number() != EEXIST) return linked;
    (void)fs_->SyncDir(dir_);
  }
  return Status::Internal("job token " + path + " vanished while being created");
}

Result<std::string> LoadOrCreateJobToken(const std::string& dir) {
  return Rendezvous(DefaultFileSystem(), dir, 0, 1).LoadOrCreateToken();
}

std::string EncodeAddressFile(int rank, int world, std::string_view nonce,
                              std::string_view address) {
  std::string rec(kAddrMagic, sizeof kAddrMagic);
  auto put32 = [&](uint32_t v) { rec.append(reinterpret_cast<const char*>(&v), 4); };
  put32(static_cast<uint32_t>(rank));
  put32(static_cast<uint32_t>(world));
  rec += nonce;
  put32(static_cast<uint32_t>(address.size()));
  rec += address;
  return rec;
}

Status ParseAddressFile(std::string_view b, int p, int world, std::string* address,
                        std::string* nonce) {
  uint32_t r = 0, w = 0, len = 0;
  if (b.size() < 36 || std::memcmp(b.data(), kAddrMagic, 8) != 0)
    return Status::Corruption("address file of rank " + std::to_string(p) + " is malformed");
  std::memcpy(&r, b.data() + 8, 4);
  std::memcpy(&w, b.data() + 12, 4);
  std::memcpy(&len, b.data() + 32, 4);
  if (r != static_cast<uint32_t>(p) || len != b.size() - 36)
    return Status::Corruption("address file of rank " + std::to_string(p) + " is malformed");
  if (w != static_cast<uint32_t>(world))
    return Status::FailedPrecondition("rank " + std::to_string(p) + " runs with world size " +
                                      std::to_string(w) + " but this rank with " +
                                      std::to_string(world) + " (stale rendezvous files?)");
  *nonce = std::string(b.substr(16, 16));
  *address = std::string(b.substr(36));
  return Status::OK();
}

Result<std::string> Rendezvous::Publish(std::string_view address) {
  CAIRN_ASSIGN_OR_RETURN(std::string nonce, RandomHex(8));
  CAIRN_RETURN_IF_ERROR(
      WriteFileAtomic(fs_, AddressPath(rank_), EncodeAddressFile(rank_, world_, nonce, address))
          .WithContext("publishing this rank's address in " + dir_));
  return nonce;
}

Status Rendezvous::Read(int peer, std::string* address, std::string* nonce) {
  const std::string path = AddressPath(peer);
  // Every rank of a job runs as its user: an address file of anyone else (or a link) is
  // not a rank's, and connecting to it would hand the job token to its maker.
  CAIRN_ASSIGN_OR_RETURN(std::string b, ReadOwnFile(fs_, path, 1 << 20));
  return ParseAddressFile(b, peer, world_, address, nonce).WithContext(path);
}

Result<AddressBook::Joined> Rendezvous::Join(std::string_view address,
                                             const std::string& token_override) {
  Joined j;
  if (token_override.empty()) {
    CAIRN_ASSIGN_OR_RETURN(j.token, LoadOrCreateToken());
  } else {
    CAIRN_RETURN_IF_ERROR(MakeDir());
    j.token = token_override;
  }
  CAIRN_ASSIGN_OR_RETURN(j.nonce, Publish(address));
  return j;
}

void Rendezvous::Withdraw() {
  (void)fs_->Unlink(AddressPath(rank_));
}

}  // namespace cairn
