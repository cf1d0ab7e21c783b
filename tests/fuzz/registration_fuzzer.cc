// Registrations as the router's registry receives them (router/node_registry.h), with their
// cache events, from several certificate identities: the input is a sequence of records, each
// one byte choosing the caller's identity, two bytes of length (little-endian) and that many
// bytes of RegisterRequest. No input may crash, hang or leak, and the registry's promises hold:
// a node_id accepted from one identity is never accepted from another until it is forgotten, a
// per-node certificate registers only its instance, node_ids stay within their bounds, and
// once every node is forgotten nothing of them is left (entries and cache indexes).
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "baton/common/model_config.h"
#include "baton/common/security.h"
#include "baton/model/model_factory.h"
#include "baton/router/node_registry.h"

namespace {

// The callers: no TLS, role-only certificates of the old PKI, and per-node ones.
const char* const kIdentities[] = {"",
                                   "spiffe://baton/prefill",
                                   "spiffe://baton/prefill/a",
                                   "spiffe://baton/prefill/b",
                                   "spiffe://baton/decode",
                                   "spiffe://baton/decode/d",
                                   "spiffe://baton/kvstore/kvstore",
                                   "spiffe://baton/router"};
constexpr size_t kMaxRecords = 16;
constexpr size_t kMaxNodeIds = 6;
constexpr size_t kMaxPerIdentity = 3;

const std::vector<baton::router::ServedModel>& Models() {
  static const std::vector<baton::router::ServedModel> models = {
      {"", *baton::model::PresetConfig("tiny"), nullptr}};
  return models;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using baton::router::NodeRegistry;
  NodeRegistry registry(Models(), {.forget_after_ms = 60000,
                                   .max_node_ids = kMaxNodeIds,
                                   .max_node_ids_per_identity = kMaxPerIdentity});
  std::map<std::string, std::string> owner;  // node_id -> the identity it was accepted from
  size_t at = 0;
  for (size_t records = 0; records < kMaxRecords && at + 3 <= size; ++records) {
    const std::string identity = kIdentities[data[at] % std::size(kIdentities)];
    const size_t length = std::min<size_t>(data[at + 1] | (data[at + 2] << 8), size - at - 3);
    baton::v1::RegisterRequest request;
    const bool parsed = request.ParseFromArray(data + at + 3, static_cast<int>(length));
    at += 3 + length;
    if (!parsed) continue;
    bool resync = false;
    if (!registry.RegisterFrom(identity, request, &resync).ok()) continue;
    const std::string instance = baton::security::InstanceOfUri(identity);
    if (!instance.empty() && instance != request.node_id()) std::abort();
    auto [it, added] = owner.try_emplace(request.node_id(), identity);
    if (!added && it->second != identity) std::abort();
    if (registry.NodeIds() > kMaxNodeIds) std::abort();
  }
  registry.ForgetExpired(std::chrono::steady_clock::now() + std::chrono::hours(1));
  if (registry.NodeIds() != 0 || registry.cache_index().nodes() != 0) std::abort();
  return 0;
}
