#include "baton/router/node_registry.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <memory_resource>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "baton/common/log.h"
#include "baton/common/metrics.h"
#include "baton/common/security.h"
#include "baton/common/wire_bounds.h"
#include "baton/common/wire_names.h"
#include "baton/kvstore/prefill_placement.h"
#include "baton/router/routing.h"

namespace baton::router {
namespace {

using Clock = std::chrono::steady_clock;

// The IP of a gRPC peer ("ipv4:10.0.0.5:41234", "ipv6:[fd00::5]:41234"); "" for any other.
std::string PeerHost(const std::string& peer) {
  absl::string_view rest(peer);
  if (!absl::ConsumePrefix(&rest, "ipv4:") && !absl::ConsumePrefix(&rest, "ipv6:")) return "";
  const size_t colon = rest.rfind(':');
  if (colon == absl::string_view::npos) return "";
  absl::string_view host = rest.substr(0, colon);
  absl::ConsumePrefix(&host, "[");
  absl::ConsumeSuffix(&host, "]");
  return std::string(host);
}

// Refused or renamed registrations are logged once per node_id; past this many the memory is
// cleared (a bound, not a ledger).
constexpr size_t kMaxNoted = 4096;

// The certificate role a node of `role` must present.
std::optional<security::Role> CertificateRole(v1::NodeRole role) {
  switch (role) {
    case v1::NODE_ROLE_PREFILL:
      return security::Role::kPrefill;
    case v1::NODE_ROLE_DECODE:
      return security::Role::kDecode;
    case v1::NODE_ROLE_KVSTORE:
      return security::Role::kKvstore;
    default:
      return std::nullopt;
  }
}

// Bounds on what a node's load report may say: a day of predicted work (or of any time it
// measures), routers, and tokens per decode step.
constexpr double kMaxReportedWorkMs = 86400e3;
constexpr uint32_t kMaxReportedRouters = 1024;
// Shadow verification tallies a decode node reports (one per mode, keep bucket and hit).
constexpr int kMaxFidelityTallies = 64;
// A decode step's tokens per request: its drafts plus one (far fewer in practice).
constexpr double kMaxTokensPerStep = 1024;
// A decode node's steps' time over what its fits price them at (DecodeRates.step_stretch).
constexpr double kMaxStepStretch = 1e4;

// The memory registered nodes live in: one pool, so that they lie together. A prefill choice
// reads the first lines of every node; scattered across a heap of cache indexes (half a GiB at
// a thousand nodes), each would cost a TLB miss that the choice's prefetch cannot hide. Nodes
// are freed by whichever thread drops the last hold on one, hence the lock.
class NodeMemory final : public std::pmr::memory_resource {
 public:
  static std::pmr::memory_resource* Get() {
    static NodeMemory* memory = new NodeMemory();  // nodes may outlive any registry
    return memory;
  }

 private:
  void* do_allocate(size_t bytes, size_t alignment) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return pool_.allocate(bytes, alignment);
  }
  void do_deallocate(void* p, size_t bytes, size_t alignment) override {
    std::lock_guard<std::mutex> lock(mutex_);
    pool_.deallocate(p, bytes, alignment);
  }
  bool do_is_equal(const std::pmr::memory_resource& other) const noexcept override {
    return this == &other;
  }

