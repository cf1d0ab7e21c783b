#include "baton/common/log.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <memory>

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

void Emit(spdlog::level::level_enum level, absl::string_view event, Fields fields) {
  const std::shared_ptr<spdlog::logger>& logger = Logger();
  if (!logger->should_log(level)) return;
  std::string line;
  if (json_format.load(std::memory_order_relaxed)) {
    // The pattern opens the object with ts, level and binary; the event and fields close it.
    line = "\"event\":" + Dump(std::string(event));
    for (const auto& [key, value] : fields) {
      line += "," + Dump(std::string(key)) + ":" + Dump(value);
    }
    line += "}";
  } else {
    line.assign(event.data(), event.size());
    for (const auto& [key, value] : fields) {
      line += ' ';
      line += key;
      line += '=';
      line += Dump(value);
    }
  }
  logger->log(level, line);
}

}  // namespace

void AddLogFlags(CLI::App& app, LogOptions& options) {
  app.add_option("--log-format", options.format, "Log lines as text or json")
      ->check(CLI::IsMember({"text", "json"}));
  app.add_option("--log-level", options.level, "Least severe events logged")
      ->check(CLI::IsMember({"debug", "info", "warn", "error"}));
}

void Init(const std::string& binary, const LogOptions& options) {
  const bool json = options.format == "json";
  json_format.store(json);
  const std::shared_ptr<spdlog::logger>& logger = Logger();
  logger->set_level(spdlog::level::from_str(options.level));
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

void Debug(absl::string_view event, Fields fields) { Emit(spdlog::level::debug, event, fields); }
void Info(absl::string_view event, Fields fields) { Emit(spdlog::level::info, event, fields); }
void Warn(absl::string_view event, Fields fields) { Emit(spdlog::level::warn, event, fields); }
void Error(absl::string_view event, Fields fields) { Emit(spdlog::level::err, event, fields); }

}  // namespace baton::log
