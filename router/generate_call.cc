#include "generate_call.h"

#include <algorithm>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "baton/common/log.h"
#include "baton/common/rpc.h"
#include "baton/kvstore/chain.h"
#include "baton/kvstore/fleet.h"
#include "baton/kvstore/hit_policy.h"
#include "prompt.h"

namespace baton::router {
namespace {

using Clock = std::chrono::steady_clock;

// A client context that carries the caller's cancellation and deadline, capped at `cap`, and
// the request's trace.
std::unique_ptr<grpc::ClientContext> Propagated(grpc::ServerContext* server,
                                                std::chrono::milliseconds cap,
                                                const trace::Span& span) {
  auto client = grpc::ClientContext::FromServerContext(*server);
  const auto capped = std::chrono::system_clock::now() + cap;
  if (server->deadline() > capped) client->set_deadline(capped);
  trace::Inject(span, *client);
  return client;
}

double MillisSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

absl::Status ClientGone() {
  return absl::CancelledError("client went away");
}

}  // namespace

GenerateCall::GenerateCall(const RouterParts& router, grpc::ServerContext* context,
                           const v1::GenerateRequest& request, ResponseWriter* writer,
                           RequestTrace& trace)
    : router_(router), context_(context), request_(&request), writer_(writer), trace_(trace) {}

absl::Status GenerateCall::Run() {
  auto start = Clock::now();
  if (absl::Status s = Resolve(); !s.ok()) return s;
  trace_.stage_ms["resolve"] += MillisSince(start);
  start = Clock::now();
  if (absl::Status s = Validate(); !s.ok()) return s;
  trace_.stage_ms["validate"] += MillisSince(start);
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    failure_.reset();
    absl::Status status = RunAttempt(attempt);
    if (finished_ || !failure_.has_value()) return status;
    const RetryRule& rule = RetryRuleFor(*failure_);
    if (++retries_[*failure_] > rule.budget) return status;
    Retry(rule, status);
  }
  return absl::UnavailableError("nodes kept failing; gave up");
}

absl::Status GenerateCall::RunAttempt(int index) {
  Attempt attempt;
  attempt.index = index;
  attempt.g = static_cast<uint32_t>(generated_.size());
  static constexpr std::pair<Stage, const char*> kStages[] = {
      {&GenerateCall::Admit, "admit"},
      {&GenerateCall::Reserve, "reserve"},
      {&GenerateCall::LookUpPrefix, "lookup"},
      {&GenerateCall::Prefill, "prefill"},
      {&GenerateCall::RelayFirst, "first_token"},
      {&GenerateCall::RelayStream, "stream"}};
  for (const auto& [stage, name] : kStages) {
    const auto start = Clock::now();
    const absl::Status s = (this->*stage)(attempt);
    trace_.stage_ms[name] += MillisSince(start);
    if (!s.ok() || finished_) return s;
  }
  return absl::OkStatus();
}

absl::Status GenerateCall::Fail(AttemptFailure failure, const RegisteredNode& node,
                                absl::Status status) {
  failure_ = failure;
  failed_node_ = node.id();
  return status;
}

void GenerateCall::Retry(const RetryRule& rule, const absl::Status& status) {
  if (rule.avoid != Avoid::kNone) {
    if (rule.mark_down) router_.registry.MarkDown(failed_node_);
    (rule.avoid == Avoid::kDecodeNode ? lost_decode_ : lost_prefill_).push_back(failed_node_);
  }
  if (rule.reason != nullptr) router_.metrics.retries.Add({{"reason", rule.reason}}).Increment();
  if (rule.log == nullptr) return;
  const char* role = rule.avoid == Avoid::kPrefillNode ? "prefill" : "decode";
  std::string message = absl::StrCat(role, " node ", failed_node_, " lost");
  if (*failure_ == AttemptFailure::kTransferFailed) {
    message = absl::StrCat("StateBlock transfer to decode node ", failed_node_, " failed");
  } else if (*failure_ == AttemptFailure::kDecodeReportedLost) {
    message = absl::StrCat("a prefill node reports decode node ", failed_node_,
                           " lost; it answers the router and stays up");
  } else if (*failure_ == AttemptFailure::kDecodeLostMidStream) {
    absl::StrAppend(&message, " after ", generated_.size(), " tokens");
  }
  log::Warn(trace_.span.Ids(), rule.log,
            {{"request_id", trace_.id},
             {"node", failed_node_},
             {"error", std::string(status.message())},
             {"tokens", generated_.size()},
             {"message", message}});
}

