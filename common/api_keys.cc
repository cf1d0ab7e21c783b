#include "baton/common/api_keys.h"

#include <yaml-cpp/yaml.h>

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "baton/common/wire_bounds.h"

namespace baton {
namespace {

constexpr size_t kMinKeyBytes = 16, kMaxKeyBytes = 256;
constexpr absl::string_view kBearer = "Bearer ";

bool ValidKey(const std::string& key) {
  if (key.size() < kMinKeyBytes || key.size() > kMaxKeyBytes) return false;
  for (char c : key) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

bool ValidTenant(const std::string& tenant) {
  if (tenant.empty() || tenant.size() > kMaxTenantBytes) return false;
  for (char c : tenant) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != '-') return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<ApiKeys> ApiKeys::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--api-keys ", path, ": cannot read"));
  return Parse(std::string(std::istreambuf_iterator<char>(in), {}), path);
}

absl::StatusOr<ApiKeys> ApiKeys::Parse(const std::string& yaml, const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("--api-keys ", path, ": ", e.what()));
  }
  if (!root.IsMap() || root.size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--api-keys ", path, ": must be a non-empty mapping from key to tenant"));
  }
  ApiKeys keys;
  int entry = 0;
  for (const auto& item : root) {
    ++entry;
    if (!item.first.IsScalar() || !item.second.IsScalar()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--api-keys ", path, ": entry ", entry, " must map a key (string) to a tenant (string)"));
    }
    const std::string key = item.first.Scalar(), tenant = item.second.Scalar();
    if (!ValidKey(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--api-keys ", path, ": entry ", entry, " (tenant '",
                       ValidTenant(tenant) ? tenant : "", "'): a key is ", kMinKeyBytes, " to ",
                       kMaxKeyBytes, " printable ASCII characters without spaces"));
    }
    if (!ValidTenant(tenant)) {
      return absl::InvalidArgumentError(absl::StrCat("--api-keys ", path, ": entry ", entry,
                                                     ": a tenant is 1 to ", kMaxTenantBytes,
                                                     " characters of [A-Za-z0-9._-]"));
    }
    if (!keys.tenants_.emplace(Sha256Of(key.data(), key.size()), tenant).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--api-keys ", path, ": entry ", entry, " repeats an earlier key"));
    }
  }
  return keys;
}

absl::StatusOr<std::string> ApiKeys::Authenticate(const grpc::ServerContext& context) const {
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find("authorization");
  if (found == metadata.end()) return Authenticate(std::nullopt);
  return Authenticate(std::string_view(found->second.data(), found->second.size()));
}

absl::StatusOr<std::string> ApiKeys::Authenticate(
    std::optional<std::string_view> authorization) const {
  if (!authorization.has_value()) {
    return absl::UnauthenticatedError(
        "authorization: an API key is required; send 'authorization: Bearer <key>'");
  }
  const absl::string_view value(authorization->data(), authorization->size());
  if (!absl::StartsWith(value, kBearer) || value.size() - kBearer.size() > kMaxKeyBytes) {
    return absl::UnauthenticatedError("authorization: expected 'Bearer <key>'");
  }
  const absl::string_view key = value.substr(kBearer.size());
  const auto tenant = tenants_.find(Sha256Of(key.data(), key.size()));
  if (tenant == tenants_.end()) return absl::UnauthenticatedError("authorization: unknown API key");
  return tenant->second;
}

}  // namespace baton
