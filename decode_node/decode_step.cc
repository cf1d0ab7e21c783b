#include "baton/decode_node/decode_step.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace baton::decode_node {

v1::FinishReason FinishReasonFor(int32_t token, uint32_t completion, uint32_t max_tokens,
                                 const std::set<int32_t>& stop_ids, bool ignore_eos,
                                 int64_t eos_token_id) {
  if (stop_ids.contains(token)) return v1::FINISH_REASON_STOP;
  if (!ignore_eos && token == eos_token_id) return v1::FINISH_REASON_EOS;
  if (completion >= max_tokens) return v1::FINISH_REASON_LENGTH;
  return v1::FINISH_REASON_UNSPECIFIED;
}

bool Generation::Accept(int32_t token, float logprob) {
  tokens.push_back(token);
  logprobs.push_back(logprob);
  completion += 1;
  next_input = token;
  if (!context.empty()) context.push_back(token);
  finish = FinishReasonFor(token, completion, max_tokens, stop_ids, ignore_eos, eos_token_id);
  return finished();
}

namespace {

int BandOf(int64_t prompt_len) {
  return prompt_len > 0 ? static_cast<int>(std::bit_width(static_cast<uint64_t>(prompt_len))) : 0;
}

}  // namespace

void ReplayCosts::AddPiece(double seconds, PieceSize piece) {
  if (piece.rows <= 0 || piece.prompt_len <= 0 || !(seconds > 0)) return;
  by_band[BandOf(piece.prompt_len)].Add(static_cast<double>(piece.rows), seconds);
  const double per_row = seconds / static_cast<double>(piece.rows);
  const double L = static_cast<double>(piece.prompt_len);
  per_position.Add(static_cast<double>(piece.rows), seconds / L);
  // A tenth forgotten each piece: the estimate follows the machine's load within a few steps.
  seconds_per_row = pieces == 0 ? per_row : 0.9 * seconds_per_row + 0.1 * per_row;
  length = pieces == 0 ? L : 0.9 * length + 0.1 * L;
  ++pieces;
}

ReplayCosts ReplayCosts::Proportional(double fixed_per_position, double row_per_position) {
  ReplayCosts costs;
  costs.per_position = CostFit::Line(fixed_per_position, row_per_position);
  costs.pieces = 1;
  return costs;
}

const CostFit* ReplayCosts::FitFor(int64_t prompt_len, double* scale) const {
  auto it = by_band.find(BandOf(prompt_len));
  if (it != by_band.end() && it->second.ready()) {
    *scale = 1;
    return &it->second;
  }
  if (per_position.ready()) {
    *scale = static_cast<double>(prompt_len);
    return &per_position;
  }
  return nullptr;
}

double ReplayCosts::PieceSeconds(PieceSize piece) const {
  double scale = 1;
  if (const CostFit* fit = FitFor(piece.prompt_len, &scale))
    return scale * fit->At(static_cast<double>(piece.rows));
  const double by_length = length > 0 ? static_cast<double>(piece.prompt_len) / length : 1;
  return seconds_per_row * by_length * static_cast<double>(piece.rows);
}

int64_t ReplayCosts::RowsWithin(double seconds, int64_t prompt_len) const {
  const int64_t most = int64_t{1} << 40;
  double scale = 1;
  if (const CostFit* fit = FitFor(prompt_len, &scale)) {
    const double fixed = scale * fit->fixed(), per_row = scale * fit->per_row();
    if (seconds < fixed) return 0;
    return per_row > 0 ? static_cast<int64_t>(
                             std::min<double>(most, std::floor((seconds - fixed) / per_row)))
                       : most;
  }
  const double row = PieceSeconds({.prompt_len = prompt_len, .rows = 1});
  return row > 0 ? static_cast<int64_t>(std::min<double>(most, std::floor(seconds / row))) : most;
}

double StreamsSeconds(const DraftCosts& costs, const ReplayCosts& replay_costs, int64_t requests,
                      int64_t decode_rows) {
  // Steps of these very rows, when there were some: the fit over every batch size bends a
  // batch's own time (a step of one request is mostly the weights' read).
  auto it = replay_costs.streams_alone.find(decode_rows);
  if (it != replay_costs.streams_alone.end()) return it->second;
  const CostFit& fit = costs.TargetFor(requests);
  return fit.ready() ? fit.At(static_cast<double>(decode_rows)) : 0;
}

