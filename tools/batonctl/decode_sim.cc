#include "decode_sim.h"

#include <algorithm>
#include <cmath>
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
  generated_.assign(requests.size(), 0);
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
  if (!node.stepping) Step(node_of_[request], now);
}

void DecodeFleet::FirstToken(size_t request, double now) {
  generated_[request] = 1;
  last_token_ms_[request] = now;
  Node& node = nodes_[node_of_[request]];
  if (requests_[request].output_len <= 1) {
    Finish(request, now);
  } else {
    node.joining.push_back(request);
    if (!node.stepping) Step(node_of_[request], now);
  }
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
  node.step_ms = node.batch == 0
                     ? 0
                     : options_.decode.step_fixed_ms + options_.decode.step_per_row_ms *
                                                           static_cast<double>(plan.decode_rows());
  for (const DecodePlan::Replay& piece : plan.replay) {
    const decode_node::Generation& g =
        node.replaying[piece.candidate - node.planned_running]->generation;
    node.step_ms +=
        replay_costs_.PieceSeconds({.prompt_len = g.replay.prompt_len, .rows = piece.rows}) * 1e3;
  }
  if (options_.decode.stretch_spread()) {
    const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;  // [0, 1)
    node.step_ms *= spread_scale_ * StretchAt(options_.decode.step_stretch_quantiles, u);
  } else {
    node.step_ms *= options_.decode.stretch();
  }
  node.pieces = plan.replay;
  node.stepping = true;
  step_ends_(now + node.step_ms, n);
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
    const double before = generated_[r];
    generated_[r] = std::min(want, before + options_.decode.tokens_per_step);
    const int64_t tokens =
        static_cast<int64_t>(std::floor(generated_[r])) - static_cast<int64_t>(before);
    const double gap = now - last_token_ms_[r];
    for (int64_t t = 0; t < tokens; ++t) {
      result_.itl_ms.push_back(gap / static_cast<double>(tokens));
    }
    if (tokens > 0) last_token_ms_[r] = now;
    if (generated_[r] >= want) {
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

void DecodeFleet::StepEnded(size_t n, double now) {
  Node& node = nodes_[n];
  result_.decode_busy_ms[n] += node.step_ms;
  Decoded(node, now);
  Replayed(node, now);
  Step(n, now);
}

}  // namespace baton::tools