// A text prompt becomes token ids here (router/prompt.h), so that everything past this point
// (validation, prefix keys, the nodes) sees ids only.
absl::Status GenerateCall::Resolve() {
  absl::StatusOr<size_t> model = ResolveServedModel(router_.models, request_->model());
  if (!model.ok()) return model.status();
  model_ = &router_.models[*model];
  trace_.hold.model = *model;
  const text::Tokenizer* tokenizer = model_->tokenizer.get();
  if (tokenizer == nullptr) return absl::OkStatus();
  if (request_->prompt_token_ids().empty() && !request_->prompt_text().empty()) {
    absl::StatusOr<std::vector<int32_t>> ids =
        EncodeTextPrompt(*tokenizer, request_->prompt_text(), router_.options.max_model_len);
    if (!ids.ok()) return ids.status();
    encoded_ = *request_;
    encoded_.clear_prompt_text();
    encoded_.mutable_prompt_token_ids()->Add(ids->begin(), ids->end());
    request_ = &encoded_;
  }
  return absl::OkStatus();
}

absl::Status GenerateCall::Validate() {
  absl::StatusOr<RouterService::Effective> effective =
      ValidateRequest(*request_, router_.models, router_.options);
  if (!effective.ok()) return effective.status();
  effective_ = *effective;
  const auto& prompt = request_->prompt_token_ids();
  router_.metrics.prompt_tokens.Increment(prompt.size());
  trace_.prompt_tokens = prompt.size();
  usage_.set_prompt_tokens(static_cast<uint32_t>(prompt.size()));
  // The text of what is streamed, where there is a tokenizer: decoded a token at a time and
  // cut at the first stop string (its tokens end the generation there).
  if (const text::Tokenizer* tokenizer = model_->tokenizer.get(); tokenizer != nullptr) {
    detokenizer_.emplace(*tokenizer, std::span<const int32_t>(prompt.data(), prompt.size()));
    stop_strings_.emplace(std::vector<std::string>(request_->sampling().stop().begin(),
                                                   request_->sampling().stop().end()));
  }
  return absl::OkStatus();
}

// The prefill node first, once one has a free slot: the reservation names the identity that
// may fill it, and is taken only now, so it never expires in a queue.
absl::Status GenerateCall::Admit(Attempt& attempt) {
  if (attempt.g == 0) {
    // Nothing streamed yet: an attempt starts afresh, on any weights of the model (a rollout
    // may have drained the ones the last attempt chose).
    s_valid_.reset();
    fingerprint_.clear();
  }
  int64_t retry_after_ms = 0;
  Admission::Ask ask{.retry = attempt.index > 0,
                     .fingerprint = fingerprint_,
                     .exclude = lost_prefill_,
                     .lost_decode = lost_decode_};
  if (router_.options.prefill_policy != PrefillPolicy::kLeastLoaded) {
    // The store is asked here, before the wait, once per weights the nodes may serve: the
    // placement itself runs under admission's lock and calls out to nothing.
    const bool look_up = effective_.mode != v1::TRUNCATION_MODE_OFF;
    if (!fingerprint_.empty()) {
      ViewFor(fingerprint_, look_up);
    } else {
      const std::vector<std::set<std::string>> served = router_.registry.ServedFingerprints();
      for (const std::string& fingerprint : served[trace_.hold.model])
        ViewFor(fingerprint, look_up);
    }
  }
  ask.placement = {.policy = router_.options.prefill_policy,
                   .hit = HitInput(),
                   .payload = kvstore::BlockPayloadBytes(model_->config),
                   .config = &model_->config};
  ask.tiers = [this](const RegisteredNode& node) { return TiersOn(node); };
  absl::StatusOr<Admission::Admitted> admitted =
      router_.admission.Admit(*context_, ask, trace_.hold, &retry_after_ms);
  if (!admitted.ok()) {
    if (absl::IsResourceExhausted(admitted.status())) {
      context_->AddTrailingMetadata(kRetryAfterKey, std::to_string(retry_after_ms));
    }
    return admitted.status();
  }
  attempt.prefill = *std::move(admitted);
  NoteChoice(attempt.prefill);
  return absl::OkStatus();
}

