// batonctl's subcommands. Each Add*Command registers a subcommand and its options on the app
// and returns it with a runner that main calls when that subcommand was chosen. Runners
// return the process exit status: 0 on success, 2 on bad input (message on stderr), 1 on
// other failures.
#pragma once

#include <functional>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "baton/decode_node/decode_step.h"
#include "baton/model/engine_factory.h"

namespace baton::tools {

struct Command {
  CLI::App* subcommand = nullptr;
  std::function<int()> run;
  // A command that loads a model: its --device flags, which main completes from the environment
  // (model::ApplyPrefillAttentionVariable) before it runs.
  model::DeviceFlags* device = nullptr;
};

Command AddPlanCommand(CLI::App& app);
Command AddMakeModelCommand(CLI::App& app);
Command AddForwardCommand(CLI::App& app);
Command AddGenerateCommand(CLI::App& app);
Command AddApproxErrorCommand(CLI::App& app);
Command AddReplayCommand(CLI::App& app);
Command AddSimulateCommand(CLI::App& app);
Command AddReportCommand(CLI::App& app);
Command AddFetchModelCommand(CLI::App& app);
Command AddModelsCommand(CLI::App& app);
Command AddStoresCommand(CLI::App& app);
Command AddRatesCommand(CLI::App& app);
Command AddFidelityCommand(CLI::App& app);
Command AddEvalCommand(CLI::App& app);
Command AddHealthCommand(CLI::App& app);
Command AddCapacityCommand(CLI::App& app);

// The decode node's step flags as the simulation takes them (`simulate` and `capacity`):
// --decode-max-batch, --replay-rows-per-step and --replay-step-budget, with baton-decode's
// defaults and ranges (its --max-batch and the two of the same names).
void AddDecodeStepFlags(CLI::App& command, decode_node::StepPolicy& policy);

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;

// Prints "batonctl <command>: error: <message>" and returns the matching exit status:
// kExitBadInput for INVALID_ARGUMENT / OUT_OF_RANGE / NOT_FOUND, kExitFailure otherwise.
int ReportError(absl::string_view command, const absl::Status& status);

}  // namespace baton::tools
