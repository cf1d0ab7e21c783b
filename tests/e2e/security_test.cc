// Security end to end, against the real binaries on loopback (issue: nobody gets in, and no
// wire input can corrupt a node): every internal port refuses plaintext clients, clients
// without a certificate and clients of another CA; a certificate's role decides what it may
// call (a prefill certificate cannot register as decode, call Prefill or Stream, and only the
// prefill identity a reservation names may fill it); the client port never serves Registry;
// API keys authenticate clients and their tenants never share prefix-cache entries.
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <tuple>

#include "baton/common/hash.h"
#include "baton/common/pki.h"
#include "baton/model/ced_model.h"
#include "baton/model/model_factory.h"
#include "client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_dir.h"

namespace baton::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kKeyA[] = "key-of-tenant-a-0123456789";
constexpr char kKeyB[] = "key-of-tenant-b-0123456789";

grpc::Status HealthCheck(const std::string& address,
                         const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(address, credentials));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckResponse response;
  return stub->Check(&context, grpc::health::v1::HealthCheckRequest(), &response);
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = ProcessTempDir() + "/security_tiny";
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("tiny"), 21, model_).ok());
    // Another CA with the same role names, and a second prefill identity of this CA.
    other_ca_ = ProcessTempDir() + "/other_pki";
    ASSERT_TRUE(pki::EnsureLocalPki(other_ca_, pki::LocalRoles()).ok());
    ASSERT_TRUE(pki::IssueCertificate(TestPki(), "prefill-b", "spiffe://baton/prefill/b").ok());
    keys_ = ProcessTempDir() + "/api_keys.yaml";
    std::ofstream(keys_) << "\"" << kKeyA << "\": tenant-a\n\"" << kKeyB << "\": tenant-b\n";
  }
  void StartCluster(std::vector<std::string> router_flags = {}) {
    cluster_ = std::make_unique<Cluster>(model_);
    router_flags.push_back("--require-kvstore");
    router_ = cluster_->StartRouter(router_flags);
    ASSERT_FALSE(router_.empty()) << cluster_->Log("router");
    ASSERT_FALSE(cluster_->StartKvstore("kvstore", cluster_->dir() + "/store").empty());
    ASSERT_FALSE(cluster_->StartDecode("decode").empty());
    ASSERT_FALSE(
        cluster_->StartPrefill("prefill", {"--kvstore", cluster_->Address("kvstore")}).empty());
    ASSERT_TRUE(cluster_->WaitForHealth(true)) << cluster_->Log("router");
  }
  // A reservation request as the router sends it, naming the cluster's prefill identity.
  v1::ReserveRequest ReserveRequest(uint32_t prompt_tokens, uint32_t max_tokens) const {
    v1::ReserveRequest reserve;
    reserve.set_request_id("test");
    reserve.set_prompt_tokens(prompt_tokens);
    reserve.set_model_fingerprint(*model::ModelFingerprint(model_));
    reserve.mutable_sampling()->set_max_tokens(max_tokens);
    reserve.set_prefill_identity("spiffe://baton/prefill");
    return reserve;
  }
  grpc::Status Reserve(const v1::ReserveRequest& request, v1::Reservation* reservation) {
    grpc::ClientContext context;
    return cluster_->Decode("decode", "router")->Reserve(&context, request, reservation);
  }
  // Pushes one chunk into `reservation` as `role`; the status.
  grpc::Status Push(const std::string& role, const v1::Reservation& reservation, v1::Region region,
                    uint64_t offset, const std::string& bytes) {
    auto stub = cluster_->Decode("decode", role);
    grpc::ClientContext context;
    v1::PushRegionsResponse pushed;
    auto writer = stub->PushRegions(&context, &pushed);
    v1::RegionChunk chunk;
    chunk.set_reservation_id(reservation.reservation_id());
    chunk.set_region(region);
    chunk.set_offset(offset);
    chunk.set_data(bytes);
    writer->Write(chunk);
    writer->WritesDone();
    return writer->Finish();
  }
  // The cluster still serves a request end to end.
  void ExpectServing() {
    EXPECT_TRUE(HealthCheck(cluster_->Address("decode"), TlsAs("client")).ok());
    auto client = cluster_->Client();
    const Outcome outcome = Generate(*client, Request({1, 2, 3, 4, 5, 6}, 4));
    EXPECT_TRUE(outcome.status.ok()) << outcome.status.error_message();
  }
  std::vector<std::string> InternalPorts() const {
    return {cluster_->router_internal(), cluster_->Address("prefill"), cluster_->Address("decode"),
            cluster_->Address("kvstore")};
  }

  static std::string model_, other_ca_, keys_;
  std::unique_ptr<Cluster> cluster_;
  std::string router_;
};
std::string SecurityTest::model_, SecurityTest::other_ca_, SecurityTest::keys_;

