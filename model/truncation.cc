#include "baton/model/truncation.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace baton::model {

v1::TruncationMode ModeToProto(TruncationMode mode) {
  switch (mode) {
    case TruncationMode::kOff:
      return v1::TRUNCATION_MODE_OFF;
    case TruncationMode::kMask:
      return v1::TRUNCATION_MODE_MASK;
    case TruncationMode::kCompact:
      return v1::TRUNCATION_MODE_COMPACT;
  }
  return v1::TRUNCATION_MODE_UNSPECIFIED;
}

absl::StatusOr<TruncationMode> ModeFromProto(v1::TruncationMode mode, absl::string_view field) {
  switch (mode) {
    case v1::TRUNCATION_MODE_OFF:
      return TruncationMode::kOff;
    case v1::TRUNCATION_MODE_MASK:
      return TruncationMode::kMask;
    case v1::TRUNCATION_MODE_COMPACT:
      return TruncationMode::kCompact;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": ", static_cast<int>(mode), " is not OFF, MASK or COMPACT"));
  }
}

absl::string_view TruncationModeName(TruncationMode mode) {
  return baton::TruncationModeName(ModeToProto(mode));
}

absl::StatusOr<TruncationMode> ParseTruncationMode(absl::string_view text,
                                                   absl::string_view field) {
  absl::StatusOr<v1::TruncationMode> mode = ParseTruncationModeName(text, field);
  if (!mode.ok()) return mode.status();
  return ModeFromProto(*mode, field);
}

int64_t TruncationSpec::s_keep() const {
  return truncated() ? std::max<int64_t>(0, prompt_len - keep) : 0;
}

int64_t TruncationSpec::retained_begin() const {
  return truncated() ? prompt_len - keep : 0;
}

int64_t TruncationSpec::replay_begin() const {
  return std::max(s_keep(), s_valid);
}

int64_t TruncationSpec::swa_lower_bound(int64_t pos) const {
  const int64_t lo = std::max({pos - window + 1, s_keep(), s_valid});
  return std::clamp<int64_t>(lo, 0, pos + 1);
}

int64_t DecodeSwaLowerBound(int64_t pos, int64_t window, int64_t s_valid) {
  return std::clamp<int64_t>(std::max(pos - window + 1, s_valid), 0, pos + 1);
}

absl::Status ValidateTruncationSpec(const TruncationSpec& spec) {
  if (spec.prompt_len < 1 || spec.prompt_len > kMaxPromptLen) {
    return absl::InvalidArgumentError(absl::StrCat("prompt length L is ", spec.prompt_len,
                                                   "; it must lie in [1, ", kMaxPromptLen, "]"));
  }
  if (spec.window < 1 || spec.window > kMaxPromptLen) {
    return absl::InvalidArgumentError(
        absl::StrCat("window W is ", spec.window, "; it must lie in [1, ", kMaxPromptLen, "]"));
  }
  if (spec.max_backtrack < 0 || spec.max_backtrack > kMaxPromptLen) {
    return absl::InvalidArgumentError(absl::StrCat("max_backtrack is ", spec.max_backtrack,
                                                   "; it must lie in [0, ", kMaxPromptLen, "]"));
  }
  if (spec.keep < 0) {
    return absl::InvalidArgumentError(absl::StrCat("keep K is ", spec.keep, "; it must be >= 0"));
  }
  if (!CheckKeep(spec.truncated(), spec.keep, spec.ring_capacity(), "keep K").ok()) {
    // The rule is CheckKeep's; the message spells out C for `batonctl plan` users.
    return absl::InvalidArgumentError(absl::StrCat(
        "keep K is ", spec.keep, " with truncation mode '", TruncationModeName(spec.mode),
        "'; it must be >= the ring capacity C = W + max_backtrack + 1 = ", spec.ring_capacity(),
        " (or use mode 'off')"));
  }
  if (spec.s_valid < 0 || spec.s_valid >= spec.prompt_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "s_valid is ", spec.s_valid, "; it must lie in [0, L) = [0, ", spec.prompt_len, ")"));
  }
  return absl::OkStatus();
}

}  // namespace baton::model
