// Security end to end, against the real binaries on loopback (issue: nobody gets in, and no
// wire input can corrupt a node): every internal port refuses plaintext clients, clients
// without a certificate and clients of another CA; a certificate's role decides what it may
// call (a prefill certificate cannot register as decode, call Prefill or Stream, and only the
// prefill identity a reservation names may commit into it); the client port never serves
// Registry; API keys authenticate clients, before any message of theirs is read, and their
// tenants never share prefix-cache entries; --max-model-len bounds the client's messages.
// The data plane: the decode node reads only from the prefill node its reservation names, refuses
// chunks outside their region, and a reservation that expires before its transfer never
// receives a byte.
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <limits>
#include <random>
#include <thread>
#include <tuple>

#include "baton/common/hash.h"
#include "baton/common/pki.h"
#include "baton/model/engine.h"
#include "baton/model/model_factory.h"
#include "client.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "scrape.h"
#include "test_dir.h"
#include "testing/eventually.h"

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

// A prefill node of the test PKI (mutual TLS, the prefill certificate) that answers every read
// with its own chunk, after `hold_ms`: a misbehaving or slow peer of the decode node.
class FakePrefill final : public v1::PrefillNode::Service {
 public:
  FakePrefill() {
    grpc::SslServerCredentialsOptions ssl(
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_root_certs = ReadFile(TestPki() + "/ca.crt");
    ssl.pem_key_cert_pairs.push_back(
        {ReadFile(TestPki() + "/prefill.key"), ReadFile(TestPki() + "/prefill.crt")});
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::SslServerCredentials(ssl), &port);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    address = "127.0.0.1:" + std::to_string(port);
  }
  ~FakePrefill() override { server_->Shutdown(std::chrono::system_clock::now()); }
  grpc::Status ReadRegions(grpc::ServerContext* context, const v1::ReadRegionsRequest* request,
                           grpc::ServerWriter<v1::RegionChunk>* writer) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
    v1::RegionChunk answer = chunk;
    if (answer.data().empty()) {  // a well-formed answer: the whole range asked for
      answer.set_region(request->region());
      answer.set_offset(request->offset());
      answer.set_data(std::string(request->length(), 'x'));
    }
    writer->Write(answer);
    ++answered;
    return grpc::Status::OK;
  }
  std::string address;
  int hold_ms = 0;
  v1::RegionChunk chunk;  // empty data: answer well-formed
  std::atomic<int> answered{0};

 private:
  std::unique_ptr<grpc::Server> server_;
};

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = ProcessTempDir() + "/security_tiny";
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("tiny"), 21, model_).ok());
    // Another CA with the same role names, and a second prefill identity of this CA.
    other_ca_ = ProcessTempDir() + "/other_pki";
    ASSERT_TRUE(pki::EnsureLocalPki(other_ca_, pki::LocalRoles()).ok());
    ASSERT_TRUE(
        pki::IssueCertificate(TestPki(), "prefill-b", "spiffe://baton/prefill/prefill-b").ok());
    keys_ = ProcessTempDir() + "/api_keys.yaml";
    std::ofstream(keys_) << "\"" << kKeyA << "\": tenant-a\n\"" << kKeyB << "\": tenant-b\n";
  }
  void StartCluster(std::vector<std::string> router_flags = {},
                    std::vector<std::string> decode_flags = {}) {
    cluster_ = std::make_unique<Cluster>(model_);
    router_flags.push_back("--require-kvstore");
    router_ = cluster_->StartRouter(router_flags);
    ASSERT_FALSE(router_.empty()) << cluster_->Log("router");
    ASSERT_FALSE(cluster_->StartKvstore("kvstore", cluster_->dir() + "/store").empty());
    ASSERT_FALSE(cluster_->StartDecode("decode", decode_flags).empty());
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
  // Commits `reservation` of `prompt_len` positions as `role`, naming an exposure to read over
  // gRPC from the prefill node the reservation names; the status. The header's checksums are
  // made up: a commit that gets as far as them fails DATA_LOSS.
  grpc::Status Commit(const std::string& role, const v1::Reservation& reservation,
                      uint32_t prompt_len) {
    v1::CommitRequest commit;
    v1::StateHeader& h = *commit.mutable_header();
    h.set_format_version(2);  // transfer::kStateFormatVersion (this target links no transfer)
    h.set_model_fingerprint(*model::ModelFingerprint(model_));
    h.set_request_id("test");
    h.set_reservation_id(reservation.reservation_id());
    h.set_prompt_len(prompt_len);
    h.set_producer_swa_bytes(reservation.producer_swa_bytes());
    h.set_consumer_swa_bytes(reservation.consumer_swa_bytes());
    h.set_block_kv_bytes(uint64_t{reservation.pages()} * reservation.page_bytes());
    commit.mutable_source()->set_transport(v1::TRANSPORT_GRPC);
    commit.mutable_source()->set_exposure_id("0123456789abcdef0123456789abcdef");
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::CommitResponse committed;
    return cluster_->Decode("decode", role)->Commit(&context, commit, &committed);
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
  // Registering as prefill with a name past its bound.
  reg.set_role(v1::NODE_ROLE_PREFILL);
  reg.set_node_id(std::string(257, 'n'));
  grpc::ClientContext long_context;
  const grpc::Status too_long = registry->Register(&long_context, reg, &registered);
  EXPECT_EQ(too_long.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(too_long.error_message(), HasSubstr("node_id: 257 bytes; it must be at most 256"));
  // A model name or config digest past its bound.
  reg.set_node_id("fake-prefill");
  reg.set_model_name(std::string(257, 'm'));
  grpc::ClientContext name_context;
  const grpc::Status long_name = registry->Register(&name_context, reg, &registered);
  EXPECT_EQ(long_name.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(long_name.error_message(), HasSubstr("model_name: 257 bytes"));
  reg.clear_model_name();
  reg.set_config_digest(std::string(129, 'd'));
  grpc::ClientContext digest_context;
  const grpc::Status long_digest = registry->Register(&digest_context, reg, &registered);
  EXPECT_EQ(long_digest.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(long_digest.error_message(), HasSubstr("config_digest: 129 bytes"));
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

// A node_id belongs to the identity that first registered it: neither another role's
// certificate nor another pod's of the same role can take over a running node's id (and with it
// the requests the router sends there).
TEST_F(SecurityTest, ANodeIdBelongsToTheIdentityThatFirstRegisteredIt) {
  StartCluster();
  ASSERT_TRUE(
      pki::IssueCertificate(TestPki(), "prefill-b", "spiffe://baton/prefill/prefill-b").ok());
  auto register_as = [&](const std::string& cert, const std::string& node_id, v1::NodeRole role) {
    auto registry =
        v1::Registry::NewStub(grpc::CreateChannel(cluster_->router_internal(), TlsAs(cert)));
    v1::RegisterRequest reg;
    reg.set_node_id(node_id);
    reg.set_role(role);
    reg.set_address("127.0.0.1:1");
    reg.set_model_fingerprint(*model::ModelFingerprint(model_));
    reg.set_draining(true);  // a node the router sends nothing to, should it be taken
    grpc::ClientContext context;
    v1::RegisterResponse registered;
    return registry->Register(&context, reg, &registered);
  };
  for (const auto& [cert, role] : {std::pair{"kvstore", v1::NODE_ROLE_KVSTORE},
                                   std::pair{"prefill-b", v1::NODE_ROLE_PREFILL}}) {
    const grpc::Status status = register_as(cert, "prefill", role);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << cert;
    EXPECT_THAT(status.error_message(), HasSubstr("node_id: 'prefill'"));
  }
  // A new id becomes its first registrant's, and stays that identity's.
  EXPECT_TRUE(register_as("prefill-b", "prefill-b", v1::NODE_ROLE_PREFILL).ok());
  EXPECT_EQ(register_as("prefill", "prefill-b", v1::NODE_ROLE_PREFILL).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(cluster_->Log("router"), HasSubstr("node_id takeover refused"));
  ExpectServing();
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
  FakePrefill fake;
  v1::ReserveRequest named = ReserveRequest(10, 4);
  named.set_prefill_address(fake.address);
  ASSERT_TRUE(Reserve(named, &reservation).ok());
  EXPECT_EQ(reservation.reservation_id().size(), 32u);
  // Another prefill identity sees no such reservation; the router may not commit at all.
  EXPECT_EQ(Commit("prefill-b", reservation, 10).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Commit("router", reservation, 10).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(fake.answered, 0);
  // The named identity's commit is read from the named prefill node (and its made-up bytes
  // fail their checksums).
  const grpc::Status named_commit = Commit("prefill", reservation, 10);
  EXPECT_EQ(named_commit.error_code(), grpc::StatusCode::DATA_LOSS) << named_commit.error_message();
  EXPECT_EQ(fake.answered, 3);
  EXPECT_TRUE(DecodeDrained(*cluster_, "decode"));
  // Only a decode certificate may read a prefill node's exposures, and only ones it was told.
  auto read = [&](const std::string& role) {
    auto stub =
        v1::PrefillNode::NewStub(grpc::CreateChannel(cluster_->Address("prefill"), TlsAs(role)));
    grpc::ClientContext context;
    v1::ReadRegionsRequest request;
    request.set_exposure_id("0123456789abcdef0123456789abcdef");
    request.set_region(v1::REGION_BLOCK_KV);
    request.set_length(64);
    auto reader = stub->ReadRegions(&context, request);
    v1::RegionChunk chunk;
    while (reader->Read(&chunk)) {
    }
    return reader->Finish();
  };
  EXPECT_EQ(read("router").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(read("decode").error_code(), grpc::StatusCode::NOT_FOUND);
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
  Eventually(
      [&] {
        again = run(kKeyA);
        return !again.status.ok() || again.usage.cached_tokens() > 0;
      },
      std::chrono::seconds(30));
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
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
  StartCluster({}, {"--poison-freed-memory", "--metrics-port", "0", "--metrics-ready-file",
                    ProcessTempDir() + "/wrap-decode.metrics"});
  FakePrefill fake;
  fake.chunk.set_region(v1::REGION_PRODUCER_SWA);
  fake.chunk.set_offset(std::numeric_limits<uint64_t>::max() - 8191);  // 2^64 - 8192
  fake.chunk.set_data(std::string(8208, 'x'));                         // the end wraps to 16
  v1::ReserveRequest request = ReserveRequest(40, 4);
  request.set_prefill_address(fake.address);
  v1::Reservation reservation;
  ASSERT_TRUE(Reserve(request, &reservation).ok());
  const grpc::Status status = Commit("prefill", reservation, 40);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("lies outside region REGION_"));
  EXPECT_TRUE(DecodeDrained(*cluster_, "decode"));
  ExpectServing();
  std::string metrics;
  std::ifstream(ProcessTempDir() + "/wrap-decode.metrics") >> metrics;
  EXPECT_EQ(Sample(Scrape(metrics), "baton_pool_poison_violations"), 0);
}

// A reservation that expires while the prefill node is still answering is freed once the read
// has stopped; the late bytes land nowhere (freed memory keeps its poison through reuse).
TEST_F(SecurityTest, AReservationThatExpiresBeforeItsTransferNeverReceivesAByte) {
  const std::string metrics_file = ProcessTempDir() + "/expire-decode.metrics";
  StartCluster({}, {"--poison-freed-memory", "--metrics-port", "0", "--metrics-ready-file",
                    metrics_file, "--slots", "1"});
  FakePrefill fake;
  fake.hold_ms = 5000;
  v1::ReserveRequest request = ReserveRequest(40, 4);
  request.set_prefill_address(fake.address);
  request.set_timeout_ms(2000);
  v1::Reservation reservation;
  ASSERT_TRUE(Reserve(request, &reservation).ok());
  const grpc::Status status = Commit("prefill", reservation, 40);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  EXPECT_TRUE(DecodeDrained(*cluster_, "decode"));
  ASSERT_TRUE(EventuallyThat([&] { return fake.answered.load(); }, ::testing::Ge(1),
                             std::chrono::seconds(20)));
  // The one slot and its pages serve the next requests, whose reservations check the poison.
  ExpectServing();
  ExpectServing();
  std::string metrics;
  std::ifstream(metrics_file) >> metrics;
  const std::string exposition = Scrape(metrics);
  EXPECT_EQ(Sample(exposition, "baton_pool_poison_violations"), 0);
  EXPECT_THAT(cluster_->Log("decode"), ::testing::Not(HasSubstr("freed pool memory was written")));
}

TEST_F(SecurityTest, StoreWritesThatWouldPoisonOrPinTheStoreAreRefused) {
  StartCluster();
  const model::StateLayout layout = model::StateLayout::For(model::LoadCedWeights(model_)->config);
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

// A process's memory figures from /proc/<pid>/status ("VmHWM", "VmRSS"), in KiB; -1 if absent.
int64_t StatusKib(pid_t pid, const std::string& field) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  return -1;
}

// Issue 48 item 2: the client port reads no message before the caller's key is checked. 16
// callers without a (valid) key, each on its own connection, send a 60 MiB Generate at once;
// the router's peak memory stays near its baseline (the whole messages were read before: +836
// MiB), every call is refused UNAUTHENTICATED, and a keyed request is served.
TEST_F(SecurityTest, UnauthenticatedSixtyMebibyteCallsAreRefusedBeforeTheyAreRead) {
  StartCluster({"--api-keys", keys_});
  const pid_t router = cluster_->Pid("router");
  // The request is serialized once and its bytes shared by every call (slices are counted
  // references), so the test process holds one copy, not 16.
  v1::GenerateRequest request = Request({1, 2, 3}, 4);
  request.set_cache_salt(std::string(60 << 20, 'x'));
  const std::string serialized = request.SerializeAsString();
  grpc::Slice slice(serialized);
  const grpc::ByteBuffer payload(&slice, 1);
  std::ofstream("/proc/" + std::to_string(router) + "/clear_refs") << "5";  // VmHWM := VmRSS
  const int64_t baseline_kib = StatusKib(router, "VmRSS");
  constexpr int kCalls = 16;
  std::vector<grpc::Status> statuses(kCalls);
  std::vector<std::thread> callers;
  for (int i = 0; i < kCalls; ++i) {
    callers.emplace_back([&, i] {
      grpc::GenericStub stub(
          grpc::CreateChannel(cluster_->Address("router"), grpc::InsecureChannelCredentials()));
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      if (i % 2 == 1) context.AddMetadata("authorization", "Bearer key-nobody-was-given-0000");
      grpc::ByteBuffer response;
      std::promise<grpc::Status> done;
      stub.UnaryCall(&context, "/baton.v1.Generation/Generate", grpc::StubOptions(), &payload,
                     &response, [&done](grpc::Status status) { done.set_value(status); });
      statuses[i] = done.get_future().get();
    });
  }
  for (std::thread& caller : callers) caller.join();
  for (int i = 0; i < kCalls; ++i) {
    EXPECT_EQ(statuses[i].error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << i << ": " << statuses[i].error_message();
  }
  const double peak_mib = static_cast<double>(StatusKib(router, "VmHWM") - baseline_kib) / 1024;
  std::cout << "16 unauthenticated 60 MiB Generate calls: router peak RSS +" << peak_mib
            << " MiB over " << baseline_kib / 1024 << " MiB" << std::endl;
  EXPECT_LT(peak_mib, 64);  // one of the messages whole would pass it
  auto client = cluster_->Client();
  const Outcome keyed =
      Generate(*client, Request({1, 2, 3, 4, 5, 6}, 4), std::chrono::seconds(60), nullptr, kKeyA);
  EXPECT_TRUE(keyed.status.ok()) << keyed.status.error_message();
}

// Issue 48 item 8: --max-model-len is the model's positions unless set, never more, and bounds
// what a text prompt may make the router tokenize. A builtin model: 512 positions.
TEST_F(SecurityTest, MaxModelLenAboveTheModelsPositionsIsRefusedAtStart) {
  const std::string model = std::string(BATON_MODELS_DIR) + "/ced-brown-shared";
  const auto [status, output] =
      RunCommand("timeout 60 " + std::string(BATON_ROUTER_PATH) + " --model " + model +
                 " --insecure-internal --port 0 --max-model-len 32768");
  EXPECT_EQ(status, 2) << output;
  EXPECT_THAT(output, HasSubstr("--max-model-len: 32768 exceeds the 512 positions"));
}

TEST_F(SecurityTest, APromptPastWhatMaxModelLenTokensCanSpellIsRefusedBeforeTokenizing) {
  Cluster cluster(std::string(BATON_MODELS_DIR) + "/ced-brown-shared");
  ASSERT_FALSE(cluster.StartRouter().empty()) << cluster.Log("router");
  auto client = cluster.Client();
  v1::GenerateRequest request;
  request.mutable_sampling()->set_max_tokens(4);
  // 2 MiB: past the client port's receive limit, 1 MiB at 512 positions.
  request.set_prompt_text(std::string(2 << 20, 'a'));
  const Outcome huge = Generate(*client, request, std::chrono::seconds(30));
  EXPECT_EQ(huge.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(huge.status.error_message(), HasSubstr("1048576"));
  // Within the receive limit, past 64 bytes a token of the (unset, so 512) --max-model-len:
  // refused on its byte count, before the tokenizer reads it.
  request.set_prompt_text(std::string(512 << 10, 'a'));
  const Outcome big = Generate(*client, request, std::chrono::seconds(30));
  EXPECT_EQ(big.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(big.status.error_message(),
              HasSubstr("prompt_text: 524288 bytes; at most 32768 bytes (64 a token of the "
                        "router's --max-model-len 512), refused before tokenizing"));
}

}  // namespace
}  // namespace baton::testing