  std::mutex mutex_;
  std::pmr::unsynchronized_pool_resource pool_{
      std::pmr::pool_options{.max_blocks_per_chunk = 256, .largest_required_pool_block = 8192}};
};

bool Contains(const std::vector<std::string>& ids, const std::string& id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// A decode node's shadow verification tallies (LoadReport.fidelity): bounded in number, each
// mode one the node can serve truncated, and every figure a count or finite sum that fits.
absl::Status CheckFidelityReport(const v1::FidelityReport& report) {
  if (report.tallies_size() > kMaxFidelityTallies) {
    return absl::InvalidArgumentError(absl::StrCat("load.fidelity.tallies: ", report.tallies_size(),
                                                   " entries; at most ", kMaxFidelityTallies));
  }
  if (!(report.cpu_seconds() >= 0 && report.cpu_seconds() <= 1e12)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "load.fidelity.cpu_seconds: ", report.cpu_seconds(), " must be finite and in [0, 1e12]"));
  }
  for (const v1::FidelityTally& t : report.tallies()) {
    if (t.mode() != "compact" && t.mode() != "mask") {
      return absl::InvalidArgumentError(
          "load.fidelity.tallies.mode: must be \"compact\" or \"mask\"");
    }
    if (t.top1_disagreements() > t.positions()) {
      return absl::InvalidArgumentError(
          absl::StrCat("load.fidelity.tallies.top1_disagreements: ", t.top1_disagreements(),
                       " exceeds positions (", t.positions(), ")"));
    }
    if (!(t.kl_sum() >= 0 && t.kl_sum() <= 1e18) ||
        !(t.max_logit_diff() >= 0 && t.max_logit_diff() <= 1e18)) {
      return absl::InvalidArgumentError(
          "load.fidelity.tallies: kl_sum and max_logit_diff must be finite and in [0, 1e18]");
    }
  }
  return absl::OkStatus();
}
// The request's fields within their bounds, and a UCX address only from a prefill node.
absl::Status CheckRegistration(const v1::RegisterRequest& request) {
  if (request.node_id().empty() || request.address().empty()) {
    return absl::InvalidArgumentError("node_id and address: both are required");
  }
  for (absl::Status s :
       {CheckBytes("node_id", request.node_id(), kMaxNodeIdBytes),
        CheckBytes("address", request.address(), kMaxAddressBytes),
        CheckBytes("model_fingerprint", request.model_fingerprint(), kMaxFingerprintBytes),
        CheckBytes("model_name", request.model_name(), kMaxModelNameBytes),
        CheckBytes("config_digest", request.config_digest(), kMaxFingerprintBytes),
        CheckBytes("build_version", request.build_version(), kMaxModelNameBytes),
        CheckBytes("ucx_worker_address", request.ucx_worker_address(), kMaxUcxAddressBytes)}) {
    if (!s.ok()) return s;
  }
  if (!request.ucx_worker_address().empty() && request.role() != v1::NODE_ROLE_PREFILL) {
    return absl::InvalidArgumentError("ucx_worker_address: only a prefill node registers one");
  }
  const v1::LoadReport& load = request.load();
  if (!(load.prefill_work_ms() >= 0 && load.prefill_work_ms() <= kMaxReportedWorkMs)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "load.prefill_work_ms: ", load.prefill_work_ms(), " must be finite and in [0, ",
        kMaxReportedWorkMs, "] (milliseconds of predicted work)"));
  }
  if (load.routers() > kMaxReportedRouters) {
    return absl::InvalidArgumentError(
        absl::StrCat("load.routers: ", load.routers(), " is more than ", kMaxReportedRouters));
  }
  // Each of a decode node's rates within its bound: times within a day of milliseconds, tokens
  // per step and the step stretch (with its quantiles) within theirs.
  const v1::DecodeRates& decode = load.decode_rates();
  struct Bounded {
    const char* field;
    double value;
    double most;
    const char* unit;
  };
  for (const Bounded& b : std::initializer_list<Bounded>{
           {"step_fixed_ms", decode.step_fixed_ms(), kMaxReportedWorkMs, " (milliseconds)"},
           {"step_per_row_ms", decode.step_per_row_ms(), kMaxReportedWorkMs, " (milliseconds)"},
           {"replay_ms_per_gflop", decode.replay_ms_per_gflop(), kMaxReportedWorkMs,
            " (milliseconds)"},
           {"replay_piece_fixed_ms", decode.replay_piece_fixed_ms(), kMaxReportedWorkMs,
            " (milliseconds)"},
           {"replay_piece_row_ms", decode.replay_piece_row_ms(), kMaxReportedWorkMs,
            " (milliseconds)"},
           {"tokens_per_step", decode.tokens_per_step(), kMaxTokensPerStep, ""},
           {"step_stretch", decode.step_stretch(), kMaxStepStretch, ""},
           {"step_stretch_p10", decode.step_stretch_p10(), kMaxStepStretch, ""},
           {"step_stretch_p50", decode.step_stretch_p50(), kMaxStepStretch, ""},
           {"step_stretch_p90", decode.step_stretch_p90(), kMaxStepStretch, ""},
           {"step_stretch_p99", decode.step_stretch_p99(), kMaxStepStretch, ""}}) {
    if (!(b.value >= 0 && b.value <= b.most)) {
      return absl::InvalidArgumentError(absl::StrCat("load.decode_rates.", b.field, ": ", b.value,
                                                     " must be finite and in [0, ", b.most, "]",
                                                     b.unit));
    }
  }
  return CheckFidelityReport(load.fidelity());
}

// The layers a node holds against what this router's split needs of its role.
absl::Status CheckHeldLayers(const v1::RegisterRequest& request, v1::Split split) {
  if (request.role() == v1::NODE_ROLE_KVSTORE) return absl::OkStatus();
  const bool producers = request.held_layers() == v1::HELD_LAYERS_PRODUCERS;
  const char* held = producers ? "the producer layers only" : "every layer";
  if (request.role() == v1::NODE_ROLE_DECODE) {
    if (!producers) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("held_layers: decode node ", request.node_id(), " holds ", held,
                     "; a decode node must hold every layer under either split"));
  }
  const bool needs_producers = split == v1::SPLIT_REPLAY_ON_DECODE;
  if (producers == needs_producers) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("held_layers: prefill node ", request.node_id(), " holds ", held, " (--split ",
                   producers ? "replay-on-decode" : "prefill-all", "); this router runs --split ",
                   SplitName(split), ", whose prefill nodes hold ",
                   needs_producers ? "the producer layers only" : "every layer"));
}

}  // namespace

absl::StatusOr<size_t> ResolveServedModel(const std::vector<ServedModel>& models,
                                          const std::string& name) {
  if (name.empty()) return 0;
  if (absl::Status s = CheckBytes("model", name, kMaxModelNameBytes); !s.ok()) return s;
  std::string served;
  for (size_t i = 0; i < models.size(); ++i) {
    if (models[i].name == name) return i;
    absl::StrAppend(&served, i == 0 ? "" : ", ", "'", models[i].name, "'");
  }
  // A router of one unnamed model serves it under any name.
  if (models.size() == 1 && models[0].name.empty()) return 0;
  return absl::NotFoundError(
      absl::StrCat("model: '", name, "' is not served here; this router serves ", served));
}

