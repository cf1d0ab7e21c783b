// Client API keys (the router's --api-keys FILE): a YAML mapping from key to tenant name, or
// to the tenant and its weight,
//
//   "k3y-for-team-a-0123456789": team-a
//   "another-key-for-team-b-xyz": {tenant: team-b, weight: 3}
//
// A tenant's weight (1 to 1000, default 1; every key of a tenant gives the same) sets its part
// of the router's pools beside the other active tenants (router/tenant_share.h): the admission
// queue, the decode streams and the HTTP front's request threads.
// A key may be given as its SHA-256 instead ("sha256:" and 64 hex digits), so that the file
// (a Kubernetes Secret) need not hold the keys themselves:
//
//   "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08": team-c
//
// Clients send `authorization: Bearer <key>`. The tenant a key maps to becomes part of every
// prefix-cache chain key of that client's requests (kvstore/chain.h), so tenants never share
// cached state and cached_tokens tells no tenant about another's prompts. Keys are held only
// as SHA-256 digests. Keys loaded from a file follow it: at most once a second a call looks at
// the file's inode, size and modification time, and a changed file is read again, so a key
// added or revoked (a Secret's update) takes effect without a restart; a file that no longer
// parses is logged and the keys before it stay. Copies share one table; safe to share between
// threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "baton/common/hash.h"
#include "grpcpp/grpcpp.h"

namespace baton {

class ApiKeys {
 public:
  // Keys: 16 to 256 printable ASCII characters without spaces, or "sha256:" and 64 hex digits;
  // tenants: 1 to 64 of [A-Za-z0-9._-]. A bad file is refused with a message naming the entry
  // (never the key). Reloaded when the file changes (see above).
  static absl::StatusOr<ApiKeys> Load(const std::string& path);
  // The same from the file's text; messages name `source`. Never reloaded.
  static absl::StatusOr<ApiKeys> Parse(const std::string& yaml, const std::string& source);

  // The tenant of the caller's bearer key; UNAUTHENTICATED when it sends none or an unknown
  // one.
  absl::StatusOr<std::string> Authenticate(const grpc::ServerContext& context) const;
  // The same for an HTTP Authorization header's value (nullopt: the header is absent).
  absl::StatusOr<std::string> Authenticate(std::optional<std::string_view> authorization) const;

  size_t size() const;
  // The tenants whose weight is not 1, with their weights.
  std::map<std::string, int64_t> weights() const;
  // A tenant's weight (1 when the file gives none).
  int64_t WeightOf(const std::string& tenant) const;

 private:
  struct Table {
    std::map<Sha256Digest, std::string> tenants;  // by SHA-256 of the key
    std::map<std::string, int64_t> weights;       // by tenant; absent: 1
  };
  struct Watched {
    std::mutex mutex;
    std::string path, stamp;
    std::chrono::steady_clock::time_point checked;
    std::shared_ptr<const Table> table;
  };
  static absl::StatusOr<Table> ParseTable(const std::string& yaml, const std::string& source);
  std::shared_ptr<const Table> Current() const;

  std::shared_ptr<Watched> state_;
};

}  // namespace baton
