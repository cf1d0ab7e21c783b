// GPU figures of the CUDA kernels running CED layers: prefill tokens/s (one chunk, truncation
// off and compact) and decode step time at several batch sizes, for the small preset and for a
// preset sized like a real model layer (d 4096, 32 heads of 128, GQA 8). Every layer has its
// own weights (so that no layer's weights sit in L2 for the next), in FP32 (cuBLAS FP32) and
// BF16 (BF16 GEMM inputs, FP32 accumulation; activations stay FP32). Not a test: nothing here
// asserts a time. bench/torch_gpu_peer.py times the same shapes in PyTorch.
//
//   baton_gpu_bench [--presets small,large] [--dtypes fp32,bf16] [--lengths 1024,4096]
//                   [--keep 140] [--batches 1,8,64] [--decode-context 2048] [--repeats 3]
//                   [--prefill-attention simple,gemm] [--json]
//
// The pass follows model/engine.cc (CedEngine::RunStep) op for op: producers over every row (SWA
// ring writes of the last C rows), the boundary's shared rows and every consumer layer's block KV,
// consumers over the plan's rows (all L in off, the last K in compact), final norm, lm_head and,
// for decode, device sampling. Block KV of all consumer layers is written into one layer's pages
// (same work, 1/D of the memory).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "baton/kernels/cuda/context.h"
#include "baton/kernels/cuda/ops.h"
#include "baton/kernels/cuda/sampling.h"
#include "nlohmann/json.hpp"

namespace {

using namespace baton::kernels;
using cuda::Context;
using cuda::DeviceArray;

struct Shape {
  std::string name;
  int64_t d, inter, heads, kv_heads, head_dim, window, capacity, block_size, layers, producers,
      vocab;
  int64_t consumers() const { return layers - producers; }
  int64_t q_dim() const { return heads * head_dim; }
  int64_t kv_dim() const { return kv_heads * head_dim; }
  int64_t qkv_dim() const { return q_dim() + 2 * kv_dim(); }
};

// The small preset of model/model_factory.cc, and a Llama-3-8B-sized layer stack.
Shape SmallShape() {
  return {"small", 512, 1536, 8, 1, 64, 128, 134, 64, 16, 8, 4096};
}
Shape LargeShape() {
  return {"large", 4096, 14336, 32, 8, 128, 128, 134, 64, 32, 16, 128256};
}

std::vector<int64_t> ParseList(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoll(item));
  return out;
}

std::vector<std::string> ParseNames(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(item);
  return out;
}

// Fills device memory with uniform values in [-scale, scale] from a 1M-float host tile.
void FillUniform(Context& ctx, float* device, int64_t count, float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> tile(std::min<int64_t>(count, int64_t{1} << 20));
  for (float& x : tile) x = dist(rng);
  for (int64_t at = 0; at < count; at += static_cast<int64_t>(tile.size())) {
    const int64_t n = std::min<int64_t>(tile.size(), count - at);
    ctx.CopyToDevice(device + at, tile.data(), n * sizeof(float));
  }
}

template <typename T>
DeviceArray<T> Upload(Context& ctx, const std::vector<T>& host) {
  DeviceArray<T> a(ctx, host.size());
  ctx.CopyToDevice(a.data(), host.data(), host.size() * sizeof(T));
  return a;
}

// A Linear weight in FP32 and, when BF16 runs, in BF16.
struct Linear {
  DeviceArray<float> w;
  DeviceArray<Bf16> w16;
  int64_t in = 0, out = 0;
};

struct Layer {
  DeviceArray<float> attn_norm, mlp_norm;
  Linear qkv, o, gate_up, down;
};

