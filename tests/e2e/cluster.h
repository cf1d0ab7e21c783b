// Multi-process test clusters: starts the real baton-router, baton-prefill and baton-decode
// binaries on loopback with free ports (each writes its address to a ready file), and stops
// every process it started when destroyed.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "baton/v1/generation.grpc.pb.h"
#include "baton/v1/kvstore.grpc.pb.h"
#include "baton/v1/node.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "test_dir.h"

extern char** environ;

namespace baton::testing {

class Cluster {
 public:
  explicit Cluster(std::string model_dir) : model_dir_(std::move(model_dir)) {
    dir_ = std::filesystem::path(baton::testing::ProcessTempDir()) /
           ("cluster_" + std::to_string(getpid()) + "_" + std::to_string(counter_++));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~Cluster() {
    for (auto& [name, pid] : pids_) {
      if (pid > 0) kill(pid, SIGTERM);
    }
    for (auto& [name, pid] : pids_) {
      if (pid <= 0) continue;
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      int status;
      while (waitpid(pid, &status, WNOHANG) != pid) {
        if (std::chrono::steady_clock::now() > until) {
          kill(pid, SIGKILL);
          waitpid(pid, &status, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }

  // Starts a binary; returns its address once it is serving ("" on failure).
  std::string Start(const std::string& name, const std::string& program,
                    std::vector<std::string> args) {
    const std::string ready = (dir_ / (name + ".addr")).string();
    args.insert(args.end(), {"--ready-file", ready});
    std::vector<char*> argv = {const_cast<char*>(program.c_str())};
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log = (dir_ / (name + ".log")).string();
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    pid_t pid = -1;
    const int error = posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (error != 0) return "";
    pids_[name] = pid;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < until) {
      std::ifstream in(ready);
      std::string address;
      if (in >> address) {
        addresses_[name] = address;
        return address;
      }
      int status;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        pids_[name] = -1;
        return "";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return "";
  }

  std::string StartRouter(std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(), {"--model", model_dir_});
    router_ = Start("router", BATON_ROUTER_PATH, extra);
    return router_;
  }
  std::string StartPrefill(const std::string& name, std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(), {"--model", model_dir_, "--router", router_, "--node-id", name});
    return Start(name, BATON_PREFILL_PATH, extra);
  }
  std::string StartDecode(const std::string& name, std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(), {"--model", model_dir_, "--router", router_, "--node-id", name});
    return Start(name, BATON_DECODE_PATH, extra);
  }

  std::string StartKvstore(const std::string& name, const std::string& data_dir,
                           std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(),
                 {"--model", model_dir_, "--router", router_, "--data-dir", data_dir});
    kvstore_ = Start(name, BATON_KVSTORE_PATH, extra);
    return kvstore_;
  }
  std::unique_ptr<v1::KvStore::Stub> Kvstore() const {
    return v1::KvStore::NewStub(grpc::CreateChannel(kvstore_, grpc::InsecureChannelCredentials()));
  }
  std::string dir() const { return dir_.string(); }

  void Kill(const std::string& name, int signal = SIGKILL) {
    const pid_t pid = pids_[name];
    if (pid <= 0) return;
    kill(pid, signal);
    int status;
    waitpid(pid, &status, 0);
    pids_[name] = -1;
  }

  // Waits until the router's health check reports `serving`.
  bool WaitForHealth(bool serving, std::chrono::seconds timeout = std::chrono::seconds(30)) {
    auto stub = grpc::health::v1::Health::NewStub(
        grpc::CreateChannel(router_, grpc::InsecureChannelCredentials()));
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
      grpc::health::v1::HealthCheckRequest request;
      grpc::health::v1::HealthCheckResponse response;
      const bool ok = stub->Check(&context, request, &response).ok();
      const bool is_serving =
          ok && response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
      if (ok && is_serving == serving) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  std::unique_ptr<v1::Generation::Stub> Client() const {
    return v1::Generation::NewStub(
        grpc::CreateChannel(router_, grpc::InsecureChannelCredentials()));
  }
  std::unique_ptr<v1::DecodeNode::Stub> Decode(const std::string& name) {
    return v1::DecodeNode::NewStub(
        grpc::CreateChannel(addresses_[name], grpc::InsecureChannelCredentials()));
  }
  std::string Log(const std::string& name) const {
    std::ifstream in(dir_ / (name + ".log"));
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  static inline int counter_ = 0;
  std::string model_dir_;
  std::filesystem::path dir_;
  std::string router_;
  std::string kvstore_;
  std::map<std::string, pid_t> pids_;
  std::map<std::string, std::string> addresses_;
};

}  // namespace baton::testing
