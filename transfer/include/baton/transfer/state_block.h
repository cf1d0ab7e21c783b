// The StateBlock's one home (DESIGN section 4): what a request's state is on the wire and in
// the prefix store. Region sizes, the header (format version, fingerprint, lengths, XXH3
// checksums) that the prefill node builds and the decode node verifies, and the payloads of one
// block in the store. The transports (UCX, gRPC) move the regions; this module says what they
// are and whether they arrived whole.
//
// Regions of a request of L prompt tokens (StateLayout):
//   producer SWA   P x 2 x C x kv_dim floats     moves; its rows of each block also persist
//   consumer SWA   D x 2 x C x kv_dim floats     moves; never persists
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

inline constexpr uint32_t kStateFormatVersion = 1;

struct RegionSizes {
  uint64_t producer_swa = 0;
  uint64_t consumer_swa = 0;
  uint64_t page = 0;      // one block-KV page
  uint64_t pages = 0;     // ceil(L / B)
  uint64_t block_kv = 0;  // pages x page
  // The bytes of `region`; 0 for one that is not a region.
  uint64_t bytes(v1::Region region) const;
};
RegionSizes RegionSizesFor(const model::StateLayout& layout, uint64_t prompt_len);

// A reservation's regions: the decode node answers Reserve with `sizes`, and the prefill node
// checks that they are the ones its prompt and model give before it stages any memory
// (INVALID_ARGUMENT naming `reservation` otherwise).
void SetReservationSizes(const RegionSizes& sizes, v1::Reservation& reservation);
absl::Status CheckReservationSizes(const v1::Reservation& reservation, const RegionSizes& sizes);

// The header the prefill node commits for `request`, every field of it built here: the model's
// `fingerprint`; the request's and the reservation's ids; prompt_len (the request's prompt
// tokens, with any already streamed), s_valid, mode and keep as the request gives them; the
// `first` token sampled and its logprob; the consumer rows `result` computed (replayed_rows);
// and, sealed over `state`'s first prompt_len positions, the format version and every
// region's length and checksum.
v1::StateHeader BuildHeader(const v1::PrefillRequest& request, std::string_view fingerprint,
                            const model::PrefillResult& result, const model::SampledToken& first,
                            const model::SequenceState& state);

// The header as the decode node that reserved `reserved_prompt_len` positions for a model of
// `fingerprint` and `vocab_size` can accept it: FAILED_PRECONDITION for another format version
// or model, INVALID_ARGUMENT naming the field otherwise (checksums are VerifyRegions').
absl::Status VerifyHeader(const v1::StateHeader& header, std::string_view fingerprint,
                          uint32_t reserved_prompt_len, int64_t vocab_size);

// The regions now in `state` have the header's lengths and checksums; DATA_LOSS naming the
// first region that does not.
absl::Status VerifyRegions(const v1::StateHeader& header, const model::SequenceState& state);

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