class Runner {
 public:
  Runner(Context& ctx, const Shape& s, bool bf16, int64_t max_rows)
      : ctx_(ctx), s_(s), bf16_(bf16), max_rows_(max_rows) {
    uint64_t seed = 1;
    for (int64_t l = 0; l < s.layers; ++l) {
      Layer layer;
      layer.attn_norm = Ones(s.d);
      layer.mlp_norm = Ones(s.d);
      layer.qkv = MakeLinear(s.d, s.qkv_dim(), seed++);
      layer.o = MakeLinear(s.q_dim(), s.d, seed++);
      layer.gate_up = MakeLinear(s.d, 2 * s.inter, seed++);
      layer.down = MakeLinear(s.inter, s.d, seed++);
      layers_.push_back(std::move(layer));
    }
    global_kv_ = MakeLinear(s.d, s.consumers() * 2 * s.kv_dim(), seed++);
    lm_head_ = MakeLinear(s.d, s.vocab, seed++);
    final_norm_ = Ones(s.d);
    const int64_t r = max_rows;
    h_ = DeviceArray<float>(ctx, r * s.d);
    x_ = DeviceArray<float>(ctx, r * s.d);
    shared_ = DeviceArray<float>(ctx, r * s.d);
    qkv_ = DeviceArray<float>(ctx, r * s.qkv_dim());
    attn_ = DeviceArray<float>(ctx, r * s.q_dim());
    gate_up_ = DeviceArray<float>(ctx, r * 2 * s.inter);
    act_ = DeviceArray<float>(ctx, r * s.inter);
    global_ = DeviceArray<float>(ctx, r * s.consumers() * 2 * s.kv_dim());
    x16_ = DeviceArray<Bf16>(ctx, r * std::max({s.d, s.inter, s.q_dim()}));
    FillUniform(ctx, h_.data(), r * s.d, 1.0f, 99);
  }

  // One forward pass over `requests` segments of `rows` rows each (rows 1: a decode step),
  // consumer rows the last `consumer_rows` of each; every request has its own rings and pages.
  struct Batch {
    int64_t requests = 0, rows = 0, consumer_rows = 0, first_position = 0;
    DeviceArray<int32_t> positions, producer_lo, consumer_positions, consumer_lo;
    DeviceArray<int32_t> producer_k_index, producer_v_index, consumer_k_index, consumer_v_index;
    DeviceArray<int32_t> consumer_rows_index;           // flat row of each consumer row
    DeviceArray<float> producer_rings, consumer_rings;  // [requests, 2, C, kv_dim]
    DeviceArray<float> pages;                           // [requests * pages_each, 2, B, kv_dim]
    std::vector<DeviceArray<float*>> page_tables;       // per request, for attention
    // Block-KV writes of every request in one launch: one table of all pages, and positions
    // shifted by r * pages_each * B so that request r's position p lands in its own pages.
    DeviceArray<float*> all_pages;
    DeviceArray<int32_t> block_kv_positions;
    DeviceArray<float> logits;
    DeviceArray<cuda::SampleRowSettings> settings;
    DeviceArray<int32_t> tokens;
    DeviceArray<float> logprobs;
    DeviceArray<int32_t> last_rows;  // each request's last consumer row (its logits row)
  };

