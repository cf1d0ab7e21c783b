#include "baton/common/log.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <memory>

#include "baton/common/options.h"

namespace baton::log {
namespace {

std::atomic<bool> json_format{false};

std::shared_ptr<spdlog::logger>& Logger() {
  // Until Init runs (tests, tools), events go to stderr as text.
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = std::make_shared<spdlog::logger>(
        "baton", std::make_shared<spdlog::sinks::stderr_sink_mt>());
    l->set_pattern("%Y-%m-%dT%H:%M:%S.%eZ %l %v", spdlog::pattern_time_type::utc);
    return l;
  }();
  return logger;
}

std::string Dump(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void Emit(spdlog::level::level_enum level, absl::string_view event, const TraceIds* trace,
          Fields fields) {
  const std::shared_ptr<spdlog::logger>& logger = Logger();
  if (!logger->should_log(level)) return;
  const bool json = json_format.load(std::memory_order_relaxed);
  std::string line;
  auto add = [&](absl::string_view key, const nlohmann::json& value) {
    if (json) {
      line += "," + Dump(std::string(key)) + ":" + Dump(value);
    } else {
      line += ' ';
      line.append(key.data(), key.size());
      line += '=';
      line += Dump(value);
    }
  };
  // The pattern opens a JSON object with ts, level and binary; the event and fields close it.
  if (json) {
    line = "\"event\":" + Dump(std::string(event));
  } else {
    line.assign(event.data(), event.size());
  }
  if (trace != nullptr) {
    add("trace_id", std::string(trace->trace_id));
    add("span_id", std::string(trace->span_id));
    if (!trace->parent_span_id.empty()) add("parent_span_id", std::string(trace->parent_span_id));
  }
  for (const auto& [key, value] : fields) add(key, value);
  if (json) line += "}";
  logger->log(level, line);
}

}  // namespace

const char* FormatName(Format format) {
  return format == Format::kJson ? "json" : "text";
}

const char* LevelName(Level level) {
  switch (level) {
    case Level::kDebug:
      return "debug";
    case Level::kInfo:
      return "info";
    case Level::kWarn:
      return "warn";
    case Level::kError:
      return "error";
  }
  return "info";
}

void AddLogFlags(CLI::App& app, LogOptions& options) {
  AddEnumOption(app, "--log-format", options.format, {Format::kText, Format::kJson}, FormatName,
                "Log lines as text or json");
  AddEnumOption(app, "--log-level", options.level,
                {Level::kDebug, Level::kInfo, Level::kWarn, Level::kError}, LevelName,
                "Least severe events logged");
}

void Init(const std::string& binary, const LogOptions& options) {
  const bool json = options.format == Format::kJson;
  json_format.store(json);
  const std::shared_ptr<spdlog::logger>& logger = Logger();
  constexpr spdlog::level::level_enum kLevels[] = {spdlog::level::debug, spdlog::level::info,
                                                   spdlog::level::warn, spdlog::level::err};
  logger->set_level(kLevels[static_cast<int>(options.level)]);
  if (json) {
    const std::string name = nlohmann::json(binary).dump();
    logger->set_pattern("{\"ts\":\"%Y-%m-%dT%H:%M:%S.%eZ\",\"level\":\"%l\",\"binary\":" + name +
                            ",%v",
                        spdlog::pattern_time_type::utc);
  } else {
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%eZ %l " + binary + " %v",
                        spdlog::pattern_time_type::utc);
  }
  logger->flush_on(spdlog::level::debug);
}

void Debug(absl::string_view event, Fields fields) {
  Emit(spdlog::level::debug, event, nullptr, fields);
}
void Info(absl::string_view event, Fields fields) {
  Emit(spdlog::level::info, event, nullptr, fields);
}
void Warn(absl::string_view event, Fields fields) {
  Emit(spdlog::level::warn, event, nullptr, fields);
}
void Error(absl::string_view event, Fields fields) {
  Emit(spdlog::level::err, event, nullptr, fields);
}
void Debug(const TraceIds& trace, absl::string_view event, Fields fields) {
  Emit(spdlog::level::debug, event, &trace, fields);
}
void Info(const TraceIds& trace, absl::string_view event, Fields fields) {
  Emit(spdlog::level::info, event, &trace, fields);
}
void Warn(const TraceIds& trace, absl::string_view event, Fields fields) {
  Emit(spdlog::level::warn, event, &trace, fields);
}

}  // namespace baton::log