TEST_F(SecurityTest, InternalPortsRefuseAnyoneWithoutACertificateOfTheCa) {
  StartCluster();
  for (const std::string& address : InternalPorts()) {
    EXPECT_TRUE(HealthCheck(address, TlsAs("client")).ok()) << address;
    for (const auto& [who, credentials] :
         {std::pair{"plaintext", grpc::InsecureChannelCredentials()},
          {"TLS without a certificate", TlsAs("")},
          {"another CA's certificate", TlsAs("router", other_ca_)}}) {
      const grpc::Status status = HealthCheck(address, credentials);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << who << " at " << address;
    }
  }
  // The router's client port is a separate server: it never serves Registry.
  auto registry =
      v1::Registry::NewStub(grpc::CreateChannel(router_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::RegisterRequest request;
  request.set_node_id("intruder");
  request.set_role(v1::NODE_ROLE_PREFILL);
  request.set_address("127.0.0.1:1");
  v1::RegisterResponse response;
  EXPECT_EQ(registry->Register(&context, request, &response).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

TEST_F(SecurityTest, ACertificateCallsOnlyWhatItsRoleAllows) {
  StartCluster();
  const auto as_prefill = TlsAs("prefill");
  // Registering as decode with a prefill certificate.
  auto registry =
      v1::Registry::NewStub(grpc::CreateChannel(cluster_->router_internal(), as_prefill));
  v1::RegisterRequest reg;
  reg.set_node_id("fake-decode");
  reg.set_role(v1::NODE_ROLE_DECODE);
  reg.set_address("127.0.0.1:1");
  v1::RegisterResponse registered;
  grpc::ClientContext register_context;
  const grpc::Status refused = registry->Register(&register_context, reg, &registered);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(refused.error_message(), HasSubstr("Registry/Register"));
  // Calling Prefill (only a router may).
  auto prefill =
      v1::PrefillNode::NewStub(grpc::CreateChannel(cluster_->Address("prefill"), as_prefill));
  grpc::ClientContext prefill_context;
  v1::PrefillRequest prefill_request;
  v1::PrefillResponse prefilled;
  EXPECT_EQ(prefill->Prefill(&prefill_context, prefill_request, &prefilled).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // Streaming from a decode node (only a router may).
  auto decode_as_prefill = cluster_->Decode("decode", "prefill");
  grpc::ClientContext stream_context;
  v1::StreamRequest stream_request;
  stream_request.set_reservation_id("0123456789abcdef0123456789abcdef");
  auto stream = decode_as_prefill->Stream(&stream_context, stream_request);
  v1::DecodeOutput output;
  EXPECT_FALSE(stream->Read(&output));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // The client certificate may call health and nothing else internal.
  auto kvstore =
      v1::KvStore::NewStub(grpc::CreateChannel(cluster_->Address("kvstore"), TlsAs("client")));
  grpc::ClientContext stats_context;
  v1::KvStoreStats stats;
  EXPECT_EQ(kvstore->Stats(&stats_context, v1::KvStoreStatsRequest(), &stats).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // Each refusal is logged with the peer's identity.
  EXPECT_THAT(cluster_->Log("router"), HasSubstr("spiffe://baton/prefill"));
  EXPECT_THAT(cluster_->Log("decode"), HasSubstr("DecodeNode/Stream"));
  EXPECT_THAT(cluster_->Log("kvstore"), HasSubstr("spiffe://baton/client"));
  // The cluster itself still serves.
  auto client = cluster_->Client();
  const Outcome outcome = Generate(*client, Request({1, 2, 3, 4, 5}, 4));
  EXPECT_TRUE(outcome.status.ok()) << outcome.status.error_message();
}

TEST_F(SecurityTest, OnlyThePrefillIdentityAReservationNamesMayFillIt) {
  StartCluster();
  v1::ReserveRequest reserve = ReserveRequest(10, 4);
  reserve.set_model_fingerprint("some other model");
  v1::Reservation reservation;
  const grpc::Status mismatch = Reserve(reserve, &reservation);
  ASSERT_EQ(mismatch.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // The node's own fingerprint is not revealed.
  EXPECT_THAT(mismatch.error_message(),
              ::testing::Not(HasSubstr(*model::ModelFingerprint(model_))));
  ASSERT_TRUE(Reserve(ReserveRequest(10, 4), &reservation).ok());
  EXPECT_EQ(reservation.reservation_id().size(), 32u);
  const std::string bytes(64, 'x');
  // Another prefill identity sees no such reservation; the router may not push at all.
  EXPECT_EQ(Push("prefill-b", reservation, v1::REGION_PRODUCER_SWA, 0, bytes).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Push("router", reservation, v1::REGION_PRODUCER_SWA, 0, bytes).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(Push("prefill", reservation, v1::REGION_PRODUCER_SWA, 0, bytes).ok());
  v1::ReleaseRequest release;
  release.set_reservation_id(reservation.reservation_id());
  grpc::ClientContext release_context;
  v1::ReleaseResponse released;
  ASSERT_TRUE(
      cluster_->Decode("decode", "router")->Release(&release_context, release, &released).ok());
  EXPECT_TRUE(DecodeDrained(*cluster_, "decode"));
}

TEST_F(SecurityTest, ApiKeysAuthenticateAndTenantsNeverShareCachedPrefixes) {
  StartCluster({"--api-keys", keys_});
  auto client = cluster_->Client();
  std::mt19937_64 rng(5);
  const std::vector<int32_t> prompt = RandomPrompt(rng, 96, 512);
  const v1::GenerateRequest request = Request(prompt, 3);
  auto run = [&](const std::string& key) {
    return Generate(*client, request, std::chrono::seconds(60), nullptr, key);
  };
  const Outcome anonymous = run("");
  EXPECT_EQ(anonymous.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(anonymous.status.error_message(), HasSubstr("authorization"));
  EXPECT_EQ(run("key-nobody-was-given-0000").status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  const Outcome first = run(kKeyA);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.usage.cached_tokens(), 0u);
  // Tenant A's repeat hits once the write-back has landed (each repeat is the poll)...
  Outcome again;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  do {
    again = run(kKeyA);
    ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  } while (again.usage.cached_tokens() == 0 && std::chrono::steady_clock::now() < until);
  EXPECT_GT(again.usage.cached_tokens(), 0u);
  // ... and tenant B, with the same prompt and the same (empty) salt, sees nothing of it.
  const Outcome other = run(kKeyB);
  ASSERT_TRUE(other.status.ok()) << other.status.error_message();
  EXPECT_EQ(other.usage.cached_tokens(), 0u);
  EXPECT_EQ(other.tokens, first.tokens);
}

// The reproducers of the security issue, each against the real binaries: a node refuses the
// input with a status naming the field, and serves on.
TEST_F(SecurityTest, AReserveWhoseSizesWrapIsRefusedAndTheNodeServesOn) {
  StartCluster();
  v1::Reservation reservation;
  const grpc::Status status = Reserve(ReserveRequest(4294967295u, 2), &reservation);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("prompt_tokens"));
  ExpectServing();
  EXPECT_TRUE(DecodeDrained(*cluster_, "decode"));
}

TEST_F(SecurityTest, RegionChunksReachingPast2To64AreRefused) {
  StartCluster();
  v1::Reservation reservation;
  ASSERT_TRUE(Reserve(ReserveRequest(40, 4), &reservation).ok());
  for (const v1::Region region :
       {v1::REGION_PRODUCER_SWA, v1::REGION_CONSUMER_SWA, v1::REGION_BLOCK_KV}) {
    const grpc::Status status =
        Push("prefill", reservation, region, std::numeric_limits<uint64_t>::max() - 8191,
             std::string(8208, 'x'));  // offset 2^64 - 8192: the end wraps to 16
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << v1::Region_Name(region) << ": " << status.error_message();
  }
  ExpectServing();
}

TEST_F(SecurityTest, StoreWritesThatWouldPoisonOrPinTheStoreAreRefused) {
  StartCluster();
  const model::StateLayout layout = (*model::CedModel::Load(model_))->state_layout();
  const std::string kv_payload(sizeof(float) * layout.page_floats(), '\0');
  auto store =
      v1::KvStore::NewStub(grpc::CreateChannel(cluster_->Address("kvstore"), TlsAs("prefill")));
  const Sha256Digest digest = Sha256Of("block", 5);
  const std::string key(reinterpret_cast<const char*>(digest.data()), digest.size());
  auto write = [&](const std::string& parent, const std::string& payload) {
    grpc::ClientContext context;
    v1::WriteBlocksResponse written;
    auto writer = store->WriteBlocks(&context, &written);
    v1::BlockWrite w;
    w.set_key(key);
    w.set_parent(parent);
    w.set_region(v1::STORE_REGION_BLOCK_KV);
    w.set_payload(payload);
    writer->Write(w);
    writer->WritesDone();
    return writer->Finish();
  };
  std::string nan_payload = kv_payload;
  const float nan = std::nanf("");
  std::memcpy(nan_payload.data() + 64, &nan, sizeof(nan));
  for (const auto& [what, parent, payload] :
       {std::tuple<const char*, std::string, std::string>{"its own parent", key, kv_payload},
        {"a payload of the wrong size", "", kv_payload + "x"},
        {"a NaN", "", nan_payload}}) {
    const grpc::Status status = write(parent, payload);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << what;
  }
  grpc::ClientContext stats_context;
  v1::KvStoreStats stats;
  ASSERT_TRUE(cluster_->Kvstore()->Stats(&stats_context, v1::KvStoreStatsRequest(), &stats).ok());
  EXPECT_EQ(stats.block_kv_values(), 0u);
  EXPECT_EQ(stats.stored_bytes(), 0u);
  EXPECT_TRUE(write("", kv_payload).ok());  // a well-formed root block is stored
}

// Runs `command`, returning its exit status and what it wrote.
std::pair<int, std::string> RunCommand(const std::string& command) {
  const std::string out = ProcessTempDir() + "/run.out";
  const int status = std::system((command + " > " + out + " 2>&1").c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ReadFile(out)};
}

TEST_F(SecurityTest, BadConfigFilesAndModelConfigsAreRefusedWithAMessage) {
  const std::string yaml = ProcessTempDir() + "/complex_key.yaml";
  std::ofstream(yaml) << "router: {? [a, b] : 1}\n";
  const auto [yaml_status, yaml_output] =
      RunCommand(std::string(BATON_DECODE_PATH) + " --config " + yaml + " --check-config");
  EXPECT_EQ(yaml_status, 2) << yaml_output;
  EXPECT_THAT(yaml_output, HasSubstr(yaml));

  // config.json whose vocabulary is 2^40 (its products would wrap in 64 bits).
  const std::string huge = ProcessTempDir() + "/huge_vocab";
  std::filesystem::create_directories(huge);
  std::string config = ReadFile(model_ + "/config.json");
  const size_t at = config.find("\"vocab_size\"");
  ASSERT_NE(at, std::string::npos);
  const size_t end = config.find_first_of(",}", at);
  config.replace(at, end - at, "\"vocab_size\": 1099511627776");
  std::ofstream(huge + "/config.json") << config;
  std::filesystem::copy_file(model_ + "/model.safetensors", huge + "/model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  const auto [model_status, model_output] = RunCommand(
      std::string(BATON_DECODE_PATH) + " --model " + huge + " --insecure-internal --port 0");
  EXPECT_EQ(model_status, 2) << model_output;
  EXPECT_THAT(model_output, HasSubstr("vocab_size"));
}

}  // namespace
}  // namespace baton::testing