  // `keep` < 0: truncation off; else compact with that K (DESIGN section 3).
  Batch MakeBatch(int64_t requests, int64_t rows, int64_t first_position, int64_t keep) {
    Batch b;
    b.requests = requests;
    b.rows = rows;
    b.first_position = first_position;
    const int64_t L = first_position + rows, W = s_.window, C = s_.capacity;
    const int64_t s_keep = keep < 0 ? 0 : std::max<int64_t>(0, L - keep);
    const int64_t consumer_begin =
        keep < 0 ? first_position : std::clamp(s_keep, first_position, L - 1);
    b.consumer_rows = L - consumer_begin;
    std::vector<int32_t> positions, producer_lo, consumer_positions, consumer_lo, pk, pv, ck, cv,
        rows_index;
    for (int64_t r = 0; r < requests; ++r) {
      for (int64_t j = 0; j < rows; ++j) {
        const int64_t pos = first_position + j;
        positions.push_back(pos);
        producer_lo.push_back(std::max<int64_t>(0, pos - W + 1));
        const bool last_c = rows - j <= C;
        pk.push_back(last_c ? static_cast<int32_t>(r * 2 * C + pos % C) : -1);
        pv.push_back(last_c ? static_cast<int32_t>(r * 2 * C + C + pos % C) : -1);
      }
      for (int64_t pos = consumer_begin; pos < L; ++pos) {
        consumer_positions.push_back(pos);
        consumer_lo.push_back(std::clamp<int64_t>(std::max(pos - W + 1, s_keep), 0, pos + 1));
        const bool writes = pos >= s_keep && L - pos <= C;
        ck.push_back(writes ? static_cast<int32_t>(r * 2 * C + pos % C) : -1);
        cv.push_back(writes ? static_cast<int32_t>(r * 2 * C + C + pos % C) : -1);
        rows_index.push_back(static_cast<int32_t>(r * rows + pos - first_position));
      }
    }
    b.positions = Upload(ctx_, positions);
    b.producer_lo = Upload(ctx_, producer_lo);
    b.consumer_positions = Upload(ctx_, consumer_positions);
    b.consumer_lo = Upload(ctx_, consumer_lo);
    b.producer_k_index = Upload(ctx_, pk);
    b.producer_v_index = Upload(ctx_, pv);
    b.consumer_k_index = Upload(ctx_, ck);
    b.consumer_v_index = Upload(ctx_, cv);
    b.consumer_rows_index = Upload(ctx_, rows_index);
    const int64_t ring_floats = 2 * C * s_.kv_dim();
    b.producer_rings = DeviceArray<float>(ctx_, requests * ring_floats);
    b.consumer_rings = DeviceArray<float>(ctx_, requests * ring_floats);
    FillUniform(ctx_, b.producer_rings.data(), requests * ring_floats, 1.0f, 7);
    FillUniform(ctx_, b.consumer_rings.data(), requests * ring_floats, 1.0f, 8);
    const int64_t B = s_.block_size, page_floats = 2 * B * s_.kv_dim();
    const int64_t pages_each = (L + B - 1) / B;
    b.pages = DeviceArray<float>(ctx_, requests * pages_each * page_floats);
    FillUniform(ctx_, b.pages.data(), requests * pages_each * page_floats, 1.0f, 9);
    std::vector<float*> all_pages;
    std::vector<int32_t> shifted;
    for (int64_t r = 0; r < requests; ++r) {
      std::vector<float*> table;
      for (int64_t p = 0; p < pages_each; ++p) {
        table.push_back(b.pages.data() + (r * pages_each + p) * page_floats);
      }
      all_pages.insert(all_pages.end(), table.begin(), table.end());
      b.page_tables.push_back(Upload(ctx_, table));
      for (int64_t j = 0; j < rows; ++j) {
        shifted.push_back(static_cast<int32_t>(r * pages_each * B + first_position + j));
      }
    }
    b.all_pages = Upload(ctx_, all_pages);
    b.block_kv_positions = Upload(ctx_, shifted);
    b.logits = DeviceArray<float>(ctx_, requests * s_.vocab);
    std::vector<cuda::SampleRowSettings> settings(requests);
    for (int64_t r = 0; r < requests; ++r) {
      settings[r] = {.temperature = 0.8f, .top_k = 50, .top_p = 0.95f, .seed = uint64_t(r)};
    }
    b.settings = Upload(ctx_, settings);
    b.tokens = DeviceArray<int32_t>(ctx_, requests);
    b.logprobs = DeviceArray<float>(ctx_, requests);
    std::vector<int32_t> last(requests);
    for (int64_t r = 0; r < requests; ++r) {
      last[r] = static_cast<int32_t>((r + 1) * b.consumer_rows - 1);
    }
    b.last_rows = Upload(ctx_, last);
    return b;
  }

