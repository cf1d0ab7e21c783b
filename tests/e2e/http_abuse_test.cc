// The router's HTTP front under abuse, before any API key is checked, against the real
// baton-router binary over raw sockets (what an attacker sends, byte for byte): bodies over the
// limit however they are framed or encoded, heads without an end, a huge token array, slow
// clients by the hundred, connection floods from one address and requests that never finish.
// Each case checks the answer and the router's peak memory (VmHWM, reset before the case with
// /proc/<pid>/clear_refs) against a stated bound, and that the router answers /health after.
// Then what must hold with API keys and many source addresses (127.0.0.x stand in for many
// clients): bodies declared without a key reserve nothing, idle connections from 17 addresses
// leave a known client served (HTTP and /metrics), one prefix's addresses share its cap and
// connections without a head go at the head deadline, a client that leaves frees its share,
// /metrics does not name tenants, and a chat without max_tokens is served.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "baton/model/model_factory.h"
#include "cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_dir.h"
#include "testing/eventually.h"
#include "text_model.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using testing::Cluster;
using testing::Eventually;
using testing::EventuallyThat;
using ::testing::HasSubstr;
using testing::TextModel;
using Clock = std::chrono::steady_clock;

// A TCP connection from `source` (a loopback address) to the router's HTTP port.
class Connection {
 public:
  Connection(int port, const std::string& source = "127.0.0.1") {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in from{};
    from.sin_family = AF_INET;
    inet_pton(AF_INET, source.c_str(), &from.sin_addr);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0) Close();
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    if (fd_ >= 0 && connect(fd_, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) Close();
  }
  ~Connection() { Close(); }
  bool ok() const { return fd_ >= 0; }
  // Sends all of `data` (false once the peer stopped taking it).
  bool Send(std::string_view data) {
    while (!data.empty() && fd_ >= 0) {
      const ssize_t n = send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return fd_ >= 0;
  }
  // What arrives until the peer closes or `timeout` passes.
  std::string Receive(std::chrono::milliseconds timeout) {
    std::string out;
    const Clock::time_point until = Clock::now() + timeout;
    char buffer[65536];
    while (fd_ >= 0 && Clock::now() < until) {
      pollfd p{fd_, POLLIN, 0};
      const int left = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count());
      if (poll(&p, 1, std::max(left, 1)) <= 0) break;
      const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
      if (n <= 0) break;
      out.append(buffer, static_cast<size_t>(n));
    }
    return out;
  }
  // True once the peer has closed (a read returns 0 or an error) within `timeout`.
  bool ClosedWithin(std::chrono::milliseconds timeout) {
    const Clock::time_point until = Clock::now() + timeout;
    char buffer[4096];
    while (Clock::now() < until) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) > 0) {
        const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
        if (n <= 0) return true;
      }
    }
    return false;
  }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// The status code of a raw HTTP response ("HTTP/1.1 413 ..."), 0 without one.
int StatusOf(const std::string& response) {
  if (response.rfind("HTTP/1.", 0) != 0 || response.size() < 12) return 0;
  return std::atoi(response.c_str() + 9);
}

class HttpAbuseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<Cluster>(TextModel());
    const std::string ready = cluster_->dir() + "/router-http.addr";
    std::vector<std::string> flags = {"--http-port",
                                      "0",
                                      "--http-ready-file",
                                      ready,
                                      "--http-request-timeout-ms",
                                      request_timeout_ms_,
                                      "--metrics-ready-file",
                                      cluster_->dir() + "/router.metrics"};
    flags.insert(flags.end(), extra_flags_.begin(), extra_flags_.end());
    ASSERT_FALSE(cluster_->StartRouter(flags).empty());
    std::string address;
    std::ifstream(ready) >> address;
    ASSERT_FALSE(address.empty());
    port_ = std::stoi(address.substr(address.rfind(':') + 1));
    pid_ = cluster_->Pid("router");
  }
  // Peak resident memory of the router (VmHWM), in KiB, since the last ResetPeak.
  int64_t PeakKib() const {
    std::ifstream status("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
    }
    return -1;
  }
  int64_t CurrentKib() const {
    std::ifstream status("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
    }
    return -1;
  }
  void ResetPeak() const { std::ofstream("/proc/" + std::to_string(pid_) + "/clear_refs") << "5"; }
  // /health answered (503: the router has no nodes, which is the answer here) within 1 s.
  bool HealthAnswers() {
    Connection c(port_);
    if (!c.Send("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")) return false;
    const int status = StatusOf(c.Receive(std::chrono::milliseconds(1000)));
    return status == 503 || status == 200;
  }
  // One abusive request's answer; the router's peak memory over its own baseline, in MiB.
  struct Abuse {
    int status = 0;
    std::string response;
    double peak_mib = 0;
  };
  Abuse Run(const std::function<std::string(Connection&)>& attack) {
    ResetPeak();
    const int64_t before = CurrentKib();
    Connection c(port_);
    EXPECT_TRUE(c.ok());
    Abuse abuse;
    abuse.response = attack(c);
    abuse.status = StatusOf(abuse.response);
    abuse.peak_mib = static_cast<double>(PeakKib() - before) / 1024;
    // The figure the closing note quotes (the bound is what the case asserts).
    std::cout << ::testing::UnitTest::GetInstance()->current_test_info()->name() << ": status "
              << abuse.status << ", router peak RSS +" << abuse.peak_mib << " MiB over "
              << before / 1024 << " MiB" << std::endl;
    return abuse;
  }

  // A prefill and a decode node (with `decode_flags`), once the router serves with them.
  void StartNodes(std::vector<std::string> decode_flags = {}) {
    ASSERT_FALSE(cluster_->StartDecode("decode", std::move(decode_flags)).empty());
    ASSERT_FALSE(cluster_->StartPrefill("prefill").empty());
    ASSERT_TRUE(cluster_->WaitForHealth(true));
  }
  int MetricsPort() const {
    std::string address;
    std::ifstream(cluster_->dir() + "/router.metrics") >> address;
    return address.empty() ? 0 : std::stoi(address.substr(address.rfind(':') + 1));
  }
  // The router's CPU time so far (user and system), in seconds.
  double CpuSeconds() const {
    std::ifstream stat("/proc/" + std::to_string(pid_) + "/stat");
    const std::string line(std::istreambuf_iterator<char>(stat), {});
    std::istringstream fields(line.substr(line.rfind(')') + 2));
    std::string field;
    double ticks = 0;
    for (int i = 3; i <= 15 && fields >> field; ++i) {
      if (i == 14 || i == 15) ticks += std::stod(field);  // utime, stime
    }
    return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  // One request on a connection of its own from `source` to `port`; what came back before the
  // server closed it (or `timeout` passed).
  static std::string Exchange(int port, const std::string& source, const std::string& request,
                              std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    Connection c(port, source);
    if (!c.Send(request)) return "";
    return c.Receive(timeout);
  }
  static std::string Get(const std::string& path, const std::string& key = "") {
    return "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" +
           (key.empty() ? "" : "Authorization: Bearer " + key + "\r\n") + "\r\n";
  }
  static std::string Post(const std::string& path, const std::string& body,
                          const std::string& key = "") {
    return "POST " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" +
           (key.empty() ? "" : "Authorization: Bearer " + key + "\r\n") +
           "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\n\r\n" + body;
  }

  std::string request_timeout_ms_ = "3000";
  std::vector<std::string> extra_flags_;
  std::unique_ptr<Cluster> cluster_;
  int port_ = 0;
  pid_t pid_ = -1;
};

constexpr const char* kPost = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
// Bound on what one refused request may cost the router (its 8 MiB body limit, and the
// buffers of one connection, are far below it; the old front took 268 MB for one of these).
constexpr double kPeakBoundMib = 48;

