#pragma once
// Huge pages for host memory that a restore is about to fill.

#include <cstddef>
#include <cstdint>

#include "cairn/options.h"

namespace cairn {

// Asks the kernel (MADV_HUGEPAGE) to back the 2 MiB-aligned interior of [data, data + n)
// with huge pages when that memory has never been touched (its first interior page is
// not resident: an optimizer state just allocated, a model made with `to_empty`). A
// restore writes every byte of its targets, and fresh memory faulted in 4 KiB at a time
// costs more than the copy itself: 70 MB took 34 ms in 4 KiB faults and 9 ms in 2 MiB ones
// (docs/performance.md, "Time to resume against dcp.load"). Memory already in use is left
// alone (advising it would only split its mapping), as is a range without a whole huge
// page inside. Returns the bytes advised (0 when none, or when the kernel refused: the
// hint is never an error).
uint64_t AdviseHugePagesIfFresh(void* data, uint64_t n);

// True when this virtual machine hands its free memory back to the hypervisor
// (virtio-balloon free page reporting: bit 5 of a balloon device's features in sysfs). The
// guest reports free blocks of 2 MiB and more, so a huge page a restore then takes is
// often backed again by the host one 4 KiB fault at a time: measured on this project's
// 2-core VMs, 150 ms instead of 46 ms with 4 KiB pages for 70 MB just after a large
// process exited (21 ms when the blocks had not been reported yet).
bool FreePagesReportedToHypervisor();

// Whether a restore asks for huge pages for fresh host targets under `setting` (the value
// of CAIRN_RESTORE_HUGE_PAGES: on; off; auto = where no free page reporting undoes them).
bool RestoreWantsHugePages(RestoreHugePages setting);

// Maps in the pages of [data + lo, data + hi) (whole pages around it) in one system call,
// MADV_POPULATE_WRITE (`write`: each page made private and writable, fresh memory zeroed)
// or MADV_POPULATE_READ, instead of a fault per page later; on kernels before 5.14, by
// touching a byte of each page (a write rewrites the byte it read).
void PopulatePages(std::byte* data, uint64_t lo, uint64_t hi, bool write);

}  // namespace cairn
