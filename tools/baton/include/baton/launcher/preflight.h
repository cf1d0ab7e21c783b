// What `baton up` checks before it starts anything: a node that cannot honour --device,
// --weights or the environment's UCX_TLS would only exit later, after the others had started.
#pragma once

#include "absl/status/status.h"
#include "baton/launcher/launch_options.h"

namespace baton::launcher {

// --device names a device this build and machine can run the model on (made with the CUDA
// prefill attention kernel asked for), --weights a weight type that device holds (bf16 is for
// --device cpu), and with --transport ucx, UCX_TLS is one the nodes accept (transfer/ucx.h).
// INVALID_ARGUMENT naming the flag and what is allowed otherwise. (Names were checked where the
// flags were parsed, and BATON_CUDA_PREFILL_ATTENTION by main.)
absl::Status CheckDevice(const LaunchOptions& options);

}  // namespace baton::launcher
