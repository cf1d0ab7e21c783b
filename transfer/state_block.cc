#include "baton/transfer/state_block.h"

#include <cstring>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "baton/common/checksum.h"

namespace baton::transfer {
namespace {

// Where row `row` of producer layer `layer` (kv 0: K, 1: V) lies in a block's store payload.
int64_t SwaRowOffset(const model::StateLayout& l, int64_t layer, int64_t kv, int64_t row) {
  return ((layer * 2 + kv) * l.block_size + row) * l.kv_dim;
}

uint64_t BlockKvChecksum(const model::SequenceState& state, const RegionSizes& sizes) {
  std::vector<const void*> pages(state.pages().begin(), state.pages().end());
  return ChecksumPieces(pages, sizes.page, sizes.block_kv);
}

bool ReplayOnDecode(v1::Split split) {
  return split == v1::SPLIT_REPLAY_ON_DECODE;
}

}  // namespace

uint64_t RegionSizes::bytes(v1::Region region) const {
  switch (region) {
    case v1::REGION_PRODUCER_SWA:
      return producer_swa;
    case v1::REGION_CONSUMER_SWA:
      return consumer_swa;
    case v1::REGION_BLOCK_KV:
      return block_kv;
    case v1::REGION_BOUNDARY_ROWS:
      return boundary_rows;
    default:
      return 0;
  }
}

RegionSizes RegionSizesFor(const model::StateLayout& layout, uint64_t prompt_len, v1::Split split,
                           uint64_t boundary_row_count) {
  RegionSizes sizes;
  sizes.split = split;
  sizes.producer_swa = sizeof(float) * static_cast<uint64_t>(layout.producer_swa_floats());
  sizes.page = sizeof(float) * static_cast<uint64_t>(layout.page_floats());
  const uint64_t B = static_cast<uint64_t>(layout.block_size);
  sizes.pages = prompt_len / B + (prompt_len % B != 0 ? 1 : 0);
  sizes.block_kv = sizes.pages * sizes.page;
  if (ReplayOnDecode(split)) {
    // Both factors are bounded (prompt_len by the wire bounds, d by the model config), so the
    // product stays far below 2^64.
    sizes.boundary_row_count = boundary_row_count;
    sizes.boundary_row = sizeof(float) * static_cast<uint64_t>(layout.hidden_size);
    sizes.boundary_rows = boundary_row_count * sizes.boundary_row;
    sizes.boundary_pages =
        sizes.boundary_rows / sizes.page + (sizes.boundary_rows % sizes.page != 0);
  } else {
    sizes.consumer_swa = sizeof(float) * static_cast<uint64_t>(layout.consumer_swa_floats());
  }
  return sizes;
}

void SetReservationSizes(const RegionSizes& sizes, v1::Reservation& reservation) {
  reservation.set_producer_swa_bytes(sizes.producer_swa);
  reservation.set_consumer_swa_bytes(sizes.consumer_swa);
  reservation.set_page_bytes(sizes.page);
  reservation.set_pages(static_cast<uint32_t>(sizes.pages));
  reservation.set_split(sizes.split);
  reservation.set_boundary_rows(static_cast<uint32_t>(sizes.boundary_row_count));
  reservation.set_boundary_row_bytes(sizes.boundary_row);
}

absl::Status CheckReservationSizes(const v1::Reservation& reservation, const RegionSizes& sizes) {
  if (reservation.pages() != sizes.pages ||
      reservation.producer_swa_bytes() != sizes.producer_swa ||
      reservation.consumer_swa_bytes() != sizes.consumer_swa ||
      reservation.page_bytes() != sizes.page || reservation.split() != sizes.split ||
      reservation.boundary_row_bytes() != sizes.boundary_row) {
    return absl::InvalidArgumentError(
        "reservation: its regions do not match this prompt and model");
  }
  if (reservation.boundary_rows() < sizes.boundary_row_count) {
    return absl::InvalidArgumentError(
        absl::StrCat("reservation: it holds ", reservation.boundary_rows(),
                     " boundary rows; this prompt hands ", "over ", sizes.boundary_row_count));
  }
  return absl::OkStatus();
}

RegionSizes RegionSizesOf(const v1::StateHeader& header, const model::StateLayout& layout) {
  return RegionSizesFor(layout, header.prompt_len(), header.split(), header.boundary_rows());
}

v1::StateHeader BuildHeader(const v1::PrefillRequest& request, std::string_view fingerprint,
                            const model::PrefillResult& result, const model::SampledToken& first,
                            const model::SequenceState& state,
                            std::span<const float> boundary_rows) {
  v1::StateHeader h;
  h.set_model_fingerprint(std::string(fingerprint));
  h.set_request_id(request.request().request_id());
  h.set_reservation_id(request.reservation().reservation_id());
  h.set_prompt_len(static_cast<uint32_t>(request.request().prompt_token_ids_size()));
  h.set_s_valid(request.s_valid());
  h.set_mode(request.mode());
  h.set_keep(request.keep());
  h.set_split(request.split());
  if (!ReplayOnDecode(request.split())) {
    h.set_first_token(first.token);
    h.set_first_logprob(first.logprob);
  }
  h.set_replayed_rows(static_cast<uint32_t>(result.consumer_rows));
  const int64_t d = state.layout().hidden_size;
  h.set_boundary_rows(static_cast<uint32_t>(d > 0 ? boundary_rows.size() / d : 0));
  const RegionSizes sizes = RegionSizesOf(h, state.layout());
  h.set_format_version(kStateFormatVersion);
  h.set_producer_swa_bytes(sizes.producer_swa);
  h.set_consumer_swa_bytes(sizes.consumer_swa);
  h.set_block_kv_bytes(sizes.block_kv);
  h.set_boundary_rows_bytes(sizes.boundary_rows);
  h.set_producer_swa_checksum(Checksum(state.producer_swa(), sizes.producer_swa));
  h.set_consumer_swa_checksum(Checksum(state.consumer_swa(), sizes.consumer_swa));
  h.set_block_kv_checksum(BlockKvChecksum(state, sizes));
  h.set_boundary_rows_checksum(Checksum(boundary_rows.data(), sizes.boundary_rows));
  return h;
}

absl::Status VerifyHeader(const v1::StateHeader& h, std::string_view fingerprint,
                          uint32_t reserved_prompt_len, int64_t vocab_size,
                          v1::Split reserved_split, uint32_t reserved_boundary_rows) {
  if (h.format_version() != kStateFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat("header.format_version ", h.format_version(),
                                                      "; expected ", kStateFormatVersion));
  }
  if (h.model_fingerprint() != fingerprint) {
    return absl::FailedPreconditionError("header.model_fingerprint does not match");
  }
  if (h.prompt_len() != reserved_prompt_len) {
    return absl::InvalidArgumentError(absl::StrCat("header.prompt_len ", h.prompt_len(), " but ",
                                                   reserved_prompt_len, " were reserved"));
  }
  if (h.s_valid() > h.prompt_len()) {
    return absl::InvalidArgumentError(absl::StrCat("header.s_valid ", h.s_valid(),
                                                   " exceeds header.prompt_len ", h.prompt_len()));
  }
  if (h.split() != reserved_split) {
    return absl::InvalidArgumentError(absl::StrCat("header.split ", v1::Split_Name(h.split()),
                                                   " but the reservation is for ",
                                                   v1::Split_Name(reserved_split)));
  }
  if (h.first_logits_size() != 0 &&
      (ReplayOnDecode(h.split()) || h.first_logits_size() != vocab_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header.first_logits: ", h.first_logits_size(),
        " floats; it must be empty, or hold vocab_size (", vocab_size, ") under PREFILL_ALL"));
  }
  if (!ReplayOnDecode(h.split())) {
    if (h.first_token() < 0 || h.first_token() >= vocab_size) {
      return absl::InvalidArgumentError("header.first_token outside the vocabulary");
    }
    if (h.boundary_rows() != 0 || h.prompt_token_ids_size() != 0) {
      return absl::InvalidArgumentError(
          "header.boundary_rows: a prefill-all StateBlock carries no boundary rows");
    }
    return absl::OkStatus();
  }
  absl::StatusOr<model::TruncationMode> mode = model::ModeFromProto(h.mode(), "header.mode");
  if (!mode.ok()) return mode.status();
  const int64_t expected = model::BoundaryRowCount(h.prompt_len(), *mode, h.keep(), h.s_valid());
  if (h.boundary_rows() != expected || h.boundary_rows() > reserved_boundary_rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header.boundary_rows ", h.boundary_rows(), "; the replay range of this prompt has ",
        expected, " rows and the reservation holds ", reserved_boundary_rows));
  }
  if (h.prompt_token_ids_size() != 0) {
    if (h.prompt_token_ids_size() != static_cast<int>(h.prompt_len())) {
      return absl::InvalidArgumentError(
          absl::StrCat("header.prompt_token_ids holds ", h.prompt_token_ids_size(),
                       " ids; it must hold the prompt's ", h.prompt_len()));
    }
    for (int32_t id : h.prompt_token_ids()) {
      if (id < 0 || id >= vocab_size) {
        return absl::InvalidArgumentError("header.prompt_token_ids: an id outside the vocabulary");
      }
    }
  }
  return absl::OkStatus();
}

