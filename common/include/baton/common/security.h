// Who may talk to whom inside a baton cluster (DESIGN section 6, "Security").
//
// Every internal gRPC surface (the router's Registry, PrefillNode, DecodeNode, KvStore) runs
// mutual TLS through gRPC's TLS credentials. Certificates and the CA are read by gRPC's
// file-watcher provider, so files replaced on disk (cert-manager rotation) are picked up
// without a restart. A peer's role is the first path segment of the SPIFFE id in its
// certificate's URI SAN: spiffe://baton/router, /prefill, /decode, /kvstore or /client, or
// spiffe://baton/<role>/<instance> for one certificate per pod (the whole id is its identity).
// Servers check the caller's role in each handler (Authorize); channels check the server's role
// after the handshake, so a node never sends a prompt or state to a peer of the wrong kind.
//
// A process configures this once, at start-up (ServerFlags do it from --tls-ca, --tls-cert,
// --tls-key, or --insecure-internal for plaintext). Until Configure runs, the process is
// insecure: in-process unit tests use that.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/auth_metadata_processor.h"

namespace CLI {
class App;
}
namespace baton {
class ApiKeys;
}

namespace baton::security {

enum class Role { kRouter, kPrefill, kDecode, kKvstore, kClient };

const char* RoleName(Role role);
// spiffe://baton/<role>.
std::string RoleUri(absl::string_view role);
inline std::string RoleUri(Role role) {
  return RoleUri(RoleName(role));
}
// The role a SPIFFE id names (spiffe://baton/<role>[/<instance>]); nullopt for any other.
std::optional<Role> RoleOfUri(absl::string_view uri);
// The instance a per-node SPIFFE id names (spiffe://baton/<role>/<instance>: everything after
// the role's segment); "" for a role-only id or any other.
std::string InstanceOfUri(absl::string_view uri);
// spiffe://baton/<role>/<instance>: the identity of one node (`baton up`, the chart).
std::string NodeUri(absl::string_view role, absl::string_view instance);

// gRPC message bounds, set explicitly on every server and channel. The largest message is a
// gRPC-transport region chunk or a store block (a few MiB); a prompt of max_model_len token
// ids is far below this.
inline constexpr int kMaxMessageBytes = 64 << 20;
// HTTP/2 keepalive: ping every this many ms while calls are open, and give a peer as long to
// answer before its connection (and every call on it) fails.
inline constexpr int kKeepaliveMs = 10000;

struct TlsOptions {
  std::string ca_file;       // PEM: the CA whose certificates are trusted
  std::string cert_file;     // PEM: this process's certificate (its role in the URI SAN)
  std::string key_file;      // PEM: its private key
  bool insecure = false;     // plaintext and no role checks: tests and single-user hosts only
  int refresh_seconds = 60;  // how often the files are re-read
};

// --tls-ca, --tls-cert, --tls-key, --insecure-internal.
void AddTlsFlags(CLI::App& app, TlsOptions& options);

// Checks `options` (all three files readable, or insecure) and makes them this process's.
absl::Status Configure(const TlsOptions& options);

// True once Configure has set mutual TLS.
bool Enabled();

// The credentials of this process's internal servers: mutual TLS (a client certificate from
// the CA is required) or, when insecure, plaintext.
std::shared_ptr<grpc::ServerCredentials> InternalServerCredentials();

// A channel to an internal server that must present `server_role`'s certificate, carrying
// this process's certificate; plaintext when insecure.
std::shared_ptr<grpc::Channel> InternalChannel(const std::string& address, Role server_role,
                                               const grpc::ChannelArguments& args);
inline std::shared_ptr<grpc::Channel> InternalChannel(const std::string& address,
                                                      Role server_role);

// Credentials of the router's client API: TLS with `cert_file`/`key_file` (re-read when they
// change), requiring client certificates from `client_ca_file` when that is given; plaintext
// when no certificate is given. With `api_key_check`, the credentials can take an
// ApiKeyCheck (ServerCredentials::SetAuthMetadataProcessor), plaintext too: gRPC runs such a
// check only on secure credentials (1.51's plaintext credentials abort on one), so plaintext is
// then XdsServerCredentials over plaintext, which, with no xDS configured (no XdsServerBuilder),
// serves exactly as its plaintext fallback does.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ClientApiCredentials(
    const std::string& cert_file, const std::string& key_file, const std::string& client_ca_file,
    bool api_key_check = false);

// Says that a call was refused: the method (":path") and the refusal.
using RefusalFn = std::function<void(absl::string_view method, const absl::Status& refusal)>;
// An AuthMetadataProcessor for the client server's credentials that checks each call's API key
// (`authorization: Bearer <key>`) from its metadata, before any message of the call is read: a
// call without a valid key is refused UNAUTHENTICATED, having cost its headers only (gRPC
// reads a whole message, up to the receive limit, before a handler could look at the key).
// grpc.health.v1 passes without a key. `refused` (may be null) hears of each refusal.
//
// The handler still takes the tenant from the key itself (ApiKeys::Authenticate, a SHA-256): in
// gRPC 1.51 the AuthContext a processor writes to is the connection's, shared by all its calls
// and never trimmed, so a property set per call would grow without bound and give every call
// of the connection every tenant seen on it.
std::shared_ptr<grpc::AuthMetadataProcessor> ApiKeyCheck(std::shared_ptr<const ApiKeys> keys,
                                                         RefusalFn refused);

// Channel arguments every baton channel uses (message bounds).
grpc::ChannelArguments ChannelArguments();
// ... and, for a client of the router's client API, a retry of baton.v1.Generation calls that
// fail UNAVAILABLE before any response (kClientServiceConfig): a router that closes
// connections at an age (--client-max-connection-age) fails a call that starts on one just as
// its GOAWAY arrives, and the retry goes to the new connection.
grpc::ChannelArguments ClientChannelArguments();
inline constexpr char kClientServiceConfig[] = R"({"methodConfig": [{
  "name": [{"service": "baton.v1.Generation"}],
  "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.05s", "maxBackoff": "0.5s",
                  "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]})";
inline std::shared_ptr<grpc::Channel> InternalChannel(const std::string& address,
                                                      Role server_role) {
  return InternalChannel(address, server_role, ChannelArguments());
}

// The caller's role from its certificate; nullopt when it has none that baton knows.
std::optional<Role> PeerRole(const grpc::ServerContextBase& context);
// The caller's SPIFFE id ("" without TLS or without one), and its address, for logs.
std::string PeerIdentity(const grpc::ServerContextBase& context);

// OK when the caller's role is in `allowed` (always, when insecure); otherwise
// PERMISSION_DENIED, and a log line naming `method`, the peer's address and its identity.
// The message names only the method, nothing the caller did not send.
absl::Status Authorize(const grpc::ServerContextBase& context, std::initializer_list<Role> allowed,
                       absl::string_view method);

// 128 random bits from OpenSSL's generator, as 32 hex digits: an identifier nobody can guess
// (decode reservations).
std::string RandomId();

}  // namespace baton::security
