#include "baton/common/wire_bounds.h"

#include "absl/strings/str_cat.h"

namespace baton {

absl::Status CheckBytes(absl::string_view field, absl::string_view value, uint64_t max_bytes) {
  if (value.size() > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", value.size(), " bytes; it must be at most ", max_bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status CheckRequestId(absl::string_view field, absl::string_view id) {
  return CheckBytes(field, id, kMaxRequestIdBytes);
}

absl::Status CheckStopStrings(absl::string_view field,
                              const google::protobuf::RepeatedPtrField<std::string>& stop,
                              bool name_index) {
  if (stop.size() > kMaxStopStrings) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", stop.size(), " strings; at most ",
                                                   kMaxStopStrings, " are allowed"));
  }
  for (int i = 0; i < stop.size(); ++i) {
    const uint64_t bytes = stop[i].size();
    if (bytes < 1 || bytes > kMaxStopStringBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, name_index ? absl::StrCat("[", i, "]") : "", ": ", bytes,
                       " bytes; it must be 1 to ", kMaxStopStringBytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSampling(absl::string_view field, const v1::SamplingParams& s,
                           const ModelConfig& config) {
  if (!(s.temperature() >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".temperature: ", s.temperature(), " must be >= 0"));
  }
  if (!(s.top_p() >= 0 && s.top_p() <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".top_p: ", s.top_p(), " must lie in [0, 1]"));
  }
  if (s.stop_token_ids_size() > kMaxStopTokenIds) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".stop_token_ids: ", s.stop_token_ids_size(), " ids; at most ",
                     kMaxStopTokenIds, " are allowed"));
  }
  if (absl::Status st =
          CheckStopStrings(absl::StrCat(field, ".stop"), s.stop(), /*name_index=*/true);
      !st.ok()) {
    return st;
  }
  for (int32_t stop : s.stop_token_ids()) {
    if (stop < 0 || stop >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".stop_token_ids: ", stop,
                                                     " is outside the vocabulary [0, ",
                                                     config.vocab_size, ")"));
    }
  }
  if (!v1::Speculative_IsValid(s.speculative())) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".speculative: ", s.speculative(),
                     " is unknown; allowed: DEFAULT, OFF, NGRAM, DRAFT"));
  }
  if (s.speculative_tokens() > static_cast<uint64_t>(config.max_backtrack)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".speculative_tokens: ", s.speculative_tokens(),
                     " exceeds the model's max_backtrack (", config.max_backtrack,
                     "): drafted rows are taken back within the rings' spare slots"));
  }
  return absl::OkStatus();
}

absl::Status CheckSequenceLength(absl::string_view prompt_field, uint64_t prompt_tokens,
                                 uint64_t more_tokens, const ModelConfig& config) {
  const uint64_t limit = static_cast<uint64_t>(config.max_position_embeddings);
  if (prompt_tokens < 1 || prompt_tokens > limit) {
    return absl::InvalidArgumentError(absl::StrCat(prompt_field, ": ", prompt_tokens,
                                                   " tokens; it must lie in [1, ", limit,
                                                   "] (the model's max_position_embeddings)"));
  }
  if (more_tokens > limit - prompt_tokens) {  // prompt + more > limit, without a sum to wrap
    return absl::InvalidArgumentError(
        absl::StrCat(prompt_field, " + tokens to generate: ", prompt_tokens, " + ", more_tokens,
                     " exceeds the model's max_position_embeddings ", limit));
  }
  return absl::OkStatus();
}

}  // namespace baton
