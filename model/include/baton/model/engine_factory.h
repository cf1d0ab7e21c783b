// Choosing a backend at run time (`--device cpu|cuda` on the nodes, `baton up` and batonctl):
// the one place that knows which backends this build has. Its target, baton_engine, links the
// CUDA backend when the build has one.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "baton/kernels/backend_options.h"
#include "baton/model/backend.h"
#include "baton/model/engine.h"

namespace baton::model {

// The backend for `device` (CUDA: device `ordinal`, made with `cuda`). FAILED_PRECONDITION
// naming why when this build or this machine cannot provide it ("this build has no CUDA
// backend", or the CUDA runtime's reason for seeing no device).
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(Device device, int ordinal = 0,
                                                     const kernels::CudaOptions& cuda = {});

// Loads the `held` layers of `model_dir` onto a fresh backend for `device`, its matrices held
// as `weight_type`.
absl::StatusOr<std::unique_ptr<Engine>> LoadEngine(const std::string& model_dir,
                                                   Device device = Device::kCpu,
                                                   WeightType weight_type = WeightType::kFp32,
                                                   HeldLayers held = HeldLayers::kAll);

// A binary's `--device`, `--weights` and `--cuda-prefill-attention` flags as parsed (after its
// config file, which sets the same fields).
struct DeviceFlags {
  Device device = Device::kCpu;
  WeightType weights = WeightType::kFp32;
  // Unset: the value of kPrefillAttentionVariable the program read at start
  // (ApplyPrefillAttentionVariable), else kernels::CudaOptions' default.
  std::optional<kernels::PrefillAttention> cuda_prefill_attention;
};

// Where `flags` has no --cuda-prefill-attention, the kPrefillAttentionVariable's `value` as the
// program's main read it (null or empty: not set) becomes it. INVALID_ARGUMENT naming the
// variable for an unknown name. The library itself reads no environment.
absl::Status ApplyPrefillAttentionVariable(const char* value, DeviceFlags& flags);

// The CUDA backend's options those flags give.
kernels::CudaOptions CudaOptionsOf(const DeviceFlags& flags);

// What those flags do: loads the model there. A device this build or machine cannot provide,
// or BF16 weights on CUDA, is INVALID_ARGUMENT naming the flag and the reason (the binaries
// exit 2 on it).
absl::StatusOr<std::unique_ptr<Engine>> LoadEngineOnDevice(const std::string& model_dir,
                                                           const DeviceFlags& flags,
                                                           HeldLayers held = HeldLayers::kAll);

}  // namespace baton::model
