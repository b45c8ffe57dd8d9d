#pragma once
// Huge pages for host memory that a restore is about to fill.

#include <cstdint>

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

}  // namespace cairn
