// A slow reference of the CED arithmetic for tests: plain loops in double precision, reading
// the tensors by name straight from model.safetensors and following DESIGN section 2 and the
// visibility rule of section 3 literally. It shares no code with the forward pass beyond
// the file reader.
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "baton/common/model_config.h"
#include "baton/model/safetensors.h"

namespace baton::model::testing {

struct ReferenceRun {
  // logits[i] for every position i >= s_valid that the reference computed (empty elsewhere)
  std::vector<std::vector<double>> logits;
};

class CedReference {
 public:
  CedReference(const std::string& model_dir, const ModelConfig& config) : c_(config) {
    auto file = SafetensorsFile::Read(model_dir + "/model.safetensors");
    for (const auto& [name, info] : file->tensors()) {
      std::vector<float> values(info.numel());
      file->CopyAsF32(info, values.data());
      t_[name] = std::vector<double>(values.begin(), values.end());
    }
  }

  // Runs tokens[0, T): rows < prompt_len are the prompt (prefill visibility with mode/keep),
  // rows >= prompt_len are decode steps. truncated: mask/compact semantics (lo_i uses s_keep).
  ReferenceRun Run(const std::vector<int32_t>& tokens, int64_t prompt_len, bool truncated,
                   int64_t keep, int64_t s_valid) const {
    const int64_t T = static_cast<int64_t>(tokens.size());
    const int64_t d = c_.hidden_size, hd = c_.head_dim, H = c_.num_attention_heads;
    const int64_t Hkv = c_.num_key_value_heads, W = c_.sliding_window;
    const int64_t P = c_.n_prefill_layer, N = c_.num_hidden_layers;
    const int64_t s_keep = truncated ? std::max<int64_t>(0, prompt_len - keep) : 0;
    Matrix h(T, std::vector<double>(d));
    for (int64_t i = 0; i < T; ++i) h[i] = Row("model.embed_tokens.weight", tokens[i], d);

    for (int64_t l = 0; l < P; ++l) {
      Matrix x = Norm(h, Name(l, "attn_norm.weight"));
      Matrix q = Project(x, Name(l, "self_attn.q_proj.weight"));
      Matrix k = Project(x, Name(l, "self_attn.k_proj.weight"));
      Matrix v = Project(x, Name(l, "self_attn.v_proj.weight"));
      Rope(q, H);
      Rope(k, Hkv);
      Matrix out(T, std::vector<double>(H * hd));
      for (int64_t i = 0; i < T; ++i) {
        std::vector<int64_t> keys;
        for (int64_t j = std::max<int64_t>(0, i - W + 1); j <= i; ++j) keys.push_back(j);
        out[i] = Attend(q[i], {{&k, &v, keys}});
      }
      Residual(h, out, l);
    }
    // Boundary: shared rows over every position; from them the block KV of every source layer
    // (every consumer layer when block_kv_sources is absent). A consumer layer reads that of
    // the nearest source at or below it: kg[l - P] is that source's.
    const Matrix shared = Norm(h, Name(P, "attn_norm.weight"));
    const std::vector<int64_t>& sources = c_.block_kv_sources;
    std::vector<Matrix> kg, vg;
    for (int64_t l = P; l < N; ++l) {
      if (sources.empty() || std::find(sources.begin(), sources.end(), l) != sources.end()) {
        kg.push_back(Project(shared, Name(l, "self_attn.global_k_proj.weight")));
        vg.push_back(Project(shared, Name(l, "self_attn.global_v_proj.weight")));
        Rope(kg.back(), Hkv);
      } else {
        kg.push_back(kg.back());
        vg.push_back(vg.back());
      }
    }
    for (int64_t l = P; l < N; ++l) {
      Matrix x = Norm(h, Name(l, "attn_norm.weight"));
      const Matrix& swa_source = c_.yoco_swa_share_hidden ? shared : x;
      Matrix q = Project(x, Name(l, "self_attn.q_proj.weight"));
      Matrix ks = Project(swa_source, Name(l, "self_attn.swa_k_proj.weight"));
      Matrix vs = Project(swa_source, Name(l, "self_attn.swa_v_proj.weight"));
      Rope(q, H);
      Rope(ks, Hkv);
      Matrix out(T, std::vector<double>(H * hd));
      for (int64_t i = s_valid; i < T; ++i) {
        std::vector<int64_t> global, local;
        for (int64_t j = 0; j <= i; ++j) global.push_back(j);
        const int64_t lo =
            i < prompt_len ? std::clamp(std::max({i - W + 1, s_keep, s_valid}), int64_t{0}, i + 1)
                           : std::clamp(std::max(i - W + 1, s_valid), int64_t{0}, i + 1);
        for (int64_t j = lo; j <= i; ++j) local.push_back(j);
        out[i] = Attend(q[i], {{&kg[l - P], &vg[l - P], global}, {&ks, &vs, local}});
      }
      Residual(h, out, l);
    }
    const Matrix final_rows = Norm(h, "model.norm.weight");
    const std::string head =
        c_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    ReferenceRun run;
    run.logits.resize(T);
    for (int64_t i = s_valid; i < T; ++i) {
      run.logits[i].resize(c_.vocab_size);
      for (int64_t v = 0; v < c_.vocab_size; ++v) {
        run.logits[i][v] = Dot(final_rows[i], t_.at(head).data() + v * d, d);
      }
    }
    return run;
  }

