// Client API keys (the router's --api-keys FILE): a YAML mapping from key to tenant name, or
// to the tenant and its weight,
//
//   "k3y-for-team-a-0123456789": team-a
//   "another-key-for-team-b-xyz": {tenant: team-b, weight: 3}
//
// A tenant's weight (1 to 1000, default 1; every key of a tenant gives the same) sets its part
// of the router's pools beside the other active tenants (router/tenant_share.h): the admission
// queue, the decode streams and the HTTP front's request threads.
// Clients send `authorization: Bearer <key>`. The tenant a key maps to becomes part of every
// prefix-cache chain key of that client's requests (kvstore/chain.h), so tenants never share
// cached state and cached_tokens tells no tenant about another's prompts. Keys are held only
// as SHA-256 digests. Immutable after Load; safe to share between threads.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "baton/common/hash.h"
#include "grpcpp/grpcpp.h"

namespace baton {

class ApiKeys {
 public:
  // Keys: 16 to 256 printable ASCII characters without spaces; tenants: 1 to 64 of
  // [A-Za-z0-9._-]. A bad file is refused with a message naming the entry (never the key).
  static absl::StatusOr<ApiKeys> Load(const std::string& path);
  // The same from the file's text; messages name `source`.
  static absl::StatusOr<ApiKeys> Parse(const std::string& yaml, const std::string& source);

  // The tenant of the caller's bearer key; UNAUTHENTICATED when it sends none or an unknown
  // one.
  absl::StatusOr<std::string> Authenticate(const grpc::ServerContext& context) const;
  // The same for an HTTP Authorization header's value (nullopt: the header is absent).
  absl::StatusOr<std::string> Authenticate(std::optional<std::string_view> authorization) const;

  size_t size() const { return tenants_.size(); }
  // The tenants whose weight is not 1, with their weights.
  const std::map<std::string, int64_t>& weights() const { return weights_; }

 private:
  std::map<Sha256Digest, std::string> tenants_;  // by SHA-256 of the key
  std::map<std::string, int64_t> weights_;       // by tenant; absent: 1
};

}  // namespace baton