TEST_F(HttpAbuseTest, AChunkedBodyOverTheLimitIsRefusedBeforeItIsReadWhole) {
  const Abuse abuse = Run([](Connection& c) {
    c.Send(std::string(kPost) +
           "Content-Type: application/json\r\n"
           "Transfer-Encoding: chunked\r\n\r\n");
    const std::string chunk(1 << 20, ' ');
    char size[32];
    std::snprintf(size, sizeof(size), "%zx\r\n", chunk.size());
    // 24 MiB offered; the server stops taking them past 8 MiB.
    for (int i = 0; i < 24; ++i) {
      if (!c.Send(std::string(size) + chunk + "\r\n")) break;
    }
    return c.Receive(std::chrono::milliseconds(5000));
  });
  EXPECT_EQ(abuse.status, 413) << abuse.response.substr(0, 300);
  EXPECT_THAT(abuse.response, HasSubstr("body: more than 8388608 bytes"));
  EXPECT_LT(abuse.peak_mib, kPeakBoundMib);
  EXPECT_TRUE(HealthAnswers());
}

TEST_F(HttpAbuseTest, AContentLengthOverTheLimitIsRefusedWithoutReadingTheBody) {
  const Abuse abuse = Run([](Connection& c) {
    c.Send(std::string(kPost) + "Content-Length: 25165824\r\n\r\n");
    return c.Receive(std::chrono::milliseconds(3000));
  });
  EXPECT_EQ(abuse.status, 413);
  EXPECT_THAT(abuse.response, HasSubstr("body: 25165824 bytes; at most 8388608"));
}

TEST_F(HttpAbuseTest, EncodedBodiesAreRefusedSoNothingIsEverDecompressed) {
  for (const char* encoding : {"gzip", "br", "deflate"}) {
    const Abuse abuse = Run([encoding](Connection& c) {
      // A gzip bomb's worth of bytes would follow; the head alone is refused.
      c.Send(std::string(kPost) + "Content-Encoding: " + encoding +
             "\r\nContent-Length: 261000\r\n\r\n" + std::string(261000, '\x1f'));
      return c.Receive(std::chrono::milliseconds(3000));
    });
    EXPECT_EQ(abuse.status, 415) << encoding;
    EXPECT_THAT(abuse.response, HasSubstr("Content-Encoding"));
    EXPECT_LT(abuse.peak_mib, kPeakBoundMib);
  }
  EXPECT_TRUE(HealthAnswers());
}

TEST_F(HttpAbuseTest, AHeaderLineWithoutAnEndIsRefusedAtTheHeadLimit) {
  const Abuse abuse = Run([](Connection& c) {
    c.Send(std::string(kPost) + "X-Long: ");
    const std::string piece(1 << 20, 'a');
    for (int i = 0; i < 64; ++i) {  // 64 MiB offered, never a CRLF
      if (!c.Send(piece)) break;
    }
    return c.Receive(std::chrono::milliseconds(3000));
  });
  EXPECT_EQ(abuse.status, 431) << abuse.response.substr(0, 200);
  EXPECT_LT(abuse.peak_mib, kPeakBoundMib);
  EXPECT_TRUE(HealthAnswers());
}

TEST_F(HttpAbuseTest, AnEightMebibyteTokenArrayIsRefusedWhileParsing) {
  std::string body = "{\"prompt\": [0";
  while (body.size() < (size_t{8} << 20) - 64) body += ",0";  // the whole body just under 8 MiB
  body += "], \"max_tokens\": 1}";
  const Abuse abuse = Run([&](Connection& c) {
    c.Send(std::string(kPost) + "Content-Type: application/json\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body);
    return c.Receive(std::chrono::milliseconds(10000));
  });
  EXPECT_EQ(abuse.status, 400) << abuse.response.substr(0, 300);
  EXPECT_THAT(abuse.response, HasSubstr("\"param\":\"prompt\""));
  EXPECT_THAT(abuse.response, HasSubstr("more than"));
  // The body itself (8 MiB), and nothing like a tree of its four million values.
  EXPECT_LT(abuse.peak_mib, kPeakBoundMib);
}

TEST_F(HttpAbuseTest, SixHundredSlowClientsDoNotKeepHealthFromAnswering) {
  // 600 clients from ten addresses (the per-client bound is 256), each sending its head one
  // byte at a time; /health from a client of its own is answered meanwhile.
  std::vector<std::unique_ptr<Connection>> slow;
  for (int i = 0; i < 600; ++i) {
    slow.push_back(std::make_unique<Connection>(port_, "127.0.0." + std::to_string(2 + i % 10)));
    ASSERT_TRUE(slow.back()->ok()) << i;
  }
  const std::string head = "GET /health HTTP/1.1\r\nHost: x\r\n";
  for (size_t byte = 0; byte < 3; ++byte) {
    for (auto& c : slow) c->Send(head.substr(byte, 1));
    EXPECT_TRUE(HealthAnswers()) << "after byte " << byte;
  }
  // The slow ones are cut off at the whole-request deadline (3 s here), not left open.
  int closed = 0;
  const Clock::time_point until = Clock::now() + std::chrono::seconds(15);
  for (auto& c : slow) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    closed += c->ClosedWithin(std::max(left, std::chrono::milliseconds(1)));
  }
  EXPECT_EQ(closed, 600);
  EXPECT_TRUE(HealthAnswers());
}

