// What a first install on a real cluster meets, reproduced on one machine with the real
// binaries: a prefix store that is absent at start or restarts (the router serves, cold),
// a node of another StateBlock format during a rollout (not paired, reported as skew), and
// client connections that the router closes at an age so that clients spread over routers
// added since (every request still completes).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "baton/common/cert_expiry.h"
#include "baton/common/model_config.h"
#include "baton/common/security.h"
#include "baton/model/model_factory.h"
#include "baton/model/weights.h"
#include "baton/transfer/state_block.h"
#include "client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scrape.h"
#include "test_dir.h"
#include "testing/eventually.h"
#include "testing/free_port.h"
#include "text_model.h"

namespace baton::testing {
namespace {

using ::testing::Ge;
using ::testing::HasSubstr;

std::string ReadAddress(const std::string& path) {
  std::ifstream in(path);
  std::string address;
  in >> address;
  return address;
}

class OperationsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = ProcessTempDir() + "/operations_tiny";
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("tiny"), 17, model_).ok());
  }
  // A router with a metrics port (its address in metrics_).
  void StartRouter(std::vector<std::string> flags = {}, const std::string& model = model_) {
    cluster_ = std::make_unique<Cluster>(model);
    const std::string file = cluster_->dir() + "/router.metrics";
    flags.insert(flags.end(), {"--metrics-port", "0", "--metrics-ready-file", file});
    ASSERT_FALSE(cluster_->StartRouter(flags).empty());
    metrics_ = ReadAddress(file);
    ASSERT_FALSE(metrics_.empty());
  }
  double RouterSample(const std::string& name, const std::map<std::string, std::string>& labels) {
    return Sample(Scrape(metrics_), name, labels).value_or(-1);
  }
  Outcome Run(const std::vector<int32_t>& prompt, uint32_t max_tokens = 4) {
    auto stub = cluster_->Client();
    return Generate(*stub, Request(prompt, max_tokens), std::chrono::seconds(60));
  }

  // Where the process started as `name` writes its health port's address.
  std::string HealthFile(const std::string& name) const {
    return ProcessTempDir() + "/operations_" + name + ".health";
  }

  static inline std::string model_;
  std::unique_ptr<Cluster> cluster_;
  std::string metrics_;
};

// The store is absent when the cluster starts (its claim Pending): the router turns ready
// with a prefill and a decode node alone and serves every request cold. Once the store is
// up, requests hit; while it is killed and started again, requests keep completing.
TEST_F(OperationsTest, TheRouterServesWithoutTheStoreAndThroughItsRestart) {
  StartRouter();
  const int store_port = FreePort();
  ASSERT_GT(store_port, 0);
  const std::string store = "127.0.0.1:" + std::to_string(store_port);
  ASSERT_FALSE(cluster_->StartDecode("decode").empty());
  ASSERT_FALSE(cluster_->StartPrefill("prefill", {"--kvstore", store}).empty());
  ASSERT_TRUE(cluster_->WaitForHealth(true));
  EXPECT_EQ(RouterSample("baton_nodes", {{"role", "kvstore"}}), 0);
  std::mt19937_64 rng(5);
  const std::vector<int32_t> prompt = RandomPrompt(rng, 90, 512);
  const Outcome cold = Run(prompt);
  ASSERT_TRUE(cold.status.ok()) << cold.status.error_message();
  EXPECT_EQ(cold.usage.cached_tokens(), 0u);

  const std::string data_dir = cluster_->dir() + "/store";
  const std::vector<std::string> store_flags = {"--port", std::to_string(store_port)};
  ASSERT_FALSE(cluster_->StartKvstore("kvstore", data_dir, store_flags).empty());
  // Write-back is asynchronous: a later run of the prompt hits.
  auto hit = [&] {
    const Outcome o = Run(prompt);
    return o.status.ok() && o.usage.cached_tokens() > 0 && o.tokens == cold.tokens;
  };
  ASSERT_TRUE(Eventually(hit, std::chrono::seconds(30), std::chrono::milliseconds(100)));

  // Requests flow while the store is killed and comes back: none fails, and the router never
  // turns unready.
  std::atomic<bool> stop{false};
  std::atomic<int> done{0}, failed{0};
  std::string first_error;
  std::thread client([&] {
    std::mt19937_64 client_rng(6);
    while (!stop) {
      const Outcome o = Run(RandomPrompt(client_rng, 40 + client_rng() % 60, 512));
      if (!o.status.ok() && failed++ == 0) first_error = o.status.error_message();
      ++done;
    }
  });
  ASSERT_TRUE(EventuallyThat([&] { return done.load(); }, Ge(3)));
  cluster_->Kill("kvstore");
  const int before_restart = done;
  ASSERT_TRUE(EventuallyThat([&] { return done.load(); }, Ge(before_restart + 3)));
  EXPECT_TRUE(cluster_->WaitForHealth(true, std::chrono::seconds(1)));
  ASSERT_FALSE(cluster_->StartKvstore("kvstore", data_dir, store_flags).empty());
  const int after_restart = done;
  ASSERT_TRUE(EventuallyThat([&] { return done.load(); }, Ge(after_restart + 3)));
  stop = true;
  client.join();
  EXPECT_EQ(failed, 0) << "first failure: " << first_error;
  // The restarted store kept its data (RocksDB on the same directory): the prompt hits again.
  ASSERT_TRUE(Eventually(hit, std::chrono::seconds(30), std::chrono::milliseconds(100)));
  EXPECT_TRUE(cluster_->WaitForHealth(true, std::chrono::seconds(1)));
}