const GenerateCall::PrefixView& GenerateCall::ViewFor(const std::string& fingerprint,
                                                      bool look_up_store) {
  auto [it, added] = views_.try_emplace(fingerprint);
  PrefixView& view = it->second;
  if (effective_.mode == v1::TRUNCATION_MODE_OFF) return view;  // DESIGN section 5, step 4
  if (added) {
    const std::vector<int32_t> tokens(request_->prompt_token_ids().begin(),
                                      request_->prompt_token_ids().end());
    view.keys = kvstore::ChainKeys(fingerprint, trace_.hold.tenant, request_->cache_salt(), tokens,
                                   model_->config.kv_block_size);
  }
  if (!look_up_store || view.looked_up) return view;
  view.looked_up = true;
  if (Stores().nodes.empty()) return view;
  router_.metrics.prefix_queries.Increment();
  view.store = ProbeOwners(view.keys);
  return view;
}

const GenerateCall::StoreSet& GenerateCall::Stores() {
  if (stores_.has_value()) return *stores_;
  StoreSet& set = stores_.emplace();
  set.nodes = router_.registry.LiveStores();
  for (const auto& node : set.nodes) {
    set.ids.push_back(node->id());
    v1::StoreNode& entry = *set.fleet.add_nodes();
    entry.set_node_id(node->id());
    entry.set_address(node->info.address());
  }
  if (!set.nodes.empty()) {
    set.fleet.set_replication(static_cast<uint32_t>(std::clamp<size_t>(
        static_cast<size_t>(router_.options.kvstore_replication), 1, set.nodes.size())));
  }
  return set;
}

kvstore::ChainLookup GenerateCall::ProbeOwners(const std::vector<Sha256Digest>& keys) {
  const StoreSet& set = *stores_;
  const std::vector<std::vector<size_t>> owned =
      kvstore::KeysByOwner(keys, set.ids, static_cast<int>(set.fleet.replication()));
  // One probe per owner with keys, skipping the owners whose breaker is open; all at once,
  // each coalesced with other requests' probes of the same node (kvstore/probe_batcher.h).
  struct Probe {
    size_t node;
    v1::ProbeResponse response;
    grpc::Status status;
  };
  std::vector<Probe> probes;
  std::vector<kvstore::ProbeBatcher::Ask> asks;
  for (size_t n = 0; n < owned.size(); ++n) {
    if (owned[n].empty() || !router_.store_breaker.Allow(set.ids[n])) continue;
    probes.push_back({n, {}, {}});
    kvstore::ProbeBatcher::Ask& ask = asks.emplace_back();
    ask.node_id = set.ids[n];
    ask.stub = router_.stubs.KvStore(*set.nodes[n]);
    for (size_t k : owned[n]) ask.keys.push_back(kvstore::KeyBytes(keys[k]));
  }
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(router_.options.lookup_timeout_ms);
  std::vector<kvstore::ProbeBatcher::Answer> answered = router_.store_probes.Probe(
      std::move(asks), deadline, {{trace::kTraceparent, trace_.span.context.Header()}});
  for (size_t i = 0; i < probes.size(); ++i) {
    probes[i].status = std::move(answered[i].status);
    probes[i].response = std::move(answered[i].response);
  }

  std::vector<kvstore::OwnerProbe> answers;
  bool failed = false;
  std::set<size_t> silent;  // owners asked that did not answer, or that were not asked
  for (size_t n = 0; n < owned.size(); ++n) {
    if (!owned[n].empty()) silent.insert(n);
  }
  for (const Probe& probe : probes) {
    const std::string& id = set.ids[probe.node];
    // A probe cut short by the client going away says nothing of the store node.
    if (probe.status.error_code() != grpc::StatusCode::CANCELLED) {
      router_.store_breaker.Record(id, probe.status.ok());
    }
    if (!probe.status.ok()) {
      failed = true;
      log::Warn(trace_.span.Ids(), "prefix probe failed; the node's blocks are not counted",
                {{"store", id}, {"error", probe.status.error_message()}});
      continue;
    }
    answers.push_back({owned[probe.node], &probe.response});
    silent.erase(probe.node);
  }
  // The prefill is sent the nodes that answered (and those that own none of the prompt's keys):
  // its reads then never wait on an owner the lookup just found failing or skipped, and every
  // value stays with its other owners, which rank as high without it.
  if (!silent.empty()) {
    v1::StoreFleet answered;
    for (int n = 0; n < set.fleet.nodes_size(); ++n) {
      if (!silent.contains(static_cast<size_t>(n))) *answered.add_nodes() = set.fleet.nodes(n);
    }
    answered.set_replication(
        answered.nodes_size() == 0
            ? 0
            : std::min<uint32_t>(set.fleet.replication(),
                                 static_cast<uint32_t>(answered.nodes_size())));
    prefill_fleet_ = std::move(answered);
  }
  if (failed) router_.metrics.prefix_query_failures.Increment();  // the store never fails a request
  return kvstore::MergeProbes(keys.size(), answers);
}

