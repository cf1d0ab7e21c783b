// batonctl approx-error: how far truncated consumer replay moves the model's outputs.
//
// For each prompt, the untruncated model (mode off) fixes a greedy continuation (or, with
// --text, the text's own next tokens are the continuation); every
// variant then runs the same prompt and is fed the same continuation (teacher forcing), so
// that step i of every variant predicts the same position from the same input. A variant is
// a truncation mode (mask, compact) at a keep K, cold (s_valid = 0) or after a prefix hit of
// H tokens (s_valid = H, as the router's ring cap would give). Per step it compares the
// next-token distribution with off's: KL(off || variant), top-1 agreement and the largest
// absolute logit difference. It also compares the consumer SWA rings right after prefill,
// position by position, grouped by the position's distance from the retained region's edge
// (p - (L - K)): rows far enough inside the retained region are exact.
//
// The seed's exactness claims become checks: with K >= R = W + (D - 1)(W - 1) every step
// equals off; compact equals mask; a hit with H <= L - K equals the cold run.
//
// --free-running asks what a user sees instead: off and every variant each generate --steps
// tokens greedily, each from its own output, and each completion is compared with off's token
// by token. A flip then changes everything after it, so this counts completions that differ
// anywhere, the share of positions that differ and where the first difference falls, with an
// exact binomial upper bound on the rate of differing completions (the rule of three, 3/N, when
// none of N differs). With --text the prompts are consecutive --prompt-len windows of the text.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "baton/common/ced_rules.h"
#include "baton/common/parse.h"
#include "baton/model/engine_factory.h"
#include "baton/model/fidelity.h"
#include "baton/text/tokenizer.h"
#include "commands.h"
#include "document_tokens.h"
#include "nlohmann/json.hpp"

namespace baton::tools {
namespace {

struct ApproxErrorOptions {
  std::string model_dir;
  std::string prompts_file;  // JSON lines, each a list of token ids
  std::string text_file;     // one document a line, tokenized with the model's tokenizer
  int64_t num_prompts = 4;
  int64_t prompt_len = 512;
  uint64_t seed = 1;
  int64_t steps = 16;
  std::string keeps;  // comma-separated; default: C, then doubling up to R and R
  std::string modes = "mask,compact";
  bool prefix_hit = true;
  bool free_running = false;  // greedy completions compared, not teacher-forced steps
  bool json = false;
};

// Greedy completion of `tokens` tokens: the prefill's argmax, then each decode step's argmax
// fed back in.
absl::StatusOr<std::vector<int32_t>> GreedyCompletion(model::Engine& ced,
                                                      const std::vector<int32_t>& prompt,
                                                      const model::PrefillOptions& options,
                                                      int64_t tokens) {
  model::SequenceState state(ced.state_layout());
  absl::StatusOr<model::PrefillResult> result = ced.Prefill(prompt, options, state);
  if (!result.ok()) return result.status();
  std::vector<float> logits(result->logits.end() - ced.config().vocab_size, result->logits.end());
  std::vector<int32_t> completion = {model::Argmax(logits)};
  while (static_cast<int64_t>(completion.size()) < tokens) {
    const model::DecodeItem item{
        .state = &state, .token = completion.back(), .logits = logits.data()};
    if (absl::Status s = ced.Decode({&item, 1}); !s.ok()) return s;
    completion.push_back(model::Argmax(logits));
  }
  return completion;
}

// The s_valid of each variant of a prompt of L tokens: 0 (cold), then, with `prefix_hit`, the
// largest hit the router's ring cap allows, floor((L - C) / B) blocks, when there is one.
std::vector<int64_t> VariantStarts(int64_t L, const ModelConfig& config, bool prefix_hit) {
  const int64_t B = config.kv_block_size;
  const int64_t hit = std::max<int64_t>(0, L - config.ring_capacity()) / B * B;
  if (prefix_hit && hit > 0) return {0, hit};
  return {0};
}

// One variant's run: the logits of every step and the consumer rings after prefill.
struct Run {
  std::vector<std::vector<float>> step_logits;  // [steps][V]
  std::vector<float> consumer_swa;
};

absl::StatusOr<Run> RunVariant(model::Engine& ced, const std::vector<int32_t>& prompt,
                               const std::vector<int32_t>& continuation, model::TruncationMode mode,
                               int64_t keep, int64_t s_valid) {
  Run run;
  const int64_t ring = ced.state_layout().consumer_swa_floats();
  absl::StatusOr<std::vector<std::vector<float>>> logits = model::TeacherForcedLogits(
      ced, prompt, continuation, {.mode = mode, .keep = keep, .s_valid = s_valid},
      [&](const model::SequenceState& state) {
        run.consumer_swa.assign(state.consumer_swa(), state.consumer_swa() + ring);
      });
  if (!logits.ok()) return logits.status();
  run.step_logits = *std::move(logits);
  return run;
}

double MaxAbs(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double{a[i]} - b[i]));
  return m;
}

