// The cairn command.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli/demo.h"
#include "core/options.h"
#include "core/trace.h"

namespace {

void PrintHelp() {
  std::printf(
      "cairn - a multi-level checkpoint cache for large-model training\n"
      "\n"
      "usage: cairn <command> [options]\n"
      "\n"
      "commands:\n"
      "  demo      2 nodes x 2 ranks train a synthetic GPT-like model with a checkpoint every\n"
      "            iteration; node 1 is killed with SIGKILL and its memory wiped; it comes\n"
      "            back from node 0's memory; the last PFS version is restored onto 3 ranks\n"
      "            in another layout; every value is checked (see `cairn demo --help`)\n"
      "  launch    run N nodes x M ranks of a program as local processes, with the\n"
      "            environment torchrun would give them (see `cairn launch --help`)\n"
      "  placement print which ranks hold whose in-memory replicas\n"
      "  ls        list the versions of a PFS job directory or a host-tier job directory\n"
      "  verify    re-read a job's versions and check every checksum (exit code 1 if any\n"
      "            is corrupt)\n"
      "  export    write the whole tensors of a committed PFS step as safetensors\n"
      "  inspect   show a version's tensors, shards, files and checksums\n"
      "  gc        delete old and incomplete steps from a PFS job directory\n"
      "  trace-merge OUT FILES...  join the ranks' CAIRN_TRACE files into one\n"
      "  help      this text\n"
      "\n"
      "Settings are read from the environment (defaults in brackets):\n");
  for (const auto& s : cairn::EnvSettings())
    std::printf("  %-28s [%s]\n      %s\n", s.name, s.default_value, s.meaning);
  std::printf("\nDocumentation: README.md in the cairn source tree.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    PrintHelp();
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  if (cmd == "demo") return cairn::cli::DemoMain(argc - 1, argv + 1);
  if (cmd == "placement") return cairn::cli::PlacementMain(argc - 1, argv + 1);
  if (cmd == "launch") return cairn::cli::LaunchMain(argc - 1, argv + 1);
  if (cmd == "ls") return cairn::cli::LsMain(argc - 1, argv + 1);
  if (cmd == "verify") return cairn::cli::VerifyMain(argc - 1, argv + 1);
  if (cmd == "export") return cairn::cli::ExportMain(argc - 1, argv + 1);
  if (cmd == "inspect") return cairn::cli::InspectMain(argc - 1, argv + 1);
  if (cmd == "gc") return cairn::cli::GcMain(argc - 1, argv + 1);
  if (cmd == "trace-merge") {
    if (argc < 4) {
      std::printf(
          "usage: cairn trace-merge OUT FILE...\n"
          "Joins the Chrome trace-event files the ranks wrote (CAIRN_TRACE) into OUT, one\n"
          "process per rank, for Perfetto or chrome://tracing.\n");
      return 2;
    }
    cairn::Status st =
        cairn::Trace::Merge(argv[2], std::vector<std::string>(argv + 3, argv + argc));
    if (!st.ok()) {
      std::fprintf(stderr, "cairn trace-merge: %s\n", st.ToString().c_str());
      return 1;
    }
    return 0;
  }
  if (cmd == "demo-worker") return cairn::cli::DemoWorkerMain(argc - 1, argv + 1);
  std::fprintf(stderr, "cairn: unknown command '%s' (try `cairn --help`)\n", cmd.c_str());
  return 2;
}
