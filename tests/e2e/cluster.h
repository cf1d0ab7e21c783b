// Multi-process test clusters: starts the real baton-router, baton-prefill and baton-decode
// binaries on loopback with free ports (each writes its address to a ready file), and stops
// every process it started when destroyed. Like `baton up`, every internal surface runs mutual
// TLS with one certificate per role from a throwaway CA (one per test process); the router's
// client port is plaintext.
#pragma once

#include <algorithm>
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
#include <optional>
#include <string>
#include <vector>

#include "baton/common/pki.h"
#include "baton/v1/generation.grpc.pb.h"
#include "baton/v1/kvstore.grpc.pb.h"
#include "baton/v1/node.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "gtest/gtest.h"
#include "spawn.h"
#include "test_dir.h"
#include "testing/eventually.h"

extern char** environ;

namespace baton::testing {

// The test process's CA and role certificates (router, prefill, decode, kvstore, client).
inline const std::string& TestPki() {
  static const std::string dir = [] {
    const std::string d = baton::testing::ProcessTempDir() + "/pki";
    EXPECT_TRUE(pki::EnsureLocalPki(d, pki::LocalRoles()).ok());
    return d;
  }();
  return dir;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// TLS credentials that trust the CA in `pki_dir` and present its `role` certificate (none
// when `role` is empty). The server's chain is verified; its host name is not: only the router's
// certificate names one (common/pki.h), the nodes are known by their SPIFFE ids.
inline std::shared_ptr<grpc::ChannelCredentials> TlsAs(const std::string& role,
                                                       const std::string& pki_dir = TestPki()) {
  namespace tls = grpc::experimental;
  std::vector<tls::IdentityKeyCertPair> identity;
  if (!role.empty()) {
    identity.push_back({ReadFile(pki_dir + "/" + role + ".key"),
                        ReadFile(pki_dir + "/" + role + ".crt")});
  }
  auto provider = identity.empty()
                      ? std::make_shared<tls::StaticDataCertificateProvider>(
                            ReadFile(pki_dir + "/ca.crt"))
                      : std::make_shared<tls::StaticDataCertificateProvider>(
                            ReadFile(pki_dir + "/ca.crt"), identity);
  tls::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (!identity.empty()) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  options.set_check_call_host(false);
  options.set_certificate_verifier(std::make_shared<tls::NoOpCertificateVerifier>());
  return tls::TlsCredentials(options);
}

// The flags that give a binary `role`'s identity.
inline std::vector<std::string> TlsFlags(const std::string& role,
                                         const std::string& pki_dir = TestPki()) {
  return {"--tls-ca",  pki_dir + "/ca.crt",          "--tls-cert", pki_dir + "/" + role + ".crt",
          "--tls-key", pki_dir + "/" + role + ".key"};
}

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
      int status;
      if (!Eventually([&, pid = pid] { return waitpid(pid, &status, WNOHANG) == pid; },
                      std::chrono::seconds(10))) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
      }
    }
  }

  // Starts a binary; returns its address once it is serving ("" on failure).
  std::string Start(const std::string& name, const std::string& program,
                    std::vector<std::string> args) {
    const std::string ready = (dir_ / (name + ".addr")).string();
    args.insert(args.end(), {"--ready-file", ready});
    // Inside a network namespace: `ip netns exec NS program args...` (netns.h).
    std::vector<std::string> wrap;
    if (auto it = wrappers_.find(name); it != wrappers_.end()) wrap = it->second;
    wrap.push_back(program);
    wrap.insert(wrap.end(), args.begin(), args.end());
    const pid_t pid = Spawn(std::move(wrap), (dir_ / (name + ".log")).string());
    if (pid < 0) return "";
    pids_[name] = pid;
    std::string address;
    bool exited = false;
    Eventually(
        [&] {
          std::ifstream in(ready);
          if (in >> address) return true;
          int status;
          exited = waitpid(pid, &status, WNOHANG) == pid;
          return exited;
        },
        std::chrono::seconds(60));
    if (exited) {
      pids_[name] = -1;
      return "";
    }
    if (!address.empty()) addresses_[name] = address;
    return address;
  }

  // Runs the process started as `name` under `prefix` + its program + its arguments (e.g. `ip
  // netns exec NS`, which execs the program, so the pid stays the program's).
  void WrapIn(const std::string& name, std::vector<std::string> prefix) {
    wrappers_[name] = std::move(prefix);
  }

  // Starts a router named `name`; returns its client address (its internal one goes to
  // Internal(name)). The first router is the one nodes register with.
  std::string StartRouter(std::vector<std::string> extra = {}, const std::string& name = "router") {
    const std::vector<std::string> tls = TlsFlags("router");
    extra.insert(extra.begin(), tls.begin(), tls.end());
    const std::string internal_ready = (dir_ / (name + "-internal.addr")).string();
    extra.insert(extra.begin(), {"--model", model_dir_, "--internal-ready-file", internal_ready});
    const std::string address = Start(name, BATON_ROUTER_PATH, extra);
    std::ifstream in(internal_ready);
    in >> addresses_[name + "-internal"];
    if (router_.empty()) {
      router_ = address;
      router_internal_ = addresses_[name + "-internal"];
    }
    return address;
  }
  std::string StartPrefill(const std::string& name, std::vector<std::string> extra = {}) {
    return StartNode(name, "prefill", BATON_PREFILL_PATH, std::move(extra));
  }
  std::string StartDecode(const std::string& name, std::vector<std::string> extra = {}) {
    return StartNode(name, "decode", BATON_DECODE_PATH, std::move(extra));
  }
  // A node of `role` (its certificate and binary), registering with the first router's
  // internal port unless `extra` names other routers.
  std::string StartNode(const std::string& name, const std::string& role,
                        const std::string& program, std::vector<std::string> extra) {
    const std::vector<std::string> tls = TlsFlags(role);
    extra.insert(extra.begin(), tls.begin(), tls.end());
    auto model = model_for_.find(name);
    if (std::find(extra.begin(), extra.end(), "--router") == extra.end()) {
      extra.insert(extra.begin(), {"--router", router_internal_});
    }
    extra.insert(extra.begin(), {"--model", model == model_for_.end() ? model_dir_ : model->second,
                                 "--node-id", name});
    return Start(name, program, extra);
  }
  // The node started as `name` serves the model in `dir` instead of the cluster's.
  void ModelFor(const std::string& name, std::string dir) { model_for_[name] = std::move(dir); }

  std::string StartKvstore(const std::string& name, const std::string& data_dir,
                           std::vector<std::string> extra = {}) {
    const std::vector<std::string> tls = TlsFlags("kvstore");
    extra.insert(extra.begin(), tls.begin(), tls.end());
    extra.insert(extra.begin(),
                 {"--model", model_dir_, "--router", router_internal_, "--data-dir", data_dir});
    kvstore_ = Start(name, BATON_KVSTORE_PATH, extra);
    return kvstore_;
  }
  // The kvstore as a router sees it.
  std::unique_ptr<v1::KvStore::Stub> Kvstore() const {
    return v1::KvStore::NewStub(grpc::CreateChannel(kvstore_, TlsAs("router")));
  }
  // The address a started process serves on ("<router>-internal" for a router's Registry).
  std::string Address(const std::string& name) const {
    auto it = addresses_.find(name);
    return it == addresses_.end() ? "" : it->second;
  }
  const std::string& router_internal() const { return router_internal_; }
  const std::string& router() const { return router_; }  // the first router's client address
  // The pid of the process started as `name` (-1 once stopped or killed).
  pid_t Pid(const std::string& name) const {
    auto it = pids_.find(name);
    return it == pids_.end() ? -1 : it->second;
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

  // Sends `signal` to the process started as `name` without waiting for it.
  void Signal(const std::string& name, int signal) {
    const pid_t pid = Pid(name);
    if (pid > 0) kill(pid, signal);
  }
  // Waits up to `timeout` for the process started as `name` to exit: its wait status, or
  // nullopt when it is still running then (or was never started).
  std::optional<int> WaitExit(const std::string& name, std::chrono::milliseconds timeout) {
    const pid_t pid = Pid(name);
    if (pid <= 0) return std::nullopt;
    int status;
    if (!Eventually([&] { return waitpid(pid, &status, WNOHANG) == pid; }, timeout)) {
      return std::nullopt;
    }
    pids_[name] = -1;
    return status;
  }

  // Waits until the router's health check reports `serving`.
  bool WaitForHealth(bool serving, std::chrono::seconds timeout = std::chrono::seconds(30)) {
    auto stub = grpc::health::v1::Health::NewStub(
        grpc::CreateChannel(router_, grpc::InsecureChannelCredentials()));  // the client port
    auto answers = [&] {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
      grpc::health::v1::HealthCheckRequest request;
      grpc::health::v1::HealthCheckResponse response;
      const bool ok = stub->Check(&context, request, &response).ok();
      const bool is_serving =
          ok && response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
      return ok && is_serving == serving;
    };
    return static_cast<bool>(Eventually(answers, timeout, std::chrono::milliseconds(50)));
  }

  std::unique_ptr<v1::Generation::Stub> Client() const {
    return v1::Generation::NewStub(
        grpc::CreateChannel(router_, grpc::InsecureChannelCredentials()));
  }
  // A decode node as `role` sees it (the router by default, which may call Stats).
  std::unique_ptr<v1::DecodeNode::Stub> Decode(const std::string& name,
                                               const std::string& role = "router") {
    // Test certificates name 127.0.0.1; nodes in network namespaces have other addresses.
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("127.0.0.1");
    return v1::DecodeNode::NewStub(grpc::CreateCustomChannel(addresses_[name], TlsAs(role), args));
  }
  std::string Log(const std::string& name) const {
    std::ifstream in(dir_ / (name + ".log"));
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  // Polls the log of `name` until it holds `text` (false at the deadline).
  bool WaitForLog(const std::string& name, const std::string& text,
                  std::chrono::seconds timeout = std::chrono::seconds(60)) const {
    return static_cast<bool>(
        Eventually([&] { return Log(name).find(text) != std::string::npos; }, timeout));
  }

 private:
  static inline int counter_ = 0;
  std::string model_dir_;
  std::filesystem::path dir_;
  std::string router_;
  std::string router_internal_;
  std::string kvstore_;
  std::map<std::string, pid_t> pids_;
  std::map<std::string, std::string> addresses_;
  std::map<std::string, std::vector<std::string>> wrappers_;
  std::map<std::string, std::string> model_for_;
};

}  // namespace baton::testing
