#include "baton/common/ced_rules.h"

#include "absl/strings/str_cat.h"

namespace baton {

absl::Status CheckKeep(bool truncated, int64_t keep, int64_t ring_capacity,
                       absl::string_view field) {
  if (!truncated || keep >= ring_capacity) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", keep, " is below the ring capacity C = ", ring_capacity,
                   "; mask and compact retain at least the ring (K >= C)"));
}

absl::string_view TruncationModeName(v1::TruncationMode mode) {
  switch (mode) {
    case v1::TRUNCATION_MODE_OFF:
      return "off";
    case v1::TRUNCATION_MODE_MASK:
      return "mask";
    case v1::TRUNCATION_MODE_COMPACT:
      return "compact";
    default:
      return "unknown";
  }
}

absl::StatusOr<v1::TruncationMode> ParseTruncationModeName(absl::string_view text,
                                                           absl::string_view field) {
  for (v1::TruncationMode mode :
       {v1::TRUNCATION_MODE_OFF, v1::TRUNCATION_MODE_MASK, v1::TRUNCATION_MODE_COMPACT}) {
    if (text == TruncationModeName(mode)) return mode;
  }
  // The caller's text comes back in the message, cut to a bound (it may be a whole request).
  constexpr size_t kEcho = 32;
  return absl::InvalidArgumentError(absl::StrCat(field, ": '", text.substr(0, kEcho),
                                                 text.size() > kEcho ? "...'" : "'",
                                                 " is not a truncation mode; allowed: off, mask, "
                                                 "compact"));
}

bool IsTruncationMode(v1::TruncationMode mode) {
  return mode == v1::TRUNCATION_MODE_OFF || mode == v1::TRUNCATION_MODE_MASK ||
         mode == v1::TRUNCATION_MODE_COMPACT;
}

}  // namespace baton
