#include "baton/node/node_main.h"

#include <cstdlib>
#include <iostream>
#include <utility>

#include "baton/common/log.h"
#include "baton/common/model_config.h"
#include "baton/common/options.h"
#include "baton/kernels/cpu_isa.h"
#include "baton/kernels/cpu_team.h"
#include "baton/transfer/state_block.h"
#include "baton/transfer/ucx.h"

namespace baton::node {

void AddDeviceFlags(CLI::App& app, model::DeviceFlags& flags) {
  AddEnumOption(app, "--device", flags.device, {model::Device::kCpu, model::Device::kCuda},
                model::DeviceName,
                "Where the model runs: cpu, or cuda (a CUDA build on a machine with a GPU; the "
                "program exits 2 naming the reason otherwise)");
  AddEnumOption(app, "--weights", flags.weights,
                {model::WeightType::kFp32, model::WeightType::kBf16}, model::WeightTypeName,
                "How the model's weight matrices are held: fp32, or bf16 (--device cpu only; "
                "halves the bytes a decode step reads; give every node of a cluster the same)");
  AddEnumOption(app, "--cuda-prefill-attention", flags.cuda_prefill_attention,
                {kernels::PrefillAttention::kSimple, kernels::PrefillAttention::kGemm},
                kernels::PrefillAttentionName,
                "The CUDA backend's kernel for prefill chunks' attention: simple (FP32, the "
                "CPU's results) or gemm (BF16 tensor cores). Default: the environment's " +
                    std::string(kernels::kPrefillAttentionVariable) + ", else simple");
}

void AddNodeFlags(CLI::App& app, NodeFlags& flags) {
  app.add_option("--model", flags.model_dir, "Model directory")->required();
  app.add_option("--served-model-name", flags.served_model_name,
                 "The model name registered with the router, which routes a request to nodes of "
                 "the name it asks for (default: the model directory's name)");
  AddDeviceFlags(app, flags.device);
  AddServerFlags(app, flags.server);
  app.add_option("--router", flags.router, "Router address to register with");
  app.add_option("--node-id", flags.node_id, "Name reported to the router");
  app.add_flag("--ucx-allow-unprotected-tcp", flags.ucx_allow_unprotected_tcp,
               transfer::kUcxAllowUnprotectedTcpHelp);
  app.add_flag("--no-ucx", flags.no_ucx, "Move StateBlocks over the gRPC transport only");
}

void AddSplitFlag(CLI::App& app, NodeFlags& flags) {
  AddEnumOption(app, "--split", flags.split,
                {model::Split::kPrefillAll, model::Split::kReplayOnDecode}, model::SplitName,
                "prefill-all (default): this node runs every layer; replay-on-decode: it holds "
                "and runs only the embedding, the producers, the boundary norm and the block-KV "
                "projections, and the decode node replays the consumer layers (the router's "
                "--split must be the same)");
}

NodeStart StartNode(CLI::App& app, int argc, char** argv, const std::string& binary,
                    const std::string& section, NodeFlags& flags) {
  if (std::optional<int> exit = ParseServerFlags(app, argc, argv, binary, section, flags.server)) {
    return {.exit = exit};
  }
  // Refused before anything starts: a worker on these transports could not be made safe.
  if (!flags.no_ucx) {
    if (std::optional<int> exit =
            transfer::RefuseUnsafeUcx(binary.c_str(), flags.ucx_allow_unprotected_tcp)) {
      return {.exit = exit};
    }
  }
  // The CPU kernels' instruction-set level (BATON_CPU_ISA overrides it), their team's wait
  // policy (OMP_WAIT_POLICY) and the CUDA prefill attention kernel where no flag names it
  // (BATON_CUDA_PREFILL_ATTENTION): the environment, read here once and settled before the model
  // loads; a name that is unknown, or a level this CPU lacks, is refused here.
  if (std::string error = kernels::ConfigureCpuKernels(std::getenv("BATON_CPU_ISA"),
                                                       std::getenv("OMP_WAIT_POLICY"));
      !error.empty()) {
    log::Error("cannot start", {{"error", error}});
    return {.exit = 2};
  }
  if (absl::Status s = model::ApplyPrefillAttentionVariable(
          std::getenv(kernels::kPrefillAttentionVariable), flags.device);
      !s.ok()) {
    log::Error("cannot start", {{"error", std::string(s.message())}});
    return {.exit = 2};
  }
  // The team's size follows OMP_NUM_THREADS (the chart's, to match the pod's CPU request).
  log::Info("cpu kernels", {{"isa", kernels::CpuIsaName(kernels::ActiveCpuIsa())},
                            {"threads", kernels::CpuTeamSize()}});
  const model::Split split = flags.split;
  absl::StatusOr<std::unique_ptr<model::Engine>> engine =
      model::LoadEngineOnDevice(flags.model_dir, flags.device, model::PrefillHeldLayers(split));
  if (!engine.ok()) {
    log::Error("cannot start", {{"error", std::string(engine.status().message())}});
    return {.exit = 2};
  }
  log::Info("model loaded", {{"split", std::string(model::SplitName(split))},
                             {"weight_bytes", (*engine)->weight_bytes()},
                             {"fingerprint", (*engine)->fingerprint()}});
  return {.engine = *std::move(engine), .split = split};
}

int ServeNode(const std::string& binary, const NodeFlags& flags, v1::NodeRole role,
              const model::Engine& engine, grpc::Service& service, NodeHooks hooks) {
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  Registration registration = NodeRegistration(
      flags.router, flags.node_id, role, engine.fingerprint(), std::move(hooks.load),
      flags.served_model_name.empty() ? DefaultServedModelName(flags.model_dir)
                                      : flags.served_model_name,
      ConfigDigest(engine.config()));
  if (!hooks.ucx_worker_address.empty()) {
    registration.node.set_ucx_worker_address(hooks.ucx_worker_address);
  }
  registration.cache = std::move(hooks.cache);
  registration.node.set_held_layers(engine.held_layers() == model::HeldLayers::kProducers
                                        ? v1::HELD_LAYERS_PRODUCERS
                                        : v1::HELD_LAYERS_ALL);
  registration.node.set_state_format_version(transfer::kStateFormatVersion);
  registration.node.set_weight_bytes(static_cast<uint64_t>(engine.weight_bytes()));
  return ServeUntilShutdown(binary, builder, flags.server.server, std::move(registration),
                            hooks.start_watchdog, hooks.stop_watchdog, {}, hooks.drain);
}

}  // namespace baton::node