kvstore::HitPolicyInput GenerateCall::HitInput() const {
  const ModelConfig& config = model_->config;
  return {.prompt_len = request_->prompt_token_ids_size(),
          .keep = effective_.keep,
          .truncation_on = effective_.mode != v1::TRUNCATION_MODE_OFF,
          .ring_capacity = config.ring_capacity(),
          .window = config.sliding_window,
          .block_size = config.kv_block_size,
          .cap = router_.options.hit_cap};
}

kvstore::TierLookups GenerateCall::TiersOn(const RegisteredNode& node) {
  // A placement asks this of every open node, nearly all of one fingerprint: the last view
  // found is asked first.
  // Registered nodes of one fingerprint share its string (RegisteredNode::fingerprint): the
  // same one as the last node's is the same view, without reading the string.
  const std::string& fingerprint =
      node.fingerprint != nullptr ? *node.fingerprint : node.info.model_fingerprint();
  if (last_view_ == nullptr || node.fingerprint == nullptr ||
      last_fingerprint_ != node.fingerprint) {
    if (last_view_ == nullptr || last_view_->first != fingerprint) {
      ViewFor(fingerprint, /*look_up_store=*/false);
      last_view_ = &*views_.find(fingerprint);
    }
    last_fingerprint_ = node.fingerprint;
  }
  PrefixView& view = last_view_->second;
  return {.local = view.local.On(router_.registry.cache_index(), view.keys, node.id_hash,
                                 [&]() -> const std::string& { return node.id(); }),
          .store = view.store};
}

kvstore::TieredHit GenerateCall::HitOn(const RegisteredNode& node) {
  return kvstore::PlanTieredHit(HitInput(), TiersOn(node),
                                kvstore::BlockPayloadBytes(model_->config));
}

void GenerateCall::NoteChoice(const Admission::Admitted& admitted) {
  const PrefillPolicy policy = router_.options.prefill_policy;
  const kvstore::TieredHit& hit = admitted.placement.plan.hit;
  const kvstore::PrefillCost& cost = admitted.placement.plan.cost;
  predicted_ttft_ms_ = cost.total_ms();
  router_.metrics.predicted_ttft.Observe(cost.total_ms() / 1000);
  // Whether the policy moved the request off the least loaded node.
  const char* reason = admitted.placement.least_loaded           ? "least_loaded"
                       : policy == PrefillPolicy::kLongestPrefix ? "prefix"
                                                                 : "predicted_ttft";
  router_.metrics.prefill_choices
      .Add({{"policy", kvstore::RoutingPolicyName(policy)}, {"reason", reason}})
      .Increment();
  // The runner-up: the next best node with a free slot ("" when there was none).
  const std::string runner_up =
      admitted.runner_up.has_value() ? admitted.runner_up->node->id() : std::string();
  const kvstore::NodePlan& other = admitted.placement.runner_up_plan;
  log::Debug(trace_.span.Ids(), "prefill node chosen",
             {{"request_id", trace_.id},
              {"policy", kvstore::RoutingPolicyName(policy)},
              {"node", admitted.chosen.node->id()},
              {"predicted_ttft_ms", cost.total_ms()},
              {"queue_ms", cost.queue_ms},
              {"load_ms", cost.load_ms},
              {"compute_ms", cost.compute_ms},
              {"replay_ms", cost.replay_ms},
              {"fixed_ms", cost.fixed_ms},
              {"hit_blocks", hit.hit_blocks},
              {"local_blocks", hit.local_blocks},
              {"computed_rows", cost.computed_rows},
              {"replayed_rows", cost.replayed_rows},
              {"runner_up", runner_up},
              {"runner_up_predicted_ttft_ms", other.cost.total_ms()},
              {"runner_up_local_blocks", other.hit.local_blocks}});
}

