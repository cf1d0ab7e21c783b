// `batonctl plan`: prints the truncation plan and the work estimate for one prompt, or the
// seed's tables (lab 20, the chunked example, the row-work ratios) with --seed-tables.
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>

#include "absl/strings/str_format.h"
#include "baton/common/model_config.h"
#include "baton/common/parse.h"
#include "baton/model/forward_schedule.h"
#include "baton/model/plan.h"
#include "baton/model/state.h"
#include "commands.h"
#include "nlohmann/json.hpp"

namespace baton::tools {
namespace {

using model::TruncationMode;
using model::TruncationSpec;

struct PlanOptions {
  int64_t prompt_len = 0;
  int64_t keep = 0;
  std::string mode = "off";
  int64_t window = 0;
  int64_t max_backtrack = 5;
  int64_t chunk_size = 0;
  std::string chunks;
  int64_t valid_start = 0;
  std::string model_config;
  bool json = false;
  bool seed_tables = false;
};

nlohmann::json PlanToJson(const model::TruncationPlan& plan, const ModelConfig* config) {
  const TruncationSpec& spec = plan.spec;
  nlohmann::json chunks = nlohmann::json::array();
  for (const model::ChunkPlan& c : plan.chunks) {
    chunks.push_back({{"q_start", c.q_start},
                      {"q_len", c.q_len},
                      {"clip_prefix", c.clip_prefix},
                      {"consumer_rows", c.work.consumer_rows},
                      {"swa_pairs", c.work.consumer_swa_pairs},
                      {"global_pairs", c.work.global_pairs},
                      {"producer_swa_pairs", c.work.producer_swa_pairs},
                      {"consumer_positions", c.consumer_positions},
                      {"swa_lo", c.swa_lo},
                      {"consumer_slots", c.consumer_slots},
                      {"producer_slots", c.producer_slots}});
  }
  nlohmann::json out = {{"prompt_len", spec.prompt_len},
                        {"keep", spec.keep},
                        {"mode", std::string(model::TruncationModeName(spec.mode))},
                        {"window", spec.window},
                        {"max_backtrack", spec.max_backtrack},
                        {"s_keep", spec.s_keep()},
                        {"s_valid", spec.s_valid},
                        {"ring_capacity", plan.ring_capacity},
                        {"total_consumer_rows", plan.total_consumer_rows()},
                        {"total_swa_pairs", plan.total_swa_pairs()},
                        {"chunks", std::move(chunks)}};
  if (config != nullptr) {
    std::vector<int64_t> lens;
    for (const model::ChunkPlan& c : plan.chunks) lens.push_back(c.q_len);
    const model::WorkEstimate estimate = model::EstimateWork(spec, lens, config);
    out["layer_rows"] = *estimate.layer_rows;
    out["flops"] = {{"producer", estimate.flops->producer},
                    {"consumer", estimate.flops->consumer},
                    {"lm_head", estimate.flops->lm_head},
                    {"total", estimate.flops->total()}};
    // The request's StateBlock regions at this prompt length: block KV in G groups (pages of B
    // positions), the producer and consumer rings.
    const model::StateLayout layout = model::StateLayout::For(*config);
    const int64_t pages = (spec.prompt_len + layout.block_size - 1) / layout.block_size;
    out["block_kv_groups"] = layout.block_kv_groups;
    const int64_t block_kv = pages * layout.page_floats() * int64_t{sizeof(float)};
    const int64_t producer_swa = layout.producer_swa_floats() * int64_t{sizeof(float)};
    const int64_t consumer_swa = layout.consumer_swa_floats() * int64_t{sizeof(float)};
    out["state_block_bytes"] = {{"block_kv", block_kv},
                                {"producer_swa", producer_swa},
                                {"consumer_swa", consumer_swa},
                                {"total", block_kv + producer_swa + consumer_swa}};
    // Under the replay-on-decode split the boundary rows of [max(s_keep, s_valid), L), d floats
    // each, take the consumer rings' place (DESIGN section 4).
    const int64_t boundary_rows =
        model::BoundaryRowCount(spec.prompt_len, spec.mode, spec.keep, spec.s_valid) *
        layout.hidden_size * int64_t{sizeof(float)};
    out["replay_on_decode_state_block_bytes"] = {
        {"block_kv", block_kv},
        {"producer_swa", producer_swa},
        {"boundary_rows", boundary_rows},
        {"total", block_kv + producer_swa + boundary_rows}};
  }
  return out;
}

// The seed's lab-20 cases (W = 3, K = 4, max_backtrack 0): one reported chunk of a prompt.
struct Lab20Case {
  const char* name;
  int64_t prompt_len;
  int64_t s_valid;
  std::vector<int64_t> chunk_lens;
  size_t reported_chunk;
};

std::string SeedTables() {
  std::string out = "window=3, keep=4; entries are consumer rows / SWA pairs\n";
  out += "case           off       mask     compact\n";
  const Lab20Case cases[] = {{"short", 2, 0, {2}, 0},
                             {"long", 12, 0, {12}, 0},
                             {"clipped", 12, 0, {4, 8}, 0},
                             {"crossing", 12, 0, {6, 4, 2}, 1},
                             {"valid-start", 12, 10, {2}, 0}};
  for (const Lab20Case& c : cases) {
    absl::StrAppendFormat(&out, "%-12s", c.name);
    const char* separator = " ";
    for (TruncationMode mode :
         {TruncationMode::kOff, TruncationMode::kMask, TruncationMode::kCompact}) {
      TruncationSpec spec{.prompt_len = c.prompt_len,
                          .keep = 4,
                          .mode = mode,
                          .window = 3,
                          .max_backtrack = 0,
                          .s_valid = c.s_valid};
      auto plan = model::BuildTruncationPlan({spec, c.chunk_lens});
      const model::ChunkWork& work = plan->chunks[c.reported_chunk].work;
      absl::StrAppendFormat(&out, "%s%2d/%2d", separator, work.consumer_rows,
                            work.consumer_swa_pairs);
      separator = "   ";
    }
    out += "\n";
  }

  out += "\nL=1024, keep=140, window=128, max_backtrack=5, compact, four 256-row chunks\n";
  out += "chunk  q_start  q_len  clip_prefix  consumer_rows\n";
  TruncationSpec chunked{.prompt_len = 1024,
                         .keep = 140,
                         .mode = TruncationMode::kCompact,
                         .window = 128,
                         .max_backtrack = 5,
                         .s_valid = 0};
  auto four = model::BuildTruncationPlan({chunked, {256, 256, 256, 256}});
  for (size_t i = 0; i < four->chunks.size(); ++i) {
    const model::ChunkPlan& c = four->chunks[i];
    absl::StrAppendFormat(&out, "%5d  %7d  %5d  %11d  %13d\n", i, c.q_start, c.q_len, c.clip_prefix,
                          c.work.consumer_rows);
  }
  auto one = model::BuildTruncationPlan({chunked, {}});
  absl::StrAppendFormat(&out, "total consumer rows: %d (one 1024-row chunk: %d)\n",
                        four->total_consumer_rows(), one->total_consumer_rows());

  out += "\nEqual layer costs, 20 producer + 20 consumer layers, keep=140\n";
  out += "length    full row-work    compact row-work    ratio\n";
  for (int64_t length : {64, 1024, 16384}) {
    TruncationSpec spec{.prompt_len = length,
                        .keep = 140,
                        .mode = TruncationMode::kCompact,
                        .window = 128,
                        .max_backtrack = 5,
                        .s_valid = 0};
    auto plan = model::BuildTruncationPlan({spec, {}});
    const int64_t full = (20 + 20) * length;
    const int64_t compact = 20 * length + 20 * plan->total_consumer_rows();
    absl::StrAppendFormat(&out, "%6d %16d %19d %8.4f\n", length, full, compact,
                          static_cast<double>(compact) / static_cast<double>(full));
  }
  return out;
}

int RunPlan(const PlanOptions& o, const CLI::App& command) {
  if (o.seed_tables) {
    std::cout << SeedTables();
    return kExitOk;
  }
  for (const char* required : {"--prompt-len", "--window"}) {
    if (command.count(required) == 0) {
      return ReportError("plan", absl::InvalidArgumentError(
                                     absl::StrCat(required, " is required (or --seed-tables)")));
    }
  }
  absl::StatusOr<TruncationMode> mode = model::ParseTruncationMode(o.mode, "--mode");
  if (!mode.ok()) return ReportError("plan", mode.status());
  model::PlanRequest request;
  request.spec = {.prompt_len = o.prompt_len,
                  .keep = o.keep,
                  .mode = *mode,
                  .window = o.window,
                  .max_backtrack = o.max_backtrack,
                  .s_valid = o.valid_start};
  if (!o.chunks.empty()) {
    absl::StatusOr<std::vector<int64_t>> lens = ParseIntList(o.chunks, "--chunks");
    if (!lens.ok()) return ReportError("plan", lens.status());
    request.chunk_lens = *std::move(lens);
  } else if (command.count("--chunk-size") > 0) {
    if (absl::Status s = model::ValidateTruncationSpec(request.spec); !s.ok()) {
      return ReportError("plan", s);
    }
    auto lens = model::EvenChunks(o.prompt_len - o.valid_start, o.chunk_size);
    if (!lens.ok()) {
      return ReportError("plan", absl::InvalidArgumentError(
                                     absl::StrCat("--chunk-size: ", lens.status().message())));
    }
    request.chunk_lens = *std::move(lens);
  }
  std::optional<ModelConfig> config;
  if (!o.model_config.empty()) {
    absl::StatusOr<ModelConfig> loaded = LoadModelConfig(o.model_config);
    if (!loaded.ok()) return ReportError("plan", loaded.status());
    config = *loaded;
  }
  absl::StatusOr<model::TruncationPlan> plan = model::BuildTruncationPlan(request);
  if (!plan.ok()) return ReportError("plan", plan.status());
  if (o.json) {
    std::cout << PlanToJson(*plan, config ? &*config : nullptr).dump() << "\n";
  } else {
    std::cout << model::DescribePlan(*plan);
    if (config) {
      std::cout << PlanToJson(*plan, &*config)["flops"].dump(2) << "\n";
    }
  }
  return kExitOk;
}

}  // namespace

Command AddPlanCommand(CLI::App& app) {
  auto options = std::make_shared<PlanOptions>();
  CLI::App* command =
      app.add_subcommand("plan", "Print the truncation plan and work estimate of one prompt");
  command->add_option("--prompt-len", options->prompt_len, "Prompt length L");
  command->add_option("--keep", options->keep, "Retained consumer rows K (>= C when truncated)");
  command->add_option("--mode", options->mode, "Truncation mode: off, mask or compact");
  command->add_option("--window", options->window, "SWA window W");
  command->add_option("--max-backtrack", options->max_backtrack,
                      "Ring slack: C = W + max_backtrack + 1 (default 5)");
  auto* size = command->add_option("--chunk-size", options->chunk_size,
                                   "Cut [s_valid, L) into chunks of S rows, the last shorter");
  auto* list =
      command->add_option("--chunks", options->chunks, "Chunk lengths a,b,c tiling [s_valid, L)");
  size->excludes(list);
  command->add_option("--valid-start", options->valid_start,
                      "s_valid: rows before it came from a prefix hit (default 0)");
  command->add_option("--model-config", options->model_config,
                      "config.json of a model: adds layer-row totals and FLOPs");
  command->add_flag("--json", options->json, "Print one JSON object");
  command->add_flag("--seed-tables", options->seed_tables,
                    "Print the seed's lab-20 table, chunked example and row-work ratios");
  return {command, [options, command] { return RunPlan(*options, *command); }};
}

}  // namespace baton::tools
