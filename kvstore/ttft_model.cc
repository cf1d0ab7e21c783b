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

void WorkTimeFit::Add(double units, double ms) {
  if (!(std::isfinite(units) && std::isfinite(ms) && units > 0 && ms > 0)) return;
  if (weight_ >= kMinSamples) ms = std::min(ms, kClip * Predict(units));
  weight_ = keep_ * weight_ + 1;
  units_ = keep_ * units_ + units;
  ms_ = keep_ * ms_ + ms;
  // A sample's error relative to its time (no sample under 1 ms weighs more than one of 1 ms).
  const double w = 1 / std::max(1.0, ms * ms);
  w_ = keep_ * w_ + w;
  w_units_ = keep_ * w_units_ + w * units;
  w_units2_ = keep_ * w_units2_ + w * units * units;
  w_ms_ = keep_ * w_ms_ + w * ms;
  w_units_ms_ = keep_ * w_units_ms_ + w * units * ms;
  // The weighted variance of the work, times w_ squared.
  const double spread = w_ * w_units2_ - w_units_ * w_units_;
  if (weight_ >= kMinSamples && spread > kMinSpread * w_units_ * w_units_) {
    const double slope = (w_ * w_units_ms_ - w_units_ * w_ms_) / spread;
    const double intercept = (w_ms_ - slope * w_units_) / w_;
    if (slope > 0 && intercept >= 0) {
      per_unit_ms_ = slope;
      fixed_ms_ = intercept;
      return;
    }
  }
  per_unit_ms_ = ms_ / units_;
  fixed_ms_ = 0;
}

PrefillRates DefaultPrefillRates() {
  return {.compute_ms_per_gflop = 20,
          .local_ms_per_mib = 0.5,
          .store_ms_per_mib = 8.0,
          .fixed_ms = 20.0};
}

PrefillRates RatesOrDefaults(const v1::PrefillRates& reported) {
  const PrefillRates d = DefaultPrefillRates();
  return {.compute_ms_per_gflop = Or(reported.compute_ms_per_gflop(), d.compute_ms_per_gflop),
          .local_ms_per_mib = Or(reported.local_ms_per_mib(), d.local_ms_per_mib),
          .store_ms_per_mib = Or(reported.store_ms_per_mib(), d.store_ms_per_mib),
          .fixed_ms = Or(reported.fixed_ms(), d.fixed_ms)};
}

v1::PrefillRates ToProto(const PrefillRates& rates, uint32_t samples) {
  v1::PrefillRates proto;
  proto.set_compute_ms_per_gflop(rates.compute_ms_per_gflop);
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

// Visible (query, key) pairs of positions [0, n) under a window-W causal SWA: m(m + 1)/2 +
// (n - m)W with m = min(n, W) (model::SwaPrefixPairs).
double SwaPairs(int64_t n, int64_t window) {
  const double m = static_cast<double>(std::min(n, window));
  return m * (m + 1) / 2 + static_cast<double>(n - std::min(n, window)) * window;
}

PrefillWork EstimatePrefillWork(const ModelConfig& config, int64_t prompt_len,
                                int64_t computed_begin, int64_t replay_begin) {
  const double P = static_cast<double>(config.num_producer_layers());
  const double D = static_cast<double>(config.num_consumer_layers());
  const double G = static_cast<double>(config.num_block_kv_groups());
  const double d = static_cast<double>(config.hidden_size);
  const double inter = static_cast<double>(config.intermediate_size);
  const double q_dim = static_cast<double>(config.num_attention_heads * config.head_dim);
  const double kv_dim = static_cast<double>(config.num_key_value_heads * config.head_dim);
  // As model::EstimateWork: projections and the SwiGLU MLP of a row, q.k and p.v of a pair.
  const double row_flops = 2 * d * (q_dim + 2 * kv_dim) + 2 * q_dim * d + 6 * d * inter;
  const double pair_flops = 4 * q_dim;
  const double block_kv_flops = 2 * d * 2 * kv_dim;
  const int64_t L = prompt_len, W = config.sliding_window;
  const int64_t a = std::clamp<int64_t>(computed_begin, 0, L);
  const int64_t r = std::clamp<int64_t>(replay_begin, 0, L);
  const double computed = static_cast<double>(L - a), replayed = static_cast<double>(L - r);
  const double global_pairs =
      (static_cast<double>(L) * (L + 1) - static_cast<double>(r) * (r + 1)) / 2;
  PrefillWork work;
  work.computed_gflop =
      (P * (row_flops * computed + pair_flops * (SwaPairs(L, W) - SwaPairs(a, W))) +
       G * block_kv_flops * computed) /
      1e9;
  work.replayed_gflop =
      (D * (row_flops * replayed + pair_flops * (global_pairs + SwaPairs(L, W) - SwaPairs(r, W))) +
       2 * d * static_cast<double>(config.vocab_size)) /
      1e9;
  return work;
}

PrefillCost PredictPrefill(const PrefillRates& rates, double queue_ms, const HitPolicyInput& input,
                           const TieredHit& hit, const ModelConfig& config) {
  const int64_t L = input.prompt_len, H = hit.hit_blocks * input.block_size;
  const int64_t s_keep = input.truncation_on ? std::max<int64_t>(0, L - input.keep) : 0;
  PrefillCost cost;
  cost.computed_rows = L - H;
  cost.replayed_rows = L - std::max(s_keep, H);
  cost.queue_ms = std::max(0.0, queue_ms);
  cost.load_ms = static_cast<double>(hit.local_bytes) / kMiB * rates.local_ms_per_mib +
                 static_cast<double>(hit.store_bytes) / kMiB * rates.store_ms_per_mib;
  const PrefillWork work = EstimatePrefillWork(config, L, H, L - cost.replayed_rows);
  cost.compute_ms = work.computed_gflop * rates.compute_ms_per_gflop;
  cost.replay_elsewhere = rates.replays_elsewhere();
  cost.replay_ms = work.replayed_gflop *
                   (cost.replay_elsewhere ? rates.replay_ms_per_gflop : rates.compute_ms_per_gflop);
  cost.fixed_ms = rates.fixed_ms;
  return cost;
}

}  // namespace baton::kvstore