NodeLease& NodeLease::operator=(NodeLease&& other) noexcept {
  if (this != &other) {
    Reset();
    registry_ = other.registry_;
    node_ = std::move(other.node_);
    other.node_ = nullptr;
  }
  return *this;
}

void NodeLease::Reset() {
  if (node_ != nullptr && registry_ != nullptr) registry_->Finished(*node_);
  node_ = nullptr;
}

NodeRegistry::NodeRegistry(const std::vector<ServedModel>& models, const Options& options)
    : models_(models),
      options_(options),
      registrations_(metrics::Counter(
          "baton_node_registrations_total",
          "Nodes that joined, by role: new, back with another address or identity, or heard "
          "from again after they expired or were marked down")),
      node_ids_(metrics::Gauge("baton_router_node_ids",
                               "Node ids the router holds, live or not (each is forgotten "
                               "--node-forget-after-ms after it was last heard from)")
                    .Add({})),
      forgotten_(metrics::Counter("baton_router_nodes_forgotten_total",
                                  "Node ids forgotten after --node-forget-after-ms of silence")
                     .Add({})) {
  for (const ServedModel& model : models_) config_digests_.push_back(ConfigDigest(model.config));
}

const char* NodeRegistry::RoleLabel(v1::NodeRole role) {
  const std::optional<security::Role> certificate = CertificateRole(role);
  return certificate.has_value() ? security::RoleName(*certificate) : "unknown";
}

bool NodeRegistry::Live(const RegisteredNode& node, Clock::time_point now) const {
  return now - node.last_seen <= std::chrono::milliseconds(options_.node_ttl_ms);
}

void NodeRegistry::ExpectCached(const RegisteredNode& node, std::span<const Sha256Digest> chain,
                                std::span<const kvstore::WriteBackStep> steps) {
  {
    std::lock_guard<std::mutex> lock(mutex_);  // a heartbeat replaces info.load() in place
    if (node.info.load().block_cache_budget_bytes() == 0) return;
  }
  cache_index_.Expect(node.id(), chain, steps, NowMs() + 3.0 * options_.heartbeat_ms);
}

double NodeRegistry::NowMs() const {
  if (options_.now_ms) return options_.now_ms();
  return std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch()).count();
}

absl::StatusOr<size_t> NodeRegistry::ModelOf(const v1::RegisterRequest& request,
                                             bool* renamed) const {
  // A prefill or decode node serves one of this router's models, with that model's config. A
  // router of one model takes a node of another name (nodes name their model after their own
  // directory by default) when the config is the same.
  size_t model = 0;
  if (!request.model_name().empty() && !(models_.size() == 1 && models_[0].name.empty())) {
    absl::StatusOr<size_t> found = ResolveServedModel(models_, request.model_name());
    if (found.ok()) {
      model = *found;
    } else if (models_.size() == 1) {
      *renamed = true;
    } else {
      return absl::FailedPreconditionError(
          absl::StrCat("model_name: node ", request.node_id(), " serves '", request.model_name(),
                       "', which this router does not; ", found.status().message()));
    }
  }
  if (!request.config_digest().empty() && request.config_digest() != config_digests_[model]) {
    return absl::FailedPreconditionError(absl::StrCat(
        "config_digest: node ", request.node_id(), "'s model config differs from the one ",
        "this router serves as '", models_[model].name,
        "' (another config needs a name of its own: --served-model-name)"));
  }
  return model;
}

void NodeRegistry::NoteRefused(const v1::RegisterRequest& request, const absl::Status& refused) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (refused_nodes_.size() >= kMaxNoted) refused_nodes_.clear();
  if (!refused_nodes_.insert(request.node_id()).second) return;
  if (!refused.ok()) {
    log::Warn("node refused", {{"node", request.node_id()},
                               {"error", std::string(refused.message())},
                               {"message", std::string(refused.message())}});
    return;
  }
  const std::string message =
      absl::StrCat("node ", request.node_id(), " registers as '", request.model_name(),
                   "'; this router serves one model, '", models_[0].name,
                   "', of the same config, and takes it as that");
  log::Warn("node of another model name taken",
            {{"node", request.node_id()}, {"message", message}});
}

absl::Status NodeRegistry::Register(const grpc::ServerContextBase& context,
                                    const v1::RegisterRequest& request, bool* cache_resync) {
  const std::optional<security::Role> role = CertificateRole(request.role());
  if (!role) return absl::InvalidArgumentError("role: must be PREFILL, DECODE or KVSTORE");
  // A node registers only as the role its certificate names.
  if (absl::Status s = security::Authorize(context, {*role}, "Registry/Register"); !s.ok()) {
    return s;
  }
  return RegisterFrom(security::PeerIdentity(context), request, cache_resync,
                      PeerHost(context.peer()));
}

std::string NodeRegistry::BindingOf(const std::string& identity, const std::string& peer_host) {
  if (identity.empty() || !security::InstanceOfUri(identity).empty() || peer_host.empty()) {
    return identity;
  }
  return absl::StrCat(identity, " at ", peer_host);
}

