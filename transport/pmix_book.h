// PmixAddressBook: the AddressBook of a job started by a PMIx launcher (Open MPI's mpirun,
// Slurm's srun --mpi=pmix, PRRTE). Each rank puts its address file's bytes
// (tiers/FORMAT.md) under the key "cairn.address" and rank 0 a fresh job token under
// "cairn.token"; a fence over the job makes them visible, then a rank gets a peer's address
// when it first talks to it. A job connecting every pair at start-up asks the fence to
// collect every rank's data (one exchange among the launcher's daemons); a larger job does
// not, and each get fetches one peer's entry from the daemon of that peer's node (PMIx's
// direct modex), so a rank only ever fetches the addresses of the ranks it talks to.
// PMIx's rank and job size must agree with options.rank and options.world_size.
// Thread-safety: as AddressBook.
#pragma once

#include <memory>

#include "transport/address_book.h"

namespace cairn {

// Whether this build has PMIx.
bool PmixAvailable();

// PMIx_Init and the checks above: FailedPrecondition when this build has no PMIx, the
// process was not started by a PMIx launcher, or PMIx's rank or job size disagree with
// the options. `collect`: the start-up fence gathers every rank's address. With
// `other_job`, a PMIx job of another size than cairn's (a launcher inside the PMIx one,
// as torchrun under srun) sets it and fails, so that the caller can use files instead.
Result<std::unique_ptr<AddressBook>> OpenPmixAddressBook(const Options& options, bool collect,
                                                         bool* other_job = nullptr);

}  // namespace cairn
