#include "baton/model/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <new>

#include "absl/strings/str_cat.h"

namespace baton::model {
namespace {

// Host memory for packed weight matrices: aligned to the cache line, so that no vector load of
// a panel splits one (malloc's large blocks start 16 bytes into a page).
template <typename T>
struct PanelAllocator {
  using value_type = T;
  static constexpr size_t kAlign = 64;
  PanelAllocator() = default;
  template <typename U>
  PanelAllocator(const PanelAllocator<U>&) {}
  T* allocate(size_t n) {
    void* memory = std::aligned_alloc(kAlign, (n * sizeof(T) + kAlign - 1) / kAlign * kAlign);
    if (memory == nullptr) throw std::bad_alloc();
    return static_cast<T*>(memory);
  }
  void deallocate(T* memory, size_t) { std::free(memory); }
  template <typename U>
  bool operator==(const PanelAllocator<U>&) const {
    return true;
  }
};
template <typename T>
using Panels = std::vector<T, PanelAllocator<T>>;

}  // namespace

absl::StatusOr<std::unique_ptr<SequenceState>> Engine::NewState() {
  auto state = std::make_unique<SequenceState>(state_layout(), backend());
  if (state->producer_swa() == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no ", DeviceName(backend().device()), " memory for a request's rings (",
        state_layout().producer_swa_floats() + state_layout().consumer_swa_floats(), " floats)"));
  }
  return state;
}

absl::string_view WeightTypeName(WeightType type) {
  return type == WeightType::kBf16 ? "bf16" : "fp32";
}

absl::StatusOr<WeightType> ParseWeightType(absl::string_view name, absl::string_view flag) {
  if (name == "fp32") return WeightType::kFp32;
  if (name == "bf16") return WeightType::kBf16;
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": '", name, "' is unknown; allowed: fp32, bf16"));
}

// The weights as the layer stack reads them: backend memory, laid out as CedWeights', except
// that the CPU backend holds every matrix as the panels its GEMM streams (kernels/gemm.h).
struct CedEngine::Weights {
  // A weight matrix [out, in]: FP32 or BF16 (BF16 on the CPU backend only), as Linear lays it
  // out or packed in panels (the CPU backend).
  struct Matrix {
    const float* f32 = nullptr;
    const kernels::Bf16* bf16 = nullptr;
    bool packed = false;
    bool swiglu = false;  // a gate_up packed for the product's SwiGLU (kernels/gemm.h)
  };
  struct Layer {
    const float* attn_norm;
    Matrix qkv;  // q_swa_kv in consumers; its q rows alone when swa_kv is set
    Matrix swa_kv;  // consumers of yoco_swa_share_hidden models: the SWA K/V rows of q_swa_kv
    Matrix o;
    const float* mlp_norm;
    Matrix gate_up;
    Matrix down;
  };
  const float* embed = nullptr;
  Matrix global_kv;
  const float* final_norm = nullptr;
  Matrix lm_head;
  std::vector<Layer> producers, consumers;
  std::vector<BackendArray<float>> uploaded;       // owned copies on a device backend
  std::vector<Panels<float>> panels;          // packed FP32 matrices (host memory)
  std::vector<Panels<kernels::Bf16>> narrow;  // packed BF16 matrices (host memory)

  class Builder;
};

// Puts host matrices where a backend's step reads them, into `weights`: in place on a host
// backend, else copied into its memory; the CPU backend packs each matrix into panels, in FP32
// or BF16. Counts the bytes held in `weight_bytes`; ok() turns false once the backend's memory
// runs out.
class CedEngine::Weights::Builder {
 public:
  Builder(Backend& backend, Weights& weights, int64_t& weight_bytes, WeightType weight_type)
      : backend_(backend),
        weights_(weights),
        weight_bytes_(weight_bytes),
        weight_type_(weight_type),
        in_place_(backend.host_memory()),
        pack_(backend.device() == Device::kCpu) {}

  bool ok() const { return ok_; }
  bool packs() const { return pack_; }

  // A vector (a norm, the embedding table) as it is.
  const float* Place(const std::vector<float>& host) {
    weight_bytes_ += static_cast<int64_t>(host.size() * sizeof(float));
    if (in_place_) return host.data();
    BackendArray<float> copy(backend_, host.size());
    if (copy.data() == nullptr) {
      ok_ = false;
      return nullptr;
    }
    backend_.CopyIn(copy.data(), host.data(), host.size() * sizeof(float));
    weights_.uploaded.push_back(std::move(copy));
    return weights_.uploaded.back().data();
  }