absl::StatusOr<size_t> NodeRegistry::CheckRequest(const std::string& identity,
                                                  const v1::RegisterRequest& request) {
  const std::optional<security::Role> role = CertificateRole(request.role());
  if (!role) return absl::InvalidArgumentError("role: must be PREFILL, DECODE or KVSTORE");
  // Register has authorized the role already; a caller of RegisterFrom may not have.
  if (!identity.empty() && security::RoleOfUri(identity) != role) {
    return absl::PermissionDeniedError(absl::StrCat("role: the caller's certificate ", identity,
                                                    " does not name the role ",
                                                    security::RoleName(*role)));
  }
  if (absl::Status s = CheckRegistration(request); !s.ok()) return s;
  if (request.has_cache_events() && request.role() != v1::NODE_ROLE_PREFILL) {
    return absl::InvalidArgumentError("cache_events: only a prefill node sends them");
  }
  if (absl::Status s = CheckCacheEvents(request.cache_events()); !s.ok()) return s;
  if (!v1::HeldLayers_IsValid(request.held_layers())) {
    return absl::InvalidArgumentError("held_layers: must be ALL or PRODUCERS");
  }
  // A certificate of its own names the one node it may speak for: its instance is the node_id.
  if (const std::string instance = security::InstanceOfUri(identity);
      !instance.empty() && instance != request.node_id()) {
    log::Warn("node_id of another instance refused",
              {{"node", request.node_id()}, {"identity", identity}});
    return absl::PermissionDeniedError(absl::StrCat(
        "node_id: '", request.node_id(), "' is not the instance '", instance,
        "' that the caller's certificate ", identity, " names; a node registers as its instance"));
  }
  if (absl::Status s = CheckHeldLayers(request, options_.split); !s.ok()) {
    NoteRefused(request, s);
    return s;
  }
  if (request.role() == v1::NODE_ROLE_KVSTORE) return 0;
  bool renamed = false;
  absl::StatusOr<size_t> served = ModelOf(request, &renamed);
  if (!served.ok() || renamed) NoteRefused(request, served.status());
  return served;
}

absl::Status NodeRegistry::CheckBindingLocked(const std::string& identity,
                                              const std::string& binding,
                                              const std::string& node_id, Clock::time_point now) const {
  const std::string caller = binding.empty() ? "none (no TLS)" : binding;
  // A node_id belongs to the identity that first registered it (and, for a role-only
  // certificate, to the address it registered from): another certificate or another pod
  // cannot take it over, drain it or speak in its name while it lives. Once it has expired,
  // its node_id may be registered again (a pod back at another address).
  if (auto bound = nodes_.find(node_id); bound != nodes_.end()) {
    if (bound->second->binding == binding) return absl::OkStatus();
    const RegisteredNode& held = *bound->second;
    if (held.identity == identity && now - held.last_heard > std::chrono::milliseconds(options_.node_ttl_ms)) return absl::OkStatus();
    log::Warn("node_id takeover refused", {{"node", node_id}, {"identity", caller}});
    return absl::PermissionDeniedError(absl::StrCat("node_id: '", node_id,
                                                    "' is registered to another identity than "
                                                    "the caller's, ",
                                                    caller));
  }
  if (nodes_.size() >= options_.max_node_ids) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "node_id: '", node_id, "' is refused: the router holds ", nodes_.size(),
        " node_ids, its bound (--max-node-ids ", options_.max_node_ids,
        "); silent ones are forgotten after --node-forget-after-ms ", options_.forget_after_ms));
  }
  if (auto held = node_ids_by_identity_.find(identity);
      !identity.empty() && held != node_ids_by_identity_.end() &&
      held->second >= options_.max_node_ids_per_identity) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "node_id: '", node_id, "' is refused: identity ", identity, " holds ", held->second,
        " node_ids, the bound per identity (--max-node-ids-per-identity ",
        options_.max_node_ids_per_identity, ")"));
  }
  return absl::OkStatus();
}

void NodeRegistry::UpdateLocked(const std::string& identity, const std::string& binding,
                                size_t model, const v1::RegisterRequest& request,
                                Clock::time_point now) {
  auto [it, added] = nodes_.try_emplace(request.node_id());
  if (added) ++node_ids_by_identity_[identity];
  std::shared_ptr<RegisteredNode>& node = it->second;
  // An expired node's id taken again from elsewhere (CheckBindingLocked) is a new node.
  if (node != nullptr && node->binding != binding) node.reset();
  // Requests in flight read a node's fixed fields without the lock, so a node that comes
  // back different is a new RegisteredNode; a heartbeat of the same node only refreshes its
  // load and drain flag. (Its identity never changes: CheckBindingLocked.)
  if (node == nullptr || node->info.address() != request.address() ||
      node->info.role() != request.role() ||
      node->info.model_fingerprint() != request.model_fingerprint() ||
      node->info.model_name() != request.model_name() ||
      node->info.ucx_worker_address() != request.ucx_worker_address() ||
      node->info.held_layers() != request.held_layers() ||
      node->info.state_format_version() != request.state_format_version()) {
    node = std::allocate_shared<RegisteredNode>(
        std::pmr::polymorphic_allocator<RegisteredNode>(NodeMemory::Get()));
    ++roster_version_;
    node->model = static_cast<uint32_t>(model);  // one of models_, a handful
    // The router sends prompts and state only to a server that proves the registered role.
    node->channel = security::InternalChannel(request.address(), *CertificateRole(request.role()));
    // A store node is connected to now: a prompt's probe has --lookup-timeout-ms (200 ms) for
    // its answer, too little on a busy machine for the connection and its TLS handshake too.
    if (request.role() == v1::NODE_ROLE_KVSTORE) node->channel->GetState(/*try_to_connect=*/true);
    node->identity = identity;
    node->binding = binding;
    node->info = request;
    // Its cache events go to the cache index, not into the node's entry: a node's first
    // registration carries its whole snapshot.
    node->info.clear_cache_events();
    node->pairing_key = PairingKey(request);
    node->id_hash = ChainHolders::IdHash(request.node_id());
    node->fingerprint = InternFingerprintLocked(request.model_fingerprint());
    node->producers_only = request.held_layers() == v1::HELD_LAYERS_PRODUCERS;
    node->NoteLoad(request.load(), NowMs());
    node->draining = request.draining();
    log::Info("node registered",
              {{"node", request.node_id()},
               {"role", v1::NodeRole_Name(request.role())},
               {"address", request.address()},
               {"message", absl::StrCat("node ", request.node_id(), " registered")}});
  } else {
    *node->info.mutable_load() = request.load();
    node->NoteLoad(request.load(), NowMs());
    node->pending_at_report_ms = node->prefills.Ahead(NowMs()) + node->ended_since_report_ms;
    node->ended_since_report_ms = 0;
    node->info.set_weight_bytes(request.weight_bytes());
    node->info.set_build_version(request.build_version());
    if (request.draining() && !node->draining) {
      log::Info("node draining", {{"node", request.node_id()},
                                  {"role", v1::NodeRole_Name(request.role())},
                                  {"message", absl::StrCat("node ", request.node_id(),
                                                           " is draining: no new requests go "
                                                           "there")}});
    }
    node->draining = request.draining();
  }
  // A new node's last_seen is the epoch, as is a marked-down one's.
  if (!Live(*node, now)) registrations_.Add({{"role", RoleLabel(request.role())}}).Increment();
  node->last_seen = now;
  node->last_heard = now;
}

