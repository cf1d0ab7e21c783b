// The StateBlock's one home (DESIGN section 4): what a request's state is on the wire and in
// the prefix store. Region sizes, the header (format version, fingerprint, lengths, XXH3
// checksums) that the prefill node builds and the decode node verifies, and the payloads of one
// block in the store. The transports (UCX, gRPC) move the regions; this module says what they
// are and whether they arrived whole.
//
// Regions of a request of L prompt tokens (StateLayout):
//   producer SWA   P x 2 x C x kv_dim floats     moves; its rows of each block also persist
//   consumer SWA   D x 2 x C x kv_dim floats     moves; never persists (prefill-all only)
//   boundary rows  R x d floats                  replay-on-decode only, in the consumer SWA's
//                  place: the residual rows entering layer P of the replay range
//                  [L - R, L); on the decode node they land in pool pages, counted back to
//                  back, and are freed once replayed
//   block KV       ceil(L / B) pages of G x 2 x B x kv_dim floats (G block-KV groups: one per
//                  block_kv_sources entry, else D), moved back to back; each page persists as
//                  the block's "block_kv" value
// A block's "producer_swa" store value is its B producer rows, [P][2][B][kv_dim] (K rows, then
// V rows, per producer layer): the ring keeps only the last C rows, so they are captured while
// the block is computed.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "baton/model/forward_schedule.h"
#include "baton/model/sampling.h"
#include "baton/model/state.h"
#include "baton/v1/node.pb.h"

namespace baton::transfer {

// 2: the split and the boundary-rows region (replay-on-decode).
inline constexpr uint32_t kStateFormatVersion = 2;

struct RegionSizes {
  v1::Split split = v1::SPLIT_PREFILL_ALL;
  uint64_t producer_swa = 0;
  uint64_t consumer_swa = 0;        // 0 under replay-on-decode
  uint64_t page = 0;                // one block-KV page
  uint64_t pages = 0;               // ceil(L / B)
  uint64_t block_kv = 0;            // pages x page
  uint64_t boundary_row_count = 0;  // R (replay-on-decode)
  uint64_t boundary_row = 0;        // bytes of one boundary row
  uint64_t boundary_rows = 0;       // R x boundary_row
  uint64_t boundary_pages = 0;      // pages of `page` bytes that hold them on the decode node
  // The bytes of `region`; 0 for one that is not a region.
  uint64_t bytes(v1::Region region) const;
};
// The regions of a prompt of `prompt_len` tokens; under replay-on-decode with
// `boundary_row_count` boundary rows.
RegionSizes RegionSizesFor(const model::StateLayout& layout, uint64_t prompt_len,
                           v1::Split split = v1::SPLIT_PREFILL_ALL,
                           uint64_t boundary_row_count = 0);

// A reservation's regions: the decode node answers Reserve with `sizes` (under
// replay-on-decode, for the most boundary rows the request may carry), and the prefill node
// checks that they are the ones its prompt and model give, with room for its boundary rows,
// before it stages any memory (INVALID_ARGUMENT naming `reservation` otherwise).
void SetReservationSizes(const RegionSizes& sizes, v1::Reservation& reservation);
absl::Status CheckReservationSizes(const v1::Reservation& reservation, const RegionSizes& sizes);

// The header the prefill node commits for `request`, every field of it built here: the model's
// `fingerprint`; the request's and the reservation's ids; prompt_len (the request's prompt
// tokens, with any already streamed), s_valid, mode and keep as the request gives them; the
// `first` token sampled and its logprob; the consumer rows `result` computed (replayed_rows);
// and, sealed over `state`'s first prompt_len positions, the format version and every
// region's length and checksum.
// Under replay-on-decode (request.split()), `boundary_rows` are the rows handed over and no
// first token is set.
v1::StateHeader BuildHeader(const v1::PrefillRequest& request, std::string_view fingerprint,
                            const model::PrefillResult& result, const model::SampledToken& first,
                            const model::SequenceState& state,
                            std::span<const float> boundary_rows = {});

// The header as the decode node that reserved `reserved_prompt_len` positions for a model of
// `fingerprint` and `vocab_size` can accept it: FAILED_PRECONDITION for another format version
// or model, INVALID_ARGUMENT naming the field otherwise (checksums are VerifyRegions').
// Under replay-on-decode the header's split must be the reservation's, and its boundary rows
// exactly the replay range of its prompt_len, mode, keep and s_valid, within
// `reserved_boundary_rows`.
absl::Status VerifyHeader(const v1::StateHeader& header, std::string_view fingerprint,
                          uint32_t reserved_prompt_len, int64_t vocab_size,
                          v1::Split reserved_split = v1::SPLIT_PREFILL_ALL,
                          uint32_t reserved_boundary_rows = 0);

// The regions now in `state` have the header's lengths and checksums; DATA_LOSS naming the
// first region that does not.
// `boundary_pages`: where the boundary rows landed (replay-on-decode).
absl::Status VerifyRegions(const v1::StateHeader& header, const model::SequenceState& state,
                           std::span<const float* const> boundary_pages = {});

// The sizes a verified header's regions have.
RegionSizes RegionSizesOf(const v1::StateHeader& header, const model::StateLayout& layout);

// Store payloads of block `block`: its block-KV page, and its producer rows taken from
// `producer_rows`, [P][2][prompt_len][kv_dim] as captured by the prefill.
std::string BlockKvPayload(const model::SequenceState& state, int64_t block);
std::string ProducerSwaPayload(const model::StateLayout& layout,
                               std::span<const float> producer_rows, int64_t prompt_len,
                               int64_t block);

// The reverse, into a request's state: the page of `block`, and the producer rows of `block`
// at positions >= first_position into the rings (slot = position mod C). The caller checked
// the payload's size (the store does too).
void LoadBlockKv(std::string_view payload, int64_t block, model::SequenceState& state);
void LoadProducerSwaRows(std::string_view payload, int64_t block, int64_t first_position,
                         model::SequenceState& state);

}  // namespace baton::transfer
