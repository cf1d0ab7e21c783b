#include "baton/common/security.h"

#include <openssl/rand.h>

#include <array>
#include <atomic>
#include <fstream>
#include <mutex>

#include "CLI/CLI.hpp"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "baton/common/api_keys.h"
#include "baton/common/log.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace baton::security {
namespace {

namespace tls = grpc::experimental;

constexpr std::array<Role, 5> kRoles = {Role::kRouter, Role::kPrefill, Role::kDecode,
                                        Role::kKvstore, Role::kClient};
constexpr absl::string_view kSpiffePrefix = "spiffe://baton/";

// The role a SPIFFE id names: spiffe://baton/<role>, or spiffe://baton/<role>/<instance> for a
// certificate per pod.
std::optional<Role> RoleOf(absl::string_view uri) {
  if (!absl::ConsumePrefix(&uri, kSpiffePrefix)) return std::nullopt;
  const absl::string_view role = uri.substr(0, uri.find('/'));
  for (Role r : kRoles) {
    if (role == RoleName(r)) return r;
  }
  return std::nullopt;
}

// Accepts a server whose certificate (already verified against the CA by gRPC) names `role`;
// the handshake fails otherwise.
class RoleVerifier final : public tls::ExternalCertificateVerifier {
 public:
  explicit RoleVerifier(Role role) : role_(role) {}
  bool Verify(tls::TlsCustomVerificationCheckRequest* request,
              std::function<void(grpc::Status)> callback, grpc::Status* sync_status) override {
    for (const grpc::string_ref& name : request->uri_names()) {
      if (RoleOf(absl::string_view(name.data(), name.size())) == role_) {
        *sync_status = grpc::Status::OK;
        return true;
      }
    }
    *sync_status = grpc::Status(
        grpc::StatusCode::UNAUTHENTICATED,
        absl::StrCat("the server's certificate does not name the role ", RoleName(role_)));
    return true;  // answered synchronously
  }
  void Cancel(tls::TlsCustomVerificationCheckRequest*) override {}

 private:
  Role role_;
};

struct State {
  TlsOptions options;
  bool enabled = false;
  std::shared_ptr<tls::CertificateProviderInterface> provider;
  std::array<std::shared_ptr<tls::CertificateVerifier>, kRoles.size()> verifiers;
};

// Set once by Configure at start-up and read by every call: readers take a reference to the
// immutable state (a reference count, not a copy), and Enabled is one atomic load.
std::mutex state_mutex;
std::shared_ptr<const State> state_ptr = std::make_shared<const State>();
std::atomic<bool> enabled{false};

std::shared_ptr<const State> Snapshot() {
  std::lock_guard<std::mutex> lock(state_mutex);
  return state_ptr;
}

absl::Status Readable(const std::string& path, const char* flag) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, ": a file is required"));
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  return absl::OkStatus();
}

}  // namespace

const char* RoleName(Role role) {
  switch (role) {
    case Role::kRouter:
      return "router";
    case Role::kPrefill:
      return "prefill";
    case Role::kDecode:
      return "decode";
    case Role::kKvstore:
      return "kvstore";
    case Role::kClient:
      return "client";
  }
  return "unknown";
}

std::string RoleUri(absl::string_view role) {
  return absl::StrCat(kSpiffePrefix, role);
}

void AddTlsFlags(CLI::App& app, TlsOptions& options) {
  app.add_option("--tls-ca", options.ca_file,
                 "PEM CA that signs every baton certificate (internal mutual TLS)");
  app.add_option("--tls-cert", options.cert_file,
                 "PEM certificate of this process; its URI SAN spiffe://baton/<role> is its role");
  app.add_option("--tls-key", options.key_file, "PEM private key of --tls-cert");
  app.add_flag("--insecure-internal", options.insecure,
               "Run the internal surfaces in plaintext without peer checks (trusted hosts only)");
}

