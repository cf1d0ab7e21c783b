// Choosing a backend at run time (`--device cpu|cuda` on the nodes, `baton up` and batonctl):
// the one place that knows which backends this build has. Its target, baton_engine, links the
// CUDA backend when the build has one.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "baton/model/backend.h"
#include "baton/model/engine.h"

namespace baton::model {

// The backend for `device` (CUDA: device `ordinal`). FAILED_PRECONDITION naming why when this
// build or this machine cannot provide it ("this build has no CUDA backend", or the CUDA
// runtime's reason for seeing no device).
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(Device device, int ordinal = 0);

// Loads `model_dir` onto a fresh backend for `device`, its matrices held as `weight_type`.
absl::StatusOr<std::unique_ptr<Engine>> LoadEngine(const std::string& model_dir,
                                                   Device device = Device::kCpu,
                                                   WeightType weight_type = WeightType::kFp32);

// What a binary's `--device` and `--weights` flags do: parses `device` ("cpu" or "cuda") and
// `weights` ("fp32" or "bf16") and loads the model there. An unknown name, a device this build
// or machine cannot provide, or BF16 weights on CUDA is INVALID_ARGUMENT naming the flag and the
// reason (the binaries exit 2 on it).
absl::StatusOr<std::unique_ptr<Engine>> LoadEngineOnDevice(const std::string& model_dir,
                                                           const std::string& device,
                                                           const std::string& weights = "fp32");

}  // namespace baton::model