absl::Status NodeRegistry::RegisterFrom(const std::string& identity,
                                        const v1::RegisterRequest& request, bool* cache_resync,
                                        const std::string& peer_host) {
  const std::string binding = BindingOf(identity, peer_host);
  absl::StatusOr<size_t> model = CheckRequest(identity, request);
  if (!model.ok()) return model.status();
  const Clock::time_point now = Clock::now();
  std::vector<std::string> forgotten;
  absl::Status bound;
  bool role_only = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    role_only = !identity.empty() && security::InstanceOfUri(identity).empty() &&
                role_only_noted_.insert(identity).second;
    if (now - last_forget_ >= std::chrono::seconds(1)) forgotten = ForgetLocked(now);
    bound = CheckBindingLocked(identity, binding, request.node_id(), now);
    if (bound.ok()) UpdateLocked(identity, binding, *model, request, now);
    node_ids_.Set(static_cast<double>(nodes_.size()));
  }
  Forgot(forgotten);
  if (role_only) {
    log::Warn("role-only certificate",
              {{"identity", identity},
               {"message", absl::StrCat("nodes register with the role-only certificate ", identity,
                                        ": their node_ids are bound to the role, not to one node; "
                                        "issue one certificate per node, "
                                        "spiffe://baton/<role>/<node_id> (docs/deploy.md)")}});
  }
  if (!bound.ok()) {
    // A takeover is logged at each attempt (CheckBindingLocked); a cap once per node_id.
    if (absl::IsResourceExhausted(bound)) NoteRefused(request, bound);
    return bound;
  }
  if (request.has_cache_events() &&
      !cache_index_.Apply(request.node_id(), request.cache_events(), NowMs()) &&
      cache_resync != nullptr) {
    *cache_resync = true;
  }
  if (on_change_) on_change_();
  return absl::OkStatus();
}

std::vector<std::string> NodeRegistry::ForgetLocked(Clock::time_point now) {
  last_forget_ = now;
  std::vector<std::string> forgotten;
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    if (now - it->second->last_heard <= std::chrono::milliseconds(options_.forget_after_ms)) {
      ++it;
      continue;
    }
    // A request holding the node keeps its RegisteredNode (a shared_ptr) until it ends.
    auto held = node_ids_by_identity_.find(it->second->identity);
    if (held != node_ids_by_identity_.end() && --held->second == 0) {
      node_ids_by_identity_.erase(held);
    }
    // Its cache index goes under the lock, so that a node registering again with the same
    // node_id meanwhile never has its fresh index taken away.
    cache_index_.Forget(it->first);
    forgotten.push_back(it->first);
    it = nodes_.erase(it);
    ++roster_version_;
  }
  return forgotten;
}

void NodeRegistry::Forgot(const std::vector<std::string>& node_ids) {
  if (node_ids.empty()) return;
  std::string named;
  for (size_t i = 0; i < node_ids.size(); ++i) {
    // The first few by name: a bound on the line, not a ledger.
    if (i < 8) absl::StrAppend(&named, i == 0 ? "" : ", ", node_ids[i]);
  }
  if (node_ids.size() > 8) absl::StrAppend(&named, ", ...");
  forgotten_.Increment(static_cast<double>(node_ids.size()));
#if defined(__GLIBC__)
  // A node's cache index is many small blocks, freed into malloc's arenas, which glibc keeps
  // unless asked: a router that forgot nodes gives their memory back (at most once a second).
  malloc_trim(0);
#endif
  log::Info("nodes forgotten",
            {{"nodes", node_ids.size()},
             {"message", absl::StrCat("forgot ", node_ids.size(), " node(s) not heard from for ",
                                      options_.forget_after_ms, " ms: ", named)}});
}