  // A matrix as the step reads it: rows [first, first + rows) of `host` ([.., in]; rows -1:
  // all). The CPU backend packs it into panels, in FP32 or BF16 (`type`); a device backend gets
  // it as it is.
  Matrix Pack(const std::vector<float>& host, int64_t in, int64_t first = 0, int64_t rows = -1,
              WeightType type = WeightType::kFp32, bool swiglu = false) {
    if (rows < 0) rows = static_cast<int64_t>(host.size()) / in - first;
    const kernels::PackWeightsParams rows_of{.out = rows, .in = in, .w = host.data() + first * in};
    if (!pack_) {
      if (first > 0) weight_bytes_ -= static_cast<int64_t>(host.size() * sizeof(float));  // shared
      const float* whole = Place(host);
      return {.f32 = whole != nullptr ? whole + first * in : nullptr};
    }
    const int64_t count = kernels::PackedWeightCount(rows, in);
    weight_bytes_ += count * static_cast<int64_t>(type == WeightType::kBf16 ? sizeof(kernels::Bf16)
                                                                            : sizeof(float));
    auto pack_into = [&](auto* panels) {
      if (swiglu) {
        kernels::PackSwiGluWeights(rows_of, panels);
      } else {
        kernels::PackWeights(rows_of, panels);
      }
    };
    if (type == WeightType::kBf16) {
      Panels<kernels::Bf16>& narrow = weights_.narrow.emplace_back(count);
      pack_into(narrow.data());
      return {.bf16 = narrow.data(), .packed = true, .swiglu = swiglu};
    }
    Panels<float>& panels = weights_.panels.emplace_back(count);
    pack_into(panels.data());
    return {.f32 = panels.data(), .packed = true, .swiglu = swiglu};
  }

  // A weight matrix in the engine's weight type.
  Matrix Weight(const std::vector<float>& host, int64_t in, int64_t first = 0, int64_t rows = -1) {
    return Pack(host, in, first, rows, weight_type_);
  }

  // gate_up with its SwiGLU fused into the product where the CPU backend packs it and whole
  // panels of 16 split the gate rows from the up rows.
  Matrix GateUp(const std::vector<float>& host, int64_t hidden, int64_t intermediate) {
    const bool fused = pack_ && intermediate % kernels::kPanelOutputs == 0;
    return Pack(host, hidden, 0, -1, weight_type_, fused);
  }

  // A matrix's host copy once its packed one exists: only the packed one is read.
  void Release(std::vector<float>& host) const {
    if (pack_) std::vector<float>().swap(host);
  }

 private:
  Backend& backend_;
  Weights& weights_;
  int64_t& weight_bytes_;
  const WeightType weight_type_;
  const bool in_place_;
  const bool pack_;
  bool ok_ = true;
};

// One step's activations, grown to the largest step seen and reused.
struct CedEngine::Workspace {
  BackendArray<float> h, x, qkv, attn, gate_up, act, shared, global, hc, sc, final_rows, logits;
  BackendArray<int32_t> ints;
  BackendArray<float*> pages;

  class StepRun;
};

namespace {

// At least `count` elements of `buffer`, or nullptr when the backend has no memory for them.
template <typename T>
T* Grow(Backend& backend, BackendArray<T>& buffer, size_t count) {
  count = std::max<size_t>(count, 1);
  if (buffer.size() < count) {
    const size_t grown = std::max(count, 2 * buffer.size());
    buffer.Reset();  // free first, so that the old and new never coexist
    buffer = BackendArray<T>(backend, grown);
  }
  return buffer.data();
}

}  // namespace

CedEngine::CedEngine(CedWeights weights, std::unique_ptr<Backend> backend)
    : config_(weights.config),
      held_(weights.held),
      fingerprint_(weights.fingerprint),
      host_weights_(std::move(weights)),
      backend_(std::move(backend)),
      weights_(std::make_unique<Weights>()) {}

CedEngine::~CedEngine() {
  (void)backend_->Synchronize();
}

absl::StatusOr<std::unique_ptr<CedEngine>> CedEngine::Create(CedWeights weights,
                                                             std::unique_ptr<Backend> backend,
                                                             WeightType weight_type) {
  if (weight_type == WeightType::kBf16 && backend->device() != Device::kCpu) {
    return absl::InvalidArgumentError(absl::StrCat("--weights bf16 is for --device cpu; the ",
                                                   DeviceName(backend->device()),
                                                   " backend reads fp32 weights"));
  }
  std::unique_ptr<CedEngine> engine(new CedEngine(std::move(weights), std::move(backend)));
  if (absl::Status s = engine->Upload(weight_type); !s.ok()) return s;
  return engine;
}