  void Forward(const Batch& b, bool sample) {
    const Shape& s = s_;
    const int64_t n = b.requests * b.rows, m = b.requests * b.consumer_rows;
    const int64_t q_dim = s.q_dim(), kv_dim = s.kv_dim(), qkv_dim = s.qkv_dim();
    const int64_t C = s.capacity, B = s.block_size;
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    const float eps = 1e-5f;
    auto attention = [&](int64_t rows_each, const int32_t* positions, const int32_t* lo,
                         const float* rings, bool consumer, std::vector<BlockKvSource>& global) {
      std::vector<AttentionParams> batch;
      global.resize(b.requests);
      for (int64_t r = 0; r < b.requests; ++r) {
        const float* row0 = qkv_.data() + r * rows_each * qkv_dim;
        const float* ring = rings + r * 2 * C * kv_dim;
        global[r] = {.pages = b.page_tables[r].data(),
                     .block_size = B,
                     .k_offset = 0,
                     .v_offset = B * kv_dim};
        batch.push_back({.rows = rows_each,
                         .num_heads = s.heads,
                         .num_kv_heads = s.kv_heads,
                         .head_dim = s.head_dim,
                         .scale = scale,
                         .q = row0,
                         .q_stride = qkv_dim,
                         .out = attn_.data() + r * rows_each * q_dim,
                         .positions = positions + r * rows_each,
                         .swa_lo = lo + r * rows_each,
                         .swa = {.ring_k = ring,
                                 .ring_v = ring + C * kv_dim,
                                 .ring_capacity = C,
                                 .tail_k = row0 + q_dim,
                                 .tail_v = row0 + q_dim + kv_dim,
                                 .tail_stride = qkv_dim,
                                 .tail_start = b.first_position + b.rows - rows_each},
                         .global = consumer ? &global[r] : nullptr});
      }
      cuda::Attention(ctx_, batch);
    };
    auto layer = [&](const Layer& w, int64_t rows, int64_t rows_each, float* hidden,
                     const int32_t* positions, const int32_t* lo, float* rings,
                     const int32_t* k_index, const int32_t* v_index, bool consumer) {
      std::vector<BlockKvSource> global;
      cuda::RmsNorm(ctx_, {.rows = rows,
                           .dim = s.d,
                           .x = hidden,
                           .weight = w.attn_norm.data(),
                           .out = x_.data(),
                           .eps = eps});
      Apply(w.qkv, rows, x_.data(), qkv_.data(), 0.0f);
      cuda::Rope(ctx_, {.rows = rows,
                        .heads = s.heads + s.kv_heads,
                        .head_dim = s.head_dim,
                        .x = qkv_.data(),
                        .stride = qkv_dim,
                        .positions = positions,
                        .theta = 10000.0});
      attention(rows_each, positions, lo, rings, consumer, global);
      cuda::ScatterRows(ctx_, {.rows = rows,
                               .width = kv_dim,
                               .src = qkv_.data() + q_dim,
                               .src_stride = qkv_dim,
                               .index = k_index,
                               .dst = rings,
                               .dst_stride = kv_dim});
      cuda::ScatterRows(ctx_, {.rows = rows,
                               .width = kv_dim,
                               .src = qkv_.data() + q_dim + kv_dim,
                               .src_stride = qkv_dim,
                               .index = v_index,
                               .dst = rings,
                               .dst_stride = kv_dim});
      Apply(w.o, rows, attn_.data(), hidden, 1.0f);
      cuda::RmsNorm(ctx_, {.rows = rows,
                           .dim = s.d,
                           .x = hidden,
                           .weight = w.mlp_norm.data(),
                           .out = x_.data(),
                           .eps = eps});
      Apply(w.gate_up, rows, x_.data(), gate_up_.data(), 0.0f);
      cuda::SwiGlu(
          ctx_, {.rows = rows, .inter = s.inter, .gate_up = gate_up_.data(), .out = act_.data()});
      Apply(w.down, rows, act_.data(), hidden, 1.0f);
    };

    for (int64_t l = 0; l < s.producers; ++l) {
      layer(layers_[l], n, b.rows, h_.data(), b.positions.data(), b.producer_lo.data(),
            b.producer_rings.data(), b.producer_k_index.data(), b.producer_v_index.data(), false);
    }
    // Boundary: shared rows, every consumer layer's block KV (RoPE'd K, then V) into pages.
    const int64_t global_dim = s.consumers() * 2 * kv_dim;
    cuda::RmsNorm(ctx_, {.rows = n,
                         .dim = s.d,
                         .x = h_.data(),
                         .weight = layers_[s.producers].attn_norm.data(),
                         .out = shared_.data(),
                         .eps = eps});
    Apply(global_kv_, n, shared_.data(), global_.data(), 0.0f);
    for (int64_t l = 0; l < s.consumers(); ++l) {
      cuda::Rope(ctx_, {.rows = n,
                        .heads = s.kv_heads,
                        .head_dim = s.head_dim,
                        .x = global_.data() + l * 2 * kv_dim,
                        .stride = global_dim,
                        .positions = b.positions.data(),
                        .theta = 10000.0});
      for (int64_t part = 0; part < 2; ++part) {
        cuda::WriteBlockKv(ctx_, {.rows = n,
                                  .width = kv_dim,
                                  .src = global_.data() + (2 * l + part) * kv_dim,
                                  .src_stride = global_dim,
                                  .positions = b.block_kv_positions.data(),
                                  .pages = b.all_pages.data(),
                                  .block_size = B,
                                  .offset = part * B * kv_dim});
      }
    }
    // Consumers over the retained rows, gathered into the front of x_ then moved to shared_
    // (the consumer hidden rows).
    cuda::GatherRows(ctx_, {.rows = m,
                            .width = s.d,
                            .src = h_.data(),
                            .src_stride = s.d,
                            .index = b.consumer_rows_index.data(),
                            .dst = shared_.data(),
                            .dst_stride = s.d});
    for (int64_t l = s.producers; l < s.layers; ++l) {
      layer(layers_[l], m, b.consumer_rows, shared_.data(), b.consumer_positions.data(),
            b.consumer_lo.data(), b.consumer_rings.data(), b.consumer_k_index.data(),
            b.consumer_v_index.data(), true);
    }
    // Logits of each request's last row. Forward copies nothing from the host, so that a
    // decode step can be captured into a CUDA graph.
    cuda::GatherRows(ctx_, {.rows = b.requests,
                            .width = s.d,
                            .src = shared_.data(),
                            .src_stride = s.d,
                            .index = b.last_rows.data(),
                            .dst = x_.data(),
                            .dst_stride = s.d});
    cuda::RmsNorm(ctx_, {.rows = b.requests,
                         .dim = s.d,
                         .x = x_.data(),
                         .weight = final_norm_.data(),
                         .out = x_.data(),
                         .eps = eps});
    Apply(lm_head_, b.requests, x_.data(), b.logits.data(), 0.0f);
    if (sample) {
      cuda::SampleRows(ctx_, {.rows = b.requests,
                              .vocab = s.vocab,
                              .logits = b.logits.data(),
                              .settings = b.settings.data(),
                              .tokens = b.tokens.data(),
                              .logprobs = b.logprobs.data()});
    }
  }