// Prompts from --text: the documents' ids (bos first, concatenated as `batonctl eval` does)
// cut into windows of --prompt-len + --steps tokens, at most --num-prompts of them; each
// window's first --prompt-len tokens are the prompt and the rest its continuation (teacher
// forced: step i predicts the continuation's token i).
absl::Status LoadTextPrompts(const ApproxErrorOptions& o, const std::string& model_dir,
                             int64_t vocab, std::vector<std::vector<int32_t>>& prompts,
                             std::vector<std::vector<int32_t>>& continuations) {
  if (!o.prompts_file.empty()) {
    return absl::InvalidArgumentError("--text and --prompts: give one of them");
  }
  if (o.num_prompts < 1 || o.prompt_len < 1) {
    return absl::InvalidArgumentError("--num-prompts and --prompt-len: both must be >= 1");
  }
  absl::StatusOr<std::unique_ptr<text::Tokenizer>> tokenizer =
      text::Tokenizer::Load(model_dir, vocab);
  if (!tokenizer.ok()) return tokenizer.status();
  absl::StatusOr<std::vector<int32_t>> read = ReadDocumentTokens(o.text_file, **tokenizer);
  if (!read.ok()) return read.status();
  const std::vector<int32_t>& stream = *read;
  // Free-running prompts need no continuation from the text: the windows are the prompts.
  const int64_t window = o.prompt_len + (o.free_running ? 0 : o.steps);
  for (int64_t at = 0; at + window <= static_cast<int64_t>(stream.size()) &&
                       static_cast<int64_t>(prompts.size()) < o.num_prompts;
       at += window) {
    prompts.emplace_back(stream.begin() + at, stream.begin() + at + o.prompt_len);
    continuations.emplace_back(stream.begin() + at + o.prompt_len, stream.begin() + at + window);
  }
  if (prompts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--text: ", o.text_file, " gives ", stream.size(), " tokens, fewer than one window of ",
        window, o.free_running ? " (--prompt-len)" : " (--prompt-len + --steps)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<int32_t>>> LoadPrompts(const ApproxErrorOptions& o,
                                                              int64_t vocab) {
  std::vector<std::vector<int32_t>> prompts;
  if (!o.prompts_file.empty()) {
    std::ifstream in(o.prompts_file);
    if (!in) return absl::NotFoundError(absl::StrCat("--prompts: cannot read ", o.prompts_file));
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
      if (!row.is_array() || row.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--prompts: line ", n, " must be a non-empty JSON list of token ids"));
      }
      std::vector<int32_t> prompt;
      for (const nlohmann::json& t : row) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab) {
          return absl::InvalidArgumentError(absl::StrCat("--prompts: line ", n, ": ", t.dump(),
                                                         " is not a token id in [0, ", vocab, ")"));
        }
        prompt.push_back(t.get<int32_t>());
      }
      prompts.push_back(std::move(prompt));
    }
    if (prompts.empty()) return absl::InvalidArgumentError("--prompts: the file holds no prompt");
    return prompts;
  }
  if (o.num_prompts < 1 || o.prompt_len < 1) {
    return absl::InvalidArgumentError("--num-prompts and --prompt-len: both must be >= 1");
  }
  std::mt19937_64 rng(o.seed);
  for (int64_t i = 0; i < o.num_prompts; ++i) {
    std::vector<int32_t> prompt(o.prompt_len);
    for (int32_t& t : prompt) t = static_cast<int32_t>(3 + rng() % (vocab - 3));
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

// The one-sided 95% upper bound on a binomial rate after `d` events in `n` trials (Clopper-
// Pearson): the p at which P(X <= d) = 0.05. With d = 0 it is 1 - 0.05^(1/n), about 3/n.
double BinomialUpper95(int64_t d, int64_t n) {
  if (d >= n) return 1;
  auto cdf = [&](double p) {  // P(X <= d) for X ~ Binomial(n, p), 0 < p < 1
    double sum = 0;
    for (int64_t k = 0; k <= d; ++k) {
      sum += std::exp(std::lgamma(n + 1.0) - std::lgamma(k + 1.0) - std::lgamma(n - k + 1.0) +
                      k * std::log(p) + (n - k) * std::log1p(-p));
    }
    return sum;
  };
  double lo = 0, hi = 1;  // cdf falls as p rises
  for (int i = 0; i < 100; ++i) {
    const double mid = (lo + hi) / 2;
    (cdf(mid) > 0.05 ? lo : hi) = mid;
  }
  return hi;
}

double Median(std::vector<int64_t> values) {  // values non-empty
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return (values[(n - 1) / 2] + values[n / 2]) / 2.0;
}

using TruncationModes = std::vector<std::pair<std::string, model::TruncationMode>>;

// One free-running variant (mode, keep, H) over the prompts.
struct Divergences {
  std::string mode;
  int64_t keep = 0;
  int64_t hit = 0;
  std::vector<int64_t> first_divergence;  // per prompt; -1 where the completion is off's
  std::vector<int64_t> positions_differ;  // per prompt
};

// A variant's figures: completions identical to off's, the divergence rate's 95% upper bound,
// the share of positions that differ, and where the first divergence falls.
nlohmann::json DivergenceJson(const Divergences& t, int64_t steps) {
  const int64_t n = static_cast<int64_t>(t.first_divergence.size());
  std::vector<int64_t> firsts;
  int64_t differ = 0;
  for (int64_t p = 0; p < n; ++p) {
    if (t.first_divergence[p] >= 0) firsts.push_back(t.first_divergence[p]);
    differ += t.positions_differ[p];
  }
  const int64_t d = static_cast<int64_t>(firsts.size());
  nlohmann::json r = {{"mode", t.mode},
                      {"keep", t.keep},
                      {"prefix_hit_tokens", t.hit},
                      {"completions", n},
                      {"identical", n - d},
                      {"identical_share", static_cast<double>(n - d) / n},
                      {"diverging", d},
                      {"divergence_upper95", BinomialUpper95(d, n)},
                      {"position_divergence_share", static_cast<double>(differ) / (n * steps)},
                      {"first_divergence_median", nullptr},
                      {"first_divergence_mean", nullptr},
                      {"first_divergence", t.first_divergence},
                      {"positions_differ", t.positions_differ}};
  if (d == 0) r["rule_of_three"] = 3.0 / n;
  if (d > 0) {
    r["first_divergence_median"] = Median(firsts);
    double sum = 0;
    for (int64_t f : firsts) sum += f;
    r["first_divergence_mean"] = sum / d;
  }
  return r;
}

// The free-running report as text, a row per variant.
void PrintFreeRunning(const nlohmann::json& report) {
  std::cout << absl::StrFormat(
      "%d prompts, %d greedy tokens each (off's: median %.1f distinct); C = %d, "
      "R = W + (D-1)(W-1) = %d\n",
      report["prompts"].get<int64_t>(), report["tokens"].get<int64_t>(),
      report["off_distinct_tokens_median"].get<double>(), report["ring_capacity"].get<int64_t>(),
      report["span_r"].get<int64_t>());
  std::cout << absl::StrFormat("%-8s %6s %6s %10s %10s %12s %12s %12s\n", "mode", "keep", "hit",
                               "identical", "upper95", "pos differ", "first med", "first mean");
  auto or_dash = [](const nlohmann::json& v) {
    return v.is_null() ? std::string("-") : absl::StrFormat("%.1f", v.get<double>());
  };
  for (const nlohmann::json& r : report["results"]) {
    std::cout << absl::StrFormat(
        "%-8s %6d %6d %10.4f %10.4f %12.4g %12s %12s\n", r["mode"].get<std::string>(),
        r["keep"].get<int64_t>(), r["prefix_hit_tokens"].get<int64_t>(),
        r["identical_share"].get<double>(), r["divergence_upper95"].get<double>(),
        r["position_divergence_share"].get<double>(), or_dash(r["first_divergence_median"]),
        or_dash(r["first_divergence_mean"]));
  }
}

// --free-running: every variant's greedy completion against off's, per prompt.
int RunFreeRunning(const ApproxErrorOptions& o, model::Engine& ced,
                   const std::vector<std::vector<int32_t>>& prompts,
                   const std::vector<int64_t>& keeps, const TruncationModes& modes) {
  const ModelConfig& config = ced.config();
  std::vector<Divergences> totals;
  // How varied off's completions are: a small model's greedy output soon repeats itself, and a
  // loop's tokens are confident ones that a small logit difference does not flip.
  std::vector<int64_t> off_distinct;
  for (const std::vector<int32_t>& prompt : prompts) {
    const int64_t L = static_cast<int64_t>(prompt.size());
    absl::StatusOr<std::vector<int32_t>> off = GreedyCompletion(ced, prompt, {}, o.steps);
    if (!off.ok()) return ReportError("approx-error", off.status());
    off_distinct.push_back(
        static_cast<int64_t>(std::set<int32_t>(off->begin(), off->end()).size()));
    const std::vector<int64_t> starts = VariantStarts(L, config, o.prefix_hit);
    for (int64_t keep : keeps) {
      for (const auto& [name, mode] : modes) {
        for (int64_t s_valid : starts) {
          absl::StatusOr<std::vector<int32_t>> completion = GreedyCompletion(
              ced, prompt, {.mode = mode, .keep = keep, .s_valid = s_valid}, o.steps);
          if (!completion.ok()) return ReportError("approx-error", completion.status());
          // Prompts of other lengths (--prompts) have other hits: one variant per (mode, K, H).
          auto it = std::find_if(totals.begin(), totals.end(), [&](const Divergences& t) {
            return t.mode == name && t.keep == keep && t.hit == s_valid;
          });
          Divergences& t =
              it != totals.end() ? *it : totals.emplace_back(Divergences{name, keep, s_valid});
          int64_t first = -1, differ = 0;
          for (int64_t i = 0; i < o.steps; ++i) {
            if ((*completion)[i] == (*off)[i]) continue;
            if (first < 0) first = i;
            ++differ;
          }
          t.first_divergence.push_back(first);
          t.positions_differ.push_back(differ);
        }
      }
    }
  }
  nlohmann::json results = nlohmann::json::array();
  for (const Divergences& t : totals) results.push_back(DivergenceJson(t, o.steps));
  const nlohmann::json report = {{"kind", "approx_error_free_running"},
                                 {"model", o.model_dir},
                                 {"text", o.text_file},
                                 {"prompts", prompts.size()},
                                 {"tokens", o.steps},
                                 {"ring_capacity", config.ring_capacity()},
                                 {"window", config.sliding_window},
                                 {"span_r", config.dependency_span()},
                                 {"off_distinct_tokens_median", Median(off_distinct)},
                                 {"off_distinct_tokens", off_distinct},
                                 {"results", std::move(results)}};
  if (o.json) {
    std::cout << report.dump(2) << "\n";
  } else {
    PrintFreeRunning(report);
  }
  return kExitOk;
}

// --keep (default: C, doubling, to R) and --modes (mask, compact; off is the reference), each
// checked.
absl::StatusOr<std::vector<int64_t>> KeepsToTry(const ApproxErrorOptions& o,
                                                const ModelConfig& config) {
  const int64_t C = config.ring_capacity(), R = config.dependency_span();
  std::vector<int64_t> keeps;
  if (o.keeps.empty()) {
    for (int64_t k = C; k < R; k *= 2) keeps.push_back(k);
    keeps.push_back(R);
  } else {
    absl::StatusOr<std::vector<int64_t>> parsed = ParseIntList(o.keeps, "--keep");
    if (!parsed.ok()) return parsed.status();
    keeps = *parsed;
  }
  for (int64_t k : keeps) {
    if (absl::Status st = CheckKeep(true, k, C, "--keep"); !st.ok()) return st;
  }
  return keeps;
}

absl::StatusOr<TruncationModes> ModesToTry(const ApproxErrorOptions& o) {
  TruncationModes modes;
  for (absl::string_view name : absl::StrSplit(o.modes, ',')) {
    absl::StatusOr<model::TruncationMode> mode =
        model::ParseTruncationMode(std::string(name), "--modes");
    if (!mode.ok()) return mode.status();
    if (*mode == model::TruncationMode::kOff) {
      return absl::InvalidArgumentError("--modes: off is the reference; use mask, compact");
    }
    modes.push_back({std::string(name), *mode});
  }
  return modes;
}

// Accumulated over prompts, per variant (mode, keep, H): per step and per edge distance.
struct Totals {
  std::string mode;
  int64_t keep = 0;
  int64_t hit = 0;
  std::vector<double> kl_sum, kl_max, max_abs;
  std::vector<int64_t> agree;
  std::map<int64_t, double> ring;  // edge distance -> max abs difference
  double vs_cold = 0;              // max abs logit difference against the cold variant
  int64_t runs = 0;
};

// Every variant's totals, and compact against mask per keep, over the prompts compared.
struct ApproxTotals {
  int64_t steps = 0;
  std::vector<Totals> totals;
  std::map<int64_t, double> compact_vs_mask;  // keep -> max abs logit difference

  Totals& For(const std::string& mode, int64_t keep, int64_t hit) {
    for (Totals& t : totals) {
      if (t.mode == mode && t.keep == keep && t.hit == hit) return t;
    }
    totals.push_back({mode, keep, hit});
    Totals& t = totals.back();
    t.kl_sum.assign(steps, 0);
    t.kl_max.assign(steps, 0);
    t.max_abs.assign(steps, 0);
    t.agree.assign(steps, 0);
    return t;
  }
};

// One variant's run against the reference into `t`: each step's logits, and the consumer
// rings' largest difference by distance from the keep edge (ring slot of position p is
// p % C; the ring holds positions [L - C, L)).
void Accumulate(const Run& reference, const Run& run, const model::StateLayout& layout, int64_t L,
                int64_t C, int64_t steps, Totals& t) {
  ++t.runs;
  for (int64_t i = 0; i < steps; ++i) {
    const model::LogitsError e = model::CompareLogits(reference.step_logits[i], run.step_logits[i]);
    t.kl_sum[i] += e.kl;
    t.kl_max[i] = std::max(t.kl_max[i], e.kl);
    t.max_abs[i] = std::max(t.max_abs[i], e.max_abs);
    t.agree[i] += e.top1;
  }
  for (int64_t p = std::max<int64_t>(0, L - C); p < L; ++p) {
    double m = 0;
    for (int64_t l = 0; l < layout.consumer_layers; ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        const int64_t at = ((l * 2 + kv) * C + p % C) * layout.kv_dim;
        for (int64_t j = 0; j < layout.kv_dim; ++j) {
          m = std::max(m,
                       std::abs(double{reference.consumer_swa[at + j]} - run.consumer_swa[at + j]));
        }
      }
    }
    double& slot = t.ring[p - (L - t.keep)];
    slot = std::max(slot, m);
  }
}

