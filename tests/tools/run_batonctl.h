// Runs the batonctl binary built by this tree and captures its exit status, stdout, stderr.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "test_dir.h"

namespace baton::testing {

struct Result {
  int exit_status = -1;
  std::string out;
  std::string err;
};

Result RunBatonctl(const std::string& args) {
  // One stderr file per process: ctest runs several of these test binaries at once.
  const std::string err_path =
      baton::testing::ProcessTempDir() + "/batonctl_stderr_" + std::to_string(getpid()) + ".txt";
  const std::string command = std::string(BATONCTL_PATH) + " " + args + " 2>" + err_path;
  Result result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    result.out.append(buffer.data(), n);
  const int status = pclose(pipe);
  result.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err(err_path);
  std::stringstream text;
  text << err.rdbuf();
  result.err = text.str();
  return result;
}

}  // namespace baton::testing