void GenerateCall::FirstToken() {
  const double ttft_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - trace_.start).count();
  timings_.set_ttft_ms(ttft_ms);
  timings_.set_predicted_ttft_ms(predicted_ttft_ms_);
  if (predicted_ttft_ms_ > 0)
    router_.metrics.ttft_prediction_ratio.Observe(ttft_ms / predicted_ttft_ms_);
}

absl::Status GenerateCall::Reserve(Attempt& attempt) {
  const RegisteredNode& prefill = *attempt.prefill.node;
  attempt.decode = router_.registry.Pick(v1::NODE_ROLE_DECODE, lost_decode_,
                                         NodeRegistry::PairingKey(prefill.info));
  if (!attempt.decode) {
    // While the request is not tied to the prefill node's weights, another prefill node may
    // still have a partner.
    if (fingerprint_.empty() && router_.registry.AnyDecode(trace_.hold.model, lost_decode_)) {
      return Fail(AttemptFailure::kNoDecodeForWeights, prefill,
                  absl::UnavailableError("no decode node serves the prefill node's weights"));
    }
    return absl::UnavailableError("no decode node is available");
  }
  const RegisteredNode& decode = *attempt.decode;
  trace_.prefill_node = prefill.id();
  trace_.decode_node = decode.id();
  attempt.decode_stub = router_.stubs.Decode(decode);
  v1::ReserveRequest reserve;
  reserve.set_request_id(absl::StrCat(trace_.id, "#", attempt.index));  // the node logs it
  reserve.set_prefill_identity(prefill.identity);
  reserve.set_prefill_address(prefill.info.address());
  reserve.set_prefill_ucx_worker_address(prefill.info.ucx_worker_address());
  reserve.set_prompt_tokens(static_cast<uint32_t>(request_->prompt_token_ids_size()) + attempt.g);
  reserve.set_model_fingerprint(decode.info.model_fingerprint());
  *reserve.mutable_sampling() = request_->sampling();
  reserve.set_logprobs(request_->logprobs());
  reserve.set_timeout_ms(router_.options.reservation_timeout_ms);
  reserve.set_completed_tokens(attempt.g);
  // What speculative decoding drafts from (prompt lookup, a draft model's prefill).
  reserve.mutable_prompt_token_ids()->Reserve(static_cast<int>(reserve.prompt_tokens()));
  reserve.mutable_prompt_token_ids()->Add(request_->prompt_token_ids().begin(),
                                          request_->prompt_token_ids().end());
  reserve.mutable_prompt_token_ids()->Add(generated_.begin(), generated_.end());
  if (attempt.g == 0) {
    // A re-prefill after a lost decode node is not verified: its first tokens came from the
    // lost node.
    fidelity_tokens_ = FidelityTokens();
    reserve.set_fidelity_tokens(fidelity_tokens_);
    reserve.set_fidelity_reply(request_->fidelity_tokens() > 0);
  } else {
    fidelity_tokens_ = 0;
  }
  reserve.set_split(router_.options.split);
  if (router_.options.split == v1::SPLIT_REPLAY_ON_DECODE) {
    // The most boundary rows the StateBlock may carry: the replay range [s_keep, L) before any
    // prefix hit (a hit only shortens it), with the re-prefill's L + g and K + g.
    const int64_t L = reserve.prompt_tokens();
    const int64_t keep = effective_.keep + attempt.g;
    reserve.set_boundary_rows(
        static_cast<uint32_t>(effective_.mode == v1::TRUNCATION_MODE_OFF ? L : std::min(L, keep)));
  }
  auto context = Propagated(
      context_, std::chrono::milliseconds(router_.options.reservation_timeout_ms), trace_.span);
  const grpc::Status status =
      attempt.decode_stub->Reserve(context.get(), reserve, &attempt.reservation);
  if (status.ok()) return absl::OkStatus();
  if (NodeLost(status)) {
    return Fail(AttemptFailure::kDecodeUnreachable, decode, FromGrpcStatus(status));
  }
  return FromGrpcStatus(status);
}