TEST_F(HttpAbuseTest, OneClientAddressGetsAtMostItsShareOfConnections) {
  std::vector<std::unique_ptr<Connection>> flood;
  for (int i = 0; i < 300; ++i) {
    flood.push_back(std::make_unique<Connection>(port_, "127.0.0.9"));
  }
  // Past 256 from one address, connections are closed as they are accepted.
  int refused = 0;
  for (size_t i = 0; i < flood.size(); ++i) {
    if (i >= 256) refused += flood[i]->ClosedWithin(std::chrono::milliseconds(2000));
  }
  EXPECT_EQ(refused, 300 - 256);
  // Another address is served meanwhile.
  EXPECT_TRUE(HealthAnswers());
}

}  // namespace
}  // namespace baton

namespace baton {
namespace {

// Three tenants' keys, in a file of the test process's.
constexpr const char* kAlpha = "abuse-test-key-alpha-0123456789";
const std::string& KeysFile() {
  static const std::string path = [] {
    const std::string p = baton::testing::ProcessTempDir() + "/abuse-keys.yaml";
    std::ofstream(p) << "\"" << kAlpha << "\": team-alpha\n"
                     << "\"abuse-test-key-bravo-0123456789\": team-bravo\n"
                     << "\"abuse-test-key-charlie-012345678\": team-charlie\n";
    return p;
  }();
  return path;
}
const std::string kSmall = R"({"prompt": "Hello", "max_tokens": 2})";

class HttpKeyedAbuseTest : public HttpAbuseTest {
 protected:
  HttpKeyedAbuseTest() { extra_flags_ = {"--api-keys", KeysFile()}; }
};

TEST_F(HttpKeyedAbuseTest, BodiesDeclaredWithoutAKeyReserveNothingSoKeyedRequestsAreServed) {
  StartNodes();
  ResetPeak();
  const int64_t before_kib = CurrentKib();
  const double before_cpu = CpuSeconds();
  // 32 connections declare 8 MiB bodies without a key and send none: 256 MiB, the whole body
  // budget of a front that reserved declared lengths before checking the key.
  std::vector<std::unique_ptr<Connection>> attack;
  for (int i = 0; i < 32; ++i) {
    attack.push_back(std::make_unique<Connection>(port_, "127.0.0." + std::to_string(2 + i % 16)));
    ASSERT_TRUE(attack.back()->Send(std::string(kPost) + "Content-Type: application/json\r\n"
                                                         "Content-Length: 8388608\r\n\r\n"));
  }
  // Seven keyed requests at once, well within the attack's 3 s request deadline.
  std::vector<std::string> served(7);
  std::vector<std::thread> threads;
  for (std::string& response : served) {
    threads.emplace_back(
        [&] { response = Exchange(port_, "127.0.0.1", Post("/v1/completions", kSmall, kAlpha)); });
  }
  for (std::thread& t : threads) t.join();
  for (const std::string& response : served) {
    EXPECT_EQ(StatusOf(response), 200) << response.substr(0, 300);
  }
  // Each attacker was refused at its head.
  for (auto& c : attack) EXPECT_EQ(StatusOf(c->Receive(std::chrono::milliseconds(3000))), 401);
  std::cout << "body-budget attack without a key: router peak RSS +"
            << static_cast<double>(PeakKib() - before_kib) / 1024 << " MiB over "
            << before_kib / 1024 << " MiB, CPU " << CpuSeconds() - before_cpu << " s" << std::endl;
}

// A router whose tenants may each have one HTTP request in flight.
class HttpOneRequestPerTenantTest : public HttpAbuseTest {
 protected:
  HttpOneRequestPerTenantTest() {
    extra_flags_ = {"--api-keys", KeysFile(), "--http-max-requests-per-tenant", "1"};
  }
};

TEST_F(HttpOneRequestPerTenantTest, AClientThatLeavesFreesItsShareAndMetricsDoNotNameItsTenant) {
  StartNodes({"--inject-step-stall-ms", "50"});  // 400 tokens: 20 s
  Connection leaver(port_);
  ASSERT_TRUE(leaver.Send(Post(
      "/v1/completions", R"({"prompt": "Hello", "max_tokens": 400, "ignore_eos": true})", kAlpha)));
  // Once it is in flight /metrics counts the tenant's stream under a digest of its name, never
  // the name.
  std::string page;
  ASSERT_TRUE(Eventually(
      [&] {
        page = Exchange(MetricsPort(), "127.0.0.1", Get("/metrics"));
        return page.find("baton_router_tenant_streams{tenant=\"t-") != std::string::npos;
      },
      std::chrono::seconds(10), std::chrono::milliseconds(100)))
      << "the long request got: " << leaver.Receive(std::chrono::milliseconds(100)).substr(0, 400);
  EXPECT_EQ(page.find("team-alpha"), std::string::npos);
  // It holds its tenant's one request: another of the tenant's gets 429.
  EXPECT_EQ(StatusOf(Exchange(port_, "127.0.0.1", Post("/v1/completions", kSmall, kAlpha))), 429);
  // The client goes: its call is cancelled and the share freed long before its 400 tokens
  // would have been generated.
  leaver.Close();
  EXPECT_TRUE(Eventually(
      [&] {
        return StatusOf(Exchange(port_, "127.0.0.1", Post("/v1/completions", kSmall, kAlpha))) ==
               200;
      },
      std::chrono::seconds(8), std::chrono::milliseconds(100)));
  // The router counts the call as cancelled, not as finished.
  page = Exchange(MetricsPort(), "127.0.0.1", Get("/metrics"));
  const size_t cancelled = page.find("baton_requests_total{outcome=\"cancelled\"} ");
  ASSERT_NE(cancelled, std::string::npos) << page;
  EXPECT_GE(std::atof(page.c_str() + page.find(' ', cancelled) + 1), 1.0);
}

// A 64-token context, so that defaults of max_tokens that ignored the prompt would be refused.
class HttpShortContextTest : public HttpAbuseTest {
 protected:
  HttpShortContextTest() { extra_flags_ = {"--max-model-len", "64"}; }
};

TEST_F(HttpShortContextTest, WithoutMaxTokensChatsAndCompletionsGetTheRoomThePromptLeaves) {
  StartNodes();
  const std::string chat = Exchange(
      port_, "127.0.0.1",
      Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "Hello"}]})"),
      std::chrono::seconds(60));
  EXPECT_EQ(StatusOf(chat), 200) << chat.substr(0, 400);
  // 58 prompt tokens leave 6, fewer than OpenAI's default of 16.
  std::string prompt = "[100";
  for (int i = 1; i < 58; ++i) prompt += "," + std::to_string(100 + i);
  const std::string completion =
      Exchange(port_, "127.0.0.1",
               Post("/v1/completions", R"({"prompt": )" + prompt + R"(], "ignore_eos": true})"));
  EXPECT_EQ(StatusOf(completion), 200) << completion.substr(0, 400);
  EXPECT_THAT(completion, HasSubstr("\"completion_tokens\":6"));
}

