// Bounds on the lengths and values a node receives on the wire (DESIGN section 6: every wire
// value is bounds-checked in 64 bits at every node that receives it). The router checks a
// request first, but the prefill and decode nodes check again: a peer may be buggy or
// compromised, and each of them sizes memory from these values.
//
// Every error is INVALID_ARGUMENT and its message names the field and what is allowed.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "baton/common/model_config.h"
#include "baton/v1/generation.pb.h"

namespace baton {

inline constexpr uint64_t kMaxRequestIdBytes = 256;
inline constexpr uint64_t kMaxCacheSaltBytes = 256;
inline constexpr uint64_t kMaxTenantBytes = 64;            // API key tenants (common/api_keys.h)
inline constexpr uint64_t kMaxIdentityBytes = 512;         // certificate identities (SPIFFE ids)
inline constexpr uint64_t kMaxAddressBytes = 512;          // host:port of a node
inline constexpr uint64_t kMaxNodeIdBytes = 256;           // a node's name at the router
inline constexpr uint64_t kMaxFingerprintBytes = 128;      // a model fingerprint (hex digest)
inline constexpr uint64_t kMaxModelNameBytes = 256;        // a served model's name
inline constexpr uint64_t kMaxUcxAddressBytes = 64 << 10;  // a UCX worker address
inline constexpr int kMaxStopTokenIds = 64;
inline constexpr int kMaxStopStrings = 16;
inline constexpr uint64_t kMaxStopStringBytes = 256;
// Completion positions one request's shadow verification compares (GenerateRequest and
// ReserveRequest fidelity_tokens, the router's --fidelity-tokens): each keeps a row of
// vocab_size logits on the decode node until its shadow runs.
inline constexpr uint32_t kMaxFidelityTokens = 256;

// The stop strings' rule: at most kMaxStopStrings, each of 1 to kMaxStopStringBytes bytes.
// The error names `field`, and a string at fault as `field`[i] when `name_index`: CheckSampling
// names sampling.stop[i]; the router's OpenAI front, which applies the rule first, names its
// client's "stop" whole, as the client may have written one string and not a list.
absl::Status CheckStopStrings(absl::string_view field,
                              const google::protobuf::RepeatedPtrField<std::string>& stop,
                              bool name_index);

// `value` is at most `max_bytes` bytes.
absl::Status CheckBytes(absl::string_view field, absl::string_view value, uint64_t max_bytes);

// At most kMaxRequestIdBytes bytes (empty is the caller's rule: the router makes one).
absl::Status CheckRequestId(absl::string_view field, absl::string_view id);

// At most kMaxStopTokenIds stop ids, each in the vocabulary; the stop strings' rule
// (CheckStopStrings); temperature >= 0 and top_p in [0, 1] (NaN refused); a known speculative
// method and speculative_tokens <= max_backtrack. `field` prefixes the
// message, e.g. "sampling".
absl::Status CheckSampling(absl::string_view field, const v1::SamplingParams& sampling,
                           const ModelConfig& config);

// The positions a request will hold fit the model: prompt_tokens >= 1, prompt_tokens <=
// max_position_embeddings, and prompt_tokens + more_tokens (generated positions still to come)
// <= max_position_embeddings, summed in 64 bits so that no uint32 sum can wrap.
// `prompt_field` names the prompt in the message.
absl::Status CheckSequenceLength(absl::string_view prompt_field, uint64_t prompt_tokens,
                                 uint64_t more_tokens, const ModelConfig& config);

}  // namespace baton
