#include "transport/address_book.h"

#include <cstdlib>

#include "core/log.h"
#include "transport/pmix_book.h"
#include "transport/rendezvous.h"

namespace cairn {

Result<std::unique_ptr<AddressBook>> OpenAddressBook(const Options& o, FileSystem* fs,
                                                     const Logger* log) {
  const bool lazy = o.world_size > o.connect_all_max;
  if (o.bootstrap == BootstrapKind::kPmix) return OpenPmixAddressBook(o, !lazy);
  if (o.bootstrap == BootstrapKind::kAuto && PmixAvailable() && std::getenv("PMIX_NAMESPACE")) {
    bool other_job = false;
    auto book = OpenPmixAddressBook(o, !lazy, &other_job);
    if (book.ok() || !other_job) return book;
    if (log) log->Info(book.status().message() + ": finding the ranks through address files");
  }
  return std::unique_ptr<AddressBook>(std::make_unique<Rendezvous>(
      fs ? fs : DefaultFileSystem(), o.RendezvousDir(), o.rank, o.world_size));
}

}  // namespace cairn