size_t NodeRegistry::ForgetExpired(Clock::time_point now) {
  std::vector<std::string> forgotten;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    forgotten = ForgetLocked(now);
    node_ids_.Set(static_cast<double>(nodes_.size()));
  }
  Forgot(forgotten);
  return forgotten.size();
}

size_t NodeRegistry::NodeIds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return nodes_.size();
}

std::string NodeRegistry::PairingKey(const v1::RegisterRequest& node) {
  return absl::StrCat(node.model_fingerprint(), "/format-", node.state_format_version());
}

NodeLease NodeRegistry::Pick(v1::NodeRole role, const std::vector<std::string>& exclude,
                             const std::string& pairs_with) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::shared_ptr<RegisteredNode>> candidates;
  std::vector<NodeLoad> loads;
  // Only the nodes of the role: a decode node is picked among the decode nodes, not among a
  // thousand prefill nodes too.
  auto add = [&](const std::shared_ptr<RegisteredNode>& node) {
    candidates.push_back(node);
    loads.push_back({.id = node->id(),
                     .role = node->info.role(),
                     .last_seen = node->last_seen,
                     .inflight = node->inflight,
                     .queued = node->info.load().queued_requests(),
                     .free_pages = node->info.load().free_pages(),
                     .draining = node->draining,
                     .fingerprint = node->pairing_key});
  };
  const Roster& roster = RosterLocked();
  if (role == v1::NODE_ROLE_DECODE || role == v1::NODE_ROLE_PREFILL) {
    for (const RosterEntry& entry : role == v1::NODE_ROLE_DECODE ? roster.decode : roster.prefill) {
      add(entry.node);
    }
  } else {
    for (const auto& [id, node] : nodes_) add(node);
  }
  const int64_t chosen = SelectNode(loads, role, exclude, Clock::now(),
                                    std::chrono::milliseconds(options_.node_ttl_ms), pairs_with);
  if (chosen < 0) return {};
  ++candidates[chosen]->inflight;
  return NodeLease(this, candidates[chosen]);
}

void RegisteredNode::NoteLoad(const v1::LoadReport& load, double now_ms) {
  const v1::PrefillRates& r = load.rates();
  // Its rates are fresh while it measures prefills or has work to: a node busy with one long
  // prefill measures nothing new until it ends, and is not idle.
  const bool fresh = reported.measured_at_ms == 0 || r.samples() != reported.samples ||
                     load.prefill_work_ms() > 0 || load.queued_requests() > 0;
  reported = {.rates = {.compute_ms_per_gflop = r.compute_ms_per_gflop(),
                        .local_ms_per_mib = r.local_ms_per_mib(),
                        .store_ms_per_mib = r.store_ms_per_mib(),
                        .fixed_ms = r.fixed_ms()},
              .prefill_work_ms = load.prefill_work_ms(),
              .queued_requests = load.queued_requests(),
              .replay_ms_per_gflop = load.decode_rates().replay_ms_per_gflop(),
              .routers = load.routers(),
              .samples = r.samples(),
              .measured_at_ms = fresh ? now_ms : reported.measured_at_ms};
  reported.rate_logs = kvstore::LogsOf(reported.rates);
}

std::shared_ptr<const std::string> NodeRegistry::InternFingerprintLocked(
    const std::string& fingerprint) {
  std::weak_ptr<const std::string>& slot = fingerprints_[fingerprint];
  if (std::shared_ptr<const std::string> held = slot.lock()) return held;
  auto made = std::make_shared<const std::string>(fingerprint);
  slot = made;
  // Those no node holds any more go as a new one comes: the map stays within the nodes' own.
  std::erase_if(fingerprints_, [](const auto& entry) { return entry.second.expired(); });
  return made;
}

uint32_t NodeRegistry::Roster::Intern(const std::string& text) {
  return interned.try_emplace(text, static_cast<uint32_t>(interned.size())).first->second;
}

const NodeRegistry::Roster& NodeRegistry::RosterLocked() const {
  if (roster_.version == roster_version_) return roster_;
  roster_.prefill.clear();
  roster_.decode.clear();
  roster_.store.clear();
  roster_.interned.clear();
  for (const auto& [id, node] : nodes_) {
    const v1::NodeRole role = node->info.role();
    std::vector<RosterEntry>* list = role == v1::NODE_ROLE_PREFILL   ? &roster_.prefill
                                     : role == v1::NODE_ROLE_DECODE  ? &roster_.decode
                                     : role == v1::NODE_ROLE_KVSTORE ? &roster_.store
                                                                     : nullptr;
    if (list == nullptr) continue;
    list->push_back({.node = node,
                     .pairing = roster_.Intern(node->pairing_key),
                     .fingerprint = roster_.Intern(node->info.model_fingerprint())});
  }
  roster_.version = roster_version_;
  return roster_;
}

