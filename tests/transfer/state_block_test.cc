// The StateBlock module: a header takes each field from the request, the model and the
// prefill's result; it verifies against the state it was sealed from and fails, naming the
// region, when any byte of a region changes; header fields outside what was reserved are
// refused; store payloads of a block load back where they came from.
#include "baton/transfer/state_block.h"

#include <numeric>
#include <random>

#include "baton/model/model_factory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::transfer {
namespace {

using ::testing::HasSubstr;

class StateBlockTest : public ::testing::Test {
 protected:
  StateBlockTest() : layout_(model::StateLayout::For(*model::PresetConfig("tiny"))) {}

  // A state of `length` positions filled with distinct values.
  std::unique_ptr<model::SequenceState> Filled(int64_t length, float base) {
    auto state = std::make_unique<model::SequenceState>(layout_);
    EXPECT_TRUE(state->EnsurePages(length).ok());
    std::iota(state->producer_swa(), state->producer_swa() + layout_.producer_swa_floats(), base);
    std::iota(state->consumer_swa(), state->consumer_swa() + layout_.consumer_swa_floats(),
              base + 1e5f);
    for (size_t p = 0; p < state->pages().size(); ++p) {
      std::iota(state->pages()[p], state->pages()[p] + layout_.page_floats(),
                base + 2e5f + 1e4f * static_cast<float>(p));
    }
    return state;
  }
  // A prefill request of `prompt_len` prompt tokens.
  static v1::PrefillRequest Request(uint32_t prompt_len) {
    v1::PrefillRequest request;
    for (uint32_t i = 0; i < prompt_len; ++i) request.mutable_request()->add_prompt_token_ids(7);
    return request;
  }
  v1::StateHeader Sealed(const model::SequenceState& state, uint32_t prompt_len) {
    return BuildHeader(Request(prompt_len), "fp", model::PrefillResult{}, {.token = 3}, state);
  }

  model::StateLayout layout_;
};

TEST_F(StateBlockTest, RegionSizesFollowTheLayoutAndThePrompt) {
  const RegionSizes sizes = RegionSizesFor(layout_, 40);
  EXPECT_EQ(sizes.pages, 3u);  // 40 positions in blocks of 16
  EXPECT_EQ(sizes.page, sizeof(float) * layout_.page_floats());
  EXPECT_EQ(sizes.block_kv, 3 * sizes.page);
  EXPECT_EQ(sizes.bytes(v1::REGION_PRODUCER_SWA), sizeof(float) * layout_.producer_swa_floats());
  EXPECT_EQ(sizes.bytes(v1::REGION_CONSUMER_SWA), sizeof(float) * layout_.consumer_swa_floats());
  EXPECT_EQ(sizes.bytes(v1::REGION_UNSPECIFIED), 0u);
  EXPECT_EQ(RegionSizesFor(layout_, 48).pages, 3u);
  EXPECT_EQ(RegionSizesFor(layout_, 49).pages, 4u);
}

// Block KV is one page of G groups per block: with block_kv_sources its pages shrink by D / G,
// and the rings, which every layer keeps, do not change.
TEST_F(StateBlockTest, SharedBlockKvShrinksThePagesOnly) {
  ModelConfig shared = *model::PresetConfig("tiny");
  shared.block_kv_sources = {shared.n_prefill_layer, shared.n_prefill_layer + 2};
  const model::StateLayout two_groups = model::StateLayout::For(shared);
  const RegionSizes plain = RegionSizesFor(layout_, 40), sizes = RegionSizesFor(two_groups, 40);
  EXPECT_EQ(two_groups.block_kv_groups, 2);
  EXPECT_EQ(sizes.page, sizeof(float) * 2 * 2 * 16 * 32);  // 2 groups of K and V, B x kv_dim
  EXPECT_EQ(sizes.page * 2, plain.page);                   // tiny: D = 4
  EXPECT_EQ(sizes.block_kv, 3 * sizes.page);
  EXPECT_EQ(sizes.bytes(v1::REGION_PRODUCER_SWA), plain.bytes(v1::REGION_PRODUCER_SWA));
  EXPECT_EQ(sizes.bytes(v1::REGION_CONSUMER_SWA), plain.bytes(v1::REGION_CONSUMER_SWA));
}

// The decode node's reservation carries the sizes the prefill node checks; a reservation of
// another prompt length or with any size changed is refused naming it.
TEST_F(StateBlockTest, AReservationsSizesAreCheckedAgainstThePrompt) {
  v1::Reservation reservation;
  SetReservationSizes(RegionSizesFor(layout_, 40), reservation);
  EXPECT_TRUE(CheckReservationSizes(reservation, RegionSizesFor(layout_, 40)).ok());
  const absl::Status other = CheckReservationSizes(reservation, RegionSizesFor(layout_, 49));
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(other.message()), ::testing::HasSubstr("reservation"));
  for (int field = 0; field < 4; ++field) {
    v1::Reservation changed = reservation;
    if (field == 0) changed.set_pages(changed.pages() + 1);
    if (field == 1) changed.set_producer_swa_bytes(changed.producer_swa_bytes() - 4);
    if (field == 2) changed.set_consumer_swa_bytes(changed.consumer_swa_bytes() + 4);
    if (field == 3) changed.set_page_bytes(changed.page_bytes() * 2);
    EXPECT_FALSE(CheckReservationSizes(changed, RegionSizesFor(layout_, 40)).ok()) << field;
  }
}