absl::Status CedEngine::Upload(WeightType weight_type) {
  Backend& backend = *backend_;
  Weights::Builder b(backend, *weights_, weight_bytes_, weight_type);
  CedWeights& w = host_weights_;
  Weights& d = *weights_;
  const int64_t hidden = config_.hidden_size, inter = config_.intermediate_size;
  const int64_t q_dim = config_.num_attention_heads * config_.head_dim;
  const bool all = held_ == HeldLayers::kAll;
  d.embed = b.Place(w.embed);
  d.global_kv = b.Weight(w.global_kv, hidden);
  b.Release(w.global_kv);
  if (all) {
    d.final_norm = b.Place(w.final_norm);
    // A tied LM head is the embedding table, read in FP32 (the lookup keeps it as it is); the
    // CPU backend packs a copy, a device backend reads the same upload.
    if (!config_.tie_word_embeddings) {
      d.lm_head = b.Weight(w.lm_head, hidden);
    } else if (b.packs()) {
      d.lm_head = b.Pack(w.embed, hidden);
    } else {
      d.lm_head = {.f32 = d.embed};
    }
    b.Release(w.lm_head);
  }
  for (ProducerLayerWeights& l : w.producers) {
    d.producers.push_back({.attn_norm = b.Place(l.attn_norm),
                           .qkv = b.Weight(l.qkv, hidden),
                           .o = b.Weight(l.o, q_dim),
                           .mlp_norm = b.Place(l.mlp_norm),
                           .gate_up = b.GateUp(l.gate_up, hidden, inter),
                           .down = b.Weight(l.down, inter)});
    for (std::vector<float>* m : {&l.qkv, &l.o, &l.gate_up, &l.down}) b.Release(*m);
  }
  if (!all) {
    // The boundary's norm alone: its rows feed the block-KV projections.
    d.consumers.push_back({.attn_norm = b.Place(w.consumers[0].attn_norm)});
  }
  const size_t held_consumers = all ? w.consumers.size() : 0;
  for (size_t i = 0; i < held_consumers; ++i) {
    ConsumerLayerWeights& l = w.consumers[i];
    Weights::Layer layer{.attn_norm = b.Place(l.attn_norm),
                         .o = b.Weight(l.o, q_dim),
                         .mlp_norm = b.Place(l.mlp_norm),
                         .gate_up = b.GateUp(l.gate_up, hidden, inter),
                         .down = b.Weight(l.down, inter)};
    if (config_.yoco_swa_share_hidden && b.packs()) {
      // Q from this layer's input, SWA K/V from the shared boundary rows: two products.
      layer.qkv = b.Weight(l.q_swa_kv, hidden, 0, q_dim);
      layer.swa_kv = b.Weight(l.q_swa_kv, hidden, q_dim);
    } else {
      layer.qkv = b.Weight(l.q_swa_kv, hidden);
      // The K/V rows of the same upload (only yoco_swa_share_hidden models read them apart).
      layer.swa_kv = {.f32 = layer.qkv.f32 != nullptr ? layer.qkv.f32 + q_dim * hidden : nullptr};
    }
    d.consumers.push_back(layer);
    for (std::vector<float>* m : {&l.q_swa_kv, &l.o, &l.gate_up, &l.down}) b.Release(*m);
  }
  const absl::Status synced = backend.Synchronize();
  if (!b.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("the model's weights do not fit in ",
                                                     DeviceName(backend.device()), " memory"));
  }
  if (!backend.host_memory()) host_weights_ = CedWeights{};  // the device copy is the only one
  return synced;
}

std::unique_lock<std::mutex> CedEngine::Serialize() {
  std::unique_lock<std::mutex> lock(serial_, std::defer_lock);
  if (!backend_->concurrent()) lock.lock();
  return lock;
}

std::unique_ptr<CedEngine::Workspace> CedEngine::TakeWorkspace() {
  std::lock_guard<std::mutex> lock(workspaces_mutex_);
  if (workspaces_.empty()) return std::make_unique<Workspace>();
  std::unique_ptr<Workspace> workspace = std::move(workspaces_.back());
  workspaces_.pop_back();
  return workspace;
}

void CedEngine::ReturnWorkspace(std::unique_ptr<Workspace> workspace) {
  std::lock_guard<std::mutex> lock(workspaces_mutex_);
  workspaces_.push_back(std::move(workspace));
}

// One step of the layer stack over a workspace: the step's activations, its dimensions and
// the stages RunStep runs in order (the producers over the full rows, the boundary over every
// residual row, the consumers over the consumer rows, the logits).
class CedEngine::Workspace::StepRun {
 public:
  using AttentionParams = kernels::AttentionParams;
  using BlockKvSource = kernels::BlockKvSource;

