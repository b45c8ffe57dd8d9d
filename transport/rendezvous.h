// Rendezvous: the AddressBook (transport/address_book.h) of address files. A directory
// every node shares (CAIRN_RENDEZVOUS_DIR, default <CAIRN_PFS_ROOT>/<job>/rendezvous)
// holds the job token (a 0600 file of this user in a 0700 directory: a process of another
// user cannot read it, and a hello without it is refused) and one address file per rank
// (tiers/FORMAT.md: magic CAIRNADR, rank, world size, nonce, address length, the UCX
// worker address). Every file access goes through the FileSystem seam, so bootstrap
// failures can be injected (tests/transport_test.cc).
// Thread-safety: one bootstrap at a time per object; the files are shared with the other
// ranks through atomic publication (temporary file, fsync, rename or link).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "cairn/status.h"
#include "core/filesystem.h"
#include "transport/address_book.h"

namespace cairn {

// Length of the job token, in hex characters.
inline constexpr size_t kTokenHexBytes = 64;

class Rendezvous final : public AddressBook {
 public:
  Rendezvous(FileSystem* fs, std::string dir, int rank, int world)
      : fs_(fs), dir_(std::move(dir)), rank_(rank), world_(world) {}

  // The job token. Rank 0 creates it (0600, atomically: a complete file linked into place)
  // when the directory has none; the other ranks only read it, NotFound until rank 0 has
  // made it (JoinAgain: Join is tried again until the connect timeout). One creator, so
  // that no two ranks each read the token they made themselves, as two clients of a
  // networked filesystem racing to link the file both could (seen on GlusterFS: the ranks
  // then refused each other's hellos). FailedPrecondition when the file is not this user's
  // 0600 file (a link included: checked on the file opened).
  Result<std::string> LoadOrCreateToken();
  // Creates the directory (0700) without a token (a token given by the caller).
  // FailedPrecondition when it, as found, is not this user's alone (core/trusted_path.h).
  Status MakeDir();
  // Publishes this rank's address with a fresh nonce (returned), replacing an older file.
  Result<std::string> Publish(std::string_view address);
  // Rank `peer`'s address and nonce: NotFound until its file appears; Corruption or
  // FailedPrecondition naming the file when it is malformed, of another world size, or not
  // this user's own 0600 file.
  Status Read(int peer, std::string* address, std::string* nonce) override;
  // Removes this rank's address file (at shutdown; errors ignored).
  void Withdraw() override;
  // The token (LoadOrCreateToken, or the override after MakeDir), then Publish.
  Result<Joined> Join(std::string_view address, const std::string& token_override) override;
  // Also the token not made yet (NotFound: the only NotFound Join returns).
  bool JoinAgain(const Status& st) const override {
    return TransientFsError(st) || st.code() == StatusCode::kNotFound;
  }

  const std::string& dir() const { return dir_; }
  const std::string& where() const override { return dir_; }
  std::string AddressPath(int rank) const;

 private:
  FileSystem* fs_;
  std::string dir_;
  int rank_;
  int world_;
};

// LoadOrCreateToken on the POSIX filesystem.
Result<std::string> LoadOrCreateJobToken(const std::string& dir);

// The bytes of an address file, and back. ParseAddressFile: Corruption when malformed or
// naming another rank; FailedPrecondition when its world size differs from `world`.
std::string EncodeAddressFile(int rank, int world, std::string_view nonce,
                              std::string_view address);
Status ParseAddressFile(std::string_view bytes, int rank, int world, std::string* address,
                        std::string* nonce);

// `bytes` random bytes from /dev/urandom, in hex.
Result<std::string> RandomHex(size_t bytes);

}  // namespace cairn