// One prompt: the untruncated reference along `continuation`, then every mode, keep and start
// against it (a start after a hit also against that mode's cold run).
absl::Status ComparePrompt(model::Engine& ced, const std::vector<int32_t>& prompt,
                           const std::vector<int32_t>& continuation, bool prefix_hit,
                           const std::vector<int64_t>& keeps, const TruncationModes& modes,
                           ApproxTotals& out) {
  const ModelConfig& config = ced.config();
  const int64_t L = static_cast<int64_t>(prompt.size()), C = config.ring_capacity();
  absl::StatusOr<Run> reference =
      RunVariant(ced, prompt, continuation, model::TruncationMode::kOff, 0, 0);
  if (!reference.ok()) return reference.status();
  const std::vector<int64_t> starts = VariantStarts(L, config, prefix_hit);
  for (int64_t keep : keeps) {
    std::map<std::string, Run> cold;
    for (const auto& [name, mode] : modes) {
      for (int64_t s_valid : starts) {
        absl::StatusOr<Run> run = RunVariant(ced, prompt, continuation, mode, keep, s_valid);
        if (!run.ok()) return run.status();
        Totals& t = out.For(name, keep, s_valid);
        Accumulate(*reference, *run, ced.state_layout(), L, C, out.steps, t);
        if (s_valid == 0) {
          cold[name] = *std::move(run);
          continue;
        }
        for (int64_t i = 0; i < out.steps; ++i) {
          t.vs_cold = std::max(t.vs_cold, MaxAbs(run->step_logits[i], cold[name].step_logits[i]));
        }
      }
    }
    if (cold.count("mask") && cold.count("compact")) {
      double& m = out.compact_vs_mask[keep];
      for (int64_t i = 0; i < out.steps; ++i) {
        m = std::max(m, MaxAbs(cold["mask"].step_logits[i], cold["compact"].step_logits[i]));
      }
    }
  }
  return absl::OkStatus();
}

