#include "baton/common/options.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace baton {

CLI::Validator OneOf(std::vector<std::string> names) {
  CLI::Validator check(
      [names](std::string& text) -> std::string {
        if (std::find(names.begin(), names.end(), text) != names.end()) return "";
        return absl::StrCat("'", text, "' is unknown; allowed: ", absl::StrJoin(names, ", "));
      },
      absl::StrCat("{", absl::StrJoin(names, ","), "}"),
      absl::StrCat(options_internal::kOneOfPrefix, absl::StrJoin(names, "|")));
  return check;
}

namespace {

// A bound as JSON: an integer where the text is one, else a number.
nlohmann::json Bound(absl::string_view text) {
  int64_t signed_value = 0;
  uint64_t unsigned_value = 0;
  double real = 0;
  if (absl::SimpleAtoi(text, &signed_value)) return signed_value;
  if (absl::SimpleAtoi(text, &unsigned_value)) return unsigned_value;
  if (absl::SimpleAtod(text, &real)) return real;
  return std::string(text);
}

// CLI11's name of the option's value type ("INT", "UINT", "FLOAT", "TEXT", ...; the part
// before the validators' descriptions) as a JSON Schema type.
std::string TypeOf(const CLI::Option& option) {
  if (option.get_expected_max() == 0) return "boolean";  // a flag
  const std::string base = option.get_type_name().substr(0, option.get_type_name().find(':'));
  if (base == "INT" || base == "UINT") return "integer";
  if (base == "FLOAT") return "number";
  if (base == "BOOLEAN") return "boolean";
  return "string";
}

// The validators' bounds (InRange, OneOf) into `entry`.
void AddBounds(CLI::Option& option, nlohmann::json& entry) {
  for (int i = 0;; ++i) {
    // CLI11 has no count of an option's validators: the index past the last throws.
    const CLI::Validator* check = nullptr;
    try {
      check = option.get_validator(i);
    } catch (const CLI::OptionNotFound&) {
      break;
    }
    if (check == nullptr) break;
    const std::string& name = check->get_name();
    if (absl::StartsWith(name, options_internal::kRangePrefix)) {
      const std::vector<absl::string_view> bounds =
          absl::StrSplit(absl::string_view(name).substr(sizeof(options_internal::kRangePrefix) - 1),
                         absl::MaxSplits(':', 1));
      if (bounds.size() == 2) {
        entry["min"] = Bound(bounds[0]);
        entry["max"] = Bound(bounds[1]);
      }
    } else if (absl::StartsWith(name, options_internal::kOneOfPrefix)) {
      entry["allowed"] = absl::StrSplit(
          absl::string_view(name).substr(sizeof(options_internal::kOneOfPrefix) - 1), '|');
    }
  }
}

}  // namespace

std::string DescribeOptions(const CLI::App& app, const std::string& program,
                            const std::string& section) {
  nlohmann::json options = nlohmann::json::array();
  for (const CLI::Option* given : app.get_options()) {
    if (given->get_lnames().empty()) continue;
    const std::string& name = given->get_lnames().front();
    if (name == "help" || name == "config" || name == "check-config" || name == "print-options") {
      continue;
    }
    // get_validator is not const in CLI11; reading the validators changes nothing.
    CLI::Option& option = const_cast<CLI::Option&>(*given);
    nlohmann::json entry = {{"name", name}, {"type", TypeOf(option)}};
    if (option.get_expected_max() > 1 || option.get_items_expected_max() > 1) entry["list"] = true;
    if (!option.get_default_str().empty()) entry["default"] = option.get_default_str();
    AddBounds(option, entry);
    if (option.get_required()) entry["required"] = true;
    entry["help"] = option.get_description();
    options.push_back(std::move(entry));
  }
  const nlohmann::json table = {
      {"program", program}, {"section", section}, {"options", std::move(options)}};
  return table.dump(2);
}

}  // namespace baton