// Small caps, so that 17 addresses fill the slots open to unknown clients; heads may take 30 s
// here, so that it is the reserved slots, not the head deadline, that keep a known client in.
class HttpCappedAbuseTest : public HttpAbuseTest {
 protected:
  HttpCappedAbuseTest() {
    extra_flags_ = {"--api-keys",
                    KeysFile(),
                    "--http-max-connections",
                    "128",
                    "--http-max-connections-per-client",
                    "8",
                    "--http-head-timeout-ms",
                    "30000"};
    request_timeout_ms_ = "30000";
  }
};

TEST_F(HttpCappedAbuseTest, IdleConnectionsFromSeventeenAddressesLeaveAKnownClientServed) {
  const int metrics = MetricsPort();
  ASSERT_NE(metrics, 0);
  // 127.0.0.1 becomes known: a keyed request, and a scrape.
  ASSERT_EQ(StatusOf(Exchange(port_, "127.0.0.1", Get("/v1/models", kAlpha))), 200);
  ASSERT_EQ(StatusOf(Exchange(metrics, "127.0.0.1", Get("/metrics"))), 200);
  // 17 addresses, 8 idle connections each (the per-client cap of both servers) to the HTTP
  // front and to /metrics: 136 each, more than the 112 and 48 slots open to unknown clients.
  std::vector<std::unique_ptr<Connection>> idle;
  for (int i = 0; i < 17 * 8; ++i) {
    const std::string source = "127.0.0." + std::to_string(2 + i % 17);
    idle.push_back(std::make_unique<Connection>(port_, source));
    idle.push_back(std::make_unique<Connection>(metrics, source));
    ASSERT_TRUE(idle[idle.size() - 2]->ok() && idle.back()->ok()) << i;
  }
  // An unknown address finds the front full.
  Connection stranger(port_, "127.0.0.99");
  EXPECT_TRUE(stranger.ClosedWithin(std::chrono::milliseconds(2000)));
  // The known client is served: /health (503: no nodes), the API and /metrics.
  EXPECT_EQ(StatusOf(Exchange(port_, "127.0.0.1", Get("/health"), std::chrono::seconds(5))), 503);
  EXPECT_EQ(StatusOf(Exchange(port_, "127.0.0.1", Get("/v1/models", kAlpha))), 200);
  EXPECT_EQ(StatusOf(Exchange(metrics, "127.0.0.1", Get("/metrics"))), 200);
}

