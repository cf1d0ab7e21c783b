// `baton up` as a child process of a test: the whole embedded cluster (router, kvstore,
// prefill, decode) on loopback, its output in <dir>/up.log, stopped with SIGTERM when the
// object goes.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "spawn.h"
#include "testing/eventually.h"

extern char** environ;

namespace baton::testing {

inline std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class BatonUp {
 public:
  // Runs `baton up --port 0 --data-dir dir --http-port 0 [--model model_dir]` plus `extra`
  // (no --model: baton up generates its default model).
  BatonUp(const std::filesystem::path& dir, const std::string& model_dir,
          std::vector<std::string> extra = {})
      : dir_(dir) {
    std::filesystem::create_directories(dir_);
    std::vector<std::string> args = {BATON_PATH,   "up",          "--port",      "0",
                                     "--data-dir", dir_.string(), "--http-port", "0"};
    if (!model_dir.empty()) args.insert(args.end(), {"--model", model_dir});
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = Spawn(std::move(args), (dir_ / "up.log").string());
  }
  ~BatonUp() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    int status;
    waitpid(pid_, &status, 0);
  }
  BatonUp(const BatonUp&) = delete;
  BatonUp& operator=(const BatonUp&) = delete;

  // Waits until baton up has printed every component's metrics address (after the router
  // reports SERVING); false if it exits first or two minutes pass.
  bool WaitUntilUp() {
    bool up = false;
    Eventually(
        [&] {
          up = log().find("baton up: metrics at") != std::string::npos;
          int status;
          if (!up && (pid_ <= 0 || waitpid(pid_, &status, WNOHANG) == pid_)) {
            pid_ = -1;
            return true;  // exited: nothing more to wait for
          }
          return up;
        },
        std::chrono::seconds(120), std::chrono::milliseconds(50));
    return up;
  }
  // The address in <dir>/run/<file> ("router.addr", "decode.metrics", ...).
  std::string Address(const std::string& file) const {
    std::ifstream in(dir_ / "run" / file);
    std::string address;
    in >> address;
    return address;
  }
  std::string log() const { return ReadFile(dir_ / "up.log"); }
  pid_t pid() const { return pid_; }

  // The pid of baton up's child started with `--node-id node_id`, or of the one whose
  // program is `program` ("baton-router"); -1 if none.
  pid_t Child(const std::string& node_id, const std::string& program = "") const {
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
      const std::string name = entry.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::string stat = ReadFile(entry.path() / "stat");
      const size_t close = stat.rfind(')');
      if (close == std::string::npos) continue;
      int ppid = -1;
      char state;
      if (sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) != 2 || ppid != pid_) continue;
      const std::string cmdline = ReadFile(entry.path() / "cmdline");
      std::vector<std::string> args;
      for (size_t at = 0; at < cmdline.size();) {
        const size_t end = cmdline.find('\0', at);
        args.push_back(cmdline.substr(at, end - at));
        if (end == std::string::npos) break;
        at = end + 1;
      }
      if (args.empty()) continue;
      if (!program.empty() && std::filesystem::path(args[0]).filename() == program) {
        return std::stoi(name);
      }
      for (size_t i = 0; i + 1 < args.size(); ++i) {
        if (args[i] == "--node-id" && args[i + 1] == node_id) return std::stoi(name);
      }
    }
    return -1;
  }

 private:
  std::filesystem::path dir_;
  pid_t pid_ = -1;
};

}  // namespace baton::testing