// Registers a decode node of another StateBlock format through the router's Registry (as a
// node of a newer build would during a rollout), every 200 ms until destroyed.
class FakeDecode {
 public:
  FakeDecode(const std::string& router_internal, const std::string& model_dir, uint32_t format)
      : thread_([this, router_internal, model_dir, format] {
          auto registry =
              v1::Registry::NewStub(grpc::CreateChannel(router_internal, TlsAs("decode")));
          v1::RegisterRequest reg;
          reg.set_node_id("decode-next");
          reg.set_role(v1::NODE_ROLE_DECODE);
          reg.set_address("127.0.0.1:1");  // nothing there: a pairing would fail requests
          reg.set_model_fingerprint(*model::ModelFingerprint(model_dir));
          reg.set_state_format_version(format);
          reg.set_build_version("0.2.0-next");
          reg.mutable_load()->set_free_slots(64);
          reg.mutable_load()->set_total_slots(64);
          reg.mutable_load()->set_free_pages(1 << 16);
          reg.mutable_load()->set_total_pages(1 << 16);
          while (!stop_) {
            grpc::ClientContext context;
            context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
            v1::RegisterResponse reply;
            const grpc::Status status = registry->Register(&context, reg, &reply);
            if (status.ok()) registered_ = true;
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
          }
        }) {}
  ~FakeDecode() {
    stop_ = true;
    thread_.join();
  }
  bool registered() const { return registered_; }

 private:
  std::atomic<bool> stop_{false}, registered_{false};
  std::thread thread_;
};

// A prefill node and a decode node of two StateBlock formats do not pair: the router stays
// unready and says why in its metrics (version skew, nodes by version); a decode node of the
// prefill node's format makes it serve, and requests go there only (the other's address has
// nothing behind it).
TEST_F(OperationsTest, ANodeOfAnotherStateFormatIsNotPaired) {
  StartRouter();
  ASSERT_FALSE(cluster_->StartPrefill("prefill").empty());
  FakeDecode next(cluster_->router_internal(), model_, transfer::kStateFormatVersion + 1);
  ASSERT_TRUE(Eventually([&] { return next.registered(); }));
  ASSERT_TRUE(EventuallyThat([&] { return RouterSample("baton_router_version_skew", {}); }, 1.0));
  EXPECT_EQ(RouterSample("baton_router_nodes_by_version",
                         {{"role", "decode"},
                          {"version", "0.2.0-next"},
                          {"state_format", std::to_string(transfer::kStateFormatVersion + 1)}}),
            1);
  EXPECT_EQ(RouterSample("baton_router_nodes_by_version",
                         {{"role", "prefill"},
                          {"version", BATON_VERSION},
                          {"state_format", std::to_string(transfer::kStateFormatVersion)}}),
            1);
  EXPECT_EQ(RouterSample("baton_nodes", {{"role", "decode"}}), 1);
  // Registered and live, yet not paired: the router is not ready and refuses requests.
  EXPECT_TRUE(cluster_->WaitForHealth(false, std::chrono::seconds(2)));
  std::mt19937_64 rng(8);
  const std::vector<int32_t> prompt = RandomPrompt(rng, 30, 512);
  auto stub = cluster_->Client();
  const Outcome refused = Generate(*stub, Request(prompt, 4), std::chrono::seconds(3));
  EXPECT_FALSE(refused.status.ok());

  ASSERT_FALSE(cluster_->StartDecode("decode").empty());
  ASSERT_TRUE(cluster_->WaitForHealth(true));
  for (int i = 0; i < 6; ++i) {
    const Outcome o = Run(RandomPrompt(rng, 20 + 7 * i, 512));
    EXPECT_TRUE(o.status.ok()) << o.status.error_message();
    EXPECT_EQ(o.tokens.size(), 4u);
  }
  EXPECT_EQ(RouterSample("baton_router_version_skew", {}), 1);
}

