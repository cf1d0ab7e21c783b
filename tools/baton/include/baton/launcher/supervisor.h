// `baton up`'s children: started one at a time, each waited for until its ready file holds its
// address, and then kept running. A child that exits on its own is started again with the
// same command line on the same port (so the others' addresses for it stay right), after
// 0.5 s, doubling (to at most 10 s) while it keeps exiting within 30 s of its start; when it
// has exited so five times in a row and exits again, everything stops. With restarts off
// (--no-restart) the first exit stops everything.
//
// Shutdown signals: BlockShutdownSignals must run before any thread exists; then SIGINT and
// SIGTERM reach only Supervise (sigtimedwait, which also wakes on SIGCHLD), and one that
// arrives while the children start waits for it. Children start with the default signal mask
// and handle SIGINT/SIGTERM themselves.
//
// Restarts and exits are logged to stderr as they happen ("decode-1 exited (killed by signal
// 9); restarting in 500 ms", "decode-1 restarted (pid N)"). Not thread-safe: one thread owns it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "baton/launcher/child_commands.h"

namespace baton::launcher {

// Blocks SIGINT, SIGTERM and SIGCHLD in the calling thread and every thread it starts later.
void BlockShutdownSignals();

class Supervisor {
 public:
  using Clock = std::chrono::steady_clock;

  Supervisor() = default;
  ~Supervisor() { StopAll(); }
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Spawns `command` and waits up to 120 s for its ready file; the child's address. From its
  // spawn on the child is supervised (and stopped by StopAll), also when it never becomes
  // ready. UNAVAILABLE when it cannot be spawned, exits first or time runs out.
  absl::StatusOr<std::string> Start(ChildCommand command);

  // Waits up to 120 s for another ready file of the child started last (the router's internal
  // and HTTP addresses), and gives its restarts `port_flag` with that address's port.
  absl::StatusOr<std::string> AwaitLastChild(const std::string& ready_file,
                                             const std::string& port_flag);

  // The children's names, in the order they were started.
  std::vector<std::string> Names() const;

  // Keeps the children running (restarting those that exit, when `restart`) until SIGINT or
  // SIGTERM (OK), or until a child's exit stops everything (ABORTED saying which and why,
  // "...; stopping the others"). Does not stop the children: StopAll does.
  absl::Status Supervise(bool restart);

  // Sends every running child SIGTERM and waits for all of them, sending SIGKILL to those
  // still running after 10 s.
  void StopAll();

 private:
  struct Child {
    ChildCommand command;
    pid_t pid = -1;
    Clock::time_point started;
    std::optional<Clock::time_point> restart_at;  // set while it waits to be started again
    int quick_exits = 0;                          // exits within 30 s of a start, in a row
  };

  // How long Supervise may sleep: until the next restart is due, at most a second.
  std::chrono::milliseconds UntilNextRestart() const;
  // Notes children that exited and schedules their restarts; ABORTED when an exit stops
  // everything.
  absl::Status ReapExited(bool restart);
  absl::Status OnExit(Child& child, int wait_status, bool restart);
  // Starts again the children whose restart is due; ABORTED when one cannot be spawned.
  absl::Status RestartDue();

  std::vector<Child> children_;
};

}  // namespace baton::launcher
