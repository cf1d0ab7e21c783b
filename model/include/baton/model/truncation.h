// Truncated consumer prefill: the modes and the inputs that decide which consumer row is
// computed, which SWA keys it may see and where it writes (DESIGN section 3, seed 9.3).
//
// A TruncationSpec is plain data shared by the plan builder and the work estimator; both
// accept only a spec that ValidateTruncationSpec passed.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "baton/common/ced_rules.h"
#include "baton/v1/generation.pb.h"

namespace baton::model {

// off: ordinary prefill. mask: every consumer row, SWA visibility narrowed to the retained
// suffix. compact: narrowed visibility and only the retained rows (plus one placeholder row
// per chunk that lies wholly before the suffix).
enum class TruncationMode { kOff, kMask, kCompact };

// The names and the wire enum are baton::TruncationModeName's (common/ced_rules.h).
absl::string_view TruncationModeName(TruncationMode mode);
// Accepts "off", "mask" and "compact"; `field` names the input in the error message.
absl::StatusOr<TruncationMode> ParseTruncationMode(absl::string_view text,
                                                   absl::string_view field = "mode");
v1::TruncationMode ModeToProto(TruncationMode mode);
// OFF, MASK and COMPACT; anything else is an error naming `field`.
absl::StatusOr<TruncationMode> ModeFromProto(v1::TruncationMode mode,
                                             absl::string_view field = "mode");

// Longest prompt the planner accepts; positions are int32 on the kernel side.
inline constexpr int64_t kMaxPromptLen = int64_t{1} << 30;

struct TruncationSpec {
  int64_t prompt_len = 0;  // L
  int64_t keep = 0;        // K: retained consumer suffix; ignored when mode is off
  TruncationMode mode = TruncationMode::kOff;
  int64_t window = 0;         // W: SWA window, inclusive of the query's own position
  int64_t max_backtrack = 5;  // ring capacity C = W + max_backtrack + 1
  int64_t s_valid = 0;        // earliest valid consumer SWA position (H after a prefix hit)

  bool truncated() const { return mode != TruncationMode::kOff; }
  int64_t ring_capacity() const { return RingCapacity(window, max_backtrack); }
  // s_keep = max(0, L - K): start of the retained region (0 when truncation is off).
  int64_t s_keep() const;
  // The first position whose consumer row belongs to the prompt's result and may write the
  // consumer ring: L - K when truncated (possibly negative when K > L), else 0.
  int64_t retained_begin() const;
  // The first position whose consumer row can reach the prompt's result or the consumer rings:
  // max(s_keep, s_valid) when truncated, s_valid when off. Under the replay-on-decode split
  // (DESIGN section 6) the prefill node hands over the boundary rows of [replay_begin(), L) and
  // the decode node computes the consumer layers over exactly those.
  int64_t replay_begin() const;
  // lo_i = clamp(max(i - W + 1, s_keep, s_valid), 0, i + 1) when truncated, without s_keep
  // when off (seed listing 9.9). lo_i = i + 1 means no SWA key is visible.
  int64_t swa_lower_bound(int64_t pos) const;
};

// Range checks with messages that name the field and what is allowed: L in [1, 2^30],
// W >= 1, max_backtrack >= 0, keep >= 0, s_valid in [0, L), and K >= C when truncated.
absl::Status ValidateTruncationSpec(const TruncationSpec& spec);

// Decode of position t: lo_t = clamp(max(t - W + 1, s_valid), 0, t + 1) (DESIGN section 2).
int64_t DecodeSwaLowerBound(int64_t pos, int64_t window, int64_t s_valid);

}  // namespace baton::model