void FoldStepTime(DraftCosts& costs, ReplayCosts& replay_costs, int64_t requests,
                  int64_t decode_rows, std::span<const PieceSize> pieces, double seconds) {
  if (pieces.empty()) {
    if (decode_rows <= 0) return;
    costs.AddStep(requests, decode_rows, seconds);
    auto [it, added] = replay_costs.streams_alone.try_emplace(decode_rows, seconds);
    if (!added) it->second = 0.9 * it->second + 0.1 * seconds;
    return;
  }
  const double streams =
      decode_rows > 0 ? StreamsSeconds(costs, replay_costs, requests, decode_rows) : 0;
  if (decode_rows > 0 && streams <= 0) return;
  double work = 0;
  for (const PieceSize& piece : pieces) work += static_cast<double>(piece.rows * piece.prompt_len);
  if (!(work > 0)) return;
  for (const PieceSize& piece : pieces) {
    replay_costs.AddPiece(
        (seconds - streams) * static_cast<double>(piece.rows * piece.prompt_len) / work, piece);
  }
}

void StepLog::Add(int64_t decode_rows, std::span<const PieceSize> pieces, double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds)) return;
  Step step{.rows = static_cast<double>(decode_rows), .seconds = seconds};
  for (const PieceSize& piece : pieces) {
    const double L = static_cast<double>(piece.prompt_len);
    step.positions += L;
    step.row_positions += L * static_cast<double>(piece.rows);
  }
  if (steps_.size() < kSteps) {
    steps_.push_back(step);
  } else {
    steps_[next_] = step;
  }
  next_ = (next_ + 1) % kSteps;
}

double StepLog::Summary::Price(int64_t decode_rows, std::span<const PieceSize> pieces) const {
  double seconds = 0;
  if (decode_rows > 0) {
    if (!line_ready) return 0;
    seconds += fixed + per_row * static_cast<double>(decode_rows);
  }
  for (const PieceSize& piece : pieces) {
    if (!pieces_ready) return 0;
    seconds += static_cast<double>(piece.prompt_len) *
               (piece_fixed + piece_row * static_cast<double>(piece.rows));
  }
  return seconds;
}

StepLog::Summary StepLog::Summarize(const CostFit& fallback, const CostFit& replay_fallback) const {
  Summary out;
  FitLine(fallback, out);
  FitPieces(replay_fallback, out);
  Spread(out);
  return out;
}

void StepLog::FitLine(const CostFit& fallback, Summary& out) const {
  // The rows' line: y = fixed + per_row x over the steps without replay.
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const Step& s : steps_) {
    if (s.positions > 0 || s.rows <= 0) continue;
    n += 1;
    sx += s.rows;
    sy += s.seconds;
    sxx += s.rows * s.rows;
    sxy += s.rows * s.seconds;
  }
  if (n >= kFewest) {
    const double mx = sx / n, my = sy / n, var = sxx / n - mx * mx;
    // Rows that never differ leave the slope to the planner's fit (or none).
    double slope = var > 1e-9 * mx * mx ? (sxy / n - mx * my) / var
                   : fallback.ready()   ? fallback.per_row()
                                        : 0;
    slope = std::max(0.0, slope);
    double fixed = my - slope * mx;
    if (fixed < 0) {  // through the origin
      fixed = 0;
      slope = sxy / sxx;
    }
    out = {.line_ready = true, .fixed = fixed, .per_row = slope};
  } else if (fallback.ready()) {
    out = {.line_ready = true, .fixed = fallback.fixed(), .per_row = fallback.per_row()};
  }
}