// Watches a channel's connectivity and counts the connections it made (each time it turned
// READY), until destroyed.
class ConnectionCounter {
 public:
  explicit ConnectionCounter(std::shared_ptr<grpc::Channel> channel)
      : channel_(std::move(channel)), thread_([this] {
          grpc_connectivity_state state = channel_->GetState(false);
          while (!stop_) {
            if (channel_->WaitForStateChange(
                    state, std::chrono::system_clock::now() + std::chrono::milliseconds(100))) {
              state = channel_->GetState(false);
              if (state == GRPC_CHANNEL_READY) ++connections_;
            }
          }
        }) {}
  ~ConnectionCounter() {
    stop_ = true;
    thread_.join();
  }
  int connections() const { return connections_; }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread thread_;
};

// One HTTP/1.1 request on an open connection; the response head and body as read until
// the body's Content-Length is in.
std::string HttpExchange(int fd, const std::string& request) {
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) return "";
  std::string response;
  char buffer[4096];
  while (true) {
    const size_t head_end = response.find("\r\n\r\n");
    if (head_end != std::string::npos) {
      const size_t at = response.find("Content-Length: ");
      if (at != std::string::npos && at < head_end) {
        const size_t length = std::stoul(response.substr(at + 16));
        if (response.size() >= head_end + 4 + length) return response;
      }
    }
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n <= 0) return response;
    response.append(buffer, static_cast<size_t>(n));
  }
}

