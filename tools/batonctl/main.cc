// batonctl: the operator's command-line tool (planning, experiments, client, benchmarks).
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "baton/kernels/cpu_team.h"
#include "commands.h"

namespace baton::tools {

int ReportError(absl::string_view command, const absl::Status& status) {
  std::cerr << "batonctl " << command << ": error: " << status.message() << "\n";
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kNotFound:
      return kExitBadInput;
    default:
      return kExitFailure;
  }
}

}  // namespace baton::tools

int main(int argc, char** argv) {
  using namespace baton::tools;
  CLI::App app{"batonctl: plan, run and inspect baton CED serving"};
  app.require_subcommand(1);
  const std::vector<Command> commands = {
      AddPlanCommand(app),        AddMakeModelCommand(app), AddForwardCommand(app),
      AddGenerateCommand(app),    AddReplayCommand(app),    AddSimulateCommand(app),
      AddApproxErrorCommand(app), AddReportCommand(app),    AddFetchModelCommand(app),
      AddModelsCommand(app),      AddStoresCommand(app),    AddRatesCommand(app),
      AddEvalCommand(app),        AddHealthCommand(app),    AddCapacityCommand(app),
      AddFidelityCommand(app)};
  std::string names;
  bool known = false;
  for (const Command& command : commands) {
    names += " " + command.subcommand->get_name();
    known |= argc > 1 && command.subcommand->check_name(argv[1]);
  }
  if (argc > 1 && argv[1][0] != '-' && !known) {
    std::cerr << "batonctl: error: unknown command '" << argv[1] << "'; available:" << names
              << "\n";
    return kExitBadInput;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "batonctl: error: " << e.what() << "\n";
    return kExitBadInput;
  }
  // The CPU kernels' level and their team's wait policy, and the CUDA prefill attention kernel
  // where no flag names it: the environment, read here once.
  if (std::string error = baton::kernels::ConfigureCpuKernels(std::getenv("BATON_CPU_ISA"),
                                                              std::getenv("OMP_WAIT_POLICY"));
      !error.empty()) {
    std::cerr << "batonctl: error: " << error << "\n";
    return kExitBadInput;
  }
  const char* prefill_attention = std::getenv(baton::kernels::kPrefillAttentionVariable);
  for (const Command& command : commands) {
    if (!command.subcommand->parsed()) continue;
    if (command.device != nullptr) {
      if (absl::Status s =
              baton::model::ApplyPrefillAttentionVariable(prefill_attention, *command.device);
          !s.ok()) {
        return ReportError(command.subcommand->get_name(), s);
      }
    }
    return command.run();
  }
  return kExitBadInput;
}