 private:
  DeviceArray<float> Ones(int64_t n) { return Upload(ctx_, std::vector<float>(n, 1.0f)); }
  Linear MakeLinear(int64_t in, int64_t out, uint64_t seed) {
    Linear l{.w = DeviceArray<float>(ctx_, in * out), .in = in, .out = out};
    FillUniform(ctx_, l.w.data(), in * out, 1.0f / std::sqrt(static_cast<float>(in)), seed);
    if (bf16_) {
      l.w16 = DeviceArray<Bf16>(ctx_, in * out);
      cuda::ToBf16(ctx_, {.count = in * out, .in = l.w.data(), .out = l.w16.data()});
    }
    return l;
  }
  // y = x W^T (+ y when beta is 1), in the runner's precision.
  void Apply(const Linear& l, int64_t rows, const float* x, float* y, float beta) {
    if (!bf16_) {
      cuda::Gemm(
          ctx_,
          {.rows = rows, .in = l.in, .out = l.out, .x = x, .w = l.w.data(), .y = y, .beta = beta});
      return;
    }
    cuda::ToBf16(ctx_, {.count = rows * l.in, .in = x, .out = x16_.data()});
    cuda::GemmBf16(ctx_, {.rows = rows,
                          .in = l.in,
                          .out = l.out,
                          .x = x16_.data(),
                          .w = l.w16.data(),
                          .y = y,
                          .beta = beta});
  }