NodeRegistry::PrefillChoice NodeRegistry::ChoosePrefill(size_t model,
                                                        const std::string& fingerprint,
                                                        const std::vector<std::string>& exclude,
                                                        const std::vector<std::string>& lost_decode,
                                                        int64_t slots) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  const double now_ms = NowMs();
  const Roster& roster = RosterLocked();
  // The weights and formats a live decode node takes: a prefill node is of use only with a
  // partner.
  std::vector<char> decodable(roster.interned.size(), 0);
  // Replay-on-decode replays on the decode node: priced at the mean of what the partners
  // measured (0, none measured: at the prefill node's compute rate).
  double replay_sum = 0;
  int replay_count = 0;
  for (const RosterEntry& entry : roster.decode) {
    const RegisteredNode& node = *entry.node;
    if (!node.draining && node.model == model && Live(node, now) &&
        (lost_decode.empty() || !Contains(lost_decode, node.id()))) {
      decodable[entry.pairing] = 1;
      if (const double rate = node.reported.replay_ms_per_gflop; rate > 0) {
        replay_sum += rate;
        ++replay_count;
      }
    }
  }
  const double decode_replay_ms_per_gflop = replay_count > 0 ? replay_sum / replay_count : 0;
  // The fingerprint asked for, as the roster numbers it (none: no node carries it).
  std::optional<uint32_t> wanted;
  if (!fingerprint.empty()) {
    auto it = roster.interned.find(fingerprint);
    wanted = it == roster.interned.end() ? ~uint32_t{0} : it->second;
  }
  PrefillChoice choice;
  // Each node is priced at its own rates as far as its evidence goes (kvstore::RateEvidence:
  // how many prefills they measured, and how long ago), and at its live peers' for the rest: a
  // node that has measured nothing yet (just started) is priced like its peers, and one that
  // got no work for a while drifts back to them (the cost model's priors only when no node has
  // measured a rate). One pass over the nodes gathers both.
  kvstore::PooledRates pool;
  std::vector<double> evidence;
  std::vector<const kvstore::RateLogs*> logs;  // the open nodes', held by `choice.open`'s nodes
  const std::vector<RosterEntry>& prefill = roster.prefill;
  for (size_t i = 0; i < prefill.size(); ++i) {
    // The nodes lie apart in memory: the next few are fetched while this one is read.
    if (i + 4 < prefill.size()) {
      const char* ahead = reinterpret_cast<const char*>(prefill[i + 4].node.get());
      __builtin_prefetch(ahead);
      __builtin_prefetch(ahead + 64);
      __builtin_prefetch(ahead + 128);
      __builtin_prefetch(ahead + 191);  // its first fields span 192 bytes, aligned or not
    }
    const RosterEntry& entry = prefill[i];
    const RegisteredNode& node = *entry.node;
    if (node.model != model || !Live(node, now)) continue;
    const kvstore::PrefillRates& r = node.reported.rates;
    // This router's own prefills there are work the node's next report will measure.
    const double idle_ms = node.prefills.count > 0 ? 0 : now_ms - node.reported.measured_at_ms;
    const double node_evidence = kvstore::RateEvidence(node.reported.samples, idle_ms);
    pool.Add(r, node.reported.rate_logs, node_evidence);
    if (node.draining || (wanted.has_value() && entry.fingerprint != *wanted) ||
        !decodable[entry.pairing] || (!exclude.empty() && Contains(exclude, node.id()))) {
      continue;
    }
    ++choice.live;
    if (node.prefills.count >= kvstore::RouterSlotShare(slots, node.reported.routers)) continue;
    choice.open.push_back(
        {.node = entry.node,
         .prefilling = node.prefills.count,
         .pending_ms = kvstore::QueueAhead(
             node.prefills.Ahead(now_ms), node.reported.prefill_work_ms, node.pending_at_report_ms),
         .reported_queued = node.reported.queued_requests,
         .rates = r,
         .replay_ms_per_gflop = node.producers_only ? decode_replay_ms_per_gflop : 0});
    evidence.push_back(node_evidence);
    logs.push_back(&node.reported.rate_logs);
  }
  const kvstore::PrefillRates pooled = pool.Pooled(kvstore::DefaultPrefillRates());
  const kvstore::RateLogs pooled_logs = kvstore::LogsOf(pooled);
  for (size_t i = 0; i < choice.open.size(); ++i) {
    choice.open[i].rates =
        kvstore::CredibleRates(choice.open[i].rates, *logs[i], evidence[i], pooled, pooled_logs);
  }
  return choice;
}

NodeLease NodeRegistry::TakePrefillSlot(const std::shared_ptr<RegisteredNode>& node,
                                        double predicted_ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  node->prefills.Took(predicted_ms, NowMs());
  ++node->inflight;
  return NodeLease(this, node);
}

void NodeRegistry::PrefillDone(RegisteredNode& node, double predicted_ms) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    node.prefills.Ended(predicted_ms, NowMs());
    node.ended_since_report_ms += predicted_ms;
  }
  if (on_change_) on_change_();
}

void NodeRegistry::Finished(RegisteredNode& node) {
  std::lock_guard<std::mutex> lock(mutex_);
  --node.inflight;
}

int64_t NodeRegistry::DecodeSlots(size_t model) const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t slots = 0;
  const auto now = Clock::now();
  for (const RosterEntry& entry : RosterLocked().decode) {
    const RegisteredNode& node = *entry.node;
    if (!node.draining && node.model == model && Live(node, now)) {
      slots += node.info.load().total_slots();
    }
  }
  return slots;
}

void NodeRegistry::MarkDown(const std::string& node_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = nodes_.find(node_id);
  if (it != nodes_.end()) it->second->last_seen = Clock::time_point{};
}