// Issue 49 item 7: behind an Ingress or Gateway every client has the proxy's address. With the
// proxy's network in --http-trusted-proxies its connections are held to the total alone: 12
// kept-alive connections from the proxy (127.0.0.9) are all served, while 12 from another
// single address (127.0.0.10) get their 4 and no more. X-Forwarded-For from a peer that is not
// a trusted proxy gains it nothing: 127.0.0.10's extra connections claiming other clients are
// closed as well.
class HttpTrustedProxyTest : public HttpAbuseTest {
 protected:
  HttpTrustedProxyTest() {
    extra_flags_ = {"--api-keys", KeysFile(), "--http-max-connections-per-client", "4",
                    "--http-trusted-proxies", "127.0.0.9/32", "--http-head-timeout-ms", "30000"};
    request_timeout_ms_ = "30000";
  }
};

TEST_F(HttpTrustedProxyTest, AProxysConnectionsAreNotHeldToOneClientsShare) {
  for (const std::string source : {"127.0.0.9", "127.0.0.10"}) {
    std::vector<std::unique_ptr<Connection>> connections;
    for (int i = 0; i < 12; ++i) {
      connections.push_back(std::make_unique<Connection>(port_, source));
      ASSERT_TRUE(connections.back()->ok()) << source << " " << i;
    }
    int served = 0;
    for (size_t i = 0; i < connections.size(); ++i) {
      const std::string request = "GET /health HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 203.0.113." +
                                  std::to_string(i) + "\r\n\r\n";
      if (connections[i]->Send(request) &&
          StatusOf(connections[i]->Receive(std::chrono::milliseconds(500))) != 0) {
        ++served;
      }
    }
    EXPECT_EQ(served, source == std::string("127.0.0.9") ? 12 : 4) << source;
  }
}