  Context& ctx_;
  Shape s_;
  bool bf16_;
  int64_t max_rows_;
  std::vector<Layer> layers_;
  Linear global_kv_, lm_head_;
  DeviceArray<float> final_norm_, h_, x_, shared_, qkv_, attn_, gate_up_, act_, global_;
  DeviceArray<Bf16> x16_;
};

double MedianMs(Context& ctx, int repeats, const std::function<void()>& run) {
  run();  // warm-up (cuBLAS heuristics, first-touch)
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) ms.push_back(ctx.TimeMs(run));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"baton GPU kernel benchmark (CED layers on the CUDA backend)"};
  std::string presets_text = "small,large", dtypes_text = "fp32,bf16", lengths_text = "1024,4096";
  std::string batches_text = "1,8,64";
  int64_t keep = 140, decode_context = 2048;
  int repeats = 3;
  bool json_output = false;
  app.add_option("--presets", presets_text, "small and/or large");
  app.add_option("--dtypes", dtypes_text, "fp32 and/or bf16 (GEMM precision)");
  app.add_option("--lengths", lengths_text, "Prefill lengths (one chunk)");
  app.add_option("--keep", keep, "Compact keep K (>= C = 134)");
  app.add_option("--batches", batches_text, "Decode batch sizes");
  app.add_option("--decode-context", decode_context, "Position of each decode step");
  app.add_option("--repeats", repeats, "Timed repeats per figure (median)");
  std::string attention_text = "simple,gemm";
  app.add_option("--prefill-attention", attention_text,
                 "Prefill attention kernels to time: simple and/or gemm");
  app.add_flag("--json", json_output, "Print one JSON object");
  CLI11_PARSE(app, argc, argv);
  std::vector<cuda::PrefillAttention> attention_kernels;
  for (const std::string& name : ParseNames(attention_text)) {
    absl::StatusOr<cuda::PrefillAttention> kernel =
        cuda::ParsePrefillAttention(name, "--prefill-attention");
    if (!kernel.ok()) {
      std::cerr << "baton_gpu_bench: " << kernel.status().message() << "\n";
      return 2;
    }
    attention_kernels.push_back(*kernel);
  }

  if (cuda::DeviceCount() == 0) {
    std::cerr << "baton_gpu_bench: no CUDA device (" << cuda::NoDeviceReason() << ")\n";
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Context>> created = Context::Create(0);
  if (!created.ok()) {
    std::cerr << created.status() << "\n";
    return 1;
  }
  Context& ctx = **created;
  const std::vector<int64_t> lengths = ParseList(lengths_text), batches = ParseList(batches_text);
  nlohmann::json result = {{"runs", nlohmann::json::array()}};
  for (const std::string& preset : ParseNames(presets_text)) {
    const Shape shape = preset == "large" ? LargeShape() : SmallShape();
    for (const std::string& dtype : ParseNames(dtypes_text)) {
      const int64_t max_rows = std::max(*std::max_element(lengths.begin(), lengths.end()),
                                        *std::max_element(batches.begin(), batches.end()));
      nlohmann::json run = {{"preset", shape.name},
                            {"dtype", dtype},
                            {"d", shape.d},
                            {"heads", shape.heads},
                            {"kv_heads", shape.kv_heads},
                            {"head_dim", shape.head_dim},
                            {"layers", shape.layers},
                            {"producers", shape.producers},
                            {"inter", shape.inter},
                            {"vocab", shape.vocab},
                            {"window", shape.window},
                            {"prefill", nlohmann::json::array()},
                            {"decode", nlohmann::json::array()}};
      {
        Runner runner(ctx, shape, dtype == "bf16", max_rows);
        for (int64_t L : lengths) {
          for (const std::string mode : {"off", "compact"}) {
            Runner::Batch b = runner.MakeBatch(1, L, 0, mode == "off" ? -1 : keep);
            for (const cuda::PrefillAttention kernel : attention_kernels) {
              ctx.set_prefill_attention(kernel);
              const double ms = MedianMs(ctx, repeats, [&] { runner.Forward(b, false); });
              run["prefill"].push_back({{"length", L},
                                        {"mode", mode},
                                        {"attention", cuda::PrefillAttentionName(kernel)},
                                        {"consumer_rows", b.consumer_rows},
                                        {"ms", ms},
                                        {"tokens_per_s", L / (ms / 1e3)}});
            }
          }
        }
        ctx.set_prefill_attention(cuda::PrefillAttention::kSimple);
        for (int64_t batch : batches) {
          Runner::Batch b = runner.MakeBatch(batch, 1, decode_context, -1);
          const double ms = MedianMs(ctx, repeats, [&] { runner.Forward(b, true); });
          nlohmann::json figure = {{"batch", batch},
                                   {"context", decode_context},
                                   {"step_ms", ms},
                                   {"tokens_per_s", batch / (ms / 1e3)}};
          // The same step captured once into a CUDA graph and replayed: no launch per op.
          absl::StatusOr<std::unique_ptr<Context::Graph>> graph =
              ctx.Capture([&] { runner.Forward(b, true); });
          if (graph.ok()) {
            figure["graph_step_ms"] = MedianMs(ctx, repeats, [&] { (*graph)->Replay(); });
          } else {
            figure["graph_step_ms"] = nullptr;
            figure["graph_error"] = std::string(graph.status().message());
          }
          run["decode"].push_back(figure);
        }
      }
      if (absl::Status s = ctx.Synchronize(); !s.ok()) {
        std::cerr << "baton_gpu_bench: " << s << "\n";
        return 1;
      }
      result["runs"].push_back(run);
    }
  }
  if (json_output) {
    std::cout << result.dump(2) << "\n";
    return 0;
  }
  for (const auto& run : result["runs"]) {
    std::printf("%s %s (d %lld, %lld heads x %lld, GQA %lld, %lld layers)\n",
                run["preset"].get<std::string>().c_str(), run["dtype"].get<std::string>().c_str(),
                run["d"].get<long long>(), run["heads"].get<long long>(),
                run["head_dim"].get<long long>(), run["kv_heads"].get<long long>(),
                run["layers"].get<long long>());
    for (const auto& p : run["prefill"]) {
      std::printf("  prefill L %6lld %-8s %-7s %10.1f tok/s  %9.2f ms\n",
                  p["length"].get<long long>(), p["mode"].get<std::string>().c_str(),
                  p["attention"].get<std::string>().c_str(), p["tokens_per_s"].get<double>(),
                  p["ms"].get<double>());
    }
    for (const auto& d : run["decode"]) {
      std::printf("  decode batch %4lld at %lld  %8.3f ms/step  %10.1f tok/s\n",
                  d["batch"].get<long long>(), d["context"].get<long long>(),
                  d["step_ms"].get<double>(), d["tokens_per_s"].get<double>());
    }
  }
  return 0;
}
