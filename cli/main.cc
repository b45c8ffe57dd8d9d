// The cairn command: one CLI11 app whose subcommands each parse their own options
// (cli/demo.cc, cli/launch.cc, cli/tools.cc).
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cairn/options.h"
#include "cli/args.h"
#include "cli/demo.h"
#include "core/trace.h"

namespace {

std::string SettingsText() {
  std::string t = "Settings are read from the environment (defaults in brackets):\n";
  for (const auto& s : cairn::Settings()) {
    std::string name = s.variable;
    if (s.fallback) name += std::string(" (else ") + s.fallback + ")";
    char line[160];
    std::snprintf(line, sizeof line, "  %-28s [%s]\n", name.c_str(), s.DefaultText().c_str());
    t += line;
    t += std::string("      ") + s.meaning + "\n";
  }
  return t + "\nDocumentation: README.md and docs/ in the cairn source tree.\n";
}

// `cairn settings [--markdown]`: the settings table (docs/settings.md is its markdown form).
int SettingsMain(int argc, char** argv) {
  CLI::App app("Prints every setting: its variable, default and meaning.", "cairn settings");
  bool markdown = false;
  app.add_flag("--markdown", markdown, "as the markdown table of docs/settings.md");
  if (auto rc = cairn::cli::Parse(app, argc, argv)) return *rc;
  if (!markdown) {
    std::fputs(SettingsText().c_str(), stdout);
    return 0;
  }
  std::printf("| Variable | Default | Meaning |\n|---|---|---|\n");
  for (const auto& s : cairn::Settings()) {
    std::string name = std::string("`") + s.variable + "`";
    if (s.fallback) name += std::string(" (else `") + s.fallback + "`)";
    const std::string def = s.DefaultText();
    std::printf("| %s | %s | %s |\n", name.c_str(), def.empty() ? "" : ("`" + def + "`").c_str(),
                s.meaning);
  }
  return 0;
}

int TraceMergeMain(int argc, char** argv) {
  CLI::App app(
      "Joins the Chrome trace-event files the ranks wrote (CAIRN_TRACE) into OUT, one process "
      "per rank, for Perfetto or chrome://tracing.",
      "cairn trace-merge");
  std::string out;
  std::vector<std::string> files;
  app.add_option("OUT", out, "the merged file")->required();
  app.add_option("FILES", files, "the ranks' trace files")->required();
  if (auto rc = cairn::cli::Parse(app, argc, argv)) return *rc;
  cairn::Status st = cairn::Trace::Merge(out, files);
  if (!st.ok()) {
    std::fprintf(stderr, "cairn trace-merge: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}

struct Command {
  const char* name;
  const char* summary;
  int (*main)(int, char**);
};

const std::vector<Command>& Commands() {
  using namespace cairn::cli;
  static const std::vector<Command> kCommands = {
      {"demo",
       "2 nodes x 2 ranks train a synthetic GPT-like model with a checkpoint every iteration; "
       "node 1 is killed with SIGKILL and its memory wiped; it comes back from node 0's memory; "
       "the last PFS version is restored onto 3 ranks in another layout; every value is checked",
       DemoMain},
      {"launch",
       "run N nodes x M ranks of a program as local processes, with the environment torchrun "
       "would give them",
       LaunchMain},
      {"placement",
       "print who holds whose in-memory replicas and the odds that k lost nodes come back from "
       "memory",
       PlacementMain},
      {"ls", "list the versions of a PFS job directory or a host-tier job directory", LsMain},
      {"verify",
       "re-read a job's versions and check every checksum (exit code 1 if any is corrupt)",
       VerifyMain},
      {"export", "write the whole tensors of a committed PFS step as safetensors", ExportMain},
      {"inspect", "show a version's tensors, shards, files and checksums", InspectMain},
      {"gc", "delete old and incomplete steps from a PFS job directory", GcMain},
      {"trace-merge", "join the ranks' CAIRN_TRACE files into one", TraceMergeMain},
      {"settings", "print every setting with its default and meaning", SettingsMain},
      {"demo-worker", nullptr, DemoWorkerMain},  // internal: a rank of the demo's jobs
  };
  return kCommands;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("cairn - a multi-level checkpoint cache for large-model training", "cairn");
  app.footer(SettingsText());
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, const Command*>> subs;
  for (const Command& c : Commands()) {
    // Each command parses the rest of the line itself (`cairn <command> --help`).
    CLI::App* sub = app.add_subcommand(c.name, c.summary ? c.summary : "");
    sub->prefix_command();
    sub->set_help_flag();
    if (!c.summary) sub->group("");
    subs.emplace_back(sub, &c);
  }
  if (argc < 2) {
    std::fputs(app.help().c_str(), stdout);
    return 2;
  }
  if (std::string(argv[1]) == "help") {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  }
  if (auto rc = cairn::cli::Parse(app, argc, argv)) return *rc;
  for (auto& [sub, c] : subs) {
    if (!sub->parsed()) continue;
    std::vector<std::string> args = {std::string("cairn ") + c->name};
    for (std::string& a : sub->remaining()) args.push_back(std::move(a));
    std::vector<char*> sub_argv;
    for (std::string& a : args) sub_argv.push_back(a.data());
    return c->main(static_cast<int>(sub_argv.size()), sub_argv.data());
  }
  return 2;
}
