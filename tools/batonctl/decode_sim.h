// The decode nodes of the cluster simulation (cluster_sim.h), stepping as a decode node steps:
// each step is the node's own plan (decode_node::PlanStep, the function DecodeService's loop
// runs) over the requests it holds, priced at what the nodes measured (DecodeRates: the
// step-cost fit and, with replay-on-decode, the replay piece costs), so that the simulated
// steps batch, budget replay rows and stretch the streams' gaps as the nodes' steps do.
//
// A node whose plan cannot change until one of its requests finishes (every request it runs
// in the batch, no replay in flight) plans those steps at once, a cruise: one event at their
// end instead of one a step, cut short at the step in flight when a request joins. The steps,
// their times and each token's gap are the ones its steps one at a time would give; only the
// events are fewer, so that a simulation of a million requests on a thousand nodes does not
// wait on a queue of every step.
//
// Not thread-safe; one per simulation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "baton/decode_node/decode_step.h"
#include "cluster_sim.h"

namespace baton::tools {

class DecodeFleet {
 public:
  // `step_ends(time, node, version)`: the steps decode node `node` planned end at `time` (the
  // simulation calls StepEnded then with `version`; an event whose version the node has moved
  // past was cut short, and StepEnded ignores it).
  using StepEnds = std::function<void(double, size_t, uint64_t)>;
  // Writes each request's decode figures into `result` (its ITL samples, TPOT, end to end and,
  // when its replay runs in steps, its TTFT) and each node's (busy time, requests).
  DecodeFleet(const std::vector<ClusterRequest>& requests, const ClusterOptions& options,
              ClusterResult& result, StepEnds step_ends);

  bool modelled() const { return !nodes_.empty(); }
  // Replay runs in the nodes' steps (DecodeRates::replays_in_steps), not as a delay.
  bool replays_in_steps() const { return in_steps_; }
  // The node whose slot admission reserves next (the fewest held, then the lowest index, as
  // the router's Pick), or nullopt when even that one is full.
  std::optional<size_t> Reservable() const;
  void Reserve(size_t request, size_t node);
  // Request `request`'s prefill ended at `now`. With replays_in_steps and `replay_rows` > 0 it
  // replays those rows (the prompt's last ones) on its node first; else its first token is now.
  void PrefillEnded(size_t request, int64_t replay_rows, double now);
  // Request `request` has its first token at `now`: it decodes from its node's next step, or
  // leaves at once when that was its only token.
  void FirstToken(size_t request, double now);
  // Node `node`'s steps (those of `version`) ended at `now`: its requests gain their tokens
  // and replay rows, and the next step begins.
  void StepEnded(size_t node, double now, uint64_t version);

 private:
  struct Replaying {
    size_t request = 0;
    decode_node::Generation generation;  // replay.prompt_len and replay_next
  };
  struct Node {
    int64_t held = 0;             // slots, from admission to the last token
    std::vector<size_t> running;  // decoding, in the order they joined
    std::vector<size_t> joining;  // first token since the step began
    std::vector<std::unique_ptr<Replaying>> replaying;
    bool stepping = false;
    // The steps in progress, all of one plan: the first `batch` of `running` decoding, and its
    // pieces; each step's time and end. The node runs the first `planned` of them (fewer than
    // planned when a request joined during the cruise) and then settles them.
    size_t batch = 0;
    std::vector<decode_node::DecodePlan::Replay> pieces;  // candidate: running.size() + index
    size_t planned_running = 0;  // running.size() when the step was planned
    std::vector<double> step_ms;
    std::vector<double> ends;
    size_t planned = 0;
    uint64_t version = 0;  // of its steps' end event
    // Stretch factors drawn from the spread and not used yet, the node's own sequence (so a
    // cruise cut short leaves the rest to its next steps), and the node's generator.
    std::deque<double> factors;
    std::mt19937_64 rng;
  };
  void Step(size_t node, double now);
  // A request joins node `node` at `now`: a cruise in flight ends with the step in flight.
  void Interrupt(size_t node, double now);
  // The steps the first `batch` of the node's running requests can all take before one of them
  // has its last token (at least 1).
  int64_t StepsUntilAFinish(const Node& node) const;
  // Request `request`'s tokens after `steps` decode steps: 1 (the prefill's) and
  // tokens_per_step a step, at most its output length.
  double TokensAfter(size_t request, int64_t steps) const;
  double Factor(Node& node, size_t step);
  void Finish(size_t request, double now);
  void Decoded(Node& node, double now);
  void Replayed(Node& node, double now);

  const std::vector<ClusterRequest>& requests_;
  const ClusterOptions& options_;
  ClusterResult& result_;
  StepEnds step_ends_;
  bool in_steps_ = false;
  std::vector<Node> nodes_;
  std::vector<size_t> node_of_;
  std::vector<int64_t> steps_;  // decode steps taken since the first token
  std::vector<double> last_token_ms_;
  // The costs the nodes' planner prices with, from what they reported.
  decode_node::DraftCosts costs_;
  decode_node::ReplayCosts replay_costs_;
  decode_node::Generation decoding_;  // what PlanStep reads of a decoding request (no drafts)
  // Each step's factor is drawn from the reported spread (DecodeRates::step_stretch_quantiles)
  // by its node's generator, seeded by the node's index: the same input simulates the same.
  double spread_scale_ = 1;  // the drawn factors' mean is step_stretch, when that is given
};

}  // namespace baton::tools
