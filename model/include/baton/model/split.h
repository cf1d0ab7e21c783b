// How a deployment cuts a request between its prefill and decode nodes (DESIGN section 6):
//   prefill-all       the prefill node runs every layer, samples the first token and ships the
//                     consumer SWA rings;
//   replay-on-decode  the prefill node holds and runs only the embedding, the producers, the
//                     boundary norm and the block-KV projections, and ships the boundary rows;
//                     the decode node replays the consumer layers over them in its batch.
// Both give the same tokens for the same request.
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "baton/model/weights.h"

namespace baton::model {

enum class Split { kPrefillAll, kReplayOnDecode };

// "prefill-all" or "replay-on-decode".
absl::string_view SplitName(Split split);

// Anything else is INVALID_ARGUMENT naming `flag` and the allowed names.
absl::StatusOr<Split> ParseSplit(absl::string_view name, absl::string_view flag);

// The layers a prefill node of `split` holds (a decode node holds every layer under both).
HeldLayers PrefillHeldLayers(Split split);

}  // namespace baton::model
