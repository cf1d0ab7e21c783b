// A binary's options as one table: each flag is declared once, in the binary's CLI::App, with
// its name, type, default (captured as declared: CaptureDefaults), help, and its allowed
// values or range through the validators below. Everything else is derived from that
// declaration:
//   - the command line and the config file (config_file.h: each long flag is a key of the
//     binary's section, checked by the same validators);
//   - `--check-config` (the settings given) and `--print-options` (the table itself, as
//     JSON: DescribeOptions), which a test compares with the Helm chart's values.schema.json
//     (tests/helm/options_schema_test.py: a name, a range or an allowed value that differ
//     fail it);
//   - `baton up --set ROLE.NAME=VALUE`, which hands any flag to a role's processes and checks
//     it with that binary's own `--check-config` before starting anything.
// So adding a flag touches the table, the code that uses it and the chart.
//
// An enum-valued flag becomes its enum where it is parsed (AddEnumOption), from the one table
// of names the enum has.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace baton {

namespace options_internal {
// The validator names DescribeOptions reads the bounds back from (CLI11 keeps validators by
// value, so the bounds travel in the name): "baton-range:MIN:MAX" and "baton-one-of:A|B|...".
inline constexpr char kRangePrefix[] = "baton-range:";
inline constexpr char kOneOfPrefix[] = "baton-one-of:";
}  // namespace options_internal

// Every option added to `app` after this call keeps its declared value as its default
// (what --help and --print-options show). Call right after making the app.
inline void CaptureDefaults(CLI::App& app) {
  app.option_defaults()->always_capture_default();
}

// [min, max] inclusive, as CLI::Range, with the bounds in the table.
template <typename T>
CLI::Validator InRange(T min, T max) {
  CLI::Range range(min, max);
  range.name(absl::StrCat(options_internal::kRangePrefix, min, ":", max));
  return range;
}

// One of `names`, as CLI::IsMember, with the names in the table.
CLI::Validator OneOf(std::vector<std::string> names);

namespace options_internal {
// --name taking one of `values` by `name_of`'s names, handing the value parsed to `set`.
template <typename E, typename NameOf, typename Set>
CLI::Option* AddEnumNames(CLI::App& app, const std::string& name, std::initializer_list<E> values,
                          NameOf name_of, Set set, const std::string& help) {
  std::vector<std::pair<std::string, E>> names;
  std::vector<std::string> allowed;
  for (E value : values) {
    names.emplace_back(std::string(name_of(value)), value);
    allowed.push_back(names.back().first);
  }
  return app
      .add_option_function<std::string>(
          name,
          [set, names](const std::string& text) {
            for (const auto& [known, value] : names) {
              if (known == text) set(value);
            }
          },
          help)
      ->check(OneOf(allowed));
}
}  // namespace options_internal

// A flag whose value is one of an enum's `values`, named by the enum's own `name_of`, stored as
// the enum where it is parsed (the command line or the config file); the default is the name
// of `field`'s value as declared. --check-config shows the names given.
template <typename E, typename NameOf>
CLI::Option* AddEnumOption(CLI::App& app, const std::string& name, E& field,
                           std::initializer_list<E> values, NameOf name_of,
                           const std::string& help) {
  const std::string declared(name_of(field));
  return options_internal::AddEnumNames(
             app, name, values, name_of, [&field](E value) { field = value; }, help)
      ->default_str(declared);
}

// The same for a flag with no default: `field` stays empty unless the flag (or its config key)
// is given, so that the caller can tell "not given" apart and fall back to something else.
template <typename E, typename NameOf>
CLI::Option* AddEnumOption(CLI::App& app, const std::string& name, std::optional<E>& field,
                           std::initializer_list<E> values, NameOf name_of,
                           const std::string& help) {
  return options_internal::AddEnumNames(
      app, name, values, name_of, [&field](E value) { field = value; }, help);
}

// The options of `app` (not its subcommands') as JSON, in declaration order:
//   {"program": PROGRAM, "section": SECTION (its config file section), "options": [{"name":
//   "prefill-slots" (the long flag
//    without dashes, which is also its config key), "type": "integer" | "number" | "string" |
//    "boolean", "list": true when it takes several values, "default": "2" (as text; absent
//    when none), "min"/"max" (InRange), "allowed": [...] (OneOf, AddEnumOption),
//    "required": true, "help": ...}, ...]}
// --help, --config, --check-config and --print-options themselves are left out.
std::string DescribeOptions(const CLI::App& app, const std::string& program,
                            const std::string& section);

}  // namespace baton