absl::Status VerifyRegions(const v1::StateHeader& h, const model::SequenceState& state,
                           std::span<const float* const> boundary_pages) {
  const RegionSizes sizes = RegionSizesOf(h, state.layout());
  if (boundary_pages.size() < sizes.boundary_pages) {
    return absl::DataLossError("region boundary_rows failed its checksum after transfer");
  }
  struct Check {
    const char* name;
    uint64_t bytes, expected_bytes, checksum;
    std::function<uint64_t()> actual;
  };
  const Check checks[] = {
      {"producer_swa", h.producer_swa_bytes(), sizes.producer_swa, h.producer_swa_checksum(),
       [&] { return Checksum(state.producer_swa(), sizes.producer_swa); }},
      {"consumer_swa", h.consumer_swa_bytes(), sizes.consumer_swa, h.consumer_swa_checksum(),
       [&] { return Checksum(state.consumer_swa(), sizes.consumer_swa); }},
      {"block_kv", h.block_kv_bytes(), sizes.block_kv, h.block_kv_checksum(),
       [&] { return BlockKvChecksum(state, sizes); }},
      {"boundary_rows", h.boundary_rows_bytes(), sizes.boundary_rows, h.boundary_rows_checksum(),
       [&] {
         std::vector<const void*> pages(boundary_pages.begin(), boundary_pages.end());
         return ChecksumPieces(pages, sizes.page, sizes.boundary_rows);
       }},
  };
  for (const Check& c : checks) {
    // An empty region (the split leaves one out) has nothing to checksum.
    if (c.bytes != c.expected_bytes || (c.expected_bytes > 0 && c.actual() != c.checksum)) {
      return absl::DataLossError(
          absl::StrCat("region ", c.name, " failed its checksum after transfer"));
    }
  }
  return absl::OkStatus();
}