// Every descriptive field comes from the request, the model or the prefill's result, each from
// its own source (distinct values, so that a field taken from the wrong one fails).
TEST_F(StateBlockTest, TheHeaderIsBuiltFromTheRequestTheModelAndTheResult) {
  auto state = Filled(40, 1.0f);
  v1::PrefillRequest request = Request(40);
  request.mutable_request()->set_request_id("request-1");
  request.mutable_reservation()->set_reservation_id("reservation-2");
  request.set_s_valid(16);
  request.set_mode(v1::TRUNCATION_MODE_MASK);
  request.set_keep(8);
  request.set_completed_tokens(5);  // already among the 40 prompt tokens, not added to them
  model::PrefillResult result;
  result.consumer_rows = 24;
  const model::SampledToken first{.token = 3, .logprob = -0.25f};
  const v1::StateHeader h = BuildHeader(request, "fp", result, first, *state);
  EXPECT_EQ(h.format_version(), kStateFormatVersion);
  EXPECT_EQ(h.model_fingerprint(), "fp");
  EXPECT_EQ(h.request_id(), "request-1");
  EXPECT_EQ(h.reservation_id(), "reservation-2");
  EXPECT_EQ(h.prompt_len(), 40u);
  EXPECT_EQ(h.s_valid(), 16u);
  EXPECT_EQ(h.mode(), v1::TRUNCATION_MODE_MASK);
  EXPECT_EQ(h.keep(), 8u);
  EXPECT_EQ(h.first_token(), 3);
  EXPECT_EQ(h.first_logprob(), -0.25f);
  EXPECT_EQ(h.replayed_rows(), 24u);
  const RegionSizes sizes = RegionSizesFor(layout_, 40);
  EXPECT_EQ(h.producer_swa_bytes(), sizes.producer_swa);
  EXPECT_EQ(h.consumer_swa_bytes(), sizes.consumer_swa);
  EXPECT_EQ(h.block_kv_bytes(), sizes.block_kv);
  // What the decode node that reserved the prompt accepts, regions and all.
  EXPECT_TRUE(VerifyHeader(h, "fp", 40, 512).ok());
  EXPECT_TRUE(VerifyRegions(h, *state).ok());
  // The checksums are over the state: another state's regions give other ones.
  const v1::StateHeader other = BuildHeader(request, "fp", result, first, *Filled(40, 2.0f));
  EXPECT_NE(other.producer_swa_checksum(), h.producer_swa_checksum());
  EXPECT_NE(other.consumer_swa_checksum(), h.consumer_swa_checksum());
  EXPECT_NE(other.block_kv_checksum(), h.block_kv_checksum());
}

TEST_F(StateBlockTest, ASealedHeaderVerifiesAndAnyChangedByteFailsItsRegion) {
  auto state = Filled(40, 1.0f);
  const v1::StateHeader h = Sealed(*state, 40);
  EXPECT_EQ(h.format_version(), kStateFormatVersion);
  EXPECT_TRUE(VerifyHeader(h, "fp", 40, 512).ok());
  EXPECT_TRUE(VerifyRegions(h, *state).ok());
  struct Case {
    const char* region;
    float* where;
  };
  for (const Case& c : {Case{"producer_swa", state->producer_swa() + 7},
                        Case{"consumer_swa", state->consumer_swa() + 11},
                        Case{"block_kv", state->pages()[2] + 5}}) {
    const float saved = *c.where;
    *c.where += 1.0f;
    const absl::Status status = VerifyRegions(h, *state);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << c.region;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.region));
    *c.where = saved;
  }
  v1::StateHeader short_kv = h;
  short_kv.set_block_kv_bytes(h.block_kv_bytes() - 4);
  EXPECT_EQ(VerifyRegions(short_kv, *state).code(), absl::StatusCode::kDataLoss);
}

