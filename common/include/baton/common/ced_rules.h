// The CED rules that the router, the nodes, batonctl and the model all apply, each in one place:
// the ring capacity C and the keep >= C rule, the truncation mode names, the dependency span R,
// and where a row's (and so a prefix hit's) producer SWA dependencies begin (DESIGN sections 2,
// 3 and 5; seed 9.1 to 9.3).
#pragma once

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "baton/v1/generation.pb.h"

namespace baton {

// C = W + max_backtrack + 1: the slots of every SWA ring (134 for W = 128, max_backtrack 5).
constexpr int64_t RingCapacity(int64_t window, int64_t max_backtrack) {
  return window + max_backtrack + 1;
}

// R = W + (D - 1)(W - 1): how far back a consumer row's SWA output depends on the prompt through
// D consumer layers (seed equation 9.1).
constexpr int64_t DependencySpan(int64_t window, int64_t consumer_layers) {
  return window + (consumer_layers - 1) * (window - 1);
}

// max(0, pos - W + 1): the first position whose producer SWA key row `pos` attends to.
constexpr int64_t ProducerLowerBound(int64_t pos, int64_t window) {
  return std::max<int64_t>(0, pos - window + 1);
}

// The ring slot a row at `pos` of a run ending before `end` writes: only the run's last C rows
// enter a ring (earlier ones would be overwritten within the run), at slot pos % C; -1 for the
// others (seed listing 9.10).
constexpr int32_t RingSlotOfRunRow(int64_t pos, int64_t end, int64_t ring_capacity) {
  return end - pos <= ring_capacity ? static_cast<int32_t>(pos % ring_capacity) : -1;
}

// The first producer SWA block a prefix hit of `hit_tokens` (H, a multiple of B) must load:
// the rows after the hit attend back to ProducerLowerBound(H, W) (DESIGN section 5, step 3).
constexpr int64_t FirstProducerBlock(int64_t hit_tokens, int64_t window, int64_t block_size) {
  return ProducerLowerBound(hit_tokens, window) / block_size;
}

// A configured keep of 0 stands for C (flags and chart values; a request's keep is taken as it
// is).
constexpr int64_t EffectiveKeep(int64_t keep, int64_t ring_capacity) {
  return keep == 0 ? ring_capacity : keep;
}

// Truncation (mask, compact) retains at least the ring: keep >= C. The error names `field`, e.g.
// "truncation.keep: 21 is below the ring capacity C = 22; ...".
absl::Status CheckKeep(bool truncated, int64_t keep, int64_t ring_capacity,
                       absl::string_view field);

// The truncation modes' names, "off", "mask" and "compact", for flags, config files and output;
// the wire enum is the one vocabulary, and model::TruncationMode maps to it.
absl::string_view TruncationModeName(v1::TruncationMode mode);
// Parses a name (exact, lower case); the error names `field` and the allowed names.
absl::StatusOr<v1::TruncationMode> ParseTruncationModeName(absl::string_view text,
                                                           absl::string_view field);
// OFF, MASK or COMPACT (not UNSPECIFIED nor an unknown number from the wire).
bool IsTruncationMode(v1::TruncationMode mode);

}  // namespace baton
