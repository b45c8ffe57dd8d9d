// Command lines of the cairn command and the benchmarks, parsed with CLI11.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "cairn/options.h"

namespace cairn::cli {

// An option taking a byte count with an optional K/M/G suffix (ParseByteCount).
inline CLI::Option* AddByteCount(CLI::App& app, const std::string& name, uint64_t* out,
                                 const std::string& description) {
  return app
      .add_option_function<std::string>(
          name,
          [out, name](const std::string& v) {
            auto b = ParseByteCount(v, name);
            if (!b.ok()) throw CLI::ValidationError(b.status().message());
            *out = *b;
          },
          description)
      ->type_name("BYTES");
}

// A whole number >= 0 (>= 1 with `positive`), for counts and steps; garbage and trailing
// characters are refused by the option's integer type itself.
inline CLI::Validator WholeNumber(bool positive = false) {
  return CLI::Validator(
      [positive](std::string& s) -> std::string {
        const bool neg = !s.empty() && s[0] == '-';
        if (neg || (positive && s.find_first_not_of('0') == std::string::npos))
          return positive ? "must be at least 1" : "must not be negative";
        return "";
      },
      positive ? "N>=1" : "N>=0");
}

// Parses argv (argv[0] is the command's name) into `app`. Returns nullopt to go on, or the
// exit code to return: 0 after --help (printed on stdout), 2 after a usage error (printed
// on stderr with a pointer to --help).
inline std::optional<int> Parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: %s (try --help)\n", app.get_name().c_str(), e.what());
    return 2;
  }
  return std::nullopt;
}

// The same for an argument vector.
inline std::optional<int> Parse(CLI::App& app, std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return Parse(app, static_cast<int>(argv.size()), argv.data());
}

}  // namespace cairn::cli