  StepRun(Backend& backend, const ModelConfig& config, const Weights& weights, const StepPlan& step)
      : be(backend),
        c(config),
        wt(weights),
        step(step),
        layout(StateLayout::For(config)),
        d(c.hidden_size),
        hd(c.head_dim),
        H(c.num_attention_heads),
        Hkv(c.num_key_value_heads),
        q_dim(H * hd),
        kv_dim(Hkv * hd),
        inter(c.intermediate_size),
        qkv_dim(q_dim + 2 * kv_dim),
        global_dim(c.num_block_kv_groups() * 2 * kv_dim),
        eps(static_cast<float>(c.rms_norm_eps)),
        scale(1.0f / std::sqrt(static_cast<float>(hd))),
        rows(step.rows),
        consumer_rows(step.consumer_rows),
        n_logits(step.logit_rows),
        residual_rows(step.rows + step.replay_rows) {}

  // The step's buffers in `ws` (grown as needed), its integers and page tables where the
  // backend reads them; false when the backend has no memory for them.
  bool Allocate(Workspace& ws, float* logits) {
    ints = step.ints.data();
    pages = step.page_tables.data();
    bool ok = true;
    auto grow = [&](auto& buffer, int64_t count) {
      auto* data = Grow(be, buffer, static_cast<size_t>(count));
      ok = ok && data != nullptr;
      return data;
    };
    if (!be.host_memory()) {
      int32_t* device_ints = grow(ws.ints, static_cast<int64_t>(step.ints.size()));
      float** device_pages = grow(ws.pages, static_cast<int64_t>(step.page_tables.size()));
      if (ok) {
        be.CopyIn(device_ints, step.ints.data(), step.ints.size() * sizeof(int32_t));
        be.CopyIn(device_pages, step.page_tables.data(), step.page_tables.size() * sizeof(float*));
      }
      ints = device_ints;
      pages = device_pages;
    }
    const int64_t max_rows = std::max(rows, consumer_rows);
    h = grow(ws.h, residual_rows * d);
    x = grow(ws.x, max_rows * d);
    qkv = grow(ws.qkv, max_rows * qkv_dim);
    attn = grow(ws.attn, max_rows * q_dim);
    gate_up = grow(ws.gate_up, max_rows * 2 * inter);
    act = grow(ws.act, max_rows * inter);
    shared = grow(ws.shared, residual_rows * d);
    global = grow(ws.global, rows * global_dim);
    hc = grow(ws.hc, consumer_rows * d);
    sc = grow(ws.sc, consumer_rows * d);
    final_rows = grow(ws.final_rows, n_logits * d);
    step_logits = be.host_memory() ? logits : grow(ws.logits, n_logits * c.vocab_size);
    positions = ints + step.positions;
    consumer_positions = ints + step.consumer_positions;
    return ok;
  }

  // Producer layers: window-W SWA over every row; a segment's last C rows enter the ring.
  absl::Status Producers(const ProducerRowsCallback* on_producer_rows) {
    if (rows == 0) return absl::OkStatus();
    be.Embedding({.rows = rows, .dim = d, .table = wt.embed, .ids = ints + step.tokens, .out = h});
    for (int64_t l = 0; l < c.num_producer_layers(); ++l) {
      const Weights::Layer& w = wt.producers[l];
      be.RmsNorm({.rows = rows, .dim = d, .x = h, .weight = w.attn_norm, .out = x, .eps = eps});
      Gemm({.rows = rows, .in = d, .out = qkv_dim, .x = x, .y = qkv}, w.qkv);
      RopeQk(rows, positions);
      attention.clear();
      for (const StepSegment& seg : step.segments) {
        if (seg.rows == 0) continue;  // a replay piece: its rows enter at the consumers
        if (on_producer_rows != nullptr && *on_producer_rows) {
          if (absl::Status st = HandRows(*on_producer_rows, l, seg); !st.ok()) return st;
        }
        attention.push_back(SwaAttention(seg.rows, seg.row_offset, positions + seg.row_offset,
                                         ints + step.producer_lo + seg.row_offset, seg.producer_swa,
                                         l, seg.q_start, nullptr));
      }
      be.Attention(attention);
      // Ring writes come after attention: a new row may take the slot of a key still being read.
      for (const StepSegment& seg : step.segments) {
        if (seg.rows == 0) continue;
        WriteRing(seg.producer_swa, l, seg.rows, seg.row_offset,
                  ints + step.producer_slots + seg.row_offset);
      }
      OutputAndMlp(h, rows, w);
    }
    return absl::OkStatus();
  }

