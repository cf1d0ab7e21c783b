#include "baton/model/cuda/cuda_ced_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "baton/kernels/cuda/ops.h"

namespace baton::model::cuda {

using kernels::cuda::Context;
using kernels::cuda::DeviceArray;
using kernels::cuda::DeviceStatePool;

// ---------------------------------------------------------------------------------------------
// CudaSequenceState

CudaSequenceState::CudaSequenceState(Context& ctx, const StateLayout& layout, DeviceStatePool* pool)
    : ctx_(ctx), layout_(layout), pool_(pool) {}

absl::StatusOr<std::unique_ptr<CudaSequenceState>> CudaSequenceState::Create(
    Context& ctx, const StateLayout& layout, DeviceStatePool* pool) {
  std::unique_ptr<CudaSequenceState> state(new CudaSequenceState(ctx, layout, pool));
  const int64_t ring_floats = layout.producer_swa_floats() + layout.consumer_swa_floats();
  if (pool != nullptr) {
    if (pool->options().slot_floats != ring_floats ||
        pool->options().page_floats != layout.page_floats()) {
      return absl::InvalidArgumentError(
          absl::StrCat("device state pool holds slots of ", pool->options().slot_floats,
                       " floats and pages of ", pool->options().page_floats, "; this model needs ",
                       ring_floats, " and ", layout.page_floats()));
    }
    std::optional<int64_t> slot = pool->AllocateSlot();
    if (!slot) return absl::ResourceExhaustedError("device state pool has no free slot");
    state->pool_slot_ = *slot;
    state->producer_swa_ = pool->producer_rings(*slot);
  } else {
    state->owned_rings_ = DeviceArray<float>(ctx, ring_floats);
    if (!state->owned_rings_.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", ring_floats, " floats of device rings"));
    }
    state->producer_swa_ = state->owned_rings_.data();
  }
  state->consumer_swa_ = state->producer_swa_ + layout.producer_swa_floats();
  ctx.Memset(state->producer_swa_, 0, ring_floats * sizeof(float));
  return state;
}

CudaSequenceState::~CudaSequenceState() {
  // Kernels still queued may read these pages: wait before handing them back.
  (void)ctx_.Synchronize();
  for (float* page : pages_) {
    if (pool_ != nullptr) {
      pool_->FreePage(page);
    } else {
      ctx_.Free(page);
    }
  }
  if (pool_ != nullptr && pool_slot_ >= 0) pool_->FreeSlot(pool_slot_);
}

absl::Status CudaSequenceState::EnsurePages(int64_t positions) {
  const int64_t needed = (positions + layout_.block_size - 1) / layout_.block_size;
  const size_t held = pages_.size();
  while (static_cast<int64_t>(pages_.size()) < needed) {
    float* page = pool_ != nullptr
                      ? pool_->AllocatePage()
                      : static_cast<float*>(ctx_.Malloc(layout_.page_floats() * sizeof(float)));
    if (page == nullptr) {
      (void)ctx_.Synchronize();  // clears the failed cudaMalloc from the context's error
      return absl::ResourceExhaustedError(absl::StrCat("no device memory for block-KV page ",
                                                       pages_.size(), " (", needed, " pages cover ",
                                                       positions, " positions)"));
    }
    pages_.push_back(page);
  }
  if (pages_.size() == held) return absl::OkStatus();
  if (page_table_.size() < pages_.size()) {
    page_table_ = DeviceArray<float*>(ctx_, std::max<size_t>(2 * page_table_.size(), needed));
    if (!page_table_.ok()) return absl::ResourceExhaustedError("no device memory for a page table");
  }
  ctx_.CopyToDevice(page_table_.data(), pages_.data(), pages_.size() * sizeof(float*));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// CudaCedModel

// CedWeights' buffers (stacked the same way) in device memory.
struct CudaCedModel::DeviceWeights {
  struct Layer {
    DeviceArray<float> attn_norm, qkv, o, mlp_norm, gate_up, down;  // qkv: q_swa_kv in consumers
  };
  DeviceArray<float> embed, global_kv, final_norm, lm_head;
  std::vector<Layer> producers, consumers;
  const float* lm_head_data(bool tied) const { return tied ? embed.data() : lm_head.data(); }
};

// As CedModel::Segment, with host metadata that RunLayers uploads.
struct CudaCedModel::Segment {
  CudaSequenceState* state = nullptr;
  int64_t q_start = 0;
  int64_t rows = 0;
  int64_t row_offset = 0;
  int64_t consumer_rows = 0;
  int64_t consumer_offset = 0;
  const int32_t* consumer_positions = nullptr;  // host [consumer_rows]
  const int32_t* swa_lo = nullptr;              // host [consumer_rows]
  const int32_t* consumer_slots = nullptr;      // host [consumer_rows], -1: no ring write
};

namespace {

// Scratch buffer indices of CudaCedModel::Scratch.
enum ScratchBuffer : size_t {
  kHidden,
  kX,
  kQkv,
  kAttn,
  kGateUp,
  kAct,
  kShared,
  kGlobal,
  kConsumerHidden,
  kConsumerShared,
  kFinal,
  kFinalNormed,
  kLogits,
};

}  // namespace

CudaCedModel::CudaCedModel(std::unique_ptr<Context> ctx, const CedWeights& weights)
    : ctx_(std::move(ctx)),
      config_(weights.config),
      fingerprint_(weights.fingerprint),
      weights_(std::make_unique<DeviceWeights>()) {}

CudaCedModel::~CudaCedModel() {
  (void)ctx_->Synchronize();
}

absl::StatusOr<std::unique_ptr<CudaCedModel>> CudaCedModel::Create(const CedWeights& weights,
                                                                   int device) {
  if (kernels::cuda::DeviceCount() == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device: ", kernels::cuda::NoDeviceReason()));
  }
  absl::StatusOr<std::unique_ptr<Context>> ctx = Context::Create(device);
  if (!ctx.ok()) return ctx.status();
  std::unique_ptr<CudaCedModel> model(new CudaCedModel(*std::move(ctx), weights));
  if (absl::Status s = model->Upload(weights); !s.ok()) return s;
  return model;
}

absl::StatusOr<std::unique_ptr<CudaCedModel>> CudaCedModel::Load(const std::string& model_dir,
                                                                 int device) {
  absl::StatusOr<CedWeights> weights = LoadCedWeights(model_dir);
  if (!weights.ok()) return weights.status();
  return Create(*weights, device);
}

absl::Status CudaCedModel::Upload(const CedWeights& w) {
  bool ok = true;
  auto upload = [&](const std::vector<float>& host) {
    DeviceArray<float> device(*ctx_, host.size());
    ok = ok && device.ok();
    if (device.ok()) ctx_->CopyToDevice(device.data(), host.data(), host.size() * sizeof(float));
    return device;
  };
  DeviceWeights& d = *weights_;
  d.embed = upload(w.embed);
  d.global_kv = upload(w.global_kv);
  d.final_norm = upload(w.final_norm);
  d.lm_head = upload(w.lm_head);
  for (const ProducerLayerWeights& l : w.producers) {
    d.producers.push_back({upload(l.attn_norm), upload(l.qkv), upload(l.o), upload(l.mlp_norm),
                           upload(l.gate_up), upload(l.down)});
  }
  for (const ConsumerLayerWeights& l : w.consumers) {
    d.consumers.push_back({upload(l.attn_norm), upload(l.q_swa_kv), upload(l.o), upload(l.mlp_norm),
                           upload(l.gate_up), upload(l.down)});
  }
  absl::Status synced = ctx_->Synchronize();
  if (!ok) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the model's weights do not fit in device memory: ", synced.message()));
  }
  return synced;
}

absl::StatusOr<std::unique_ptr<CudaSequenceState>> CudaCedModel::NewState(DeviceStatePool* pool) {
  return CudaSequenceState::Create(*ctx_, state_layout(), pool);
}

float* CudaCedModel::Scratch(size_t which, size_t count) {
  DeviceArray<float>& buffer = scratch_[which];
  if (buffer.size() < count) {
    const size_t grown = std::max<size_t>(count, 2 * buffer.size());
    buffer = DeviceArray<float>();  // free first, so that the old and new never coexist
    buffer = DeviceArray<float>(*ctx_, grown);
  }
  return buffer.data();
}

absl::Status CudaCedModel::RunLayers(std::span<const Segment> segments, const int32_t* tokens,
                                     int64_t rows, const ProducerRowsCallback* on_producer_rows,
                                     std::span<const int64_t> logit_rows, float* logits) {
  namespace kc = kernels::cuda;
  using kernels::AttentionParams;
  using kernels::BlockKvSource;
  Context& ctx = *ctx_;
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, hd = c.head_dim;
  const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const int64_t q_dim = H * hd, kv_dim = Hkv * hd, inter = c.intermediate_size;
  const int64_t qkv_dim = q_dim + 2 * kv_dim;
  const int64_t C = c.ring_capacity(), W = c.sliding_window, B = c.kv_block_size;
  const int64_t D = c.num_consumer_layers(), V = c.vocab_size;
  const int64_t global_dim = D * 2 * kv_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const StateLayout layout = state_layout();
  const int64_t n_logits = static_cast<int64_t>(logit_rows.size());

  // Every per-row integer the kernels read, planned here on the host and uploaded at once:
  // tokens, positions, producer SWA bounds and ring slots (the segment's last C rows) over
  // all rows; consumer positions, SWA bounds and ring slots (the plan's) over consumer rows;
  // the consumer rows whose logits are wanted.
  int64_t consumer_total = 0;
  for (const Segment& seg : segments) consumer_total += seg.consumer_rows;
  const int64_t off_tokens = 0, off_positions = rows, off_producer_lo = 2 * rows,
                off_producer_slots = 3 * rows, off_consumer_positions = 4 * rows,
                off_consumer_lo = off_consumer_positions + consumer_total,
                off_consumer_slots = off_consumer_lo + consumer_total,
                off_logit_rows = off_consumer_slots + consumer_total,
                metadata_count = off_logit_rows + n_logits;
  std::vector<int32_t> meta(metadata_count);
  std::copy_n(tokens, rows, meta.begin() + off_tokens);
  for (const Segment& seg : segments) {
    for (int64_t j = 0; j < seg.rows; ++j) {
      const int64_t pos = seg.q_start + j, r = seg.row_offset + j;
      meta[off_positions + r] = static_cast<int32_t>(pos);
      meta[off_producer_lo + r] = static_cast<int32_t>(ProducerLowerBound(pos, W));
      // Producer rings take the segment's last C rows (no two of them share a slot).
      meta[off_producer_slots + r] = j >= seg.rows - C ? static_cast<int32_t>(pos % C) : -1;
    }
    std::copy_n(seg.consumer_positions, seg.consumer_rows,
                meta.begin() + off_consumer_positions + seg.consumer_offset);
    std::copy_n(seg.swa_lo, seg.consumer_rows,
                meta.begin() + off_consumer_lo + seg.consumer_offset);
    std::copy_n(seg.consumer_slots, seg.consumer_rows,
                meta.begin() + off_consumer_slots + seg.consumer_offset);
  }
  for (int64_t i = 0; i < n_logits; ++i) {
    meta[off_logit_rows + i] = static_cast<int32_t>(logit_rows[i]);
  }
  if (metadata_.size() < meta.size()) {
    metadata_ = DeviceArray<int32_t>();
    metadata_ = DeviceArray<int32_t>(ctx, std::max<size_t>(meta.size(), 1024));
  }
  int32_t* const dmeta = metadata_.data();
  if (dmeta == nullptr) return absl::ResourceExhaustedError("no device memory for step metadata");
  ctx.CopyToDevice(dmeta, meta.data(), meta.size() * sizeof(int32_t));

  const int64_t max_rows = std::max(rows, consumer_total);
  float* const h = Scratch(kHidden, rows * d);
  float* const x = Scratch(kX, max_rows * d);
  float* const qkv = Scratch(kQkv, max_rows * qkv_dim);
  float* const attn = Scratch(kAttn, max_rows * q_dim);
  float* const gate_up = Scratch(kGateUp, max_rows * 2 * inter);
  float* const act = Scratch(kAct, max_rows * inter);
  float* const shared = Scratch(kShared, rows * d);
  float* const global = Scratch(kGlobal, rows * global_dim);
  float* const hc = Scratch(kConsumerHidden, std::max<int64_t>(consumer_total, 1) * d);
  float* const sc = Scratch(kConsumerShared, std::max<int64_t>(consumer_total, 1) * d);
  float* const final_rows = Scratch(kFinal, std::max<int64_t>(n_logits, 1) * d);
  float* const final_normed = Scratch(kFinalNormed, std::max<int64_t>(n_logits, 1) * d);
  float* const device_logits = Scratch(kLogits, std::max<int64_t>(n_logits, 1) * V);
  for (const DeviceArray<float>& buffer : scratch_) {
    if (buffer.data() == nullptr) {
      (void)ctx.Synchronize();
      return absl::ResourceExhaustedError("no device memory for the forward pass's activations");
    }
  }
  std::vector<AttentionParams> attention(segments.size());
  std::vector<BlockKvSource> block_kv(segments.size());

  // o_proj into the residual, then the SwiGLU MLP; shared by both layer groups.
  auto output_and_mlp = [&](float* hidden, int64_t n, const DeviceWeights::Layer& w) {
    kc::Gemm(
        ctx,
        {.rows = n, .in = q_dim, .out = d, .x = attn, .w = w.o.data(), .y = hidden, .beta = 1.0f});
    kc::RmsNorm(
        ctx, {.rows = n, .dim = d, .x = hidden, .weight = w.mlp_norm.data(), .out = x, .eps = eps});
    kc::Gemm(ctx,
             {.rows = n, .in = d, .out = 2 * inter, .x = x, .w = w.gate_up.data(), .y = gate_up});
    kc::SwiGlu(ctx, {.rows = n, .inter = inter, .gate_up = gate_up, .out = act});
    kc::Gemm(ctx, {.rows = n,
                   .in = inter,
                   .out = d,
                   .x = act,
                   .w = w.down.data(),
                   .y = hidden,
                   .beta = 1.0f});
  };
  // K and V of `n` qkv rows from `first` into one layer's rings; index -1 writes nothing.
  auto write_ring = [&](float* ring, int64_t layer, int64_t n, int64_t first,
                        const int32_t* slots) {
    const float* row0 = qkv + first * qkv_dim;
    kc::ScatterRows(ctx, {.rows = n,
                          .width = kv_dim,
                          .src = row0 + q_dim,
                          .src_stride = qkv_dim,
                          .index = slots,
                          .dst = ring + layout.ring_k_offset(layer),
                          .dst_stride = kv_dim});
    kc::ScatterRows(ctx, {.rows = n,
                          .width = kv_dim,
                          .src = row0 + q_dim + kv_dim,
                          .src_stride = qkv_dim,
                          .index = slots,
                          .dst = ring + layout.ring_v_offset(layer),
                          .dst_stride = kv_dim});
  };
  // As CedModel's: SWA keys from `ring` before tail_start and from these rows after it.
  auto swa_attention = [&](int64_t n, int64_t first, const int32_t* row_positions,
                           const int32_t* lo, const float* ring, int64_t layer, int64_t tail_start,
                           const BlockKvSource* global_source) {
    const float* row0 = qkv + first * qkv_dim;
    return AttentionParams{.rows = n,
                           .num_heads = H,
                           .num_kv_heads = Hkv,
                           .head_dim = hd,
                           .scale = scale,
                           .q = row0,
                           .q_stride = qkv_dim,
                           .out = attn + first * q_dim,
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

  const DeviceWeights& wt = *weights_;
  kc::Embedding(
      ctx, {.rows = rows, .dim = d, .table = wt.embed.data(), .ids = dmeta + off_tokens, .out = h});

  // Producer layers: window-W SWA over every row; a segment's last C rows enter the ring.
  std::vector<float> host_rows;
  for (int64_t l = 0; l < c.num_producer_layers(); ++l) {
    const DeviceWeights::Layer& w = wt.producers[l];
    kc::RmsNorm(
        ctx, {.rows = rows, .dim = d, .x = h, .weight = w.attn_norm.data(), .out = x, .eps = eps});
    kc::Gemm(ctx, {.rows = rows, .in = d, .out = qkv_dim, .x = x, .w = w.qkv.data(), .y = qkv});
    kc::Rope(ctx, {.rows = rows,
                   .heads = H + Hkv,
                   .head_dim = hd,
                   .x = qkv,
                   .stride = qkv_dim,
                   .positions = dmeta + off_positions,
                   .theta = c.rope_theta});
    for (size_t s = 0; s < segments.size(); ++s) {
      const Segment& seg = segments[s];
      if (on_producer_rows != nullptr && *on_producer_rows) {
        host_rows.resize(seg.rows * qkv_dim);
        ctx.CopyToHost(host_rows.data(), qkv + seg.row_offset * qkv_dim,
                       host_rows.size() * sizeof(float));
        if (absl::Status st = ctx.Synchronize(); !st.ok()) return st;
        (*on_producer_rows)(l, seg.q_start, seg.rows, host_rows.data() + q_dim,
                            host_rows.data() + q_dim + kv_dim, qkv_dim);
      }
      attention[s] = swa_attention(seg.rows, seg.row_offset, dmeta + off_positions + seg.row_offset,
                                   dmeta + off_producer_lo + seg.row_offset,
                                   seg.state->producer_swa(), l, seg.q_start, nullptr);
    }
    kc::Attention(ctx, attention);
    // Ring writes come after attention: a new row may take the slot of a key still being read.
    for (const Segment& seg : segments) {
      write_ring(seg.state->producer_swa(), l, seg.rows, seg.row_offset,
                 dmeta + off_producer_slots + seg.row_offset);
    }
    output_and_mlp(h, rows, w);
  }

  // Boundary (layer P): shared rows s over every row, and from them every consumer layer's
  // block KV, which is therefore exact whatever the truncation (seed 9.2.2).
  kc::RmsNorm(ctx, {.rows = rows,
                    .dim = d,
                    .x = h,
                    .weight = wt.consumers[0].attn_norm.data(),
                    .out = shared,
                    .eps = eps});
  kc::Gemm(ctx, {.rows = rows,
                 .in = d,
                 .out = global_dim,
                 .x = shared,
                 .w = wt.global_kv.data(),
                 .y = global});
  for (int64_t l = 0; l < D; ++l) {
    kc::Rope(ctx, {.rows = rows,
                   .heads = Hkv,
                   .head_dim = hd,
                   .x = global + l * 2 * kv_dim,
                   .stride = global_dim,
                   .positions = dmeta + off_positions,
                   .theta = c.rope_theta});
  }
  for (const Segment& seg : segments) {
    const float* row0 = global + seg.row_offset * global_dim;
    for (int64_t l = 0; l < D; ++l) {
      for (const bool is_v : {false, true}) {
        kc::WriteBlockKv(ctx, {.rows = seg.rows,
                               .width = kv_dim,
                               .src = row0 + l * 2 * kv_dim + (is_v ? kv_dim : 0),
                               .src_stride = global_dim,
                               .positions = dmeta + off_positions + seg.row_offset,
                               .pages = seg.state->device_page_table(),
                               .block_size = B,
                               .offset = is_v ? layout.page_v_offset(l) : layout.page_k_offset(l)});
      }
    }
  }
  if (consumer_total == 0) return ctx.Synchronize();

  // Consumer layers over each segment's consumer rows (the last rows of the segment).
  for (const Segment& seg : segments) {
    const int64_t first = seg.row_offset + seg.rows - seg.consumer_rows;
    ctx.CopyOnDevice(hc + seg.consumer_offset * d, h + first * d,
                     seg.consumer_rows * d * sizeof(float));
    ctx.CopyOnDevice(sc + seg.consumer_offset * d, shared + first * d,
                     seg.consumer_rows * d * sizeof(float));
  }
  const int32_t* const consumer_positions = dmeta + off_consumer_positions;
  for (int64_t l = 0; l < D; ++l) {
    const DeviceWeights::Layer& w = wt.consumers[l];
    kc::RmsNorm(ctx, {.rows = consumer_total,
                      .dim = d,
                      .x = hc,
                      .weight = w.attn_norm.data(),
                      .out = x,
                      .eps = eps});
    if (!c.yoco_swa_share_hidden) {
      kc::Gemm(
          ctx,
          {.rows = consumer_total, .in = d, .out = qkv_dim, .x = x, .w = w.qkv.data(), .y = qkv});
    } else {
      // SWA K/V from the shared boundary rows instead of this layer's own input.
      kc::Gemm(ctx, {.rows = consumer_total,
                     .in = d,
                     .out = q_dim,
                     .x = x,
                     .w = w.qkv.data(),
                     .y = qkv,
                     .y_stride = qkv_dim});
      kc::Gemm(ctx, {.rows = consumer_total,
                     .in = d,
                     .out = 2 * kv_dim,
                     .x = sc,
                     .w = w.qkv.data() + q_dim * d,
                     .y = qkv + q_dim,
                     .y_stride = qkv_dim});
    }
    kc::Rope(ctx, {.rows = consumer_total,
                   .heads = H + Hkv,
                   .head_dim = hd,
                   .x = qkv,
                   .stride = qkv_dim,
                   .positions = consumer_positions,
                   .theta = c.rope_theta});
    for (size_t s = 0; s < segments.size(); ++s) {
      const Segment& seg = segments[s];
      block_kv[s] = {.pages = seg.state->device_page_table(),
                     .block_size = B,
                     .k_offset = layout.page_k_offset(l),
                     .v_offset = layout.page_v_offset(l)};
      attention[s] = swa_attention(
          seg.consumer_rows, seg.consumer_offset, consumer_positions + seg.consumer_offset,
          dmeta + off_consumer_lo + seg.consumer_offset, seg.state->consumer_swa(), l,
          seg.consumer_rows > 0 ? seg.consumer_positions[0] : 0, &block_kv[s]);
    }
    kc::Attention(ctx, attention);
    for (const Segment& seg : segments) {
      write_ring(seg.state->consumer_swa(), l, seg.consumer_rows, seg.consumer_offset,
                 dmeta + off_consumer_slots + seg.consumer_offset);
    }
    output_and_mlp(hc, consumer_total, w);
  }

  // Logits of the requested consumer rows.
  if (n_logits == 0) return ctx.Synchronize();
  kc::GatherRows(ctx, {.rows = n_logits,
                       .width = d,
                       .src = hc,
                       .src_stride = d,
                       .index = dmeta + off_logit_rows,
                       .dst = final_rows,
                       .dst_stride = d});
  kc::RmsNorm(ctx, {.rows = n_logits,
                    .dim = d,
                    .x = final_rows,
                    .weight = wt.final_norm.data(),
                    .out = final_normed,
                    .eps = eps});
  kc::Gemm(ctx, {.rows = n_logits,
                 .in = d,
                 .out = V,
                 .x = final_normed,
                 .w = wt.lm_head_data(c.tie_word_embeddings),
                 .y = device_logits});
  ctx.CopyToHost(logits, device_logits, n_logits * V * sizeof(float));
  return ctx.Synchronize();
}

absl::StatusOr<PrefillResult> CudaCedModel::Prefill(std::span<const int32_t> tokens,
                                                    const PrefillOptions& options,
                                                    CudaSequenceState& state) {
  absl::StatusOr<PrefillSchedule> schedule =
      SchedulePrefill(config_, tokens, options, state.length);
  if (!schedule.ok()) return schedule.status();
  const int64_t L = static_cast<int64_t>(tokens.size());
  if (absl::Status s = state.EnsurePages(L); !s.ok()) return s;

  const ProducerRowsCallback* callback = &options.on_producer_rows;
  PrefillResult result;
  result.consumer_rows = schedule->plan.total_consumer_rows();
  const int64_t V = config_.vocab_size;
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
    const size_t old = result.logits.size();
    result.logits.resize(old + run.logit_rows.size() * V);
    if (absl::Status s = RunLayers({&seg, 1}, tokens.data() + run.q_start, run.rows, callback,
                                   run.logit_rows, result.logits.data() + old);
        !s.ok()) {
      return s;
    }
    for (int64_t r : run.logit_rows) result.positions.push_back(seg.consumer_positions[r]);
  }
  state.length = L;
  state.s_valid = options.s_valid;
  return result;
}

absl::Status CudaCedModel::Decode(std::span<const CudaDecodeItem> batch) {
  const int64_t n = static_cast<int64_t>(batch.size());
  std::vector<int32_t> tokens(n);
  std::vector<DecodeRow> rows(n);
  std::vector<Segment> segments(n);
  std::vector<int64_t> logit_rows(n);
  for (int64_t i = 0; i < n; ++i) {
    const CudaDecodeItem& item = batch[i];
    if (item.state == nullptr || item.logits == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("decode item ", i, " has no state or logits"));
    }
    absl::StatusOr<DecodeRow> row =
        ScheduleDecodeRow(config_, i, item.token, item.state->length, item.state->s_valid);
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
  if (n == 0) return absl::OkStatus();
  const int64_t V = config_.vocab_size;
  std::vector<float> logits(n * V);
  if (absl::Status s = RunLayers(segments, tokens.data(), n, nullptr, logit_rows, logits.data());
      !s.ok()) {
    return s;
  }
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(logits.data() + i * V, V, batch[i].logits);
    batch[i].state->length += 1;
  }
  return absl::OkStatus();
}

}  // namespace baton::model::cuda
