#include "baton/kvstore/ttft_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
namespace baton::kvstore {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

double Or(double measured, double fallback) {
  return std::isfinite(measured) && measured > 0 ? measured : fallback;
}

bool Has(const ChainLookup& lookup, int64_t block) {
  return block < lookup.block_kv_blocks;
}

bool HasSwa(const ChainLookup& lookup, int64_t block) {
  return Has(lookup, block) && block < static_cast<int64_t>(lookup.swa_present.size()) &&
         lookup.swa_present[block];
}

}  // namespace

const char* RoutingPolicyName(RoutingPolicy policy) {
  switch (policy) {
    case RoutingPolicy::kLeastLoaded:
      return "least-loaded";
    case RoutingPolicy::kLongestPrefix:
      return "longest-prefix";
    case RoutingPolicy::kPredictedTtft:
      return "predicted-ttft";
  }
  return "unknown";
}

absl::StatusOr<RoutingPolicy> ParseRoutingPolicy(absl::string_view text, absl::string_view field) {
  for (RoutingPolicy policy : kRoutingPolicies) {
    if (text == RoutingPolicyName(policy)) return policy;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": '", text, "' is unknown; allowed: least-loaded, longest-prefix, predicted-ttft"));
}

PrefillRates DefaultPrefillRates() {
  return {.producer_ms_per_row = 0.25,
          .consumer_ms_per_row = 0.25,
          .local_ms_per_mib = 0.5,
          .store_ms_per_mib = 8.0,
          .fixed_ms = 20.0};
}

PrefillRates RatesOrDefaults(const v1::PrefillRates& reported) {
  const PrefillRates d = DefaultPrefillRates();
  return {.producer_ms_per_row = Or(reported.producer_ms_per_row(), d.producer_ms_per_row),
          .consumer_ms_per_row = Or(reported.consumer_ms_per_row(), d.consumer_ms_per_row),
          .local_ms_per_mib = Or(reported.local_ms_per_mib(), d.local_ms_per_mib),
          .store_ms_per_mib = Or(reported.store_ms_per_mib(), d.store_ms_per_mib),
          .fixed_ms = Or(reported.fixed_ms(), d.fixed_ms)};
}

v1::PrefillRates ToProto(const PrefillRates& rates, uint32_t samples) {
  v1::PrefillRates proto;
  proto.set_producer_ms_per_row(rates.producer_ms_per_row);
  proto.set_consumer_ms_per_row(rates.consumer_ms_per_row);
  proto.set_local_ms_per_mib(rates.local_ms_per_mib);
  proto.set_store_ms_per_mib(rates.store_ms_per_mib);
  proto.set_fixed_ms(rates.fixed_ms);
  proto.set_samples(samples);
  return proto;
}

BlockBytes BlockPayloadBytes(const ModelConfig& config) {
  const uint64_t rows = 2 * static_cast<uint64_t>(config.kv_block_size) *
                        static_cast<uint64_t>(config.num_key_value_heads * config.head_dim) *
                        sizeof(float);
  return {.block_kv = static_cast<uint64_t>(config.num_block_kv_groups()) * rows,
          .swa = static_cast<uint64_t>(config.num_producer_layers()) * rows};
}

TieredHit PlanTieredHit(const HitPolicyInput& input, const TierLookups& tiers,
                        const BlockBytes& bytes) {
  const uint64_t block_kv_bytes = bytes.block_kv, swa_bytes = bytes.swa;
  // Both tiers as one: a block is there when either holds it.
  ChainLookup both;
  both.block_kv_blocks = std::max(tiers.local.block_kv_blocks, tiers.store.block_kv_blocks);
  for (int64_t b = 0; b < both.block_kv_blocks; ++b) {
    both.swa_present.push_back(HasSwa(tiers.local, b) || HasSwa(tiers.store, b));
  }
  TieredHit hit;
  hit.hit_blocks = HitBlocks(input, both);
  const HitReads reads = ReadsForHit(hit.hit_blocks, input.window, input.block_size);
  for (int64_t b = 0; b < reads.block_kv_end; ++b) {
    const bool local = Has(tiers.local, b);
    hit.local_blocks += local ? 1 : 0;
    (local ? hit.local_bytes : hit.store_bytes) += block_kv_bytes;
  }
  for (int64_t b = reads.producer_swa_begin; b < reads.producer_swa_end; ++b) {
    (HasSwa(tiers.local, b) ? hit.local_bytes : hit.store_bytes) += swa_bytes;
  }
  return hit;
}

PrefillCost PredictPrefill(const PrefillRates& rates, double queue_ms, const HitPolicyInput& input,
                           const TieredHit& hit, int64_t block_size) {
  const int64_t L = input.prompt_len, H = hit.hit_blocks * block_size;
  const int64_t s_keep = input.truncation_on ? std::max<int64_t>(0, L - input.keep) : 0;
  PrefillCost cost;
  cost.computed_rows = L - H;
  cost.replayed_rows = L - std::max(s_keep, H);
  cost.queue_ms = std::max(0.0, queue_ms);
  cost.load_ms = static_cast<double>(hit.local_bytes) / kMiB * rates.local_ms_per_mib +
                 static_cast<double>(hit.store_bytes) / kMiB * rates.store_ms_per_mib;
  cost.compute_ms = static_cast<double>(cost.computed_rows) * rates.producer_ms_per_row;
  cost.replay_ms = static_cast<double>(cost.replayed_rows) * rates.consumer_ms_per_row;
  cost.fixed_ms = rates.fixed_ms;
  return cost;
}

}  // namespace baton::kvstore