// One variant's figures: over all steps and per step, and the ring by edge distance.
nlohmann::json TotalsJson(const Totals& t, int64_t steps_per_run) {
  nlohmann::json steps = nlohmann::json::array();
  double kl_total = 0, kl_max = 0, max_abs = 0;
  int64_t agree = 0;
  for (int64_t i = 0; i < steps_per_run; ++i) {
    steps.push_back({{"step", i},
                     {"kl_mean", t.kl_sum[i] / t.runs},
                     {"kl_max", t.kl_max[i]},
                     {"top1_agreement", static_cast<double>(t.agree[i]) / t.runs},
                     {"max_abs_logit_diff", t.max_abs[i]}});
    kl_total += t.kl_sum[i];
    kl_max = std::max(kl_max, t.kl_max[i]);
    max_abs = std::max(max_abs, t.max_abs[i]);
    agree += t.agree[i];
  }
  nlohmann::json ring = nlohmann::json::array();
  for (const auto& [d, m] : t.ring) ring.push_back({{"edge_distance", d}, {"max_abs", m}});
  nlohmann::json r = {{"mode", t.mode},
                      {"keep", t.keep},
                      {"prefix_hit_tokens", t.hit},
                      {"prompts", t.runs},
                      {"kl_mean", kl_total / (t.runs * steps_per_run)},
                      {"kl_max", kl_max},
                      {"top1_agreement", static_cast<double>(agree) / (t.runs * steps_per_run)},
                      {"max_abs_logit_diff", max_abs},
                      {"steps", std::move(steps)},
                      {"ring_distance", std::move(ring)}};
  if (t.hit > 0) r["max_abs_vs_cold"] = t.vs_cold;
  return r;
}