absl::Status Configure(const TlsOptions& options) {
  State state;
  state.options = options;
  const bool any_file =
      !options.ca_file.empty() || !options.cert_file.empty() || !options.key_file.empty();
  if (options.insecure && any_file) {
    return absl::InvalidArgumentError(
        "--insecure-internal: cannot be combined with --tls-ca, --tls-cert or --tls-key");
  }
  if (!options.insecure) {
    if (!any_file) {
      return absl::InvalidArgumentError(
          "--tls-ca, --tls-cert, --tls-key: internal surfaces need mutual TLS; give all three "
          "(or --insecure-internal on a trusted host)");
    }
    for (const auto& [path, flag] :
         {std::pair{&options.ca_file, "--tls-ca"}, std::pair{&options.cert_file, "--tls-cert"},
          std::pair{&options.key_file, "--tls-key"}}) {
      if (absl::Status s = Readable(*path, flag); !s.ok()) return s;
    }
    state.enabled = true;
    state.provider = std::make_shared<tls::FileWatcherCertificateProvider>(
        options.key_file, options.cert_file, options.ca_file, options.refresh_seconds);
    for (size_t i = 0; i < kRoles.size(); ++i) {
      state.verifiers[i] = tls::ExternalCertificateVerifier::Create<RoleVerifier>(kRoles[i]);
    }
  }
  const bool on = state.enabled;
  {
    std::lock_guard<std::mutex> lock(state_mutex);
    state_ptr = std::make_shared<const State>(std::move(state));
  }
  enabled.store(on, std::memory_order_release);
  return absl::OkStatus();
}

bool Enabled() {
  return enabled.load(std::memory_order_acquire);
}

std::shared_ptr<grpc::ServerCredentials> InternalServerCredentials() {
  const std::shared_ptr<const State> state = Snapshot();
  if (!state->enabled) return grpc::InsecureServerCredentials();
  tls::TlsServerCredentialsOptions options(state->provider);
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ClientApiCredentials(
    const std::string& cert_file, const std::string& key_file, const std::string& client_ca_file,
    bool api_key_check) {
  if (cert_file.empty() && key_file.empty()) {
    if (!client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          "--client-tls-ca: needs --client-tls-cert and --client-tls-key");
    }
    return api_key_check ? grpc::XdsServerCredentials(grpc::InsecureServerCredentials())
                         : grpc::InsecureServerCredentials();
  }
  if (absl::Status s = Readable(cert_file, "--client-tls-cert"); !s.ok()) return s;
  if (absl::Status s = Readable(key_file, "--client-tls-key"); !s.ok()) return s;
  const int refresh = Snapshot()->options.refresh_seconds;
  std::shared_ptr<tls::CertificateProviderInterface> provider;
  if (client_ca_file.empty()) {
    provider = std::make_shared<tls::FileWatcherCertificateProvider>(key_file, cert_file, refresh);
  } else {
    if (absl::Status s = Readable(client_ca_file, "--client-tls-ca"); !s.ok()) return s;
    provider = std::make_shared<tls::FileWatcherCertificateProvider>(key_file, cert_file,
                                                                     client_ca_file, refresh);
  }
  tls::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (!client_ca_file.empty()) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

namespace {

// ApiKeyCheck's processor. Checking a key is a SHA-256 and a map lookup, so it runs on the
// transport's thread (not blocking) rather than on a thread pool of its own.
class ApiKeyProcessor final : public grpc::AuthMetadataProcessor {
 public:
  ApiKeyProcessor(std::shared_ptr<const ApiKeys> keys, RefusalFn refused)
      : keys_(std::move(keys)), refused_(std::move(refused)) {}
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* /*connection*/,
                       OutputMetadata* /*consumed*/, OutputMetadata* /*response*/) override {
    const auto path = metadata.find(":path");
    const absl::string_view method =
        path == metadata.end() ? "" : absl::string_view(path->second.data(), path->second.size());
    if (absl::StartsWith(method, "/grpc.health.v1.Health/")) return grpc::Status::OK;
    const auto header = metadata.find("authorization");
    std::optional<std::string_view> authorization;
    if (header != metadata.end()) {
      authorization.emplace(header->second.data(), header->second.size());
    }
    absl::StatusOr<std::string> tenant = keys_->Authenticate(authorization);
    if (tenant.ok()) return grpc::Status::OK;
    if (refused_) refused_(method, tenant.status());
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(tenant.status().message()));
  }

 private:
  std::shared_ptr<const ApiKeys> keys_;
  RefusalFn refused_;
};

}  // namespace