  // Replay rows enter here: the boundary rows a prefill node computed and handed over. Then
  // the boundary (layer P): shared rows s over every residual row, and from the full rows' the
  // block KV of every group (each source layer's projection), which is therefore exact
  // whatever the truncation (seed 9.2.2). A replay row's block KV came with its StateBlock.
  void Boundary() {
    float* replay_row = h + rows * d;
    for (size_t i = 0; i < step.replay_input.size(); ++i) {
      be.CopyIn(replay_row, step.replay_input[i], step.replay_input_rows[i] * d * sizeof(float));
      replay_row += step.replay_input_rows[i] * d;
    }
    be.RmsNorm({.rows = residual_rows,
                .dim = d,
                .x = h,
                .weight = wt.consumers[0].attn_norm,
                .out = shared,
                .eps = eps});
    if (rows == 0) return;
    Gemm({.rows = rows, .in = d, .out = global_dim, .x = shared, .y = global}, wt.global_kv);
    const int64_t G = c.num_block_kv_groups();
    for (int64_t g = 0; g < G; ++g) {
      be.Rope({.rows = rows,
               .heads = Hkv,
               .head_dim = hd,
               .x = global + g * 2 * kv_dim,
               .stride = global_dim,
               .positions = positions,
               .theta = c.rope_theta});
    }
    for (const StepSegment& seg : step.segments) {
      for (int64_t g = 0; seg.rows > 0 && g < G; ++g) {
        for (const bool is_v : {false, true}) {
          be.WriteBlockKv(
              {.rows = seg.rows,
               .width = kv_dim,
               .src = global + seg.row_offset * global_dim + g * 2 * kv_dim + (is_v ? kv_dim : 0),
               .src_stride = global_dim,
               .positions = positions + seg.row_offset,
               .pages = pages + seg.page_table,
               .block_size = c.kv_block_size,
               .offset = is_v ? layout.page_v_offset(g) : layout.page_k_offset(g)});
        }
      }
    }
  }

  // Consumer layers over each segment's consumer rows (the last rows of the segment).
  void Consumers() {
    for (auto [from, to] : {std::pair{h, hc}, std::pair{shared, sc}}) {
      be.GatherRows({.rows = consumer_rows,
                     .width = d,
                     .src = from,
                     .src_stride = d,
                     .index = ints + step.consumer_source,
                     .dst = to,
                     .dst_stride = d});
    }
    attention.resize(step.segments.size());
    std::vector<BlockKvSource> block_kv(step.segments.size());
    for (int64_t l = 0; l < c.num_consumer_layers(); ++l) {
      const Weights::Layer& w = wt.consumers[l];
      ConsumerQkv(w);
      // The block KV of this layer's group (its nearest source at or below it).
      const int64_t group = c.block_kv_group(c.n_prefill_layer + l);
      for (size_t s = 0; s < step.segments.size(); ++s) {
        const StepSegment& seg = step.segments[s];
        block_kv[s] = {.pages = pages + seg.page_table,
                       .block_size = c.kv_block_size,
                       .k_offset = layout.page_k_offset(group),
                       .v_offset = layout.page_v_offset(group)};
        attention[s] = SwaAttention(seg.consumer_rows, seg.consumer_offset,
                                    consumer_positions + seg.consumer_offset,
                                    ints + step.consumer_lo + seg.consumer_offset, seg.consumer_swa,
                                    l, seg.consumer_start, &block_kv[s]);
      }
      be.Attention(attention);
      for (const StepSegment& seg : step.segments) {
        WriteRing(seg.consumer_swa, l, seg.consumer_rows, seg.consumer_offset,
                  ints + step.consumer_slots + seg.consumer_offset);
      }
      OutputAndMlp(hc, consumer_rows, w);
    }
  }

  // Logits of the requested consumer rows into `logits` (host memory).
  void Logits(float* logits) {
    be.GatherRows({.rows = n_logits,
                   .width = d,
                   .src = hc,
                   .src_stride = d,
                   .index = ints + step.logit_source,
                   .dst = final_rows,
                   .dst_stride = d});
    be.RmsNorm({.rows = n_logits,
                .dim = d,
                .x = final_rows,
                .weight = wt.final_norm,
                .out = final_rows,
                .eps = eps});
    Gemm({.rows = n_logits, .in = d, .out = c.vocab_size, .x = final_rows, .y = step_logits},
         wt.lm_head);
    if (step_logits != logits) {
      be.CopyOut(logits, step_logits, n_logits * c.vocab_size * sizeof(float));
    }
  }

  float* residual() const { return h; }

 private:
  // Y = X W^T (+ Y) against a weight matrix in whichever type the engine holds it.
  // RoPE on the Q and K heads of the first `n` rows of qkv, at `at`'s positions.
  void RopeQk(int64_t n, const int32_t* at) {
    be.Rope({.rows = n,
             .heads = H + Hkv,
             .head_dim = hd,
             .x = qkv,
             .stride = qkv_dim,
             .positions = at,
             .theta = c.rope_theta});
  }