// The report as text: the variants' rows, then compact against mask.
void PrintApproxError(const nlohmann::json& report) {
  std::cout << absl::StrFormat(
      "%d prompts, %d teacher-forced steps; C = %d, W = %d, R = W + (D-1)(W-1) = %d\n",
      report["prompts"].get<int64_t>(), report["steps"].get<int64_t>(),
      report["ring_capacity"].get<int64_t>(), report["window"].get<int64_t>(),
      report["span_r"].get<int64_t>());
  std::cout << absl::StrFormat("%-8s %6s %6s %12s %12s %8s %14s %12s\n", "mode", "keep", "hit",
                               "KL mean", "KL max", "top-1", "max |dlogit|", "vs cold");
  for (const nlohmann::json& r : report["results"]) {
    std::cout << absl::StrFormat(
        "%-8s %6d %6d %12.4g %12.4g %8.4f %14.4g %12s\n", r["mode"].get<std::string>(),
        r["keep"].get<int64_t>(), r["prefix_hit_tokens"].get<int64_t>(), r["kl_mean"].get<double>(),
        r["kl_max"].get<double>(), r["top1_agreement"].get<double>(),
        r["max_abs_logit_diff"].get<double>(),
        r.contains("max_abs_vs_cold") ? absl::StrFormat("%.4g", r["max_abs_vs_cold"].get<double>())
                                      : std::string("-"));
  }
  for (const nlohmann::json& m : report["compact_vs_mask"]) {
    std::cout << absl::StrFormat("compact vs mask at keep %d: max |dlogit| %.4g\n",
                                 m["keep"].get<int64_t>(), m["max_abs_logit_diff"].get<double>());
  }
}

