// One Generate call on the router as a pipeline of stages (DESIGN section 6), in the manner of
// Envoy's filter chain: each stage is one method returning absl::Status, and the retry policy
// (routing.h kRetryPolicy) is data consumed by one loop.
//
//   Resolve -> Validate -> attempt: Admit -> Reserve -> LookUpPrefix -> Prefill -> RelayFirst
//                                   -> RelayStream
//
// A stage whose error another attempt may cure says which failure it was (Fail); the loop looks
// its rule up, avoids the node the rule names, and starts the attempt again, keeping what the
// client has already been sent: a re-prefill covers prompt + the tokens streamed so far with
// keep K + g, on the same weights, so the client sees every token once.
//
// Threading: a GenerateCall belongs to the gRPC thread serving its call.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "baton/common/hash.h"
#include "baton/common/stream_watch.h"
#include "baton/common/trace.h"
#include "baton/kvstore/ttft_model.h"
#include "baton/router/admission.h"
#include "baton/router/node_registry.h"
#include "baton/router/node_stubs.h"
#include "baton/router/router_service.h"
#include "baton/router/routing.h"
#include "baton/text/streaming_text.h"
#include "router_metrics.h"

namespace baton::router {

// What a call uses of the router; all of it outlives the call.
struct RouterParts {
  const RouterOptions& options;
  const std::vector<ServedModel>& models;
  NodeRegistry& registry;
  Admission& admission;
  NodeStubs& stubs;
  RouterMetrics& metrics;
  StreamWatch& idle_watch;
  kvstore::StoreBreaker& store_breaker;
  kvstore::ProbeBatcher& store_probes;
};

// What one request did, for its metrics and log lines.
struct RequestTrace {
  std::string id;
  trace::Span span;  // the router's span of the request's W3C trace; every node call carries it
  StreamHold hold;  // its tenant, served model and place in the tenant's share
  std::chrono::steady_clock::time_point start;
  std::optional<std::chrono::steady_clock::time_point> last_token;
  int64_t tokens = 0;
  int64_t prompt_tokens = 0;  // once encoded (a text prompt's ids)
  std::string prefill_node;   // the nodes of the last attempt, for the log line
  std::string decode_node;
  // Milliseconds in each stage, summed over attempts ("resolve", "admit", ... "stream").
  std::map<std::string, double> stage_ms;
};

class GenerateCall {
 public:
  GenerateCall(const RouterParts& router, grpc::ServerContext* context,
               const v1::GenerateRequest& request, ResponseWriter* writer, RequestTrace& trace);
  // Serves the request to its end: OK once the last message is sent, or the error for the
  // client.
  absl::Status Run();

 private:
  // The nodes and reservation of one attempt.
  struct Attempt {
    int index = 0;
    uint32_t g = 0;  // tokens streamed before it
    Admission::Admitted prefill;
    NodeLease decode;
    std::shared_ptr<v1::DecodeNode::StubInterface> decode_stub;
    v1::Reservation reservation;
    v1::PrefillResponse prefilled;
  };
  using Stage = absl::Status (GenerateCall::*)(Attempt&);

  // The stages, in order.
  absl::Status Resolve();                  // the served model, and a text prompt encoded to ids
  absl::Status Validate();                 // bounds and the effective truncation
  absl::Status Admit(Attempt& attempt);    // a prefill node's slot
  absl::Status Reserve(Attempt& attempt);  // a decode node and its reservation
  absl::Status LookUpPrefix(Attempt& attempt);  // s_valid, once per request
  absl::Status Prefill(Attempt& attempt);       // the prompt computed and its state moved
  absl::Status RelayFirst(Attempt& attempt);    // the first token to the client
  absl::Status RelayStream(Attempt& attempt);   // the decode node's stream to the client

