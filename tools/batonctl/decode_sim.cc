#include "decode_sim.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace baton::tools {

using decode_node::DecodePlan;
using decode_node::StepCandidate;

DecodeFleet::DecodeFleet(const std::vector<ClusterRequest>& requests, const ClusterOptions& options,
                         ClusterResult& result, StepEnds step_ends)
    : requests_(requests),
      options_(options),
      result_(result),
      step_ends_(std::move(step_ends)),
      in_steps_(options.decode_nodes > 0 && options.decode.replays_in_steps()),
      nodes_(static_cast<size_t>(std::max<int64_t>(0, options.decode_nodes))) {
  result_.requests_per_decode_node.assign(nodes_.size(), 0);
  result_.decode_busy_ms.assign(nodes_.size(), 0);
  if (nodes_.empty()) return;
  node_of_.assign(requests.size(), 0);
  steps_.assign(requests.size(), 0);
  last_token_ms_.assign(requests.size(), 0);
  result_.e2e_ms.assign(requests.size(), 0);
  result_.tpot_ms.assign(requests.size(), -1);
  // What the nodes reported, as the planner's fits (seconds; the piece costs at 1,024
  // positions, per position).
  costs_.target = decode_node::CostFit::Line(options.decode.step_fixed_ms / 1e3,
                                             options.decode.step_per_row_ms / 1e3);
  if (options.decode.stretch_spread() && options.decode.step_stretch > 0) {
    spread_scale_ =
        options.decode.step_stretch / StretchMean(options.decode.step_stretch_quantiles);
  }
  replay_costs_ = decode_node::ReplayCosts::Proportional(
      options.decode.replay_piece_fixed_ms / 1024e3, options.decode.replay_piece_row_ms / 1024e3);
  for (size_t n = 0; n < nodes_.size(); ++n) nodes_[n].rng.seed(0x5eed + n);
}

std::optional<size_t> DecodeFleet::Reservable() const {
  size_t best = 0;
  for (size_t d = 1; d < nodes_.size(); ++d) {
    if (nodes_[d].held < nodes_[best].held) best = d;
  }
  if (nodes_.empty() || nodes_[best].held >= options_.decode_slots) return std::nullopt;
  return best;
}

void DecodeFleet::Reserve(size_t request, size_t node) {
  ++nodes_[node].held;
  ++result_.requests_per_decode_node[node];
  node_of_[request] = node;
}

void DecodeFleet::PrefillEnded(size_t request, int64_t replay_rows, double now) {
  const int64_t L = requests_[request].prompt_len;
  replay_rows = std::min(replay_rows, L);
  if (!in_steps_ || replay_rows <= 0) {
    FirstToken(request, now);
    return;
  }
  auto replaying = std::make_unique<Replaying>();
  replaying->request = request;
  replaying->generation.replay.prompt_len = L;
  replaying->generation.replay_next = L - replay_rows;
  Node& node = nodes_[node_of_[request]];
  node.replaying.push_back(std::move(replaying));
  if (!node.stepping) {
    Step(node_of_[request], now);
  } else {
    Interrupt(node_of_[request], now);
  }
}

void DecodeFleet::FirstToken(size_t request, double now) {
  steps_[request] = 0;
  last_token_ms_[request] = now;
  Node& node = nodes_[node_of_[request]];
  if (requests_[request].output_len <= 1) {
    Finish(request, now);
  } else {
    node.joining.push_back(request);
    if (!node.stepping) {
      Step(node_of_[request], now);
    } else {
      Interrupt(node_of_[request], now);
    }
  }
}

void DecodeFleet::Interrupt(size_t n, double now) {
  Node& node = nodes_[n];
  if (node.planned <= 1) return;
  // The step in flight: the first to end at or after now (at one time a prefill's end comes
  // before a step's, so a request that joins as a step ends waits for the next).
  const auto first = node.ends.begin();
  const size_t in_flight = std::min<size_t>(
      node.planned - 1,
      static_cast<size_t>(std::lower_bound(first, first + node.planned, now) - first));
  if (in_flight + 1 == node.planned) return;
  node.planned = in_flight + 1;
  step_ends_(node.ends[in_flight], n, ++node.version);
}

double DecodeFleet::TokensAfter(size_t request, int64_t steps) const {
  return std::min(static_cast<double>(requests_[request].output_len),
                  1 + static_cast<double>(steps) * options_.decode.tokens_per_step);
}

int64_t DecodeFleet::StepsUntilAFinish(const Node& node) const {
  int64_t least = std::numeric_limits<int64_t>::max();
  const double per_step = options_.decode.tokens_per_step;
  for (size_t i = 0; i < node.batch && i < node.running.size(); ++i) {
    const size_t r = node.running[i];
    const double want = static_cast<double>(requests_[r].output_len);
    // The fewest steps s with TokensAfter(s) at want: from the quotient, then checked with
    // TokensAfter's own arithmetic so that the settled steps finish it exactly there.
    int64_t s =
        std::max<int64_t>(steps_[r] + 1, static_cast<int64_t>(std::ceil((want - 1) / per_step)));
    while (s > steps_[r] + 1 && TokensAfter(r, s - 1) >= want) --s;
    while (TokensAfter(r, s) < want) ++s;
    least = std::min(least, s - steps_[r]);
  }
  return least == std::numeric_limits<int64_t>::max() ? 1 : least;
}

