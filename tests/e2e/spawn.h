// Starting the processes the multi-process tests run: the binaries of a cluster, `baton up`,
// clients that get killed, and the `ip` commands that build network namespaces.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/types.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace baton::testing {

// Starts args[0] (a path, or a name looked up on PATH) with stdout and stderr written to
// `output` (created or truncated); the pid, or -1 when it could not be started.
inline pid_t Spawn(std::vector<std::string> args, const std::string& output = "/dev/null") {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  const int error = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  return error == 0 ? pid : -1;
}

}  // namespace baton::testing
