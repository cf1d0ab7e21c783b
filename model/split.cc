#include "baton/model/split.h"

#include "absl/strings/str_cat.h"

namespace baton::model {

absl::string_view SplitName(Split split) {
  return split == Split::kReplayOnDecode ? "replay-on-decode" : "prefill-all";
}

absl::StatusOr<Split> ParseSplit(absl::string_view name, absl::string_view flag) {
  if (name == "prefill-all") return Split::kPrefillAll;
  if (name == "replay-on-decode") return Split::kReplayOnDecode;
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": '", name, "' is unknown; allowed: prefill-all, replay-on-decode"));
}

HeldLayers PrefillHeldLayers(Split split) {
  return split == Split::kReplayOnDecode ? HeldLayers::kProducers : HeldLayers::kAll;
}

}  // namespace baton::model
