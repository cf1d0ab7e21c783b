// The router's HTTP front under abuse, before any API key is checked, against the real
// baton-router binary over raw sockets (what an attacker sends, byte for byte): bodies over the
// limit however they are framed or encoded, heads without an end, a huge token array, slow
// clients by the hundred, connection floods from one address and requests that never finish.
// Each case checks the answer and the router's peak memory (VmHWM, reset before the case with
// /proc/<pid>/clear_refs) against a stated bound, and that the router answers /health after.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "baton/model/model_factory.h"
#include "cluster.h"
#include "text_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_dir.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using testing::Cluster;
using testing::TextModel;
using ::testing::HasSubstr;
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
    std::vector<std::string> flags = {"--http-port", "0", "--http-ready-file", ready,
                                      "--http-request-timeout-ms", "3000"};
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
    std::cout << ::testing::UnitTest::GetInstance()->current_test_info()->name()
              << ": status " << abuse.status << ", router peak RSS +" << abuse.peak_mib
              << " MiB over " << before / 1024 << " MiB" << std::endl;
    return abuse;
  }

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
    c.Send(std::string(kPost) + "Content-Type: application/json\r\n"
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