  void Gemm(kernels::GemmParams p, const Weights::Matrix& w) {
    p.w = w.f32;
    p.w_bf16 = w.bf16;
    p.w_packed = w.packed;
    be.Gemm(p);
  }

  // o_proj into the residual, then the SwiGLU MLP; shared by both layer groups.
  void OutputAndMlp(float* hidden, int64_t n, const Weights::Layer& w) {
    Gemm({.rows = n, .in = q_dim, .out = d, .x = attn, .y = hidden, .beta = 1.0f}, w.o);
    be.RmsNorm({.rows = n, .dim = d, .x = hidden, .weight = w.mlp_norm, .out = x, .eps = eps});
    if (w.gate_up.swiglu) {
      Gemm({.rows = n, .in = d, .out = 2 * inter, .x = x, .y = gate_up, .swiglu = act}, w.gate_up);
    } else {
      Gemm({.rows = n, .in = d, .out = 2 * inter, .x = x, .y = gate_up}, w.gate_up);
      be.SwiGlu({.rows = n, .inter = inter, .gate_up = gate_up, .out = act});
    }
    Gemm({.rows = n, .in = inter, .out = d, .x = act, .y = hidden, .beta = 1.0f}, w.down);
  }

  // A consumer layer's Q, K and V of the consumer rows, with RoPE.
  void ConsumerQkv(const Weights::Layer& w) {
    be.RmsNorm(
        {.rows = consumer_rows, .dim = d, .x = hc, .weight = w.attn_norm, .out = x, .eps = eps});
    if (!c.yoco_swa_share_hidden) {
      Gemm({.rows = consumer_rows, .in = d, .out = qkv_dim, .x = x, .y = qkv}, w.qkv);
    } else {
      // SWA K/V from the shared boundary rows instead of this layer's own input.
      Gemm({.rows = consumer_rows, .in = d, .out = q_dim, .x = x, .y = qkv, .y_stride = qkv_dim},
           w.qkv);
      Gemm({.rows = consumer_rows,
            .in = d,
            .out = 2 * kv_dim,
            .x = sc,
            .y = qkv + q_dim,
            .y_stride = qkv_dim},
           w.swa_kv);
    }
    RopeQk(consumer_rows, consumer_positions);
  }

  // A segment's producer K and V rows of layer `l`, handed to the caller (from host memory).
  absl::Status HandRows(const ProducerRowsCallback& on_producer_rows, int64_t l,
                        const StepSegment& seg) {
    const float* seg_rows = qkv + seg.row_offset * qkv_dim;
    if (!be.host_memory()) {
      host_rows.resize(seg.rows * qkv_dim);
      be.CopyOut(host_rows.data(), seg_rows, host_rows.size() * sizeof(float));
      if (absl::Status st = be.Synchronize(); !st.ok()) return st;
      seg_rows = host_rows.data();
    }
    on_producer_rows(l, seg.q_start, seg.rows, seg_rows + q_dim, seg_rows + q_dim + kv_dim,
                     qkv_dim);
    return absl::OkStatus();
  }

  // K and V of `n` qkv rows from `first` into one layer's rings at the plan's slots (-1: none).
  void WriteRing(float* ring, int64_t layer, int64_t n, int64_t first, const int32_t* slots) {
    const float* row0 = qkv + first * qkv_dim;
    for (const bool is_v : {false, true}) {
      be.ScatterRows(
          {.rows = n,
           .width = kv_dim,
           .src = row0 + q_dim + (is_v ? kv_dim : 0),
           .src_stride = qkv_dim,
           .index = slots,
           .dst = ring + (is_v ? layout.ring_v_offset(layer) : layout.ring_k_offset(layer)),
           .dst_stride = kv_dim});
    }
  }

  // Attention over `n` rows whose q/k/v sit at qkv row `first`: SWA keys from `ring` (one
  // layer's K/V rings) before tail_start and from these rows after it.
  AttentionParams SwaAttention(int64_t n, int64_t first, const int32_t* row_positions,
                               const int32_t* lo, const float* ring, int64_t layer,
                               int64_t tail_start, const BlockKvSource* global_source) const {
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
                                   .ring_capacity = c.ring_capacity(),
                                   .tail_k = row0 + q_dim,
                                   .tail_v = row0 + q_dim + kv_dim,
                                   .tail_stride = qkv_dim,
                                   .tail_start = tail_start},
                           .global = global_source};
  }

  Backend& be;
  const ModelConfig& c;
  const Weights& wt;
  const StepPlan& step;
  const StateLayout layout;
  const int64_t d, hd, H, Hkv, q_dim, kv_dim, inter, qkv_dim, global_dim;
  const float eps, scale;
  const int64_t rows, consumer_rows, n_logits, residual_rows;
  const int32_t* ints = nullptr;
  float* const* pages = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* consumer_positions = nullptr;
  float *h = nullptr, *x = nullptr, *qkv = nullptr, *attn = nullptr, *gate_up = nullptr,
        *act = nullptr, *shared = nullptr, *global = nullptr, *hc = nullptr, *sc = nullptr,
        *final_rows = nullptr, *step_logits = nullptr;
  std::vector<AttentionParams> attention;
  std::vector<float> host_rows;
};