int Connect(const std::string& address) {
  const size_t colon = address.rfind(':');
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval timeout{.tv_sec = 30, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// With --client-max-connection-age 1s, the router closes a client's gRPC connection about
// every second (GOAWAY): the client reconnects on its own, and every request completes (with
// the retry of UNAVAILABLE that clients of a router with an age need), a stream that outlives
// the age too (the grace is unlimited). The HTTP front ends a kept-alive
// connection past the age with "Connection: close", and its own in-process calls still work.
TEST_F(OperationsTest, ClientConnectionsOlderThanTheAgeAreClosedAndClientsReconnect) {
  const std::string http_file = ProcessTempDir() + "/age-router.http";
  StartRouter(
      {"--client-max-connection-age", "1s", "--http-port", "0", "--http-ready-file", http_file},
      TextModel());
  ASSERT_FALSE(cluster_->StartDecode("decode").empty());
  ASSERT_FALSE(cluster_->StartPrefill("prefill").empty());
  ASSERT_TRUE(cluster_->WaitForHealth(true));
  const std::string router = cluster_->Address("router");
  // A client as batonctl makes one: it retries a call that fails UNAVAILABLE before any
  // response, which one started just as a GOAWAY arrives does.
  auto channel = grpc::CreateCustomChannel(router, grpc::InsecureChannelCredentials(),
                                           security::ClientChannelArguments());
  auto stub = v1::Generation::NewStub(channel);
  ConnectionCounter counter(channel);
  std::mt19937_64 rng(9);
  // A stream read slowly, so that it lives past several ages.
  std::atomic<bool> slow_done{false};
  Outcome slow;
  std::thread slow_reader([&] {
    slow = Generate(*stub, Request(RandomPrompt(rng, 30, 4096), 60), std::chrono::seconds(60),
                    [](const Outcome&) {
                      std::this_thread::sleep_for(std::chrono::milliseconds(60));
                      return true;
                    });
    slow_done = true;
  });
  int requests = 0, failed = 0;
  std::string first_error;
  std::mt19937_64 prompts(10);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < until || !slow_done) {
    const Outcome o = Generate(*stub, Request(RandomPrompt(prompts, 10 + prompts() % 30, 4096), 3),
                               std::chrono::seconds(30));
    ++requests;
    if (!o.status.ok() && failed++ == 0) first_error = o.status.error_message();
  }
  slow_reader.join();
  EXPECT_EQ(failed, 0) << "of " << requests << "; first: " << first_error;
  EXPECT_TRUE(slow.status.ok()) << slow.status.error_message();
  EXPECT_EQ(slow.tokens.size(), 60u);
  // About one connection a second over at least five seconds (gRPC jitters the age by 10%).
  EXPECT_GE(counter.connections(), 3) << requests << " requests";

  const std::string http = ReadAddress(http_file);
  ASSERT_FALSE(http.empty());
  const int fd = Connect(http);
  ASSERT_GE(fd, 0);
  const std::string get = "GET /health HTTP/1.1\r\nHost: baton\r\n\r\n";
  const std::string young = HttpExchange(fd, get);
  EXPECT_THAT(young, HasSubstr("200 OK"));
  EXPECT_THAT(young, ::testing::Not(HasSubstr("Connection: close")));
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // past the age, under idle
  const std::string old = HttpExchange(fd, get);
  EXPECT_THAT(old, HasSubstr("200 OK"));
  EXPECT_THAT(old, HasSubstr("Connection: close"));
  char byte;
  EXPECT_EQ(read(fd, &byte, 1), 0) << "the router closes the connection after the response";
  close(fd);
  // The HTTP front calls the client API in-process, past the age too.
  const std::string body = R"({"model":"tiny-text","prompt":"hello there","max_tokens":3})";
  const int post_fd = Connect(http);
  ASSERT_GE(post_fd, 0);
  const std::string completion = HttpExchange(
      post_fd,
      "POST /v1/completions HTTP/1.1\r\nHost: baton\r\nContent-Type: application/json\r\n"
      "Content-Length: " +
          std::to_string(body.size()) + "\r\n\r\n" + body);
  close(post_fd);
  EXPECT_THAT(completion, HasSubstr("200 OK"));
  EXPECT_THAT(completion, HasSubstr("\"completion_tokens\":3"));
}

// Whether this machine has IPv6 loopback (::1).
bool HasIpv6Loopback() {
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_loopback;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return ok;
}

// --host :: serves every port of the router (gRPC, HTTP, metrics) on IPv4 and IPv6 alike.
TEST_F(OperationsTest, HostColonColonServesEveryPortOnIpv4AndIpv6) {
  if (!HasIpv6Loopback()) GTEST_SKIP() << "no IPv6 loopback here";
  const std::string http_file = ProcessTempDir() + "/dual-router.http";
  StartRouter({"--host", "::", "--http-port", "0", "--http-ready-file", http_file}, TextModel());
  ASSERT_FALSE(cluster_->StartDecode("decode").empty());
  ASSERT_FALSE(cluster_->StartPrefill("prefill").empty());
  ASSERT_TRUE(cluster_->WaitForHealth(true));
  auto port_of = [](const std::string& address) { return address.substr(address.rfind(':') + 1); };
  EXPECT_THAT(metrics_, ::testing::StartsWith("[::]:"));
  const std::string http = ReadAddress(http_file);
  EXPECT_THAT(http, ::testing::StartsWith("[::]:"));
  for (const std::string host : {"127.0.0.1", "[::1]"}) {
    EXPECT_THAT(Scrape(host + ":" + port_of(metrics_)), HasSubstr("baton_build_info")) << host;
    auto stub = v1::Generation::NewStub(grpc::CreateChannel(
        host + ":" + port_of(cluster_->Address("router")), grpc::InsecureChannelCredentials()));
    const Outcome o = Generate(*stub, Request({1, 2, 3, 4, 5}, 3), std::chrono::seconds(30));
    EXPECT_TRUE(o.status.ok()) << host << ": " << o.status.error_message();
    EXPECT_EQ(o.tokens.size(), 3u) << host;
  }
  // The HTTP front over IPv6.
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 to{};
  to.sin6_family = AF_INET6;
  to.sin6_addr = in6addr_loopback;
  to.sin6_port = htons(static_cast<uint16_t>(std::stoi(port_of(http))));
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
  timeval timeout{.tv_sec = 30, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  EXPECT_THAT(HttpExchange(fd, "GET /health HTTP/1.1\r\nHost: baton\r\n\r\n"), HasSubstr("200 OK"));
  close(fd);
}

// --node-expiry-ms below three heartbeats plus a resolver timeout is refused at start, naming
// the flag and the bound.
TEST_F(OperationsTest, ANodeExpiryBelowThreeHeartbeatsAndAResolverTimeoutIsRefused) {
  cluster_ = std::make_unique<Cluster>(model_);
  EXPECT_TRUE(
      cluster_->StartRouter({"--heartbeat-ms", "2000", "--node-expiry-ms", "6000"}).empty());
  EXPECT_THAT(cluster_->Log("router"),
              HasSubstr("--node-expiry-ms: 6000 is below 11000 (three --heartbeat-ms of 2000 "
                        "plus a 5000 ms resolver timeout)"));
}

// Every role's binary serves grpc.health.v1 on --health-port, as the chart's pods are started
// (the chart sets the health port for every role, and a probe on it gates each pod): each
// process starts, its health port answers SERVING, and a request is served through them.
TEST_F(OperationsTest, EveryRoleServesItsHealthPort) {
  StartRouter({"--health-port", "0", "--health-ready-file", HealthFile("router")});
  auto health = [&](const std::string& name) {
    return std::vector<std::string>{"--health-port", "0", "--health-ready-file",
                                    HealthFile(name)};
  };
  ASSERT_FALSE(cluster_->StartPrefill("prefill", health("prefill")).empty())
      << cluster_->Log("prefill");
  ASSERT_FALSE(cluster_->StartDecode("decode", health("decode")).empty())
      << cluster_->Log("decode");
  const std::string store = ProcessTempDir() + "/operations_health_store";
  ASSERT_FALSE(cluster_->StartKvstore("kvstore", store, health("kvstore")).empty())
      << cluster_->Log("kvstore");
  for (const std::string name : {"router", "prefill", "decode", "kvstore"}) {
    const std::string address = ReadAddress(HealthFile(name));
    ASSERT_FALSE(address.empty()) << name << ": no health address";
    auto stub = grpc::health::v1::Health::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    EXPECT_TRUE(Eventually(
        [&] {
          grpc::ClientContext context;
          context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
          grpc::health::v1::HealthCheckRequest request;
          grpc::health::v1::HealthCheckResponse response;
          return stub->Check(&context, request, &response).ok() &&
                 response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
        },
        std::chrono::seconds(30)))
        << name << "'s health port " << address << " does not answer SERVING";
  }
  ASSERT_TRUE(cluster_->WaitForHealth(true));
  const Outcome served = Run({1, 2, 3, 4, 5, 6, 7, 8});
  EXPECT_TRUE(served.status.ok()) << served.status.error_message();
  EXPECT_EQ(served.tokens.size(), 4u);
}

// Issue 49 item 1: a prefill or decode node is ready only while a router takes it. Both
// register with a router that refuses them (it serves another model name) and with a second
// address where no router runs yet: they stay NOT_SERVING after the refusal, so a rollout
// would not count them as available. Once a router that accepts them starts on that address
// they turn SERVING, and when it is gone (and the other still refuses) NOT_SERVING again.
TEST_F(OperationsTest, ANodeIsReadyOnlyWhileARouterAcceptsIt) {
  // The refusing router serves a model of another config (fewer positions), so the nodes'
  // config digest differs from its model's.
  ModelConfig config = *model::PresetConfig("tiny");
  config.max_position_embeddings /= 2;
  const std::string other = ProcessTempDir() + "/operations_tiny_other";
  ASSERT_TRUE(model::MakeModel(config, 17, other).ok());
  cluster_ = std::make_unique<Cluster>(model_);
  std::vector<std::string> args = TlsFlags("router");
  const std::string refusing_ready = cluster_->dir() + "/refusing-internal.addr";
  args.insert(args.end(), {"--model", other, "--internal-ready-file", refusing_ready});
  ASSERT_FALSE(cluster_->Start("refusing", BATON_ROUTER_PATH, args).empty())
      << cluster_->Log("refusing");
  const int second = FreePort();
  const std::string routers = ReadAddress(refusing_ready) + ",127.0.0.1:" + std::to_string(second);
  const std::vector<std::string> roles = {"prefill", "decode"};
  for (const std::string& role : roles) {
    const std::vector<std::string> flags = {"--router", routers, "--health-port", "0",
                                            "--health-ready-file", HealthFile("gated-" + role)};
    const std::string address = role == "prefill" ? cluster_->StartPrefill(role, flags)
                                                  : cluster_->StartDecode(role, flags);
    ASSERT_FALSE(address.empty()) << cluster_->Log(role);
  }
  auto status = [&](const std::string& role) {
    auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(
        ReadAddress(HealthFile("gated-" + role)), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    grpc::health::v1::HealthCheckResponse response;
    if (!stub->Check(&context, grpc::health::v1::HealthCheckRequest(), &response).ok()) {
      return grpc::health::v1::HealthCheckResponse::UNKNOWN;
    }
    return response.status();
  };
  for (const std::string& role : roles) {
    ASSERT_TRUE(Eventually(
        [&] { return cluster_->Log(role).find("registration refused") != std::string::npos; },
        std::chrono::seconds(30)))
        << cluster_->Log(role);
    EXPECT_EQ(status(role), grpc::health::v1::HealthCheckResponse::NOT_SERVING) << role;
  }
  ASSERT_FALSE(
      cluster_->StartRouter({"--internal-port", std::to_string(second)}, "accepting").empty());
  for (const std::string& role : roles) {
    EXPECT_TRUE(Eventually(
        [&] { return status(role) == grpc::health::v1::HealthCheckResponse::SERVING; },
        std::chrono::seconds(30)))
        << role << ": " << cluster_->Log(role);
  }
  cluster_->Kill("accepting");
  for (const std::string& role : roles) {
    EXPECT_TRUE(Eventually(
        [&] { return status(role) == grpc::health::v1::HealthCheckResponse::NOT_SERVING; },
        std::chrono::seconds(30)))
        << role;
  }
}

// Issue 49 item 3: when the certificate a process serves with expires, as a metric read from
// its file at each scrape (so a renewal shows at the next scrape, and one that never comes shows
// as the BatonCertificateExpiring alert). The router's
// baton_certificate_expiry_timestamp_seconds{kind="internal"} is its --tls-cert's notAfter; a
// file that no longer parses turns baton_certificate_unreadable to 1 and drops the expiry, and a
// certificate put back restores both.
TEST_F(OperationsTest, TheCertificatesExpiryIsScrapedFromItsFile) {
  const std::string pki = ProcessTempDir() + "/operations_pki_copy";
  std::filesystem::remove_all(pki);
  std::filesystem::create_directories(pki);
  for (const char* name : {"ca.crt", "router.crt", "router.key"}) {
    std::filesystem::copy_file(TestPki() + "/" + name, pki + "/" + name);
  }
  cluster_ = std::make_unique<Cluster>(model_);
  std::vector<std::string> args = TlsFlags("router", pki);
  const std::string metrics_file = cluster_->dir() + "/router.metrics";
  args.insert(args.end(), {"--model", model_, "--internal-ready-file",
                           cluster_->dir() + "/router-internal.addr", "--metrics-port", "0",
                           "--metrics-ready-file", metrics_file});
  ASSERT_FALSE(cluster_->Start("router", BATON_ROUTER_PATH, args).empty())
      << cluster_->Log("router");
  metrics_ = ReadAddress(metrics_file);
  const std::string cert = pki + "/router.crt";
  const absl::StatusOr<int64_t> not_after = CertificateNotAfter(cert);
  ASSERT_TRUE(not_after.ok()) << not_after.status();
  const std::map<std::string, std::string> internal = {{"kind", "internal"}};
  EXPECT_EQ(RouterSample("baton_certificate_expiry_timestamp_seconds", internal),
            static_cast<double>(*not_after));
  EXPECT_EQ(RouterSample("baton_certificate_unreadable", internal), 0);

  std::ifstream in(cert);
  const std::string pem((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(cert, std::ios::trunc) << "not a certificate\n";
  EXPECT_EQ(RouterSample("baton_certificate_unreadable", internal), 1);
  EXPECT_EQ(RouterSample("baton_certificate_expiry_timestamp_seconds", internal), -1);  // absent
  std::ofstream(cert, std::ios::trunc) << pem;
  EXPECT_EQ(RouterSample("baton_certificate_unreadable", internal), 0);
  EXPECT_EQ(RouterSample("baton_certificate_expiry_timestamp_seconds", internal),
            static_cast<double>(*not_after));
}

}  // namespace
}  // namespace baton::testing
