#include "baton/common/api_keys.h"

#include <yaml-cpp/yaml.h>

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
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

constexpr int64_t kMaxWeight = 1000;

// An entry's value: a tenant, or a mapping {tenant: NAME, weight: N}. Errors name the entry.
struct Entry {
  std::string tenant;
  int64_t weight = 1;
};
absl::StatusOr<Entry> ParseEntry(const YAML::Node& value, const std::string& where) {
  if (value.IsScalar()) return Entry{value.Scalar()};
  if (!value.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " must map a key (string) to a tenant (string) or to {tenant, weight}"));
  }
  Entry entry;
  bool named = false;
  const std::string weights = absl::StrCat("a whole number from 1 to ", kMaxWeight);
  for (const auto& field : value) {
    const std::string name = field.first.IsScalar() ? field.first.Scalar() : "";
    if (name == "tenant") {
      if (!field.second.IsScalar()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": tenant must be a string"));
      }
      entry.tenant = field.second.Scalar();
      named = true;
    } else if (name == "weight") {
      if (!field.second.IsScalar() || !absl::SimpleAtoi(field.second.Scalar(), &entry.weight) ||
          entry.weight < 1 || entry.weight > kMaxWeight) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": weight must be ", weights));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown field '", name.substr(0, 32),
                                                     "' (allowed: tenant, a string; weight, ",
                                                     weights, ")"));
    }
  }
  if (!named) return absl::InvalidArgumentError(absl::StrCat(where, ": tenant is missing"));
  return entry;
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
  std::map<std::string, int64_t> weights;  // every tenant's, 1 included
  int entry = 0;
  for (const auto& item : root) {
    ++entry;
    const std::string where = absl::StrCat("--api-keys ", path, ": entry ", entry);
    if (!item.first.IsScalar()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " must map a key (string) to a tenant (string) or to {tenant, weight}"));
    }
    absl::StatusOr<Entry> parsed = ParseEntry(item.second, where);
    if (!parsed.ok()) return parsed.status();
    const std::string key = item.first.Scalar(), tenant = parsed->tenant;
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
    // A share is the tenant's, not a key's: its keys must agree on the weight.
    const auto known = weights.emplace(tenant, parsed->weight).first;
    if (known->second != parsed->weight) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": weight ", parsed->weight, " differs from the weight ", known->second,
          " an earlier key gives tenant '", tenant, "' (every key of a tenant gives the same)"));
    }
  }
  for (const auto& [tenant, weight] : weights) {
    if (weight != 1) keys.weights_.emplace(tenant, weight);
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
