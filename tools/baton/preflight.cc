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

absl::Status CheckDevice(const LaunchOptions& options) {
  const model::DeviceFlags& flags = options.device;
  if (flags.weights == model::WeightType::kBf16 && flags.device != model::Device::kCpu) {
    return absl::InvalidArgumentError("--weights bf16 is for --device cpu");
  }
  if (absl::StatusOr<std::unique_ptr<model::Backend>> backend =
          model::MakeBackend(flags.device, 0, model::CudaOptionsOf(flags));
      !backend.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--device ", model::DeviceName(flags.device),
                                                   ": ", backend.status().message()));
  }
  // The nodes would refuse a UCX_TLS that serves RMA over TCP; say so once. (UCX reads the
  // variable itself when a worker is made, so the check reads what UCX will.)
  if (options.transport == v1::TRANSPORT_UCX) {
    if (auto transports = transfer::UcxTransports(std::getenv("UCX_TLS"), false);
        !transports.ok()) {
      return absl::InvalidArgumentError(transports.status().message());
    }
  }
  return absl::OkStatus();
}

}  // namespace baton::launcher