  absl::Status RunAttempt(int index);
  // Records a failure another attempt may cure, about `node`; returns `status`.
  absl::Status Fail(AttemptFailure failure, const RegisteredNode& node, absl::Status status);
  // Applies the policy's rule for the recorded failure before the next attempt.
  void Retry(const RetryRule& rule, const absl::Status& status);
  // The prompt's chain keys on `fingerprint` and the store's lookup of them (empty when the
  // truncation allows no hit, or the store is absent, slow or failing), looked up once.
  struct PrefixView {
    std::vector<Sha256Digest> keys;
    kvstore::ChainLookup store;
    bool looked_up = false;  // the store was asked (or there is none to ask)
    ChainHolders local;      // the chain in the prefill nodes' local caches
  };
  const PrefixView& ViewFor(const std::string& fingerprint, bool look_up_store);
  // The prefix store's live nodes and the replication, taken from the registry once per
  // request: the lookup asks their owners, and every prefill of the request carries them.
  struct StoreSet {
    std::vector<std::shared_ptr<RegisteredNode>> nodes;  // by node_id
    std::vector<std::string> ids;
    v1::StoreFleet fleet;
  };
  const StoreSet& Stores();
  // The owners' probes of `keys`, in parallel under --lookup-timeout-ms, folded into what the
  // hit policy takes; an owner that fails counts as holding none of its keys, and is left out
  // of the store set the prefill is sent.
  kvstore::ChainLookup ProbeOwners(const std::vector<Sha256Digest>& keys);
  kvstore::HitPolicyInput HitInput() const;
  // This request's chain in a prefill node's local cache (the router's cache index) and in
  // the store (ViewFor), and the hit over both.
  kvstore::TierLookups TiersOn(const RegisteredNode& node);
  kvstore::TieredHit HitOn(const RegisteredNode& node);
  // Logs and counts the admission's choice, its inputs and the runner-up.
  void NoteChoice(const Admission::Admitted& admitted);
  // The first token reached the client now.
  void FirstToken();
  // The decode node's reservation is given back (the attempt ends before its stream); its
  // answer (a failure to reach it is the router's own evidence that the node is down).
  grpc::Status ReleaseReservation(Attempt& attempt);

  // Adds one token's text to `response`; true when it completed a stop string.
  bool AddText(int32_t token, v1::GenerateResponse& response);
  // The text held at the end of generation; true when it held a stop string after all.
  bool FlushText(v1::GenerateResponse& response);
  // Whether the first attempt is shadow verified, and how far: the client's
  // GenerateRequest.fidelity_tokens, or --fidelity-tokens for a request served with truncation
  // and drawn at --fidelity-sample-rate.
  uint32_t FidelityTokens() const;
  // Ends `response` with `reason`, the usage so far and the timings.
  void Finish(v1::FinishReason reason, v1::GenerateResponse& response);
  // Writes one message to the client, cancelling the call if it stays blocked past
  // --stream-idle-timeout; false when the client is gone. Counts the tokens delivered.
  bool Send(const v1::GenerateResponse& response);

  const RouterParts& router_;
  grpc::ServerContext* context_;
  const v1::GenerateRequest* request_;  // the client's, or encoded_
  v1::GenerateRequest encoded_;
  ResponseWriter* writer_;
  RequestTrace& trace_;

  // Fixed by Resolve and Validate.
  const ServedModel* model_ = nullptr;
  RouterService::Effective effective_{};
  std::optional<text::IncrementalDetokenizer> detokenizer_;
  std::optional<text::StopStrings> stop_strings_;

  // Kept across attempts.
  std::vector<int32_t> generated_;
  std::vector<std::string> lost_decode_, lost_prefill_;
  std::optional<uint32_t> s_valid_;  // decided once; a re-prefill keeps it
  // The weights serving the request, fixed with s_valid: a re-prefill after tokens were
  // streamed continues on the same weights (a rollout may run two versions side by side).
  std::string fingerprint_;
  std::map<AttemptFailure, int> retries_;
  std::map<std::string, PrefixView> views_;  // by fingerprint
  std::pair<const std::string, PrefixView>* last_view_ = nullptr;  // TiersOn's last
  // The registered fingerprint it was found for (held: a pointer is never reused meanwhile).
  std::shared_ptr<const std::string> last_fingerprint_;
  std::optional<StoreSet> stores_;
  // The store nodes the prefill is sent when the lookup found some silent (ProbeOwners).
  std::optional<v1::StoreFleet> prefill_fleet_;
  double predicted_ttft_ms_ = 0;
  // Shadow verification: the completion tokens the first attempt's decode node compares
  // (the client's ask, or the router's sample of a truncated request; 0: none).
  uint32_t fidelity_tokens_ = 0;
  v1::Usage usage_;
  // Speculative decoding's counts: of decode streams that ended, and of the current one.
  uint32_t drafts_before_ = 0, accepted_before_ = 0, drafts_now_ = 0, accepted_now_ = 0;
  v1::Timings timings_;

  // The last attempt's outcome.
  bool finished_ = false;  // the client has had its last message
  std::optional<AttemptFailure> failure_;
  std::string failed_node_;
};

}  // namespace baton::router
