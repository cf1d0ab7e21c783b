#include "baton/launcher/supervisor.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace baton::launcher {

namespace {

using Clock = Supervisor::Clock;

// The restart policy (the header comment). The stop message names kMaxQuickExits and
// kQuickExit in words: change them together.
constexpr auto kQuickExit = std::chrono::seconds(30);  // an exit this soon after a start counts
constexpr int kMaxQuickExits = 5;
constexpr auto kFirstRestartDelay = std::chrono::milliseconds(500);
constexpr auto kMaxRestartDelay = std::chrono::milliseconds(10000);

sigset_t ShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGCHLD);
  return signals;
}

pid_t Spawn(const ChildCommand& command) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(command.program.c_str()));
  for (const std::string& a : command.args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // baton up's environment, less the names the command sets, then the command's.
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const bool set_here = std::any_of(command.env.begin(), command.env.end(), [&](const auto& own) {
      const size_t name = own.find('=');
      return entry.substr(0, entry.find('=')) == std::string_view(own).substr(0, name);
    });
    if (!set_here) envp.push_back(*e);
  }
  for (const std::string& own : command.env) envp.push_back(const_cast<char*>(own.c_str()));
  envp.push_back(nullptr);
  // Children start with the default signal mask so that they handle SIGINT/SIGTERM themselves.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t empty;
  sigemptyset(&empty);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int error =
      posix_spawn(&pid, command.program.c_str(), nullptr, &attr, argv.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  return error == 0 ? pid : -1;
}

// Waits for `path` to hold an address; false if `pid` exits first or time runs out.
bool WaitForReadyFile(const std::string& path, pid_t pid, std::string* address) {
  const auto until = Clock::now() + std::chrono::seconds(120);
  while (Clock::now() < until) {
    std::ifstream in(path);
    if (in >> *address) return true;
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// The port of a "host:port" address (the ready files' format).
std::string PortOf(const std::string& address) {
  return address.substr(address.rfind(':') + 1);
}

// Replaces the value after `flag` in `args` (or appends both).
void SetFlag(std::vector<std::string>& args, const std::string& flag, const std::string& value) {
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == flag) {
      args[i + 1] = value;
      return;
    }
  }
  args.insert(args.end(), {flag, value});
}

// "status 1", "killed by signal 9": how a child ended, from waitpid's status.
std::string HowItExited(int wait_status) {
  return WIFSIGNALED(wait_status) ? "killed by signal " + std::to_string(WTERMSIG(wait_status))
                                  : "status " + std::to_string(WEXITSTATUS(wait_status));
}

// 0.5 s after the first of a run of quick exits, doubling with each, at most 10 s.
std::chrono::milliseconds RestartDelay(int quick_exits) {
  return std::chrono::milliseconds(std::min<int64_t>(
      kMaxRestartDelay.count(), int64_t{kFirstRestartDelay.count()} << (quick_exits - 1)));
}

}  // namespace

void BlockShutdownSignals() {
  const sigset_t signals = ShutdownSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

absl::StatusOr<std::string> Supervisor::Start(ChildCommand command) {
  const pid_t pid = Spawn(command);
  if (pid < 0) return absl::UnavailableError(absl::StrCat("cannot start ", command.program));
  const std::string ready_file = command.ready_file;
  children_.push_back({std::move(command), pid, Clock::now()});
  return AwaitLastChild(ready_file, "--port");
}

absl::StatusOr<std::string> Supervisor::AwaitLastChild(const std::string& ready_file,
                                                       const std::string& port_flag) {
  Child& child = children_.back();
  std::string address;
  if (!WaitForReadyFile(ready_file, child.pid, &address)) {
    return absl::UnavailableError(
        absl::StrCat(child.command.name, " wrote no address to ", ready_file));
  }
  // A restart serves on the same port, so the others' addresses for it stay right.
  SetFlag(child.command.args, port_flag, PortOf(address));
  return address;
}

std::vector<std::string> Supervisor::Names() const {
  std::vector<std::string> names;
  for (const Child& c : children_) names.push_back(c.command.name);
  return names;
}

absl::Status Supervisor::Supervise(bool restart) {
  const sigset_t signals = ShutdownSignals();
  while (true) {
    // Wake for a signal, or when the next restart is due.
    const std::chrono::milliseconds wait = UntilNextRestart();
    const timespec timeout{static_cast<time_t>(wait.count() / 1000),
                           static_cast<long>(wait.count() % 1000) * 1000000};
    siginfo_t info;
    const int signal = sigtimedwait(&signals, &info, &timeout);
    if (signal == SIGINT || signal == SIGTERM) return absl::OkStatus();
    if (absl::Status s = ReapExited(restart); !s.ok()) return s;
    if (absl::Status s = RestartDue(); !s.ok()) return s;
  }
}

std::chrono::milliseconds Supervisor::UntilNextRestart() const {
  auto wait = std::chrono::milliseconds(1000);
  for (const Child& c : children_) {
    if (c.restart_at.has_value()) {
      wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(*c.restart_at -
                                                                                  Clock::now()));
    }
  }
  return std::max(wait, std::chrono::milliseconds(1));
}

absl::Status Supervisor::ReapExited(bool restart) {
  for (Child& c : children_) {
    int status;
    if (c.pid > 0 && waitpid(c.pid, &status, WNOHANG) == c.pid) {
      c.pid = -1;
      if (absl::Status s = OnExit(c, status, restart); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status Supervisor::OnExit(Child& child, int wait_status, bool restart) {
  const std::string& name = child.command.name;
  const std::string how = HowItExited(wait_status);
  if (!restart) {
    return absl::AbortedError(absl::StrCat(name, " exited (", how, "); stopping the others"));
  }
  const bool quick = Clock::now() - child.started < kQuickExit;
  child.quick_exits = quick ? child.quick_exits + 1 : 1;
  if (child.quick_exits > kMaxQuickExits) {
    return absl::AbortedError(
        absl::StrCat(name, " exited (", how,
                     ") five times in a row within 30 s of starting; stopping the others"));
  }
  const std::chrono::milliseconds delay = RestartDelay(child.quick_exits);
  std::cerr << "baton up: " << name << " exited (" << how << "); restarting in " << delay.count()
            << " ms\n";
  child.restart_at = Clock::now() + delay;
  return absl::OkStatus();
}

absl::Status Supervisor::RestartDue() {
  for (Child& c : children_) {
    if (!c.restart_at.has_value() || Clock::now() < *c.restart_at) continue;
    c.restart_at.reset();
    std::error_code ignored;
    std::filesystem::remove(c.command.ready_file, ignored);
    c.pid = Spawn(c.command);
    c.started = Clock::now();
    if (c.pid < 0) {
      return absl::AbortedError(
          absl::StrCat("cannot start ", c.command.name, " again; stopping the others"));
    }
    std::cerr << "baton up: " << c.command.name << " restarted (pid " << c.pid << ")\n";
  }
  return absl::OkStatus();
}

void Supervisor::StopAll() {
  for (Child& c : children_) {
    if (c.pid > 0) kill(c.pid, SIGTERM);
  }
  const auto until = Clock::now() + std::chrono::seconds(10);
  for (Child& c : children_) {
    while (c.pid > 0) {
      int status;
      if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.pid = -1;
      } else if (Clock::now() > until) {
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &status, 0);
        c.pid = -1;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }
}

}  // namespace baton::launcher
