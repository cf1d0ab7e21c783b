// Cluster DNS as Kubernetes gives it, on one machine: a network namespace whose resolv.conf
// (`ip netns exec` mounts /etc/netns/NS/resolv.conf) sends every lookup to a DNS server the
// test runs on the namespace's loopback, with ndots:5 and three search domains, as a pod's.
// Once the nodes have registered, the server answers every query 5 s late, so one lookup of
// the router's name takes four rounds of 5 s. Heartbeats never wait on it: no node is dropped.
// The router listens on "::" (IPv4 and IPv6) and the test reaches it over IPv4.
// Skipped where network namespaces cannot be made (not root, no iproute2).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "baton/model/model_factory.h"
#include "client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "netns.h"
#include "scrape.h"
#include "test_dir.h"
#include "testing/eventually.h"

namespace baton::testing {
namespace {

using ::testing::Ge;

constexpr char kRouterName[] = "router.baton.test";
constexpr int kRouterInternalPort = 17001;

// A DNS server on 127.0.0.1:53 of a network namespace: A 127.0.0.1 for kRouterName, no
// address (NOERROR, empty) for its AAAA, NXDOMAIN for every other name; each answer `delay`
// late once slow() is set. Each query is answered on a thread of its own, so that late
// answers do not queue.
class StubDns {
 public:
  explicit StubDns(const std::string& netns) {
    std::thread([this, netns] { Serve(netns); }).detach();
  }
  ~StubDns() {
    stop_ = true;
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [this] { return served_ && pending_ == 0; });
  }
  bool WaitReady() {
    return static_cast<bool>(Eventually([this] { return ready_ || failed_; })) && ready_;
  }
  void SetSlow(std::chrono::milliseconds delay) { delay_ms_ = delay.count(); }
  int queries() const { return queries_; }
  int late_answers() const { return late_answers_; }

 private:
  void Serve(const std::string& netns) {
    const int ns = open(("/run/netns/" + netns).c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) {
      failed_ = true;
      Done();
      return;
    }
    close(ns);
    fd_ = socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(53);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval timeout{.tv_sec = 0, .tv_usec = 100000};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    if (bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      failed_ = true;
      Done();
      return;
    }
    ready_ = true;
    while (!stop_) {
      unsigned char query[512];
      sockaddr_in from{};
      socklen_t from_length = sizeof(from);
      const ssize_t n =
          recvfrom(fd_, query, sizeof(query), 0, reinterpret_cast<sockaddr*>(&from), &from_length);
      if (n < 17) continue;  // a timeout, or no question
      ++queries_;
      std::string answer = Answer(query, static_cast<size_t>(n));
      if (answer.empty()) continue;
      const int64_t delay = delay_ms_;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ++pending_;
      }
      std::thread([this, answer, from, delay] {
        if (delay > 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(delay));
          ++late_answers_;
        }
        sendto(fd_, answer.data(), answer.size(), 0, reinterpret_cast<const sockaddr*>(&from),
               sizeof(from));
        std::lock_guard<std::mutex> lock(mutex_);
        --pending_;
        finished_.notify_all();
      }).detach();
    }
    {
      std::unique_lock<std::mutex> lock(mutex_);
      finished_.wait(lock, [this] { return pending_ == 0; });
    }
    Done();
  }
  void Done() {
    if (fd_ >= 0) close(fd_);
    std::lock_guard<std::mutex> lock(mutex_);
    served_ = true;
    finished_.notify_all();
  }
  // The response to one query ("" for one that cannot be parsed).
  static std::string Answer(const unsigned char* query, size_t n) {
    std::string name;
    size_t at = 12;
    while (at < n && query[at] != 0) {
      const size_t length = query[at];
      if (length > 63 || at + 1 + length > n) return "";
      if (!name.empty()) name += '.';
      name.append(reinterpret_cast<const char*>(query + at + 1), length);
      at += 1 + length;
    }
    if (at + 5 > n) return "";
    const int type = (query[at + 1] << 8) | query[at + 2];
    const size_t question_end = at + 5;
    const bool known = name == kRouterName;
    std::string out(reinterpret_cast<const char*>(query), question_end);
    out[2] = static_cast<char>(0x81);                 // a response, recursion desired
    out[3] = static_cast<char>(known ? 0x80 : 0x83);  // recursion available; NXDOMAIN
    out[4] = 0, out[5] = 1;                           // one question
    const bool a_record = known && type == 1;
    out[6] = 0, out[7] = a_record ? 1 : 0;  // answers
    out[8] = out[9] = out[10] = out[11] = 0;
    if (a_record) {
      const unsigned char record[] = {0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4, 127, 0, 0, 1};
      out.append(reinterpret_cast<const char*>(record), sizeof(record));
    }
    return out;
  }

  int fd_ = -1;
  std::atomic<bool> stop_{false}, ready_{false}, failed_{false};
  std::atomic<int64_t> delay_ms_{0};
  std::atomic<int> queries_{0}, late_answers_{0};
  std::mutex mutex_;
  std::condition_variable finished_;
  int pending_ = 0;
  bool served_ = false;
};

