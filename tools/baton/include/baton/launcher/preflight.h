// What `baton up` checks before it starts anything: a node that cannot honour --device,
// --weights, --cuda-prefill-attention (or BATON_CUDA_PREFILL_ATTENTION) or the environment's
// UCX_TLS would only exit later, after the others had started.
#pragma once

#include "absl/status/status.h"
#include "baton/launcher/launch_options.h"

namespace baton::launcher {

// --device names a device this build and machine can run the model on, --weights a weight
// type that device holds (bf16 is for --device cpu), the CUDA prefill attention kernel is one
// the nodes know (from the flag, else the variable), and with --transport ucx, UCX_TLS is one
// the nodes accept (transfer/ucx.h). INVALID_ARGUMENT naming the flag and what is allowed
// otherwise.
absl::Status CheckDevice(const LaunchOptions& options);

}  // namespace baton::launcher