// The hit over both tiers of the chosen node: its local cache first, then the store (DESIGN
// section 5's policy over the blocks either holds).
absl::Status GenerateCall::LookUpPrefix(Attempt& attempt) {
  if (s_valid_.has_value()) return absl::OkStatus();
  fingerprint_ = attempt.decode->info.model_fingerprint();
  const PrefixView& view = ViewFor(fingerprint_, /*look_up_store=*/true);
  const kvstore::TieredHit hit = HitOn(*attempt.prefill.node);
  const int64_t B = model_->config.kv_block_size;
  s_valid_ = static_cast<uint32_t>(hit.hit_blocks * B);
  // What the node reads of the hit stays in its cache: the next prompt that shares it is
  // priced with it from now, not from the node's next heartbeat.
  router_.registry.ExpectCached(
      *attempt.prefill.node, view.keys,
      kvstore::CacheKeptReads(hit.hit_blocks, model_->config.sliding_window, B));
  if (hit.hit_blocks > 0) {
    router_.metrics.prefix_hits.Increment();
    router_.metrics.cached_tokens.Increment(static_cast<double>(hit.hit_blocks * B));
  }
  return absl::OkStatus();
}

// A re-prefill covers prompt + the g tokens streamed so far, with keep K + g so that s_keep
// stays where the undisturbed prefill put it (DESIGN section 6).
absl::Status GenerateCall::Prefill(Attempt& attempt) {
  v1::PrefillRequest prefill;
  *prefill.mutable_request() = *request_;
  prefill.mutable_request()->clear_prompt_text();
  prefill.mutable_request()->set_request_id(trace_.id);  // the nodes log under the router's id
  for (int32_t t : generated_) prefill.mutable_request()->add_prompt_token_ids(t);
  prefill.set_first_logits(fidelity_tokens_ > 0);
  prefill.set_mode(effective_.mode);
  prefill.set_keep(effective_.mode == v1::TRUNCATION_MODE_OFF ? 0 : effective_.keep + attempt.g);
  prefill.set_transport(router_.options.transport);
  prefill.set_completed_tokens(attempt.g);
  prefill.set_tenant(trace_.hold.tenant);
  *prefill.mutable_reservation() = attempt.reservation;
  prefill.set_decode_address(attempt.decode->info.address());
  prefill.set_decode_identity(attempt.decode->identity);
  prefill.set_s_valid(s_valid_.value_or(0));
  prefill.set_split(router_.options.split);
  *prefill.mutable_stores() = prefill_fleet_.has_value() ? *prefill_fleet_ : Stores().fleet;

  const RegisteredNode& node = *attempt.prefill.node;
  auto context = Propagated(context_, std::chrono::milliseconds(router_.options.prefill_timeout_ms),
                            trace_.span);
  const grpc::Status status =
      router_.stubs.Prefill(node)->Prefill(context.get(), prefill, &attempt.prefilled);
  attempt.prefill.slot.Done();
  if (status.ok()) {
    // And so do the blocks it computed, from the end of the hit it served (which a lost read
    // leaves short of s_valid).
    const std::vector<Sha256Digest>& keys = views_[fingerprint_].keys;
    const int64_t served =
        std::min<int64_t>(attempt.prefilled.usage().cached_tokens() / model_->config.kv_block_size,
                          static_cast<int64_t>(keys.size()));
    router_.registry.ExpectCached(
        node, keys, kvstore::WriteBackSteps(served, static_cast<int64_t>(keys.size())));
    return absl::OkStatus();
  }
  const grpc::Status released = ReleaseReservation(attempt);
  // A failure the prefill node attributes to the decode node (its commit could not reach it)
  // is the decode node's, and takes it down only when the router's own call (the release)
  // does not reach it either.
  const bool decode_answered = released.error_code() != grpc::StatusCode::UNAVAILABLE &&
                               released.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED;
  const std::optional<AttemptFailure> failure =
      ClassifyPrefillFailure(status, router_.stubs.FailedNode(*context), decode_answered);
  if (!failure.has_value()) return FromGrpcStatus(status);
  return Fail(*failure, *failure == AttemptFailure::kPrefillLost ? node : *attempt.decode,
              FromGrpcStatus(status));
}