std::shared_ptr<grpc::AuthMetadataProcessor> ApiKeyCheck(std::shared_ptr<const ApiKeys> keys,
                                                         RefusalFn refused) {
  return std::make_shared<ApiKeyProcessor>(std::move(keys), std::move(refused));
}

grpc::ChannelArguments ChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // Dead peers are found by pings while a call is open (common/rpc.cc sets the server side).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveMs);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // A peer that is not up yet (pods start together; a router restarts) is dialled again within
  // a second, not on gRPC's default backoff (1 s growing to 120 s): a node that started before
  // its router would otherwise register seconds to minutes after the router serves.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return args;
}

grpc::ChannelArguments ClientChannelArguments() {
  grpc::ChannelArguments args = ChannelArguments();
  args.SetServiceConfigJSON(kClientServiceConfig);
  return args;
}

std::shared_ptr<grpc::Channel> InternalChannel(const std::string& address, Role server_role,
                                               const grpc::ChannelArguments& args) {
  const std::shared_ptr<const State> state = Snapshot();
  if (!state->enabled) {
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                     args);
  }
  tls::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(state->provider);
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  // The server's identity is its role, not its address (pods come and go); RoleVerifier
  // checks it in place of the host name.
  options.set_check_call_host(false);
  options.set_certificate_verifier(state->verifiers[static_cast<size_t>(server_role)]);
  return grpc::CreateCustomChannel(address, grpc::experimental::TlsCredentials(options),
                                   args);
}

std::optional<Role> RoleOfUri(absl::string_view uri) { return RoleOf(uri); }

std::string InstanceOfUri(absl::string_view uri) {
  if (!RoleOf(uri).has_value()) return "";
  absl::ConsumePrefix(&uri, kSpiffePrefix);
  const size_t slash = uri.find('/');
  return slash == absl::string_view::npos ? "" : std::string(uri.substr(slash + 1));
}

std::string NodeUri(absl::string_view role, absl::string_view instance) {
  return absl::StrCat(kSpiffePrefix, role, "/", instance);
}

std::string PeerIdentity(const grpc::ServerContextBase& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr) return "";
  for (const char* property : {GRPC_PEER_SPIFFE_ID_PROPERTY_NAME, GRPC_PEER_URI_PROPERTY_NAME}) {
    for (const grpc::string_ref& value : auth->FindPropertyValues(property)) {
      const absl::string_view uri(value.data(), value.size());
      if (absl::StartsWith(uri, kSpiffePrefix)) return std::string(uri);
    }
  }
  return "";
}

std::optional<Role> PeerRole(const grpc::ServerContextBase& context) {
  return RoleOf(PeerIdentity(context));
}

absl::Status Authorize(const grpc::ServerContextBase& context, std::initializer_list<Role> allowed,
                       absl::string_view method) {
  if (!Enabled()) return absl::OkStatus();
  const std::optional<Role> role = PeerRole(context);
  if (role && std::find(allowed.begin(), allowed.end(), *role) != allowed.end()) {
    return absl::OkStatus();
  }
  const std::string identity = PeerIdentity(context);
  log::Warn("permission denied", {{"method", std::string(method)},
                                  {"peer", context.peer()},
                                  {"identity", identity.empty() ? "none" : identity}});
  return absl::PermissionDeniedError(
      absl::StrCat(method, ": the caller's certificate does not allow this call"));
}

std::string RandomId() {
  unsigned char bytes[16];
  // OpenSSL's generator only fails when it cannot be seeded, which no caller can recover from.
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) std::abort();
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(bytes), sizeof(bytes)));
}

}  // namespace baton::security
