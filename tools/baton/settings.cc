#include <algorithm>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "baton/launcher/launch_options.h"

namespace baton::launcher {

absl::StatusOr<Setting> ParseSetting(const std::string& item) {
  const size_t dot = item.find('.');
  const size_t equals = item.find('=');
  auto refuse = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--set: '", item.substr(0, 200), "' ", why,
        "; allowed: ROLE.NAME=VALUE with ROLE router, prefill, decode or kvstore and "
        "NAME one of that binary's flags without dashes (baton-ROLE --print-options)"));
  };
  if (dot == std::string::npos || equals == std::string::npos || dot > equals) {
    return refuse("is not ROLE.NAME=VALUE");
  }
  Setting setting{item.substr(0, dot), item.substr(dot + 1, equals - dot - 1),
                  item.substr(equals + 1)};
  if (setting.role != "router" && setting.role != "prefill" && setting.role != "decode" &&
      setting.role != "kvstore") {
    return refuse(absl::StrCat("names no role baton up starts ('", setting.role, "')"));
  }
  const bool name_ok = !setting.name.empty() && absl::ascii_islower(setting.name[0]) &&
                       std::all_of(setting.name.begin(), setting.name.end(), [](char c) {
                         return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-';
                       });
  if (!name_ok) return refuse("has no flag name of lower-case letters, digits and dashes");
  if (setting.name == "config" || setting.name == "check-config" ||
      setting.name == "print-options" || setting.name == "help") {
    return refuse(absl::StrCat("names --", setting.name, ", which is not a setting"));
  }
  return setting;
}

}  // namespace baton::launcher
