#include "baton/common/api_keys.h"

#include <yaml-cpp/yaml.h>

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "baton/common/file_stamp.h"
#include "baton/common/log.h"
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
constexpr absl::string_view kHashedPrefix = "sha256:";

// A hashed entry's digest ("sha256:" and 64 hex digits, either case); nullopt for anything else.
std::optional<Sha256Digest> HashedKey(const std::string& key) {
  if (!absl::StartsWith(key, kHashedPrefix) || key.size() != kHashedPrefix.size() + 64) {
    return std::nullopt;
  }
  Sha256Digest digest{};
  for (size_t i = 0; i < digest.size(); ++i) {
    int byte = 0;
    for (char c : key.substr(kHashedPrefix.size() + 2 * i, 2)) {
      if (!absl::ascii_isxdigit(c)) return std::nullopt;
      byte = byte * 16 + (absl::ascii_isdigit(c) ? c - '0' : absl::ascii_tolower(c) - 'a' + 10);
    }
    digest[i] = static_cast<uint8_t>(byte);
  }
  return digest;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--api-keys ", path, ": cannot read"));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

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
  const std::string stamp = FileStamp(path);
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<ApiKeys> keys = Parse(*text, path);
  if (!keys.ok()) return keys.status();
  keys->state_->path = path;
  keys->state_->stamp = stamp;
  keys->state_->checked = std::chrono::steady_clock::now();
  return keys;
}

absl::StatusOr<ApiKeys> ApiKeys::Parse(const std::string& yaml, const std::string& path) {
  absl::StatusOr<Table> table = ParseTable(yaml, path);
  if (!table.ok()) return table.status();
  ApiKeys keys;
  keys.state_ = std::make_shared<Watched>();
  keys.state_->table = std::make_shared<const Table>(*std::move(table));
  return keys;
}

std::shared_ptr<const ApiKeys::Table> ApiKeys::Current() const {
  Watched& w = *state_;
  std::lock_guard<std::mutex> lock(w.mutex);
  const auto now = std::chrono::steady_clock::now();
  if (w.path.empty() || now - w.checked < std::chrono::seconds(1)) return w.table;
  w.checked = now;
  const std::string stamp = FileStamp(w.path);
  if (stamp == w.stamp) return w.table;
  w.stamp = stamp;
  absl::StatusOr<std::string> text = ReadFile(w.path);
  absl::StatusOr<Table> table =
      text.ok() ? ParseTable(*text, w.path) : absl::StatusOr<Table>(text.status());
  if (!table.ok()) {
    log::Warn("API keys not reloaded; the previous keys stay",
              {{"error", std::string(table.status().message())}});
    return w.table;
  }
  w.table = std::make_shared<const Table>(*std::move(table));
  log::Info("API keys reloaded",
            {{"file", w.path}, {"keys", static_cast<int64_t>(w.table->tenants.size())}});
  return w.table;
}

size_t ApiKeys::size() const { return Current()->tenants.size(); }

std::map<std::string, int64_t> ApiKeys::weights() const { return Current()->weights; }

int64_t ApiKeys::WeightOf(const std::string& tenant) const {
  const std::shared_ptr<const Table> table = Current();
  const auto it = table->weights.find(tenant);
  return it == table->weights.end() ? 1 : it->second;
}

absl::StatusOr<ApiKeys::Table> ApiKeys::ParseTable(const std::string& yaml,
                                                   const std::string& path) {
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
  Table keys;
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
    const std::optional<Sha256Digest> hashed = HashedKey(key);
    if (!hashed.has_value() && absl::StartsWith(key, kHashedPrefix)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--api-keys ", path, ": entry ", entry, ": a key written as ", kHashedPrefix,
          " must be followed by the 64 hex digits of the key's SHA-256"));
    }
    if (!hashed.has_value() && !ValidKey(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--api-keys ", path, ": entry ", entry, " (tenant '",
                       ValidTenant(tenant) ? tenant : "", "'): a key is ", kMinKeyBytes, " to ",
                       kMaxKeyBytes, " printable ASCII characters without spaces, or ",
                       kHashedPrefix, " and the 64 hex digits of its SHA-256"));
    }
    if (!ValidTenant(tenant)) {
      return absl::InvalidArgumentError(absl::StrCat("--api-keys ", path, ": entry ", entry,
                                                     ": a tenant is 1 to ", kMaxTenantBytes,
                                                     " characters of [A-Za-z0-9._-]"));
    }
    const Sha256Digest digest = hashed.value_or(Sha256Of(key.data(), key.size()));
    if (!keys.tenants.emplace(digest, tenant).second) {
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
    if (weight != 1) keys.weights.emplace(tenant, weight);
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
  const std::shared_ptr<const Table> table = Current();
  const auto tenant = table->tenants.find(Sha256Of(key.data(), key.size()));
  if (tenant == table->tenants.end()) {
    return absl::UnauthenticatedError("authorization: unknown API key");
  }
  return tenant->second;
}

}  // namespace baton
