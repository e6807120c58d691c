#include "args.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace onnxtrain::cli {

std::string help_text(const Command& c) {
  std::string s = "usage: onnxtrain " + c.name;
  for (const auto& p : c.positionals) s += " " + p;
  if (!c.options.empty()) s += " [options]";
  s += "\n\n" + c.summary + "\n";
  s += "\noptions:\n";
  std::vector<Option> all = c.options;
  all.push_back({"-h, --help", "", "show this help"});
  for (const auto& o : all) {
    std::string left = "  " + o.name + (o.metavar.empty() ? "" : " " + o.metavar);
    if (left.size() < 26) left.resize(26, ' ');
    else left += "\n" + std::string(26, ' ');
    s += left + o.help + "\n";
  }
  if (!c.details.empty()) s += "\n" + c.details;
  if (s.back() != '\n') s += '\n';
  return s;
}

std::optional<Args> Args::parse(const Command& c, int argc, char** argv, int first) {
  Args a;
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::fputs(help_text(c).c_str(), stdout);
      return std::nullopt;
    }
    if (arg.rfind("--", 0) != 0 || arg == "--") {
      if (a.positionals_.size() >= c.positionals.size())
        throw UsageError("unexpected argument '" + arg + "'");
      a.positionals_.push_back(arg);
      continue;
    }
    std::string name = arg, value;
    const size_t eq = arg.find('=');
    if (eq != std::string::npos) name = arg.substr(0, eq);
    const Option* opt = nullptr;
    for (const auto& o : c.options)
      if (o.name == name) opt = &o;
    if (!opt) throw UsageError("unknown option '" + name + "'");
    if (a.values_.count(name) && !opt->repeatable) throw UsageError("option '" + name + "' is given twice");
    if (opt->metavar.empty()) {
      if (eq != std::string::npos) throw UsageError("option '" + name + "' takes no value");
    } else if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else {
      if (i + 1 >= argc) throw UsageError("option '" + name + "' needs a value (" + opt->metavar + ")");
      value = argv[++i];
    }
    a.values_[name] = value;
    a.repeated_[name].push_back(value);
  }
  if (a.positionals_.size() < c.positionals.size())
    throw UsageError("missing " + c.positionals[a.positionals_.size()]);
  return a;
}

std::string Args::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

std::vector<std::string> Args::get_all(const std::string& name) const {
  auto it = repeated_.find(name);
  return it == repeated_.end() ? std::vector<std::string>{} : it->second;
}

std::string Args::require(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw UsageError("missing required option " + name);
  if (it->second.empty()) throw UsageError("option " + name + " needs a non-empty value");
  return it->second;
}

int64_t Args::get_int(const std::string& name, int64_t fallback, int64_t min) const {
  if (!has(name)) return fallback;
  const std::string v = get(name);
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE) throw UsageError(name + " expects an integer, got '" + v + "'");
  if (x < min) throw UsageError(name + " must be >= " + std::to_string(min) + ", got " + v);
  return x;
}

std::optional<double> Args::get_optional_double(const std::string& name) const {
  if (!has(name)) return std::nullopt;
  const std::string v = get(name);
  char* end = nullptr;
  errno = 0;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(x))
    throw UsageError(name + " expects a finite number, got '" + v + "'");
  return x;
}

double Args::get_double(const std::string& name, double fallback) const {
  return get_optional_double(name).value_or(fallback);
}

std::vector<std::string> Args::get_list(const std::string& name) const {
  std::vector<std::string> items;
  if (!has(name)) return items;
  const std::string v = get(name);
  size_t start = 0;
  while (true) {
    const size_t comma = v.find(',', start);
    std::string item = v.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.empty()) throw UsageError(name + " expects a comma-separated list of names, got '" + v + "'");
    items.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return items;
}

std::string Args::get_choice(const std::string& name, const std::vector<std::string>& choices,
                             const std::string& fallback) const {
  if (!has(name)) return fallback;
  const std::string v = get(name);
  std::string list;
  for (const auto& c : choices) {
    if (c == v) return v;
    list += (list.empty() ? "" : ", ") + c;
  }
  throw UsageError(name + " must be one of " + list + "; got '" + v + "'");
}

}  // namespace onnxtrain::cli
