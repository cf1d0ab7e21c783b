#include "trace.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace baton::tools {
namespace {

absl::Status LineError(int64_t line, absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", field, ": ", what));
}

// A JSON integer that fits int64 (floats such as 3.0 and strings are refused).
bool AsInt64(const nlohmann::json& value, int64_t* out) {
  if (value.is_number_integer() && !value.is_number_unsigned()) {
    *out = value.get<int64_t>();
    return true;
  }
  if (value.is_number_unsigned() &&
      value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    *out = static_cast<int64_t>(value.get<uint64_t>());
    return true;
  }
  return false;
}

// A required integer field in [min, max].
absl::Status ReadCount(const nlohmann::json& object, const char* field, int64_t min, int64_t max,
                       int64_t line, int64_t* out) {
  auto it = object.find(field);
  if (it == object.end()) return LineError(line, field, "missing; expected an integer");
  if (!AsInt64(*it, out)) {
    return LineError(line, field, absl::StrCat("expected an integer, got ", it->dump()));
  }
  if (*out < min || *out > max) {
    return LineError(line, field,
                     absl::StrCat(*out, " is not allowed; it must lie in [", min, ", ", max, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckTraceBlock(int64_t trace_block) {
  if (trace_block < 1 || trace_block > kMaxTraceBlock) {
    return absl::InvalidArgumentError(
        absl::StrCat("trace_block is ", trace_block, "; it must lie in [1, ", kMaxTraceBlock, "]"));
  }
  return absl::OkStatus();
}

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

std::vector<TraceRequest> SamplePrefixGroups(const std::vector<TraceRequest>& trace,
                                             int64_t one_in) {
  if (one_in <= 1) return trace;
  std::vector<TraceRequest> sample;
  for (const TraceRequest& request : trace) {
    uint64_t state = request.hash_ids.empty() ? 0 : static_cast<uint64_t>(request.hash_ids[0]);
    if (SplitMix64(state) % static_cast<uint64_t>(one_in) == 0) sample.push_back(request);
  }
  return sample;
}

absl::StatusOr<TraceRequest> ParseTraceLine(absl::string_view text, int64_t line,
                                            int64_t trace_block) {
  if (absl::Status s = CheckTraceBlock(trace_block); !s.ok()) return s;
  const nlohmann::json object = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (object.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat("line ", line, ": not valid JSON"));
  }
  if (!object.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("line ", line, ": expected a JSON object, got ", object.type_name()));
  }
  TraceRequest request;
  request.line = line;
  auto timestamp = object.find("timestamp");
  if (timestamp == object.end()) {
    return LineError(line, "timestamp", "missing; expected a number of milliseconds >= 0");
  }
  if (!timestamp->is_number()) {
    return LineError(line, "timestamp",
                     absl::StrCat("expected a number of milliseconds, got ", timestamp->dump()));
  }
  request.timestamp_ms = timestamp->get<double>();
  if (!(request.timestamp_ms >= 0) || !std::isfinite(request.timestamp_ms)) {
    return LineError(line, "timestamp",
                     absl::StrCat(timestamp->dump(), " is not allowed; it must be >= 0"));
  }
  if (absl::Status s =
          ReadCount(object, "input_length", 1, kMaxTraceLength, line, &request.input_length);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          ReadCount(object, "output_length", 0, kMaxTraceLength, line, &request.output_length);
      !s.ok()) {
    return s;
  }
  auto ids = object.find("hash_ids");
  if (ids == object.end()) return LineError(line, "hash_ids", "missing; expected an int array");
  if (!ids->is_array()) {
    return LineError(line, "hash_ids",
                     absl::StrCat("expected an array of integers, got ", ids->type_name()));
  }
  request.hash_ids.reserve(ids->size());
  for (size_t i = 0; i < ids->size(); ++i) {
    int64_t id = 0;
    if (!AsInt64((*ids)[i], &id)) {
      return LineError(
          line, "hash_ids",
          absl::StrCat("item ", i, " is ", (*ids)[i].dump(), "; expected an array of integers"));
    }
    request.hash_ids.push_back(id);
  }
  const int64_t needed = (request.input_length + trace_block - 1) / trace_block;
  if (static_cast<int64_t>(request.hash_ids.size()) < needed) {
    return LineError(
        line, "hash_ids",
        absl::StrCat(request.hash_ids.size(), " ids for input_length ", request.input_length,
                     "; at ", trace_block, " tokens per id it needs at least ", needed));
  }
  return request;
}

absl::StatusOr<std::vector<TraceRequest>> ParseTrace(absl::string_view text, int64_t trace_block) {
  const std::vector<absl::string_view> rows = absl::StrSplit(text, '\n');
  // Rows [first, end) parsed in order into `out`; the first bad one's error ends the range.
  auto parse = [&](size_t first, size_t end, std::vector<TraceRequest>& out) -> absl::Status {
    for (size_t i = first; i < end; ++i) {
      if (absl::StripAsciiWhitespace(rows[i]).empty()) continue;
      absl::StatusOr<TraceRequest> request =
          ParseTraceLine(rows[i], static_cast<int64_t>(i) + 1, trace_block);
      if (!request.ok()) return request.status();
      out.push_back(*std::move(request));
    }
    return absl::OkStatus();
  };
  // A trace of a million lines takes seconds to parse on one core: large ones are cut into a
  // range of rows a core, each parsed on its own thread and joined in order, and the error
  // reported is the first bad line's, as one pass would report it.
  constexpr size_t kRowsPerThread = size_t{1} << 14;
  const size_t threads = std::clamp<size_t>(rows.size() / kRowsPerThread, 1,
                                            std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::vector<TraceRequest>> parts(threads);
  std::vector<absl::Status> status(threads);
  std::vector<std::thread> running;
  for (size_t t = 1; t < threads; ++t) {
    running.emplace_back([&, t] {
      status[t] = parse(rows.size() * t / threads, rows.size() * (t + 1) / threads, parts[t]);
    });
  }
  status[0] = parse(0, rows.size() / threads, parts[0]);
  for (std::thread& thread : running) thread.join();
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  std::vector<TraceRequest> requests = std::move(parts[0]);
  for (size_t t = 1; t < threads; ++t) {
    std::move(parts[t].begin(), parts[t].end(), std::back_inserter(requests));
  }
  if (requests.empty()) return absl::InvalidArgumentError("the trace has no requests");
  return requests;
}

absl::StatusOr<std::vector<TraceRequest>> LoadTrace(const std::string& path, int64_t trace_block) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<std::vector<TraceRequest>> requests = ParseTrace(text.str(), trace_block);
  if (!requests.ok()) {
    return absl::Status(requests.status().code(),
                        absl::StrCat(path, ": ", requests.status().message()));
  }
  return requests;
}

absl::Status ValidateTokenOptions(const TokenOptions& options) {
  if (absl::Status s = CheckTraceBlock(options.trace_block); !s.ok()) return s;
  if (!(options.length_scale > 0 && options.length_scale <= kMaxLengthScale)) {
    return absl::InvalidArgumentError(absl::StrCat("length_scale is ", options.length_scale,
                                                   "; it must lie in (0, ", kMaxLengthScale, "]"));
  }
  constexpr int64_t kMaxVocab = int64_t{1} << 31;  // token ids are int32
  if (options.vocab_size < 4 || options.vocab_size > kMaxVocab) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_size is ", options.vocab_size,
                                                   "; it must lie in [4, ", kMaxVocab,
                                                   "] (ids 0..2 are special)"));
  }
  return absl::OkStatus();
}

