// Structured logs on stderr, one event a line, through spdlog:
//
//   json: {"ts":"2026-11-30T11:35:40.123Z","level":"info","binary":"baton-router",
//          "event":"request finished","trace_id":"4bf9…","span_id":"00f0…","request_id":"r-12",
//          "tokens":32}
//   text: 2026-11-30T11:35:40.123Z info baton-router request finished request_id="r-12" tokens=32
//
// Events name what happened; fields carry the values (request_id on every event about a
// request, and the request's trace ids, so one request can be followed across router, store,
// prefill and decode nodes).
#pragma once

#include <initializer_list>
#include <string>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace baton::log {

enum class Format { kText, kJson };
enum class Level { kDebug, kInfo, kWarn, kError };
const char* FormatName(Format format);  // "text", "json"
const char* LevelName(Level level);     // "debug", "info", "warn", "error"

struct LogOptions {
  Format format = Format::kText;
  Level level = Level::kInfo;  // the least severe events logged
};

// --log-format and --log-level.
void AddLogFlags(CLI::App& app, LogOptions& options);

// Sets up the process's logger for `binary`; call once after parsing flags.
void Init(const std::string& binary, const LogOptions& options);

using Fields = std::initializer_list<std::pair<const char*, nlohmann::json>>;

void Debug(absl::string_view event, Fields fields = {});
void Info(absl::string_view event, Fields fields = {});
void Warn(absl::string_view event, Fields fields = {});
void Error(absl::string_view event, Fields fields = {});

// The trace an event about a request belongs to (W3C trace context, baton/common/trace.h),
// written right after the event as trace_id, span_id and parent_span_id (when not empty).
struct TraceIds {
  absl::string_view trace_id, span_id, parent_span_id;
};
void Debug(const TraceIds& trace, absl::string_view event, Fields fields = {});
void Info(const TraceIds& trace, absl::string_view event, Fields fields = {});
void Warn(const TraceIds& trace, absl::string_view event, Fields fields = {});

}  // namespace baton::log