// Behind the proxy, request body memory is each X-Forwarded-For client's (32 MiB each by
// default). One client (203.0.113.1) holding unfinished 8 MiB bodies on eight connections fills
// its share (the holders past it are refused), so that client's next such body is refused too
// (sent with another tenant's key, whose own share is empty), while another client
// (203.0.113.2) through the same proxy, same key, has its body read: a body that is not JSON
// gets the handler's 400, not the body-memory 503.
TEST_F(HttpTrustedProxyTest, BehindTheProxyEachForwardedClientHasItsOwnBodyMemory) {
  const std::string body_refusal = "the server holds as many request bodies as it takes";
  const std::string bravo = "abuse-test-key-bravo-0123456789";
  auto head = [](const std::string& client, const std::string& key, size_t length) {
    return std::string(kPost) + "Authorization: Bearer " + key + "\r\nX-Forwarded-For: " +
           client + "\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(length) + "\r\n\r\n";
  };
  const size_t big = size_t{8} << 20;
  std::vector<std::unique_ptr<Connection>> holding;
  for (int i = 0; i < 8; ++i) {
    holding.push_back(std::make_unique<Connection>(port_, "127.0.0.9"));
    ASSERT_TRUE(holding.back()->ok());
    holding.back()->Send(head("203.0.113.1", kAlpha, big) + std::string(big - 1, ' '));
  }
  // A body as large as the holders' (not JSON): its memory grows the way theirs did, so it
  // fits exactly where another holder would have.
  auto answer = [&](const std::string& client) {
    const std::string body(big - 1, 'x');
    Connection c(port_, "127.0.0.9");
    c.Send(head(client, bravo, body.size()) + body);
    return c.Receive(std::chrono::milliseconds(1000));
  };
  // Once the router has read what the holders sent, 203.0.113.1's share is full.
  EXPECT_TRUE(EventuallyThat([&] { return answer("203.0.113.1"); }, HasSubstr(body_refusal),
                             std::chrono::seconds(20), std::chrono::milliseconds(10)));
  const std::string other = answer("203.0.113.2");
  EXPECT_EQ(StatusOf(other), 400) << other;
  EXPECT_THAT(other, ::testing::Not(HasSubstr(body_refusal)));
}

// IPv4 clients counted per /24, 8 connections each; the 2 s head deadline applies (heads and
// bodies may otherwise take 30 s).
class HttpPrefixAbuseTest : public HttpAbuseTest {
 protected:
  HttpPrefixAbuseTest() {
    extra_flags_ = {"--http-ipv4-prefix", "24", "--http-max-connections-per-client", "8"};
    request_timeout_ms_ = "30000";
  }
};

TEST_F(HttpPrefixAbuseTest, OnePrefixSharesItsCapAndConnectionsWithoutAHeadGoAtTheHeadDeadline) {
  // 34 connections from 17 addresses of 127.0.0.0/24, each with half a head.
  std::vector<std::unique_ptr<Connection>> flood;
  for (int i = 0; i < 34; ++i) {
    flood.push_back(std::make_unique<Connection>(port_, "127.0.0." + std::to_string(2 + i % 17)));
    flood.back()->Send("GET /health HTTP/1.1\r\n");
  }
  // Another address of the /24 is refused; one of another /24 is served.
  Connection same_prefix(port_, "127.0.0.200");
  EXPECT_TRUE(same_prefix.ClosedWithin(std::chrono::milliseconds(1000)));
  EXPECT_EQ(StatusOf(Exchange(port_, "127.1.0.1", Get("/health"), std::chrono::seconds(5))), 503);
  // Every headless connection is closed by the head deadline, long before the 30 s one.
  int closed = 0;
  const Clock::time_point until = Clock::now() + std::chrono::seconds(10);
  for (auto& c : flood) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    closed += c->ClosedWithin(std::max(left, std::chrono::milliseconds(1)));
  }
  EXPECT_EQ(closed, 34);
}

}  // namespace
}  // namespace baton