absl::Status CedEngine::RunStep(const StepPlan& step, const ProducerRowsCallback* on_producer_rows,
                                float* logits, float* boundary_out, int64_t boundary_first,
                                int64_t boundary_rows) {
  Backend& be = *backend_;
  // Residual rows: the full rows, then the replay rows handed over (boundary rows).
  if (step.rows + step.replay_rows == 0) return absl::OkStatus();
  struct Returner {
    CedEngine* engine;
    std::unique_ptr<Workspace> workspace;
    ~Returner() { engine->ReturnWorkspace(std::move(workspace)); }
  } held{this, TakeWorkspace()};
  Workspace::StepRun run(be, config_, *weights_, step);
  if (!run.Allocate(*held.workspace, logits)) {
    (void)be.Synchronize();
    return absl::ResourceExhaustedError(absl::StrCat(
        "no ", DeviceName(be.device()), " memory for a step of ", step.rows, " rows' activations"));
  }
  if (absl::Status s = run.Producers(on_producer_rows); !s.ok()) return s;
  run.Boundary();
  if (boundary_out != nullptr && boundary_rows > 0) {
    be.CopyOut(boundary_out, run.residual() + boundary_first * config_.hidden_size,
               boundary_rows * config_.hidden_size * sizeof(float));
  }
  if (step.consumer_rows == 0) return be.Synchronize();
  run.Consumers();
  if (step.logit_rows > 0) run.Logits(logits);
  return be.Synchronize();
}

absl::StatusOr<PrefillResult> CedEngine::Prefill(std::span<const int32_t> tokens,
                                                 const PrefillOptions& options,
                                                 SequenceState& state) {
  const std::unique_lock<std::mutex> serial = Serialize();
  absl::StatusOr<PrefillSchedule> schedule =
      SchedulePrefill(config_, tokens, options, state.length);
  if (!schedule.ok()) return schedule.status();
  const int64_t L = static_cast<int64_t>(tokens.size());
  if (!options.boundary_rows.empty() || held_ != HeldLayers::kAll) {
    return PrefillProducers(tokens, options, *schedule, state);
  }
  if (absl::Status s = state.EnsurePages(L); !s.ok()) return s;

  PrefillResult result;
  result.consumer_rows = schedule->plan.total_consumer_rows();
  const int64_t V = config_.vocab_size;
  const bool streamed = options.on_result_logits != nullptr && options.result_logits;
  for (const PrefillRun& run : schedule->runs) {
    if (options.cancelled && options.cancelled()) return PrefillCancelled(run.q_start, L);
    const StepPlan step = PlanPrefillStep(config_, *schedule, run, tokens, state);
    if (streamed && !run.logit_rows.empty()) result.logits.clear();  // one chunk at a time
    const size_t old = result.logits.size();
    result.logits.resize(old + run.logit_rows.size() * V);
    if (absl::Status s = RunStep(step, &options.on_producer_rows, result.logits.data() + old);
        !s.ok()) {
      return s;
    }
    const int32_t* consumer_positions = step.ints.data() + step.consumer_positions;
    for (size_t i = 0; i < run.logit_rows.size(); ++i) {
      const int64_t position = consumer_positions[run.logit_rows[i]];
      if (streamed) {
        options.on_result_logits(position, {result.logits.data() + i * V, static_cast<size_t>(V)});
      } else {
        result.positions.push_back(position);
      }
    }
    if (streamed && !run.logit_rows.empty()) {
      // Keep the last row only: the sampled one.
      result.logits.erase(result.logits.begin(), result.logits.end() - V);
      result.positions = {consumer_positions[run.logit_rows.back()]};
    }
  }
  state.length = L;
  state.s_valid = options.s_valid;
  return result;
}

