// The cairn command's subcommands: `cairn demo` (cli/demo.cc: 2 nodes x 2 ranks train, node 1
// is killed and recovered from node 0's memory, the PFS version is resharded onto 3 ranks),
// the launcher and the checkpoint tools (cli/tools.cc).
#pragma once

namespace cairn::cli {

// `cairn demo ...` (the parent: launches, kills and restarts the ranks). Returns exit code.
int DemoMain(int argc, char** argv);
// `cairn demo-worker ...` (internal: one rank of the jobs the demo starts).
int DemoWorkerMain(int argc, char** argv);
// `cairn launch ...`: N nodes x M ranks of a program as local processes.
int LaunchMain(int argc, char** argv);
// `cairn placement ...`: the replica placement table.
int PlacementMain(int argc, char** argv);
// `cairn ls PATH`: the versions of a PFS or host-tier job directory (cli/tools.cc).
int LsMain(int argc, char** argv);
// `cairn verify PATH [--step N]`: re-reads and checks every checksum (cli/tools.cc).
int VerifyMain(int argc, char** argv);
// `cairn export PATH [--step N] [--tensors REGEX] OUT`: whole tensors as safetensors.
int ExportMain(int argc, char** argv);
// `cairn inspect PATH [--step N]`: tensors, shards, files, checksums of a version.
int InspectMain(int argc, char** argv);
// `cairn gc PATH --keep N`: old and incomplete steps removed from a PFS job directory.
int GcMain(int argc, char** argv);

}  // namespace cairn::cli