int RunApproxError(const ApproxErrorOptions& o) {
  absl::StatusOr<std::unique_ptr<model::Engine>> loaded = model::LoadEngine(o.model_dir);
  if (!loaded.ok()) return ReportError("approx-error", loaded.status());
  model::Engine& ced = **loaded;
  const ModelConfig& config = ced.config();
  if (o.steps < 1) {
    return ReportError("approx-error", absl::InvalidArgumentError(
                                           absl::StrCat("--steps is ", o.steps, "; must be >= 1")));
  }
  absl::StatusOr<std::vector<int64_t>> keeps = KeepsToTry(o, config);
  if (!keeps.ok()) return ReportError("approx-error", keeps.status());
  absl::StatusOr<TruncationModes> modes = ModesToTry(o);
  if (!modes.ok()) return ReportError("approx-error", modes.status());
  absl::StatusOr<std::vector<std::vector<int32_t>>> prompts;
  std::vector<std::vector<int32_t>> text_continuations;  // with --text: each prompt's own
  if (!o.text_file.empty()) {
    prompts.emplace();
    if (absl::Status s =
            LoadTextPrompts(o, o.model_dir, config.vocab_size, *prompts, text_continuations);
        !s.ok()) {
      return ReportError("approx-error", s);
    }
  } else {
    prompts = LoadPrompts(o, config.vocab_size);
  }
  if (!prompts.ok()) return ReportError("approx-error", prompts.status());
  if (o.free_running) return RunFreeRunning(o, ced, *prompts, *keeps, *modes);

  ApproxTotals totals{.steps = o.steps};
  for (size_t index = 0; index < prompts->size(); ++index) {
    const std::vector<int32_t>& prompt = (*prompts)[index];
    // The continuation, fed to every variant: the text's next tokens, or off's greedy ones.
    std::vector<int32_t> continuation;
    if (!text_continuations.empty()) {
      continuation = text_continuations[index];
    } else {
      absl::StatusOr<std::vector<int32_t>> greedy = GreedyCompletion(ced, prompt, {}, o.steps);
      if (!greedy.ok()) return ReportError("approx-error", greedy.status());
      continuation = *std::move(greedy);
    }
    if (absl::Status s =
            ComparePrompt(ced, prompt, continuation, o.prefix_hit, *keeps, *modes, totals);
        !s.ok()) {
      return ReportError("approx-error", s);
    }
  }
  nlohmann::json results = nlohmann::json::array();
  for (const Totals& t : totals.totals) results.push_back(TotalsJson(t, o.steps));
  nlohmann::json mask_compact = nlohmann::json::array();
  for (const auto& [keep, m] : totals.compact_vs_mask) {
    mask_compact.push_back({{"keep", keep}, {"max_abs_logit_diff", m}});
  }
  const nlohmann::json report = {{"kind", "approx_error"},
                                 {"model", o.model_dir},
                                 {"text", o.text_file},
                                 {"prompts", prompts->size()},
                                 {"steps", o.steps},
                                 {"ring_capacity", config.ring_capacity()},
                                 {"window", config.sliding_window},
                                 {"span_r", config.dependency_span()},
                                 {"results", std::move(results)},
                                 {"compact_vs_mask", std::move(mask_compact)}};
  if (o.json) {
    std::cout << report.dump(2) << "\n";
  } else {
    PrintApproxError(report);
  }
  return kExitOk;
}

}  // namespace