void StepLog::FitPieces(const CostFit& replay_fallback, Summary& out) const {
  // The pieces: what a step with replay took beyond its rows' line, against sum(L) and
  // sum(L x rows).
  double m = 0, spp = 0, spq = 0, sqq = 0, spr = 0, sqr = 0;
  for (const Step& s : steps_) {
    if (s.positions <= 0 || (s.rows > 0 && !out.line_ready)) continue;
    const double rest = s.seconds - (s.rows > 0 ? out.fixed + out.per_row * s.rows : 0);
    m += 1;
    spp += s.positions * s.positions;
    spq += s.positions * s.row_positions;
    sqq += s.row_positions * s.row_positions;
    spr += s.positions * rest;
    sqr += s.row_positions * rest;
  }
  if (m >= kFewest && sqq > 0) {
    const double det = spp * sqq - spq * spq;
    double a = 0, b = 0;
    if (det > 1e-9 * spp * sqq) {
      a = (spr * sqq - sqr * spq) / det;
      b = (sqr * spp - spr * spq) / det;
    } else {  // every piece of one size per position: the per-row part is the planner's
      b = replay_fallback.ready() ? replay_fallback.per_row() : 0;
      a = (spr - b * spq) / spp;
    }
    if (a < 0) {
      a = 0;
      b = sqr / sqq;
    }
    if (b < 0) {
      b = 0;
      a = spr / spp;
    }
    out.pieces_ready = true;
    out.piece_fixed = std::max(0.0, a);
    out.piece_row = std::max(0.0, b);
  } else if (replay_fallback.ready()) {
    out.pieces_ready = true;
    out.piece_fixed = replay_fallback.fixed();
    out.piece_row = replay_fallback.per_row();
  }
}

void StepLog::Spread(Summary& out) const {
  // The spread about those prices: each step's ratio, weighted by its price, so that a step
  // of little work that waited out a neighbour's time slice (a ratio of hundreds) counts as
  // little as it weighs in the node's time.
  std::vector<std::pair<double, double>> ratios;  // (time / price, price)
  double measured = 0, priced = 0;
  for (const Step& s : steps_) {
    double price = 0;
    if (s.rows > 0) price = out.line_ready ? out.fixed + out.per_row * s.rows : -1;
    if (s.positions > 0) {
      price = out.pieces_ready && price >= 0
                  ? price + out.piece_fixed * s.positions + out.piece_row * s.row_positions
                  : -1;
    }
    if (!(price > 0)) continue;
    measured += s.seconds;
    priced += price;
    ratios.emplace_back(s.seconds / price, price);
  }
  if (ratios.empty()) return;
  out.stretch = measured / priced;
  std::sort(ratios.begin(), ratios.end());
  double below = 0;  // the price of the steps before `i`
  size_t i = 0;
  for (size_t q = 0; q < kQuantiles.size(); ++q) {
    while (i + 1 < ratios.size() && below + ratios[i].second < kQuantiles[q] * priced) {
      below += ratios[i].second;
      ++i;
    }
    out.quantiles[q] = ratios[i].first;
  }
}

int64_t DecodePlan::decode_rows() const {
  int64_t rows = 0;
  for (const Decode& d : decode) rows += 1 + d.drafts;
  return rows;
}

int64_t DecodePlan::replay_rows() const {
  int64_t rows = 0;
  for (const Replay& r : replay) rows += r.rows;
  return rows;
}

namespace {

// The decoding candidates the step takes and the tokens each drafts.
void PlanDecode(std::span<const StepCandidate> candidates, const StepPolicy& policy,
                const DraftCosts& costs, DecodePlan& plan) {
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].work != StepCandidate::Work::kDecode) continue;
    if (static_cast<int64_t>(plan.decode.size()) >= policy.max_batch) break;
    plan.decode.push_back({.candidate = i});
  }
  const int64_t batch = static_cast<int64_t>(plan.decode.size());
  for (DecodePlan::Decode& d : plan.decode) {
    Generation& g = *candidates[d.candidate].generation;
    // A step emits at most drafts + 1 tokens, and never more than the request has left.
    if (!g.context.empty()) d.drafts = g.speculation.Plan(costs, batch, g.tokens_left() - 1);
  }
}

}  // namespace

