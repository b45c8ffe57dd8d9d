// `cairn demo`: a single-rank training loop of a synthetic GPT-like model that checkpoints
// every iteration, is killed with SIGKILL mid-run, restarts and restores bit-exactly.
#pragma once

namespace cairn::cli {

// `cairn demo ...` (the parent: runs, kills and restarts the worker). Returns exit code.
int DemoMain(int argc, char** argv);
// `cairn demo-worker ...` (internal: the training process the demo starts).
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