// Replay-on-decode (format 2): the boundary rows of the replay range take the consumer SWA's
// place, a reservation holds pages for the most rows its prompt may hand over, the header
// carries no first token and is refused unless its rows are exactly the replay range of its
// prompt, mode, keep and s_valid; a changed row fails the boundary region's checksum.
TEST_F(StateBlockTest, ReplayOnDecodeCarriesTheBoundaryRowsInsteadOfTheConsumerRings) {
  const int64_t d = layout_.hidden_size;
  ASSERT_GT(d, 0);
  const uint64_t L = 40, keep = 25, rows = L - (L - keep);  // compact: [s_keep, L)
  const RegionSizes sizes = RegionSizesFor(layout_, L, v1::SPLIT_REPLAY_ON_DECODE, rows);
  EXPECT_EQ(sizes.consumer_swa, 0u);
  EXPECT_EQ(sizes.bytes(v1::REGION_BOUNDARY_ROWS), rows * d * sizeof(float));
  EXPECT_EQ(sizes.boundary_pages, (sizes.boundary_rows + sizes.page - 1) / sizes.page);
  // Under the serving default (compact, K = C) the rows weigh less than the rings they replace.
  EXPECT_LT(
      RegionSizesFor(layout_, L, v1::SPLIT_REPLAY_ON_DECODE, layout_.ring_capacity).boundary_rows,
      RegionSizesFor(layout_, L).consumer_swa);

  // The decode node reserves for the most rows (L under off); the prefill node's fit.
  v1::Reservation reservation;
  SetReservationSizes(RegionSizesFor(layout_, L, v1::SPLIT_REPLAY_ON_DECODE, L), reservation);
  EXPECT_TRUE(CheckReservationSizes(reservation, sizes).ok());
  EXPECT_FALSE(CheckReservationSizes(reservation, RegionSizesFor(layout_, L)).ok());
  reservation.set_boundary_rows(rows - 1);
  EXPECT_THAT(CheckReservationSizes(reservation, sizes).message(), HasSubstr("boundary rows"));

  auto state = Filled(L, 1.0f);
  std::vector<float> boundary(rows * d);
  std::iota(boundary.begin(), boundary.end(), 3e5f);
  v1::PrefillRequest request = Request(L);
  request.set_split(v1::SPLIT_REPLAY_ON_DECODE);
  request.set_mode(v1::TRUNCATION_MODE_COMPACT);
  request.set_keep(keep);
  const v1::StateHeader h =
      BuildHeader(request, "fp", model::PrefillResult{}, {.token = 3}, *state, boundary);
  EXPECT_EQ(h.split(), v1::SPLIT_REPLAY_ON_DECODE);
  EXPECT_EQ(h.boundary_rows(), rows);
  EXPECT_EQ(h.boundary_rows_bytes(), sizes.boundary_rows);
  EXPECT_EQ(h.consumer_swa_bytes(), 0u);
  EXPECT_EQ(h.first_token(), 0);  // the decode node samples it
  EXPECT_TRUE(VerifyHeader(h, "fp", L, 512, v1::SPLIT_REPLAY_ON_DECODE, L).ok());
  EXPECT_THAT(VerifyHeader(h, "fp", L, 512).message(), HasSubstr("header.split"));
  EXPECT_THAT(VerifyHeader(h, "fp", L, 512, v1::SPLIT_REPLAY_ON_DECODE, rows - 1).message(),
              HasSubstr("header.boundary_rows"));
  v1::StateHeader other_keep = h;
  other_keep.set_keep(keep + 1);  // its replay range has one row more than the header carries
  EXPECT_THAT(VerifyHeader(other_keep, "fp", L, 512, v1::SPLIT_REPLAY_ON_DECODE, L).message(),
              HasSubstr("header.boundary_rows"));
  // The prompt for the decode node's prompt logprobs: exactly L ids, each in the vocabulary.
  v1::StateHeader ids = h;
  for (uint32_t i = 0; i < L; ++i) ids.add_prompt_token_ids(static_cast<int32_t>(i));
  EXPECT_TRUE(VerifyHeader(ids, "fp", L, 512, v1::SPLIT_REPLAY_ON_DECODE, L).ok());
  v1::StateHeader short_ids = ids;
  short_ids.mutable_prompt_token_ids()->RemoveLast();
  v1::StateHeader outside = ids;
  outside.set_prompt_token_ids(3, 512);
  for (const v1::StateHeader& bad : {short_ids, outside}) {
    const absl::Status status = VerifyHeader(bad, "fp", L, 512, v1::SPLIT_REPLAY_ON_DECODE, L);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("header.prompt_token_ids"));
  }
  v1::StateHeader bad_mode = h;
  bad_mode.set_mode(static_cast<v1::TruncationMode>(9));
  EXPECT_THAT(VerifyHeader(bad_mode, "fp", L, 512, v1::SPLIT_REPLAY_ON_DECODE, L).message(),
              HasSubstr("header.mode"));
  // A prefill-all header carries no boundary rows.
  v1::StateHeader all = Sealed(*state, L);
  all.set_boundary_rows(1);
  EXPECT_THAT(VerifyHeader(all, "fp", L, 512).message(), HasSubstr("header.boundary_rows"));

  // The rows as the decode node holds them: in pages, counted back to back.
  std::vector<std::vector<float>> pages(sizes.boundary_pages,
                                        std::vector<float>(sizes.page / sizeof(float)));
  for (size_t i = 0; i < boundary.size(); ++i) {
    pages[i * sizeof(float) / sizes.page][i % (sizes.page / sizeof(float))] = boundary[i];
  }
  std::vector<const float*> landed;
  for (const auto& page : pages) landed.push_back(page.data());
  EXPECT_TRUE(VerifyRegions(h, *state, landed).ok());
  pages.back()[0] += 1.0f;
  EXPECT_THAT(VerifyRegions(h, *state, landed).message(), HasSubstr("boundary_rows"));
  EXPECT_THAT(VerifyRegions(h, *state).message(), HasSubstr("boundary_rows"));  // none landed
}