DecodePlan PlanStep(std::span<const StepCandidate> candidates, const StepPolicy& policy,
                    const DraftCosts& costs, const ReplayCosts& replay_costs) {
  DecodePlan plan;
  PlanDecode(candidates, policy, costs, plan);
  // The row bound protects the running streams' inter-token latency; with none running, a step
  // replays up to the idle bound, so a lone prompt's first token is not held back.
  plan.replay_budget = plan.decode.empty() ? std::max(policy.replay_rows, policy.idle_replay_rows)
                                           : policy.replay_rows;
  const double streams =
      plan.decode.empty()
          ? 0
          : StreamsSeconds(costs, replay_costs, static_cast<int64_t>(plan.decode.size()),
                           plan.decode_rows());
  double time_left = std::numeric_limits<double>::infinity();
  if (policy.replay_step_budget > 0 && !plan.decode.empty()) {
    if (streams > 0 && replay_costs.ready()) {
      time_left = policy.replay_step_budget * streams;
      plan.replay_budget_ms = time_left * 1e3;
    } else {
      plan.replay_budget = std::min(plan.replay_budget, policy.unpriced_replay_rows);
    }
  }
  int64_t rows_left = plan.replay_budget;
  for (size_t i = 0; i < candidates.size() && rows_left > 0; ++i) {
    if (candidates[i].work != StepCandidate::Work::kReplay) continue;
    const Generation& g = *candidates[i].generation;
    int64_t rows = std::min(rows_left, g.replay_rows_left());
    if (std::isfinite(time_left)) {
      const int64_t L = g.replay.prompt_len;
      // The step's first piece takes a row at least: a replay always moves on.
      rows = std::min(rows, std::max<int64_t>(plan.replay.empty() ? 1 : 0,
                                              replay_costs.RowsWithin(time_left, L)));
      if (rows > 0) time_left -= replay_costs.PieceSeconds({.prompt_len = L, .rows = rows});
    }
    if (rows <= 0) break;
    plan.replay.push_back({.candidate = i, .first_row = g.replay_next, .rows = rows});
    rows_left -= rows;
  }
  return plan;
}

std::string DescribePlan(const DecodePlan& plan) {
  std::string line =
      absl::StrCat("decode ", plan.decode.size(), " [",
                   absl::StrJoin(plan.decode, " ",
                                 [](std::string* out, const DecodePlan::Decode& d) {
                                   absl::StrAppend(out, d.candidate, "+", d.drafts);
                                 }),
                   "] replay ", plan.replay.size(), " [",
                   absl::StrJoin(plan.replay, " ",
                                 [](std::string* out, const DecodePlan::Replay& r) {
                                   absl::StrAppend(out, r.candidate, ":", r.first_row, "+", r.rows);
                                 }),
                   "] budget ", plan.replay_budget, " rows");
  if (plan.replay_budget_ms >= 0)
    absl::StrAppend(&line, absl::StrFormat(" %.1f ms", plan.replay_budget_ms));
  return line;
}

DecodeSettled SettleDecode(Generation& g, int64_t drafts, const model::Verdict& verdict) {
  DecodeSettled settled{.drafted = drafts};
  const int64_t context_before = static_cast<int64_t>(g.context.size());
  // The step appended drafts + 1 rows; the rejected drafts' rows are taken back.
  settled.taken_back = drafts - verdict.accepted;
  for (const model::SampledToken& token : verdict.tokens) {
    if (g.finished()) break;
    g.Accept(token.token, token.logprob);
    ++settled.emitted;
  }
  if (drafts > 0) {
    Speculation& spec = g.speculation;
    // Accepted drafts that were sent (a stop may end the request inside them).
    settled.accepted = std::min<int64_t>(verdict.accepted, settled.emitted);
    spec.drafted += static_cast<uint32_t>(drafts);
    spec.accepted += static_cast<uint32_t>(settled.accepted);
    spec.Adapt(drafts, verdict.accepted);
    if (spec.drafter == Drafter::kDraft) {
      DraftModel::Settle(spec, context_before, drafts, verdict.accepted);
    }
  }
  return settled;
}

bool SettleReplay(Generation& g, int64_t rows, std::span<const float> logits, int64_t vocab) {
  const int64_t L = g.replay.prompt_len, first = g.replay_next;
  const size_t V = static_cast<size_t>(vocab);
  if (!g.prompt_tokens.empty()) {
    // A row's log-probability of the next prompt token (the last row's next token is sampled).
    for (int64_t j = 0; j < rows && first + j + 1 < L; ++j) {
      g.prompt_logprobs.push_back(
          model::LogSoftmaxAt(logits.subspan(static_cast<size_t>(j) * V, V),
                              g.prompt_tokens[static_cast<size_t>(first + j + 1)]));
    }
  }
  g.replay_next += rows;
  if (g.replay_next < L) return false;
  // The prompt's last row: the first token, sampled as the prefill node would have.
  const model::SampledToken token = model::SampleToken(logits.last(V), g.sampling, g.completion);
  g.Accept(token.token, token.logprob);
  return true;
}

}  // namespace baton::decode_node
