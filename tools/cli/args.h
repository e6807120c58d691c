// Command-line parsing for the onnxtrain subcommands. Each command declares its positionals and
// options once, with their help, so parsing, checking and --help come from the same table.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace onnxtrain::cli {

// Wrong or missing arguments: main prints the message and exits with status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Option {
  std::string name;       // "--epochs"
  std::string metavar;    // "N"; empty for a flag
  std::string help;
  bool repeatable = false;  // may be given more than once (Args::get_all)
};

struct Command {
  std::string name;
  std::string summary;                  // one line, for `onnxtrain --help`
  std::vector<std::string> positionals; // metavars, all required
  std::vector<Option> options;
  std::string details;                  // paragraphs after the option list
};

std::string help_text(const Command& command);

class Args {
 public:
  // Parses argv[first..argc). Returns nullopt after printing help for -h/--help. Throws
  // UsageError for unknown or repeated options, missing values and wrong positional counts.
  static std::optional<Args> parse(const Command& command, int argc, char** argv, int first);

  const std::string& positional(size_t i) const { return positionals_.at(i); }
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  bool flag(const std::string& name) const { return has(name); }
  std::string get(const std::string& name, const std::string& fallback = "") const;
  std::string require(const std::string& name) const;
  // Typed values; a malformed or out-of-range number is a UsageError naming the option.
  int64_t get_int(const std::string& name, int64_t fallback, int64_t min = INT64_MIN) const;
  double get_double(const std::string& name, double fallback) const;
  std::optional<double> get_optional_double(const std::string& name) const;
  // Every value of a repeatable option, in the order given.
  std::vector<std::string> get_all(const std::string& name) const;
  // A comma-separated list; empty items are a UsageError.
  std::vector<std::string> get_list(const std::string& name) const;
  // The value must be one of `choices`.
  std::string get_choice(const std::string& name, const std::vector<std::string>& choices,
                         const std::string& fallback) const;

 private:
  std::vector<std::string> positionals_;
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> repeated_;
};

}  // namespace onnxtrain::cli
