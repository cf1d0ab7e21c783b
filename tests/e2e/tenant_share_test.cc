// Tenant shares against the real binaries (issue 48, item 6): a router with three API-key
// tenants and small pools (16 queue places, 4 decode slots, 8 HTTP threads). Two tenants flood
// it until each has been refused part of its flood; then every request of the third, sent one
// after another, is served, over gRPC and over HTTP. With each tenant's share fixed at half of
// each pool, the two floods held all of it and the third got 429 on 11 of 11 requests.
#include <curl/curl.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "client.h"
#include "cluster.h"
#include "gtest/gtest.h"
#include "testing/eventually.h"
#include "text_model.h"

namespace baton::testing {
namespace {

const char* const kFloods[] = {"flood-a", "flood-b"};
constexpr char kThird[] = "third";
constexpr int kThirdRequests = 3;

std::string KeyOf(const std::string& tenant) {
  return tenant + "-key-0123456789";
}

// POST /v1/completions with `tenant`'s key; the HTTP status (0: no response).
long PostCompletion(const std::string& address, const std::string& tenant, int max_tokens) {
  CURL* curl = curl_easy_init();
  const std::string url = "http://" + address + "/v1/completions";
  const std::string body = "{\"prompt\": \"Hello from " + tenant +
                           "\", \"max_tokens\": " + std::to_string(max_tokens) +
                           ", \"ignore_eos\": true}";
  const std::string auth = "Authorization: Bearer " + KeyOf(tenant);
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  headers = curl_slist_append(headers, auth.c_str());
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, 120L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(
      curl, CURLOPT_WRITEFUNCTION, +[](char*, size_t size, size_t n, void*) { return size * n; });
  long status = 0;
  if (curl_easy_perform(curl) == CURLE_OK) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  return status;
}

class TenantShareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<Cluster>(TextModel());
    const std::string keys = cluster_->dir() + "/api_keys.yaml";
    std::ofstream out(keys);
    for (const std::string tenant : {kFloods[0], kFloods[1], kThird}) {
      out << "\"" << KeyOf(tenant) << "\": " << tenant << "\n";
    }
    out.close();
    const std::string http_ready = cluster_->dir() + "/router-http.addr";
    ASSERT_FALSE(cluster_
                     ->StartRouter({"--api-keys", keys, "--prefill-slots", "1", "--max-queued",
                                    "16", "--http-port", "0", "--http-ready-file", http_ready,
                                    "--http-threads", "8"})
                     .empty());
    ASSERT_FALSE(cluster_->StartDecode("decode", {"--slots", "4"}).empty());
    ASSERT_FALSE(cluster_->StartPrefill("prefill").empty());
    ASSERT_TRUE(cluster_->WaitForHealth(true)) << cluster_->Log("router");
    std::ifstream(http_ready) >> http_;
    ASSERT_FALSE(http_.empty());
  }

  // Each flood tenant sends `per_tenant` requests at once through `send` (kServed, kRefused
  // for its share or a busy server, kFailed otherwise). Once both have been refused and all but
  // `pool` (the most the router can hold at all) have been answered, the floods hold what they
  // can; then the third sends its requests one after another, and each must be served.
  void FloodThenServeTheThird(int per_tenant, int pool,
                              const std::function<int(const std::string&, bool flood)>& send) {
    std::atomic<int> refused[2] = {0, 0};
    std::atomic<int> answered{0};
    std::vector<std::thread> floods;
    for (int t = 0; t < 2; ++t) {
      for (int i = 0; i < per_tenant; ++i) {
        floods.emplace_back([&, t] {
          if (send(kFloods[t], true) == kRefused) ++refused[t];
          ++answered;
        });
      }
    }
    const ::testing::AssertionResult flooded = Eventually(
        [&] { return refused[0] > 0 && refused[1] > 0 && answered >= 2 * per_tenant - pool; },
        std::chrono::seconds(60));
    std::vector<int> third;
    for (int i = 0; i < kThirdRequests; ++i) third.push_back(send(kThird, false));
    for (std::thread& t : floods) t.join();
    ASSERT_TRUE(flooded) << "refused " << refused[0] << " and " << refused[1] << ", answered "
                         << answered;
    EXPECT_EQ(third, std::vector<int>(kThirdRequests, kServed))
        << "the third tenant's outcomes (0 served)";
  }

  static constexpr int kServed = 0, kRefused = 1, kFailed = 2;
  std::unique_ptr<Cluster> cluster_;
  std::string http_;
};

TEST_F(TenantShareTest, TwoFloodingTenantsLeaveTheThirdServedOverGrpc) {
  auto stub = cluster_->Client();
  // The router holds at most 16 requests in its queue and 4 in decode streams.
  FloodThenServeTheThird(20, 16 + 4, [&](const std::string& tenant, bool flood) {
    const Outcome o = Generate(*stub, Request({5, 6, 7, 8, 9, 10, 11, 12}, flood ? 32 : 8),
                               std::chrono::seconds(120), nullptr, KeyOf(tenant));
    if (o.status.ok()) return kServed;
    if (o.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED && flood) return kRefused;
    ADD_FAILURE() << tenant << ": " << o.status.error_message();
    return kFailed;
  });
}

// The floods' requests are long here: each holds its HTTP thread while the third comes.
TEST_F(TenantShareTest, TwoFloodingTenantsLeaveTheThirdServedOverHttp) {
  // The HTTP front holds at most 8 requests (its threads).
  FloodThenServeTheThird(10, 8, [&](const std::string& tenant, bool flood) {
    long status = PostCompletion(http_, tenant, flood ? 256 : 8);
    // A finished request gives its thread back just after its response is sent, so the third's
    // next request, sent back to back, may find it still taken: it is sent again for at most
    // 500 ms, far less than any flood request holds its thread.
    if (!flood && (status == 429 || status == 503)) {
      (void)Eventually(
          [&] {
            status = PostCompletion(http_, tenant, 8);
            return status != 429 && status != 503;
          },
          std::chrono::milliseconds(500), std::chrono::milliseconds(50));
    }
    if (status == 200) return kServed;
    if ((status == 429 || status == 503) && flood) return kRefused;
    ADD_FAILURE() << tenant << ": HTTP " << status;
    return kFailed;
  });
}

}  // namespace
}  // namespace baton::testing