absl::StatusOr<PrefillResult> CedEngine::PrefillProducers(std::span<const int32_t> tokens,
                                                          const PrefillOptions& options,
                                                          const PrefillSchedule& schedule,
                                                          SequenceState& state) {
  const int64_t L = static_cast<int64_t>(tokens.size()), d = config_.hidden_size;
  const int64_t begin = schedule.plan.spec.replay_begin();
  if (options.boundary_rows.empty()) {
    return absl::FailedPreconditionError(
        "this engine holds the producer layers only (the prefill node of the replay-on-decode "
        "split): it prefills into boundary rows and computes no logits");
  }
  if (static_cast<int64_t>(options.boundary_rows.size()) != (L - begin) * d) {
    return absl::InvalidArgumentError(absl::StrCat(
        "boundary_rows holds ", options.boundary_rows.size(), " floats; the replay range [", begin,
        ", ", L, ") needs ", (L - begin) * d, " (", L - begin, " rows of hidden_size ", d, ")"));
  }
  if (options.result_logits) {
    return absl::InvalidArgumentError(
        "result_logits: a replay-on-decode prefill computes no logits (the decode node does)");
  }
  if (absl::Status s = state.EnsurePages(L); !s.ok()) return s;
  for (const PrefillRun& run : schedule.runs) {
    if (options.cancelled && options.cancelled()) return PrefillCancelled(run.q_start, L);
    // Producers and the block KV only: a run with no consumer rows.
    const PrefillRun bare{.q_start = run.q_start, .rows = run.rows};
    const StepPlan step = PlanPrefillStep(config_, schedule, bare, tokens, state);
    const int64_t first = std::max(begin, run.q_start), end = run.q_start + run.rows;
    float* out = first < end ? options.boundary_rows.data() + (first - begin) * d : nullptr;
    if (absl::Status s = RunStep(step, &options.on_producer_rows, nullptr, out, first - run.q_start,
                                 std::max<int64_t>(0, end - first));
        !s.ok()) {
      return s;
    }
  }
  state.length = L;
  state.s_valid = options.s_valid;
  PrefillResult result;
  result.consumer_rows = L - begin;  // what the decode node's replay computes
  return result;
}

absl::Status CedEngine::Step(std::span<const DecodeItem> decode,
                             std::span<const ReplayItem> replay) {
  const std::unique_lock<std::mutex> serial = Serialize();
  if (held_ != HeldLayers::kAll) {
    return absl::FailedPreconditionError(
        "this engine holds the producer layers only (the prefill node of the replay-on-decode "
        "split); it cannot decode or replay");
  }
  const size_t n = decode.size();
  std::vector<SequenceState*> states(n);
  std::vector<int32_t> tokens(n);
  std::vector<std::span<const int32_t>> drafts(n);
  int64_t logit_rows = 0;
  for (size_t i = 0; i < n; ++i) {
    if (decode[i].logits == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("decode item ", i, " has no logits"));
    }
    states[i] = decode[i].state;
    tokens[i] = decode[i].token;
    drafts[i] = decode[i].draft;
    logit_rows += 1 + static_cast<int64_t>(decode[i].draft.size());
  }
  const int64_t decode_rows = logit_rows;
  for (size_t i = 0; i < replay.size(); ++i) {
    const int64_t rows = ReplayLogitRows(replay[i]);
    if (rows > 0 && replay[i].logits == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("replay item ", i, " has no logits"));
    }
    logit_rows += rows;
  }
  absl::StatusOr<StepPlan> step = PlanDecodeStep(config_, states, tokens, replay, drafts);
  if (!step.ok()) return step.status();
  const int64_t V = config_.vocab_size;
  std::vector<float> logits(logit_rows * V);
  if (absl::Status s = RunStep(*step, nullptr, logits.data()); !s.ok()) return s;
  const float* row = logits.data();
  for (size_t i = 0; i < n; ++i) {
    const int64_t rows = 1 + static_cast<int64_t>(decode[i].draft.size());
    std::copy_n(row, rows * V, decode[i].logits);
    row += rows * V;
    decode[i].state->length += rows;
  }
  const float* next = logits.data() + decode_rows * V;
  for (const ReplayItem& item : replay) {
    const int64_t rows = ReplayLogitRows(item);
    std::copy_n(next, rows * V, item.logits);
    next += rows * V;
  }
  return absl::OkStatus();
}

absl::Status CedEngine::StageIn(std::span<const StageCopy> copies) {
  const std::unique_lock<std::mutex> serial = Serialize();
  for (const StageCopy& copy : copies) backend_->CopyIn(copy.dst, copy.src, copy.bytes);
  return backend_->Synchronize();
}

absl::Status CedEngine::StageOut(std::span<const StageCopy> copies) {
  const std::unique_lock<std::mutex> serial = Serialize();
  for (const StageCopy& copy : copies) backend_->CopyOut(copy.dst, copy.src, copy.bytes);
  return backend_->Synchronize();
}

int32_t Argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace baton::model
