#include "baton/launcher/preflight.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "baton/model/engine.h"
#include "baton/model/engine_factory.h"
#include "baton/transfer/ucx.h"

namespace baton::launcher {

namespace {

absl::Status CheckDeviceFlag(const std::string& device) {
  absl::StatusOr<model::Device> parsed = model::ParseDevice(device, "--device");
  if (!parsed.ok()) return absl::InvalidArgumentError(parsed.status().message());
  if (absl::StatusOr<std::unique_ptr<model::Backend>> backend = model::MakeBackend(*parsed);
      !backend.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device ", device, ": ", backend.status().message()));
  }
  return absl::OkStatus();
}

absl::Status CheckWeightsFlag(const std::string& weights, const std::string& device) {
  absl::StatusOr<model::WeightType> parsed = model::ParseWeightType(weights, "--weights");
  if (!parsed.ok()) return absl::InvalidArgumentError(parsed.status().message());
  if (*parsed == model::WeightType::kBf16 && device != "cpu") {
    return absl::InvalidArgumentError("--weights bf16 is for --device cpu");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckDevice(const LaunchOptions& options) {
  if (absl::Status s = CheckDeviceFlag(options.device); !s.ok()) return s;
  if (absl::Status s = CheckWeightsFlag(options.weights, options.device); !s.ok()) return s;
  if (absl::StatusOr<kernels::CudaOptions> cuda =
          model::CudaOptionsFrom(options.cuda_prefill_attention, "--cuda-prefill-attention");
      !cuda.ok()) {
    return cuda.status();
  }
  // The nodes would refuse a UCX_TLS that serves RMA over TCP; say so once.
  if (options.transport == "ucx") {
    if (auto transports = transfer::UcxTransports(std::getenv("UCX_TLS"), false);
        !transports.ok()) {
      return absl::InvalidArgumentError(transports.status().message());
    }
  }
  return absl::OkStatus();
}

}  // namespace baton::launcher