std::string BlockKvPayload(const model::SequenceState& state, int64_t block) {
  return std::string(reinterpret_cast<const char*>(state.pages()[block]),
                     sizeof(float) * state.layout().page_floats());
}

std::string ProducerSwaPayload(const model::StateLayout& layout,
                               std::span<const float> producer_rows, int64_t prompt_len,
                               int64_t block) {
  const int64_t B = layout.block_size;
  std::string rows;
  rows.reserve(sizeof(float) * layout.stored_swa_block_floats());
  for (int64_t l = 0; l < layout.producer_layers; ++l) {
    for (int64_t kv = 0; kv < 2; ++kv) {
      rows.append(
          reinterpret_cast<const char*>(producer_rows.data() +
                                        ((l * 2 + kv) * prompt_len + block * B) * layout.kv_dim),
          sizeof(float) * B * layout.kv_dim);
    }
  }
  return rows;
}

void LoadBlockKv(std::string_view payload, int64_t block, model::SequenceState& state) {
  std::memcpy(state.pages()[block], payload.data(), sizeof(float) * state.layout().page_floats());
}

void LoadProducerSwaRows(std::string_view payload, int64_t block, int64_t first_position,
                         model::SequenceState& state) {
  const model::StateLayout& layout = state.layout();
  const int64_t B = layout.block_size, C = layout.ring_capacity;
  const float* rows = reinterpret_cast<const float*>(payload.data());
  float* ring = state.producer_swa();
  for (int64_t r = 0; r < B; ++r) {
    const int64_t pos = block * B + r;
    if (pos < first_position) continue;
    for (int64_t l = 0; l < layout.producer_layers; ++l) {
      std::memcpy(ring + layout.ring_k_offset(l) + (pos % C) * layout.kv_dim,
                  rows + SwaRowOffset(layout, l, 0, r), sizeof(float) * layout.kv_dim);
      std::memcpy(ring + layout.ring_v_offset(l) + (pos % C) * layout.kv_dim,
                  rows + SwaRowOffset(layout, l, 1, r), sizeof(float) * layout.kv_dim);
    }
  }
}

}  // namespace baton::transfer