grpc::Status GenerateCall::ReleaseReservation(Attempt& attempt) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  trace::Inject(trace_.span, context);
  v1::ReleaseRequest release;
  release.set_reservation_id(attempt.reservation.reservation_id());
  v1::ReleaseResponse ignored;
  return attempt.decode_stub->Release(&context, release, &ignored);
}

absl::Status GenerateCall::RelayFirst(Attempt& attempt) {
  const v1::PrefillResponse& prefilled = attempt.prefilled;
  if (attempt.g == 0) {
    router_.metrics.replayed_rows.Increment(prefilled.usage().replayed_rows());
    usage_.set_replayed_rows(prefilled.usage().replayed_rows());
    usage_.set_cached_tokens(prefilled.usage().cached_tokens());
    const uint32_t local =
        std::min(prefilled.usage().local_cached_tokens(), prefilled.usage().cached_tokens());
    usage_.set_local_cached_tokens(local);
    router_.metrics.tier_cached_tokens.Add({{"tier", "local"}}).Increment(local);
    router_.metrics.tier_cached_tokens.Add({{"tier", "store"}})
        .Increment(prefilled.usage().cached_tokens() - local);
    timings_.set_prefill_ms(prefilled.prefill_ms());
    timings_.set_transfer_ms(prefilled.transfer_ms());
  }
  // Under replay-on-decode the decode node samples the first token: it arrives on the stream
  // (RelayStream), with the prompt logprobs.
  if (router_.options.split == v1::SPLIT_REPLAY_ON_DECODE) return absl::OkStatus();
  generated_.push_back(prefilled.first_token());
  if (attempt.g == 0) FirstToken();
  v1::GenerateResponse first;
  first.set_request_id(trace_.id);
  first.add_token_ids(prefilled.first_token());
  if (request_->logprobs()) first.add_logprobs(prefilled.first_logprob());
  if (attempt.g == 0) *first.mutable_prompt_logprobs() = prefilled.prompt_logprobs();
  if (AddText(prefilled.first_token(), first)) {
    // The first token completed a stop string: the request ends here, and the state the
    // decode node holds for it is freed.
    Finish(v1::FINISH_REASON_STOP, first);
    ReleaseReservation(attempt);
    finished_ = true;
    return Send(first) ? absl::OkStatus() : ClientGone();
  }
  if (!Send(first)) {
    ReleaseReservation(attempt);
    finished_ = true;
    return ClientGone();
  }
  return absl::OkStatus();
}

absl::Status GenerateCall::RelayStream(Attempt& attempt) {
  auto context = grpc::ClientContext::FromServerContext(*context_);
  trace::Inject(trace_.span, *context);
  v1::StreamRequest open;
  open.set_reservation_id(attempt.reservation.reservation_id());
  auto stream = attempt.decode_stub->Stream(context.get(), open);
  // A new stream counts its drafts from zero; the lost one's stay in the usage.
  drafts_before_ += drafts_now_;
  accepted_before_ += accepted_now_;
  drafts_now_ = accepted_now_ = 0;
  v1::DecodeOutput output;
  bool first = router_.options.split == v1::SPLIT_REPLAY_ON_DECODE;
  while (stream->Read(&output)) {
    if (request_->logprobs() && output.logprobs_size() != output.token_ids_size()) {
      // Each token is relayed with its logprob by index: a node that sends fewer is faulty,
      // and its stream is treated as lost (the tokens so far are kept, the rest come from
      // another decode node).
      context->TryCancel();
      (void)stream->Finish();
      return Fail(AttemptFailure::kDecodeLostMidStream, *attempt.decode,
                  absl::DataLossError(absl::StrCat(
                      "DecodeOutput.logprobs: ", output.logprobs_size(), " values for ",
                      output.token_ids_size(), " token_ids (one per token when asked for)")));
    }
    drafts_now_ = output.draft_tokens();
    accepted_now_ = output.accepted_draft_tokens();
    if (output.has_fidelity() && request_->fidelity_tokens() > 0) {
      *usage_.mutable_fidelity() = output.fidelity();
    }
    v1::GenerateResponse response;
    response.set_request_id(trace_.id);
    if (first && output.token_ids_size() > 0) {
      // Replay-on-decode: this output carries the first token the decode node sampled.
      first = false;
      if (attempt.g == 0) {
        FirstToken();
        timings_.set_replay_ms(output.replay_ms());
        *response.mutable_prompt_logprobs() = output.prompt_logprobs();
      }
    }
    bool stopped = false;
    for (int i = 0; i < output.token_ids_size() && !stopped; ++i) {
      generated_.push_back(output.token_ids(i));
      response.add_token_ids(output.token_ids(i));
      if (request_->logprobs()) response.add_logprobs(output.logprobs(i));
      stopped = AddText(output.token_ids(i), response);
    }
    if (!stopped && output.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      stopped = FlushText(response);
      Finish(output.finish_reason(), response);
    }
    if (stopped) {
      // A stop string ends the generation at the token that completed it; the decode node
      // sees the cancel and frees the request's slot and pages.
      Finish(v1::FINISH_REASON_STOP, response);
      context->TryCancel();
      finished_ = true;
      return Send(response) ? absl::OkStatus() : ClientGone();
    }
    if (!Send(response)) {
      context->TryCancel();
      finished_ = true;
      return ClientGone();
    }
  }
  const grpc::Status status = stream->Finish();
  finished_ = status.ok();
  if (status.ok()) return absl::OkStatus();
  if (context_->IsCancelled()) return absl::CancelledError("cancelled");
  if (NodeLost(status)) {
    return Fail(AttemptFailure::kDecodeLostMidStream, *attempt.decode, FromGrpcStatus(status));
  }
  return FromGrpcStatus(status);
}

