// `baton up` (DESIGN section 7) as a library: main.cc parses the flags into LaunchOptions and
// calls StartCluster, then Supervisor::Supervise until a signal or a failure, then
// Supervisor::StopAll. The steps, each in its own file:
//   preflight.h       the device, weight type and UCX_TLS, before anything starts
//   layout.h          the data dir's run/ and tls/ folders, the binaries, the PKI
//   model_source.h    the model served (the trained default, --model or a generated --preset)
//   child_commands.h  each child's command line
//   supervisor.h      starting, watching, restarting and stopping the children
//
// Errors carry the message `baton up` prints after "baton up: ", and the code ExitCode maps to
// its exit status.
#pragma once

#include "absl/status/status.h"
#include "baton/launcher/launch_options.h"
#include "baton/launcher/supervisor.h"

namespace baton::launcher {

// Checks the flags, resolves the model, makes the PKI, then starts baton-router, baton-kvstore,
// --decode-nodes baton-decode and --prefill-nodes baton-prefill under `children`, in that
// order, each once the one before has written its ready file, and waits for the router to
// report SERVING; then prints the ready lines (the router's addresses, the OpenAI base URL,
// the certificates' folder, every child's metrics address). Prints a warning when the client
// API listens beyond loopback without --api-keys.
//
// INVALID_ARGUMENT naming the flag when the flags cannot be honoured here (nothing started);
// another code when a step fails, "a component failed to start; stopping the others" when a
// child does (the children started so far are left to Supervisor::StopAll).
absl::Status StartCluster(const LaunchOptions& options, Supervisor& children);

// `baton up`'s exit status for how it ended: 0 when OK; 2 when the flags cannot be honoured
// (INVALID_ARGUMENT); 1 when starting or running failed.
int ExitCode(const absl::Status& status);

}  // namespace baton::launcher