class ResolverTest : public ::testing::Test {
 protected:
  // The process joins the "client" member before anything starts gRPC's threads.
  static void SetUpTestSuite() {
    if (!Netns::Available(&unavailable_)) return;
    net_ = new Netns("rs" + std::to_string(getpid() % 100000));
    for (const char* m : {"client", "cluster"}) {
      ASSERT_TRUE(net_->Add(m)) << "cannot make network namespace member " << m;
    }
    ASSERT_TRUE(net_->Join("client"));
    resolv_dir_ = "/etc/netns/" + net_->Ns("cluster");
    std::filesystem::create_directories(resolv_dir_);
    std::ofstream(resolv_dir_ + "/resolv.conf") << "nameserver 127.0.0.1\n"
                                                << "search a.baton.test b.baton.test c.baton.test\n"
                                                << "options ndots:5 timeout:10 attempts:1\n";
    model_ = ProcessTempDir() + "/resolver_tiny";
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("tiny"), 19, model_).ok());
  }
  static void TearDownTestSuite() {
    if (!resolv_dir_.empty()) std::filesystem::remove_all(resolv_dir_);
    delete net_;
    net_ = nullptr;
  }
  void SetUp() override {
    if (net_ == nullptr) GTEST_SKIP() << unavailable_;
  }

  static inline Netns* net_ = nullptr;
  static inline std::string unavailable_, resolv_dir_, model_;
};

TEST_F(ResolverTest, ASlowResolverDropsNoNode) {
  StubDns dns(net_->Ns("cluster"));
  ASSERT_TRUE(dns.WaitReady()) << "cannot serve DNS in the namespace";
  Cluster cluster(model_);
  for (const char* name : {"router", "prefill", "decode"}) {
    cluster.WrapIn(name, net_->Exec("cluster"));
  }
  const std::string metrics_file = cluster.dir() + "/router.metrics";
  // The shortest expiry the router takes at 200 ms heartbeats: three plus 5 s.
  ASSERT_FALSE(
      cluster
          .StartRouter({"--host", "::", "--internal-port", std::to_string(kRouterInternalPort),
                        "--heartbeat-ms", "200", "--node-expiry-ms", "5600", "--metrics-port", "0",
                        "--metrics-ready-file", metrics_file})
          .empty());
  // The router's ready files name "[::]:port"; the test reaches it at its IPv4 address.
  auto port_of = [](const std::string& address) { return address.substr(address.rfind(':') + 1); };
  std::string metrics_address;
  std::ifstream(metrics_file) >> metrics_address;
  ASSERT_THAT(metrics_address, ::testing::StartsWith("[::]:"));
  const std::string ip = net_->Address("cluster");
  const std::string metrics = ip + ":" + port_of(metrics_address);
  const std::string router = ip + ":" + port_of(cluster.Address("router"));
  const std::string by_name = std::string(kRouterName) + ":" + std::to_string(kRouterInternalPort);
  for (const auto& [node, program] :
       {std::pair{"prefill", BATON_PREFILL_PATH}, std::pair{"decode", BATON_DECODE_PATH}}) {
    std::vector<std::string> args = TlsFlags(node);
    args.insert(args.end(), {"--model", model_, "--node-id", node, "--router", by_name,
                             "--router-resolve-ms", "500"});
    ASSERT_FALSE(cluster.Start(node, program, args).empty()) << node;
  }
  auto live = [&](const char* role) {
    return Sample(Scrape(metrics), "baton_nodes", {{"role", role}}).value_or(-1);
  };
  ASSERT_TRUE(EventuallyThat([&] { return live("prefill") + live("decode"); }, 2.0,
                             std::chrono::seconds(30)));
  const int fast_queries = dns.queries();
  EXPECT_GT(fast_queries, 0);
  // From now on every lookup takes 4 x 5 s (three search domains, then the name).
  dns.SetSlow(std::chrono::seconds(5));
  auto stub =
      v1::Generation::NewStub(grpc::CreateChannel(router, grpc::InsecureChannelCredentials()));
  int checks = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(14);
  while (std::chrono::steady_clock::now() < until) {
    ASSERT_EQ(live("prefill"), 1) << "after " << checks << " checks";
    ASSERT_EQ(live("decode"), 1) << "after " << checks << " checks";
    ++checks;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  // The slow path was taken: the nodes looked the name up again and got late answers.
  EXPECT_GT(dns.late_answers(), 0);
  EXPECT_GT(dns.queries(), fast_queries);
  const Outcome outcome = Generate(*stub, Request({1, 2, 3, 4, 5, 6}, 4), std::chrono::seconds(30));
  EXPECT_TRUE(outcome.status.ok()) << outcome.status.error_message();
  EXPECT_EQ(outcome.tokens.size(), 4u);
}

}  // namespace
}  // namespace baton::testing