TEST_F(StateBlockTest, HeaderFieldsOutsideTheReservationAreRefusedByName) {
  auto state = Filled(40, 1.0f);
  const v1::StateHeader h = Sealed(*state, 40);
  auto refused = [&](v1::StateHeader changed, uint32_t reserved, absl::StatusCode code,
                     const char* field) {
    const absl::Status status = VerifyHeader(changed, "fp", reserved, 512);
    EXPECT_EQ(status.code(), code) << field;
    EXPECT_THAT(std::string(status.message()), HasSubstr(field));
  };
  v1::StateHeader version = h;
  version.set_format_version(kStateFormatVersion + 1);
  refused(version, 40, absl::StatusCode::kFailedPrecondition, "header.format_version");
  v1::StateHeader model = h;
  model.set_model_fingerprint("other");
  refused(model, 40, absl::StatusCode::kFailedPrecondition, "header.model_fingerprint");
  refused(h, 39, absl::StatusCode::kInvalidArgument, "header.prompt_len");
  v1::StateHeader s_valid = h;
  s_valid.set_s_valid(41);
  refused(s_valid, 40, absl::StatusCode::kInvalidArgument, "header.s_valid");
  for (int32_t token : {-1, 512}) {
    v1::StateHeader first = h;
    first.set_first_token(token);
    refused(first, 40, absl::StatusCode::kInvalidArgument, "header.first_token");
  }
  // Shadow verification's first_logits: empty or exactly the vocabulary (512 here).
  for (const int floats : {1, 511, 513}) {
    v1::StateHeader logits = h;
    for (int i = 0; i < floats; ++i) logits.add_first_logits(0.5f);
    refused(logits, 40, absl::StatusCode::kInvalidArgument, "header.first_logits");
  }
  v1::StateHeader whole = h;
  for (int i = 0; i < 512; ++i) whole.add_first_logits(0.5f);
  EXPECT_TRUE(VerifyHeader(whole, "fp", 40, 512).ok());
}

TEST_F(StateBlockTest, StorePayloadsLoadBackWhereTheyCameFrom) {
  const int64_t L = 48, B = layout_.block_size, C = layout_.ring_capacity;
  auto source = Filled(L, 1.0f);
  // Producer rows as the prefill captures them: [P][2][L][kv_dim].
  std::vector<float> rows(layout_.producer_layers * 2 * L * layout_.kv_dim);
  std::mt19937 rng(3);
  for (float& v : rows) v = static_cast<float>(rng() % 1000);
  auto target = Filled(L, -5e5f);
  for (int64_t b = 0; b < L / B; ++b) {
    const std::string kv = BlockKvPayload(*source, b);
    const std::string swa = ProducerSwaPayload(layout_, rows, L, b);
    ASSERT_EQ(kv.size(), sizeof(float) * layout_.page_floats());
    ASSERT_EQ(swa.size(), sizeof(float) * layout_.stored_swa_block_floats());
    LoadBlockKv(kv, b, *target);
    LoadProducerSwaRows(swa, b, L - C, *target);
    EXPECT_EQ(0, std::memcmp(target->pages()[b], source->pages()[b], kv.size())) << b;
  }
  // The rings hold the last C positions' rows at slot position mod C; older rows were skipped.
  for (int64_t l = 0; l < layout_.producer_layers; ++l) {
    for (int64_t pos = L - C; pos < L; ++pos) {
      for (int64_t kv = 0; kv < 2; ++kv) {
        const float* ring = target->producer_swa() +
                            (kv == 0 ? layout_.ring_k_offset(l) : layout_.ring_v_offset(l)) +
                            (pos % C) * layout_.kv_dim;
        const float* row = rows.data() + ((l * 2 + kv) * L + pos) * layout_.kv_dim;
        EXPECT_EQ(0, std::memcmp(ring, row, sizeof(float) * layout_.kv_dim))
            << "layer " << l << " pos " << pos;
      }
    }
  }
}

}  // namespace
}  // namespace baton::transfer