 private:
  using Matrix = std::vector<std::vector<double>>;
  struct KeySet {
    const Matrix* k;
    const Matrix* v;
    std::vector<int64_t> positions;
  };

  static std::string Name(int64_t layer, const char* suffix) {
    return "model.layers." + std::to_string(layer) + "." + suffix;
  }
  std::vector<double> Row(const std::string& name, int64_t row, int64_t width) const {
    const double* data = t_.at(name).data() + row * width;
    return std::vector<double>(data, data + width);
  }
  static double Dot(const std::vector<double>& a, const double* b, int64_t n) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
    return sum;
  }
  Matrix Norm(const Matrix& x, const std::string& weight) const {
    Matrix out = x;
    const std::vector<double>& g = t_.at(weight);
    for (auto& row : out) {
      double sq = 0;
      for (double v : row) sq += v * v;
      const double inv = 1.0 / std::sqrt(sq / row.size() + c_.rms_norm_eps);
      for (size_t e = 0; e < row.size(); ++e) row[e] *= inv * g[e];
    }
    return out;
  }
  // y = x W^T with W in Linear layout [out, in].
  Matrix Project(const Matrix& x, const std::string& weight) const {
    const std::vector<double>& w = t_.at(weight);
    const int64_t in = static_cast<int64_t>(x[0].size());
    const int64_t out_dim = static_cast<int64_t>(w.size()) / in;
    Matrix y(x.size(), std::vector<double>(out_dim));
    for (size_t r = 0; r < x.size(); ++r) {
      for (int64_t o = 0; o < out_dim; ++o) y[r][o] = Dot(x[r], w.data() + o * in, in);
    }
    return y;
  }
  void Rope(Matrix& x, int64_t heads) const {
    const int64_t hd = c_.head_dim, half = hd / 2;
    for (size_t pos = 0; pos < x.size(); ++pos) {
      for (int64_t h = 0; h < heads; ++h) {
        double* v = x[pos].data() + h * hd;
        std::vector<double> rotated(hd);
        for (int64_t e = 0; e < hd; ++e) {
          const int64_t k = e % half;
          const double angle = static_cast<double>(pos) * std::pow(c_.rope_theta, -2.0 * k / hd);
          const double rot = e < half ? -v[e + half] : v[e - half];
          rotated[e] = v[e] * std::cos(angle) + rot * std::sin(angle);
        }
        std::copy(rotated.begin(), rotated.end(), v);
      }
    }
  }
  // One softmax over the union of the key sets, per query head (GQA).
  std::vector<double> Attend(const std::vector<double>& q, const std::vector<KeySet>& sets) const {
    const int64_t hd = c_.head_dim, H = c_.num_attention_heads;
    const int64_t group = H / c_.num_key_value_heads;
    std::vector<double> out(H * hd, 0.0);
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kvh = h / group;
      std::vector<double> scores;
      std::vector<const double*> values;
      for (const KeySet& set : sets) {
        for (int64_t j : set.positions) {
          double s = 0;
          for (int64_t e = 0; e < hd; ++e) s += q[h * hd + e] * (*set.k)[j][kvh * hd + e];
          scores.push_back(s / std::sqrt(static_cast<double>(hd)));
          values.push_back((*set.v)[j].data() + kvh * hd);
        }
      }
      const double m = *std::max_element(scores.begin(), scores.end());
      double total = 0;
      for (double& s : scores) total += (s = std::exp(s - m));
      for (size_t n = 0; n < scores.size(); ++n) {
        for (int64_t e = 0; e < hd; ++e) out[h * hd + e] += scores[n] / total * values[n][e];
      }
    }
    return out;
  }
  // h += o_proj(attn); h += down(silu(gate(y)) * up(y)), y = RMSNorm_mlp(h).
  void Residual(Matrix& h, const Matrix& attn, int64_t l) const {
    const Matrix o = Project(attn, Name(l, "self_attn.o_proj.weight"));
    for (size_t i = 0; i < h.size(); ++i) {
      for (size_t e = 0; e < h[i].size(); ++e) h[i][e] += o[i][e];
    }
    const Matrix y = Norm(h, Name(l, "mlp_norm.weight"));
    const Matrix gate = Project(y, Name(l, "mlp.gate_proj.weight"));
    Matrix up = Project(y, Name(l, "mlp.up_proj.weight"));
    for (size_t i = 0; i < up.size(); ++i) {
      for (size_t e = 0; e < up[i].size(); ++e) {
        up[i][e] *= gate[i][e] / (1.0 + std::exp(-gate[i][e]));
      }
    }
    const Matrix down = Project(up, Name(l, "mlp.down_proj.weight"));
    for (size_t i = 0; i < h.size(); ++i) {
      for (size_t e = 0; e < h[i].size(); ++e) h[i][e] += down[i][e];
    }
  }

  ModelConfig c_;
  std::map<std::string, std::vector<double>> t_;
};

}  // namespace baton::model::testing