bool GenerateCall::AddText(int32_t token, v1::GenerateResponse& response) {
  if (!detokenizer_.has_value()) return false;
  text::StopStrings::Step step = stop_strings_->Push(detokenizer_->Next(token));
  response.mutable_text()->append(step.text);
  return step.stopped;
}

bool GenerateCall::FlushText(v1::GenerateResponse& response) {
  if (!detokenizer_.has_value()) return false;
  text::StopStrings::Step step = stop_strings_->Push(detokenizer_->Flush());
  response.mutable_text()->append(step.text);
  if (!step.stopped) response.mutable_text()->append(stop_strings_->Flush());
  return step.stopped;
}

uint32_t GenerateCall::FidelityTokens() const {
  if (request_->fidelity_tokens() > 0) return request_->fidelity_tokens();
  const double rate = router_.options.fidelity_sample_rate;
  const bool truncated = effective_.mode != v1::TRUNCATION_MODE_OFF &&
                         effective_.keep < request_->prompt_token_ids_size();
  if (!truncated || rate <= 0) return 0;
  thread_local std::mt19937_64 draws{std::random_device{}()};
  const bool sampled = rate >= 1 || std::uniform_real_distribution<double>(0, 1)(draws) < rate;
  return sampled ? router_.options.fidelity_tokens : 0;
}

void GenerateCall::Finish(v1::FinishReason reason, v1::GenerateResponse& response) {
  usage_.set_completion_tokens(static_cast<uint32_t>(generated_.size()));
  // A stop string may end the request inside a run of accepted drafts: only tokens sent count,
  // and the drafts past the stop count neither as accepted nor as drafted.
  const uint32_t accepted = accepted_before_ + accepted_now_;
  const uint32_t sent = std::min<uint32_t>(accepted, usage_.completion_tokens());
  usage_.set_accepted_draft_tokens(sent);
  usage_.set_draft_tokens(drafts_before_ + drafts_now_ - (accepted - sent));
  response.set_finish_reason(reason);
  *response.mutable_usage() = usage_;
  *response.mutable_timings() = timings_;
}

bool GenerateCall::Send(const v1::GenerateResponse& response) {
  {
    StreamWatch::Writing writing(router_.idle_watch, context_);
    if (!writer_->Write(response)) return false;
  }
  // Time to first token, then inter-token times, as the client sees them.
  const int n = response.token_ids_size();
  if (n <= 0) return true;
  const auto now = Clock::now();
  if (!trace_.last_token.has_value()) {
    router_.metrics.ttft.Observe(Seconds(now - trace_.start));
    for (int i = 1; i < n; ++i) router_.metrics.itl.Observe(0);
  } else {
    const double each = Seconds(now - *trace_.last_token) / n;
    for (int i = 0; i < n; ++i) router_.metrics.itl.Observe(each);
  }
  trace_.last_token = now;
  trace_.tokens += n;
  router_.metrics.generation_tokens.Increment(n);
  return true;
}

}  // namespace baton::router
