#include "baton/model/ced_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "baton/kernels/attention.h"
#include "baton/kernels/elementwise.h"
#include "baton/kernels/gemm.h"

namespace baton::model {

// A run of consecutive positions of one request inside a batch. Its full rows (producers,
// boundary, block KV) are rows [row_offset, row_offset + rows) of the batch; its consumer rows
// are the last consumer_rows of those, at [consumer_offset, ...) of the consumer buffers.
struct CedModel::Segment {
  SequenceState* state = nullptr;
  int64_t q_start = 0;
  int64_t rows = 0;
  int64_t row_offset = 0;
  int64_t consumer_rows = 0;
  int64_t consumer_offset = 0;
  const int32_t* consumer_positions = nullptr;  // [consumer_rows]
  const int32_t* swa_lo = nullptr;              // [consumer_rows]
  const int32_t* consumer_slots = nullptr;      // [consumer_rows], -1: no ring write
};

namespace {

void CopyRow(const float* from, float* to, int64_t n) {
  std::memcpy(to, from, n * sizeof(float));
}

}  // namespace

CedModel::CedModel(CedWeights weights) : weights_(std::move(weights)) {}

absl::StatusOr<std::unique_ptr<CedModel>> CedModel::Load(const std::string& model_dir) {
  absl::StatusOr<CedWeights> weights = LoadCedWeights(model_dir);
  if (!weights.ok()) return weights.status();
  return std::make_unique<CedModel>(*std::move(weights));
}

void CedModel::RunLayers(std::span<const Segment> segments, const int32_t* tokens, int64_t rows,
                         const ProducerRowsCallback* on_producer_rows,
                         std::span<const int64_t> logit_rows, float* logits) const {
  using namespace kernels;
  const ModelConfig& c = config();
  const int64_t d = c.hidden_size, hd = c.head_dim;
  const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const int64_t q_dim = H * hd, kv_dim = Hkv * hd, inter = c.intermediate_size;
  const int64_t qkv_dim = q_dim + 2 * kv_dim;
  const int64_t C = c.ring_capacity(), W = c.sliding_window, B = c.kv_block_size;
  const int64_t D = c.num_consumer_layers();
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const StateLayout layout = state_layout();

  int64_t consumer_total = 0;
  std::vector<int32_t> positions(rows), producer_lo(rows);
  for (const Segment& seg : segments) {
    for (int64_t j = 0; j < seg.rows; ++j) {
      const int64_t pos = seg.q_start + j;
      positions[seg.row_offset + j] = static_cast<int32_t>(pos);
      producer_lo[seg.row_offset + j] = static_cast<int32_t>(ProducerLowerBound(pos, W));
    }
    consumer_total += seg.consumer_rows;
  }
  const int64_t max_rows = std::max(rows, consumer_total);
  std::vector<float> h(rows * d), x(max_rows * d), qkv(max_rows * qkv_dim);
  std::vector<float> attn(max_rows * q_dim), gate_up(max_rows * 2 * inter), act(max_rows * inter);
  std::vector<AttentionParams> attention(segments.size());

  // o_proj into the residual, then the SwiGLU MLP; shared by both layer groups.
  auto output_and_mlp = [&](float* hidden, int64_t n, const std::vector<float>& o,
                            const std::vector<float>& mlp_norm, const std::vector<float>& gate_up_w,
                            const std::vector<float>& down) {
    Gemm({.rows = n,
          .in = q_dim,
          .out = d,
          .x = attn.data(),
          .w = o.data(),
          .y = hidden,
          .beta = 1.0f});
    RmsNorm(
        {.rows = n, .dim = d, .x = hidden, .weight = mlp_norm.data(), .out = x.data(), .eps = eps});
    Gemm({.rows = n,
          .in = d,
          .out = 2 * inter,
          .x = x.data(),
          .w = gate_up_w.data(),
          .y = gate_up.data()});
    SwiGlu({.rows = n, .inter = inter, .gate_up = gate_up.data(), .out = act.data()});
    Gemm({.rows = n,
          .in = inter,
          .out = d,
          .x = act.data(),
          .w = down.data(),
          .y = hidden,
          .beta = 1.0f});
  };
  auto write_ring = [&](float* ring, int64_t layer, int64_t slot, const float* k, const float* v) {
    CopyRow(k, ring + layout.ring_k_offset(layer) + slot * kv_dim, kv_dim);
    CopyRow(v, ring + layout.ring_v_offset(layer) + slot * kv_dim, kv_dim);
  };

  // Attention over `n` rows whose q/k/v sit at qkv row `first`: SWA keys from `ring` (one
  // layer's K/V rings) before tail_start and from these rows after it.
  auto swa_attention = [&](int64_t n, int64_t first, const int32_t* row_positions,
                           const int32_t* lo, const float* ring, int64_t layer, int64_t tail_start,
                           const BlockKvSource* global_source) {
    const float* row0 = qkv.data() + first * qkv_dim;
    return AttentionParams{.rows = n,
                           .num_heads = H,
                           .num_kv_heads = Hkv,
                           .head_dim = hd,
                           .scale = scale,
                           .q = row0,
                           .q_stride = qkv_dim,
                           .out = attn.data() + first * q_dim,
                           .positions = row_positions,
                           .swa_lo = lo,
                           .swa = {.ring_k = ring + layout.ring_k_offset(layer),
                                   .ring_v = ring + layout.ring_v_offset(layer),
                                   .ring_capacity = C,
                                   .tail_k = row0 + q_dim,
                                   .tail_v = row0 + q_dim + kv_dim,
                                   .tail_stride = qkv_dim,
                                   .tail_start = tail_start},
                           .global = global_source};
  };

  Embedding(
      {.rows = rows, .dim = d, .table = weights_.embed.data(), .ids = tokens, .out = h.data()});

  // Producer layers: window-W SWA over every row; a segment's last C rows enter the ring.
  for (int64_t l = 0; l < c.num_producer_layers(); ++l) {
    const ProducerLayerWeights& w = weights_.producers[l];
    RmsNorm({.rows = rows,
             .dim = d,
             .x = h.data(),
             .weight = w.attn_norm.data(),
             .out = x.data(),
             .eps = eps});
    Gemm(
        {.rows = rows, .in = d, .out = qkv_dim, .x = x.data(), .w = w.qkv.data(), .y = qkv.data()});
    Rope({.rows = rows,
          .heads = H + Hkv,
          .head_dim = hd,
          .x = qkv.data(),
          .stride = qkv_dim,
          .positions = positions.data(),
          .theta = c.rope_theta});
    for (size_t s = 0; s < segments.size(); ++s) {
      const Segment& seg = segments[s];
      const float* row0 = qkv.data() + seg.row_offset * qkv_dim;
      if (on_producer_rows != nullptr && *on_producer_rows) {
        (*on_producer_rows)(l, seg.q_start, seg.rows, row0 + q_dim, row0 + q_dim + kv_dim, qkv_dim);
      }
      attention[s] = swa_attention(seg.rows, seg.row_offset, positions.data() + seg.row_offset,
                                   producer_lo.data() + seg.row_offset, seg.state->producer_swa(),
                                   l, seg.q_start, nullptr);
    }
    Attention(attention);
    // Ring writes come after attention: a new row may take the slot of a key still being read.
    for (const Segment& seg : segments) {
      for (int64_t j = std::max<int64_t>(0, seg.rows - C); j < seg.rows; ++j) {
        const float* row = qkv.data() + (seg.row_offset + j) * qkv_dim;
        write_ring(seg.state->producer_swa(), l, (seg.q_start + j) % C, row + q_dim,
                   row + q_dim + kv_dim);
      }
    }
    output_and_mlp(h.data(), rows, w.o, w.mlp_norm, w.gate_up, w.down);
  }

  // Boundary (layer P): shared rows s over every row, and from them every consumer layer's
  // block KV, which is therefore exact whatever the truncation (seed 9.2.2).
  const int64_t global_dim = D * 2 * kv_dim;
  std::vector<float> shared(rows * d), global(rows * global_dim);
  RmsNorm({.rows = rows,
           .dim = d,
           .x = h.data(),
           .weight = weights_.consumers[0].attn_norm.data(),
           .out = shared.data(),
           .eps = eps});
  Gemm({.rows = rows,
        .in = d,
        .out = global_dim,
        .x = shared.data(),
        .w = weights_.global_kv.data(),
        .y = global.data()});
  for (int64_t l = 0; l < D; ++l) {
    Rope({.rows = rows,
          .heads = Hkv,
          .head_dim = hd,
          .x = global.data() + l * 2 * kv_dim,
          .stride = global_dim,
          .positions = positions.data(),
          .theta = c.rope_theta});
  }
  for (const Segment& seg : segments) {
    const std::vector<float*>& pages = seg.state->pages();
    for (int64_t j = 0; j < seg.rows; ++j) {
      const int64_t pos = seg.q_start + j;
      float* page = pages[pos / B];
      const float* row = global.data() + (seg.row_offset + j) * global_dim;
      for (int64_t l = 0; l < D; ++l) {
        CopyRow(row + l * 2 * kv_dim, page + layout.page_k_offset(l) + (pos % B) * kv_dim, kv_dim);
        CopyRow(row + l * 2 * kv_dim + kv_dim, page + layout.page_v_offset(l) + (pos % B) * kv_dim,
                kv_dim);
      }
    }
  }
  if (consumer_total == 0) return;

  // Consumer layers over each segment's consumer rows (the last rows of the segment).
  std::vector<float> hc(consumer_total * d), sc(consumer_total * d);
  for (const Segment& seg : segments) {
    const int64_t first = seg.row_offset + seg.rows - seg.consumer_rows;
    CopyRow(h.data() + first * d, hc.data() + seg.consumer_offset * d, seg.consumer_rows * d);
    CopyRow(shared.data() + first * d, sc.data() + seg.consumer_offset * d, seg.consumer_rows * d);
  }
  std::vector<int32_t> consumer_positions(consumer_total);
  for (const Segment& seg : segments) {
    std::copy_n(seg.consumer_positions, seg.consumer_rows,
                consumer_positions.begin() + seg.consumer_offset);
  }
  for (int64_t l = 0; l < D; ++l) {
    const ConsumerLayerWeights& w = weights_.consumers[l];
    RmsNorm({.rows = consumer_total,
             .dim = d,
             .x = hc.data(),
             .weight = w.attn_norm.data(),
             .out = x.data(),
             .eps = eps});
    if (!c.yoco_swa_share_hidden) {
      Gemm({.rows = consumer_total,
            .in = d,
            .out = qkv_dim,
            .x = x.data(),
            .w = w.q_swa_kv.data(),
            .y = qkv.data()});
    } else {
      // SWA K/V from the shared boundary rows instead of this layer's own input.
      Gemm({.rows = consumer_total,
            .in = d,
            .out = q_dim,
            .x = x.data(),
            .w = w.q_swa_kv.data(),
            .y = qkv.data(),
            .y_stride = qkv_dim});
      Gemm({.rows = consumer_total,
            .in = d,
            .out = 2 * kv_dim,
            .x = sc.data(),
            .w = w.q_swa_kv.data() + q_dim * d,
            .y = qkv.data() + q_dim,
            .y_stride = qkv_dim});
    }
    Rope({.rows = consumer_total,
          .heads = H + Hkv,
          .head_dim = hd,
          .x = qkv.data(),
          .stride = qkv_dim,
          .positions = consumer_positions.data(),
          .theta = c.rope_theta});
    std::vector<BlockKvSource> block_kv(segments.size());
    for (size_t s = 0; s < segments.size(); ++s) {
      const Segment& seg = segments[s];
      block_kv[s] = {.pages = seg.state->pages().data(),
                     .block_size = B,
                     .k_offset = layout.page_k_offset(l),
                     .v_offset = layout.page_v_offset(l)};
      attention[s] =
          swa_attention(seg.consumer_rows, seg.consumer_offset, seg.consumer_positions, seg.swa_lo,
                        seg.state->consumer_swa(), l,
                        seg.consumer_rows > 0 ? seg.consumer_positions[0] : 0, &block_kv[s]);
    }
    Attention(attention);
    for (const Segment& seg : segments) {
      for (int64_t r = 0; r < seg.consumer_rows; ++r) {
        if (seg.consumer_slots[r] < 0) continue;
        const float* row = qkv.data() + (seg.consumer_offset + r) * qkv_dim;
        write_ring(seg.state->consumer_swa(), l, seg.consumer_slots[r], row + q_dim,
                   row + q_dim + kv_dim);
      }
    }
    output_and_mlp(hc.data(), consumer_total, w.o, w.mlp_norm, w.gate_up, w.down);
  }

  // Logits of the requested consumer rows.
  const int64_t n = static_cast<int64_t>(logit_rows.size());
  if (n == 0) return;
  std::vector<float> final_rows(n * d);
  for (int64_t i = 0; i < n; ++i)
    CopyRow(hc.data() + logit_rows[i] * d, final_rows.data() + i * d, d);
  RmsNorm({.rows = n,
           .dim = d,
           .x = final_rows.data(),
           .weight = weights_.final_norm.data(),
           .out = final_rows.data(),
           .eps = eps});
  Gemm({.rows = n,
        .in = d,
        .out = c.vocab_size,
        .x = final_rows.data(),
        .w = weights_.lm_head_data(),
        .y = logits});
}

absl::StatusOr<PrefillResult> CedModel::Prefill(std::span<const int32_t> tokens,
                                                const PrefillOptions& options,
                                                SequenceState& state) const {
  absl::StatusOr<PrefillSchedule> schedule =
      SchedulePrefill(config(), tokens, options, state.length);
  if (!schedule.ok()) return schedule.status();
  const int64_t L = static_cast<int64_t>(tokens.size());
  if (absl::Status s = state.EnsurePages(L); !s.ok()) return s;

  const ProducerRowsCallback* callback = &options.on_producer_rows;
  PrefillResult result;
  result.consumer_rows = schedule->plan.total_consumer_rows();
  const int64_t V = config().vocab_size;
  for (const PrefillRun& run : schedule->runs) {
    if (options.cancelled && options.cancelled()) return PrefillCancelled(run.q_start, L);
    Segment seg{.state = &state, .q_start = run.q_start, .rows = run.rows};
    if (run.chunk >= 0) {
      const ChunkPlan& chunk_plan = schedule->plan.chunks[run.chunk];
      seg.consumer_rows = static_cast<int64_t>(chunk_plan.consumer_positions.size());
      seg.consumer_positions = chunk_plan.consumer_positions.data();
      seg.swa_lo = chunk_plan.swa_lo.data();
      seg.consumer_slots = chunk_plan.consumer_slots.data();
    }
    const bool streamed = options.on_result_logits != nullptr && options.result_logits;
    if (streamed && !run.logit_rows.empty()) result.logits.clear();  // one chunk at a time
    const size_t old = result.logits.size();
    result.logits.resize(old + run.logit_rows.size() * V);
    RunLayers({&seg, 1}, tokens.data() + run.q_start, run.rows, callback, run.logit_rows,
              result.logits.data() + old);
    for (size_t i = 0; i < run.logit_rows.size(); ++i) {
      const int64_t position = seg.consumer_positions[run.logit_rows[i]];
      if (streamed) {
        options.on_result_logits(position, {result.logits.data() + i * V, static_cast<size_t>(V)});
      } else {
        result.positions.push_back(position);
      }
    }
    if (streamed && !run.logit_rows.empty()) {
      // Keep the last row only: the sampled one.
      result.logits.erase(result.logits.begin(), result.logits.end() - V);
      result.positions = {seg.consumer_positions[run.logit_rows.back()]};
    }
  }
  state.length = L;
  state.s_valid = options.s_valid;
  return result;
}

absl::Status CedModel::Decode(std::span<const DecodeItem> batch) const {
  const int64_t n = static_cast<int64_t>(batch.size());
  std::vector<int32_t> tokens(n);
  std::vector<DecodeRow> rows(n);
  std::vector<Segment> segments(n);
  std::vector<int64_t> logit_rows(n);
  for (int64_t i = 0; i < n; ++i) {
    const DecodeItem& item = batch[i];
    if (item.state == nullptr || item.logits == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("decode item ", i, " has no state or logits"));
    }
    absl::StatusOr<DecodeRow> row =
        ScheduleDecodeRow(config(), i, item.token, item.state->length, item.state->s_valid);
    if (!row.ok()) return row.status();
    if (absl::Status s = item.state->EnsurePages(row->position + 1); !s.ok()) return s;
    tokens[i] = item.token;
    rows[i] = *row;
    segments[i] = {.state = item.state,
                   .q_start = row->position,
                   .rows = 1,
                   .row_offset = i,
                   .consumer_rows = 1,
                   .consumer_offset = i,
                   .consumer_positions = &rows[i].position,
                   .swa_lo = &rows[i].swa_lo,
                   .consumer_slots = &rows[i].slot};
    logit_rows[i] = i;
  }
  std::vector<float> logits(n * config().vocab_size);
  RunLayers(segments, tokens.data(), n, nullptr, logit_rows, logits.data());
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(logits.data() + i * config().vocab_size, config().vocab_size, batch[i].logits);
    batch[i].state->length += 1;
  }
  return absl::OkStatus();
}

}  // namespace baton::model

namespace baton::model {

int32_t Argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace baton::model
