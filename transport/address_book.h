// AddressBook: where the ranks of a job publish their UCX worker addresses, find each
// other's, and get the job token a hello must present. Two kinds:
//   - Rendezvous (transport/rendezvous.h): a directory every node shares, one address file
//     per rank; works under any launcher;
//   - PmixAddressBook (transport/pmix_book.h): the key-value store of a PMIx launcher
//     (Open MPI's mpirun, Slurm's srun --mpi=pmix): no file per rank and no filesystem
//     metadata traffic at start-up.
// Options::bootstrap chooses (OpenAddressBook below).
// Thread-safety: one caller at a time (UcxComm holds its lock around every call).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "cairn/options.h"
#include "cairn/status.h"
#include "core/filesystem.h"

namespace cairn {

class Logger;

class AddressBook {
 public:
  virtual ~AddressBook() = default;
  struct Joined {
    std::string token;  // the job token (hex)
    std::string nonce;  // names this incarnation of this rank's address
  };
  // Publishes this rank's `address` with a fresh nonce and returns the job token (or
  // `token_override` when it is not empty: tests play an intruder with it).
  virtual Result<Joined> Join(std::string_view address, const std::string& token_override) = 0;
  // Whether a Join that failed so is worth trying again until the connect timeout: a
  // networked filesystem's client reconnecting (ENOTCONN, ESTALE, ETIMEDOUT), or what the
  // book waits for (the job token rank 0 has not made yet).
  virtual bool JoinAgain(const Status& st) const { return TransientFsError(st); }
  // Rank `peer`'s address and nonce: NotFound until it has published; another error, naming
  // where it looked, when what it published is malformed.
  virtual Status Read(int peer, std::string* address, std::string* nonce) = 0;
  // Retracts this rank's address (at shutdown; errors ignored).
  virtual void Withdraw() = 0;
  // For messages: the rendezvous directory, or "PMIx namespace <ns>".
  virtual const std::string& where() const = 0;
};

// The book Options::bootstrap selects for options.rank of options.world_size:
// files (Rendezvous over `fs`, nullptr: POSIX), pmix (FailedPrecondition when
// this build has no PMIx or the process was not started by a PMIx launcher), or auto (pmix
// when PMIX_NAMESPACE is set, this build has PMIx and the PMIx job is cairn's job, i.e. of
// the same size; else files, said in an info line on `log`).
Result<std::unique_ptr<AddressBook>> OpenAddressBook(const Options& options, FileSystem* fs,
                                                     const Logger* log);

}  // namespace cairn