bool NodeRegistry::AnyDecode(size_t model, const std::vector<std::string>& exclude) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  for (const RosterEntry& entry : RosterLocked().decode) {
    const RegisteredNode& node = *entry.node;
    if (!node.draining && node.model == model && Live(node, now) && !Contains(exclude, node.id())) {
      return true;
    }
  }
  return false;
}

bool NodeRegistry::Serving() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  const Roster& roster = RosterLocked();
  auto live = [&](const RosterEntry& entry) {
    return !entry.node->draining && Live(*entry.node, now);
  };
  std::vector<char> decodable(roster.interned.size(), 0);
  for (const RosterEntry& entry : roster.decode) {
    if (live(entry)) decodable[entry.pairing] = 1;
  }
  bool paired = false;
  for (const RosterEntry& entry : roster.prefill) paired |= live(entry) && decodable[entry.pairing];
  bool kvstore = false;
  for (const RosterEntry& entry : roster.store) kvstore |= live(entry);
  // The store is needed to become ready, not to stay ready: a store lost later makes requests
  // cold, never the router unready (DESIGN section 6).
  if (kvstore) kvstore_seen_ = true;
  return paired && (kvstore_seen_ || !options_.require_kvstore);
}

std::vector<NodeRegistry::WeightBytes> NodeRegistry::ResidentWeightBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  std::vector<WeightBytes> bytes(models_.size());
  for (const auto& [id, node] : nodes_) {
    if (node->info.role() == v1::NODE_ROLE_KVSTORE || !Live(*node, now)) continue;
    uint64_t& held = node->info.role() == v1::NODE_ROLE_PREFILL ? bytes[node->model].prefill
                                                                : bytes[node->model].decode;
    held = std::max(held, node->info.weight_bytes());
  }
  return bytes;
}

std::vector<std::set<std::string>> NodeRegistry::ServedFingerprints() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  // Paired by PairingKey; reported by fingerprint.
  // A router asks this for each request: the roster's interned keys, each fingerprint once.
  const Roster& roster = RosterLocked();
  std::vector<std::vector<char>> decodable(models_.size(),
                                           std::vector<char>(roster.interned.size(), 0));
  for (const RosterEntry& entry : roster.decode) {
    const RegisteredNode& node = *entry.node;
    if (!node.draining && Live(node, now)) decodable[node.model][entry.pairing] = 1;
  }
  std::vector<std::set<std::string>> served(models_.size());
  std::vector<std::vector<char>> added(models_.size(),
                                       std::vector<char>(roster.interned.size(), 0));
  for (const RosterEntry& entry : roster.prefill) {
    const RegisteredNode& node = *entry.node;
    if (node.draining || !Live(node, now) || !decodable[node.model][entry.pairing] ||
        added[node.model][entry.fingerprint]) {
      continue;
    }
    added[node.model][entry.fingerprint] = 1;
    served[node.model].insert(node.info.model_fingerprint());
  }
  return served;
}

std::vector<NodeRegistry::VersionCount> NodeRegistry::LiveByVersion() const {
  std::map<std::tuple<std::string, std::string, uint32_t>, double> counts;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  for (const auto& [id, node] : nodes_) {
    if (!Live(*node, now)) continue;
    counts[{RoleLabel(node->info.role()), node->info.build_version(),
            node->info.state_format_version()}] += 1;
  }
  std::vector<VersionCount> out;
  for (const auto& [key, n] : counts) {
    out.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key), n});
  }
  return out;
}

std::vector<NodeRegistry::ModelCount> NodeRegistry::LiveByModel() const {
  std::map<std::tuple<std::string, std::string, std::string>, double> counts;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  for (const auto& [id, node] : nodes_) {
    const v1::NodeRole role = node->info.role();
    if (!Live(*node, now) || (role != v1::NODE_ROLE_PREFILL && role != v1::NODE_ROLE_DECODE)) {
      continue;
    }
    const std::string& model = node->model < models_.size() ? models_[node->model].name : "";
    counts[{model, node->info.model_fingerprint(), RoleLabel(role)}] += 1;
  }
  std::vector<ModelCount> out;
  for (const auto& [key, n] : counts) {
    out.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key), n});
  }
  return out;
}

std::vector<std::shared_ptr<RegisteredNode>> NodeRegistry::LiveStores() const {
  std::vector<std::shared_ptr<RegisteredNode>> stores;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  for (const RosterEntry& entry : RosterLocked().store) {  // by node_id
    if (!entry.node->draining && Live(*entry.node, now)) stores.push_back(entry.node);
  }
  return stores;
}

std::vector<std::shared_ptr<RegisteredNode>> NodeRegistry::LiveServingNodes() const {
  std::vector<std::shared_ptr<RegisteredNode>> serving;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  for (const auto& [id, node] : nodes_) {
    const v1::NodeRole role = node->info.role();
    if ((role == v1::NODE_ROLE_PREFILL || role == v1::NODE_ROLE_DECODE) && Live(*node, now)) {
      serving.push_back(node);
    }
  }
  return serving;
}

std::map<std::string, double> NodeRegistry::LiveByRole() const {
  std::map<std::string, double> live = {{"prefill", 0}, {"decode", 0}, {"kvstore", 0}};
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  for (const auto& [id, node] : nodes_) {
    if (Live(*node, now)) live[RoleLabel(node->info.role())] += 1;
  }
  return live;
}

}  // namespace baton::router