Command AddApproxErrorCommand(CLI::App& app) {
  auto o = std::make_shared<ApproxErrorOptions>();
  CLI::App* command = app.add_subcommand(
      "approx-error", "Measure how truncated consumer replay moves outputs against mode off");
  command->add_option("--model", o->model_dir, "Model directory")->required();
  command->add_option("--prompts", o->prompts_file,
                      "JSON lines, each a list of token ids (default: generated prompts)");
  command->add_option("--text", o->text_file,
                      "Text file, one document a line: prompts and their continuations are "
                      "windows of its tokens (the model's tokenizer)");
  command->add_option("--num-prompts", o->num_prompts,
                      "Generated prompts (without --prompts), or most windows of --text");
  command->add_option("--prompt-len", o->prompt_len, "Tokens per generated prompt");
  command->add_option("--seed", o->seed, "Seed of the generated prompts");
  command->add_option("--steps", o->steps,
                      "Next-token predictions compared: the prompt's, then teacher-forced ones "
                      "(with --free-running: the tokens each completion generates)");
  command->add_option("--keep", o->keeps,
                      "Keeps K to measure, comma-separated (default: C, doubling, then R)");
  command->add_option("--modes", o->modes, "Truncation modes, comma-separated: mask, compact");
  command->add_flag("!--no-prefix-hit", o->prefix_hit,
                    "Skip the variants with a prefix hit (s_valid = the ring-capped H)");
  command->add_flag("--free-running", o->free_running,
                    "Compare greedy completions of --steps tokens, each variant continuing from "
                    "its own output, instead of teacher-forced steps");
  command->add_flag("--json", o->json, "Print one JSON object");
  return {command, [o] { return RunApproxError(*o); }};
}

}  // namespace baton::tools