int64_t TokensPerHashId(const TokenOptions& options) {
  return std::max<int64_t>(
      1, std::llround(static_cast<double>(options.trace_block) * options.length_scale));
}

int64_t ScaledPromptLength(const TraceRequest& request, const TokenOptions& options) {
  const int64_t scaled = std::max<int64_t>(
      1, std::llround(static_cast<double>(request.input_length) * options.length_scale));
  return std::min(scaled, static_cast<int64_t>(request.hash_ids.size()) * TokensPerHashId(options));
}

std::vector<int32_t> HashIdTokens(int64_t hash_id, int64_t tokens, int64_t vocab_size) {
  constexpr int64_t kFirstOrdinaryId = 3;  // 0..2 are special (pad, bos, eos)
  const uint64_t range = static_cast<uint64_t>(vocab_size - kFirstOrdinaryId);
  uint64_t state = static_cast<uint64_t>(hash_id);
  std::vector<int32_t> block(static_cast<size_t>(tokens));
  for (int32_t& token : block) {
    token = static_cast<int32_t>(kFirstOrdinaryId + SplitMix64(state) % range);
  }
  return block;
}

std::vector<int32_t> TraceTokens(const TraceRequest& request, const TokenOptions& options) {
  const int64_t per_id = TokensPerHashId(options);
  const int64_t length = ScaledPromptLength(request, options);
  std::vector<int32_t> tokens;
  tokens.reserve(static_cast<size_t>(length));
  for (int64_t id : request.hash_ids) {
    if (static_cast<int64_t>(tokens.size()) >= length) break;
    const std::vector<int32_t> block = HashIdTokens(id, per_id, options.vocab_size);
    const int64_t take = std::min<int64_t>(per_id, length - static_cast<int64_t>(tokens.size()));
    tokens.insert(tokens.end(), block.begin(), block.begin() + take);
  }
  return tokens;
}

}  // namespace baton::tools