double DecodeFleet::Factor(Node& node, size_t step) {
  if (!options_.decode.stretch_spread()) return options_.decode.stretch();
  while (node.factors.size() <= step) {
    const double u = static_cast<double>(node.rng() >> 11) * 0x1.0p-53;  // [0, 1)
    node.factors.push_back(spread_scale_ * StretchAt(options_.decode.step_stretch_quantiles, u));
  }
  return node.factors[step];
}

void DecodeFleet::Finish(size_t request, double now) {
  const ClusterRequest& r = requests_[request];
  result_.e2e_ms[request] = now - r.arrival_ms;
  if (r.output_len > 1) {
    result_.tpot_ms[request] =
        (now - (r.arrival_ms + result_.ttft_ms[request])) / static_cast<double>(r.output_len - 1);
  }
  --nodes_[node_of_[request]].held;
}

// The node's plan over its requests (those that joined since the last step included), priced
// as the node prices it: the streams' rows at the step-cost fit, each piece at its cost.
void DecodeFleet::Step(size_t n, double now) {
  Node& node = nodes_[n];
  node.running.insert(node.running.end(), node.joining.begin(), node.joining.end());
  node.joining.clear();
  node.stepping = false;
  node.batch = 0;
  node.pieces.clear();
  std::vector<StepCandidate> candidates;
  for (size_t i = 0; i < node.running.size(); ++i) {
    candidates.push_back({.work = StepCandidate::Work::kDecode, .generation = &decoding_});
  }
  for (const std::unique_ptr<Replaying>& r : node.replaying) {
    candidates.push_back({.work = StepCandidate::Work::kReplay, .generation = &r->generation});
  }
  if (candidates.empty()) return;
  const DecodePlan plan =
      decode_node::PlanStep(candidates, options_.decode_step, costs_, replay_costs_);
  if (plan.empty()) return;
  node.batch = plan.decode.size();
  node.planned_running = node.running.size();
  double step_ms =
      node.batch == 0 ? 0
                      : options_.decode.step_fixed_ms + options_.decode.step_per_row_ms *
                                                            static_cast<double>(plan.decode_rows());
  for (const DecodePlan::Replay& piece : plan.replay) {
    const decode_node::Generation& g =
        node.replaying[piece.candidate - node.planned_running]->generation;
    step_ms +=
        replay_costs_.PieceSeconds({.prompt_len = g.replay.prompt_len, .rows = piece.rows}) * 1e3;
  }
  // A cruise: with no replay in flight, the same plan holds until a request finishes.
  const size_t steps =
      options_.decode_cruises && plan.replay.empty() && node.replaying.empty() && step_ms > 0
          ? static_cast<size_t>(StepsUntilAFinish(node))
          : 1;
  node.step_ms.resize(steps);
  node.ends.resize(steps);
  double end = now;
  for (size_t j = 0; j < steps; ++j) {
    node.step_ms[j] = step_ms * Factor(node, j);
    end += node.step_ms[j];
    node.ends[j] = end;
  }
  node.planned = steps;
  node.pieces = plan.replay;
  node.stepping = true;
  step_ends_(node.ends.back(), n, ++node.version);
}

// Every request of the step gains its tokens; each token's gap is an ITL sample.
void DecodeFleet::Decoded(Node& node, double now) {
  std::vector<size_t> staying;
  for (size_t i = 0; i < node.running.size(); ++i) {
    const size_t r = node.running[i];
    if (i >= node.batch) {  // beyond the step's batch: it waits for a later one
      staying.push_back(r);
      continue;
    }
    const double want = static_cast<double>(requests_[r].output_len);
    const double before = TokensAfter(r, steps_[r]);
    const double after = TokensAfter(r, ++steps_[r]);
    const int64_t tokens =
        static_cast<int64_t>(std::floor(after)) - static_cast<int64_t>(std::floor(before));
    const double gap = now - last_token_ms_[r];
    if (tokens > 0) {
      const double each = gap / static_cast<double>(tokens);
      result_.itl.Add(each, tokens);
      if (options_.itl_samples) result_.itl_ms.insert(result_.itl_ms.end(), tokens, each);
      last_token_ms_[r] = now;
    }
    if (after >= want) {
      Finish(r, now);
    } else {
      staying.push_back(r);
    }
  }
  node.running = std::move(staying);
}

// Each piece moves its replay on; a replay at its prompt's end has its first token now.
void DecodeFleet::Replayed(Node& node, double now) {
  for (const DecodePlan::Replay& piece : node.pieces) {
    node.replaying[piece.candidate - node.planned_running]->generation.replay_next += piece.rows;
  }
  std::vector<size_t> ended;
  std::erase_if(node.replaying, [&](const std::unique_ptr<Replaying>& r) {
    if (r->generation.replay_rows_left() > 0) return false;
    ended.push_back(r->request);
    return true;
  });
  for (size_t request : ended) {
    result_.ttft_ms[request] = now - requests_[request].arrival_ms;
    FirstToken(request, now);
  }
}

void DecodeFleet::StepEnded(size_t n, double now, uint64_t version) {
  Node& node = nodes_[n];
  if (version != node.version) return;  // a cruise cut short: its earlier end holds
  // The steps it ran, one after another (a request finishes only in the last).
  const size_t steps = node.planned;
  node.planned = 0;
  for (size_t j = 0; j < steps; ++j) {
    result_.decode_busy_ms[n] += node.step_ms[j];
    Decoded(node, node.ends[j]);
  }
  if (options_.decode.stretch_spread()) {
    node.factors.erase(node.factors.begin(),
                       node.factors.begin() + static_cast<std::ptrdiff_t>(steps));
  }
  Replayed(node, now);
  Step(n, now);
}

}  // namespace baton::tools
