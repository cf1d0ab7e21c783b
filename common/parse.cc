#include "baton/common/parse.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace baton {

absl::StatusOr<std::vector<int64_t>> ParseIntList(absl::string_view text, absl::string_view field) {
  std::vector<int64_t> values;
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected a comma-separated list of integers, got an empty value"));
  }
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    int64_t value = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(item), &value)) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": '", item,
                                                     "' is not an integer; expected a "
                                                     "comma-separated list of integers"));
    }
    values.push_back(value);
  }
  return values;
}

std::string JoinHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos && host.front() != '[') {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

}  // namespace baton
