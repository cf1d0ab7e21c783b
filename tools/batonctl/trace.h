// Workload traces in the Mooncake JSONL format (FAST'25 trace release), and the deterministic
// prompt tokens a replayer or simulator makes for them. Used by `batonctl simulate` and
// `batonctl replay`.
//
// A trace line is one JSON object: `timestamp` (ms since the trace's start), `input_length`
// and `output_length` (tokens), `hash_ids` (one id per `trace_block` tokens of the prompt,
// 512 in Mooncake's traces; equal ids at equal positions mean a shared prefix block). Traces
// carry no text: TraceTokens makes the tokens of each hash id as a pure function of the id,
// so equal ids give equal token blocks, hence equal chain keys in the prefix store.
//
// Everything here is a pure function of its inputs; safe to call from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton::tools {

// Tokens per hash id in Mooncake's traces.
inline constexpr int64_t kMooncakeTraceBlock = 512;

// Bounds on what a trace may ask for; a trace is input from anywhere, and these values size
// allocations. A line's lengths are at most the largest model context baton accepts
// (kMaxPositionEmbeddings, 2^24 tokens); a hash id stands for at most 2^20 tokens; the length
// scale is at most 16, so a scaled prompt stays below 2^28 tokens.
inline constexpr int64_t kMaxTraceLength = int64_t{1} << 24;
inline constexpr int64_t kMaxTraceBlock = int64_t{1} << 20;
inline constexpr double kMaxLengthScale = 16;

struct TraceRequest {
  int64_t line = 0;               // 1-based line of the trace file, for messages
  double timestamp_ms = 0;        // arrival, >= 0; need not increase from line to line
  int64_t input_length = 0;       // prompt tokens, in [1, kMaxTraceLength]
  int64_t output_length = 0;      // completion tokens, in [0, kMaxTraceLength]
  std::vector<int64_t> hash_ids;  // at least ceil(input_length / trace_block) ids
};

// Parses one line; trace_block must lie in [1, kMaxTraceBlock]. Unknown keys are ignored.
// Errors (INVALID_ARGUMENT) read "line N: <field>: <what is wrong and what is allowed>".
absl::StatusOr<TraceRequest> ParseTraceLine(absl::string_view text, int64_t line,
                                            int64_t trace_block = kMooncakeTraceBlock);

// Parses a whole trace: one request per non-blank line, in file order (blank lines are
// skipped but counted). An empty trace is an error.
absl::StatusOr<std::vector<TraceRequest>> ParseTrace(absl::string_view text,
                                                     int64_t trace_block = kMooncakeTraceBlock);

// Reads and parses the file at `path`; errors start with the path. NOT_FOUND when it cannot
// be read.
absl::StatusOr<std::vector<TraceRequest>> LoadTrace(const std::string& path,
                                                    int64_t trace_block = kMooncakeTraceBlock);

// The requests of one prefix group in `one_in` (>= 1; 1: all of them), in trace order: a
// request's group is its first hash id, and a group is in when a splitmix64 mix of that id is
// 0 modulo `one_in`, so every request that shares a prompt's first block, and with it any longer
// prefix, is in or out together. Its arrivals stay where they were: the sample carries about
// 1/one_in of the trace's load with its prefix sharing intact, for 1/one_in of the nodes to
// serve (`batonctl capacity --sample-one-in`; a smaller pool, so a little worse than the whole
// cluster serves the whole trace).
std::vector<TraceRequest> SamplePrefixGroups(const std::vector<TraceRequest>& trace,
                                             int64_t one_in);

struct TokenOptions {
  int64_t trace_block = kMooncakeTraceBlock;  // tokens per hash id in the trace
  // Scales both the prompt length and the tokens per hash id (each rounded to nearest, at
  // least 1), e.g. 0.25 to fit a trace to a model with a shorter context.
  double length_scale = 1.0;
  // Token ids are drawn from [3, vocab_size), leaving the special ids 0..2 alone. The default
  // is the `small` model preset's vocabulary.
  int64_t vocab_size = 4096;
};

// Checks trace_block in [1, kMaxTraceBlock], length_scale in (0, kMaxLengthScale], vocab_size
// in [4, 2^31] (ids are int32); the message names the field.
absl::Status ValidateTokenOptions(const TokenOptions& options);

// max(1, round(trace_block * length_scale)): tokens each hash id stands for.
int64_t TokensPerHashId(const TokenOptions& options);

// The prompt length TraceTokens gives: max(1, round(input_length * length_scale)), but no
// more than hash_ids.size() * TokensPerHashId (rounding may otherwise ask for a few tokens
// past the last id's block).
int64_t ScaledPromptLength(const TraceRequest& request, const TokenOptions& options);

// The `tokens` token ids of hash id `hash_id`: a splitmix64 stream seeded by the id, each value
// mapped to [3, vocab_size). A pure function of (hash_id, tokens, vocab_size); a shorter block
// is a prefix of a longer one.
std::vector<int32_t> HashIdTokens(int64_t hash_id, int64_t tokens, int64_t vocab_size);

// The prompt of `request`: the blocks of its hash ids, in order, cut to
// ScaledPromptLength(request, options) tokens. `options` must have passed
// ValidateTokenOptions.
std::vector<int32_t> TraceTokens(const TraceRequest& request, const TokenOptions& options);

}  // namespace baton::tools
