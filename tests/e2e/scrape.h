// Reads a Prometheus text exposition over HTTP (libcurl) and looks samples up by name and
// labels, for tests that check that a binary's metrics moved.
#pragma once

#include <curl/curl.h>

#include <map>
#include <optional>
#include <sstream>
#include <string>

namespace baton::testing {

// GET http://address/metrics; "" when the request fails.
inline std::string Scrape(const std::string& address) {
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return "";
  std::string body;
  const std::string url = "http://" + address + "/metrics";
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, 10L);
  curl_easy_setopt(
      curl, CURLOPT_WRITEFUNCTION, +[](char* data, size_t size, size_t n, void* out) {
        static_cast<std::string*>(out)->append(data, size * n);
        return size * n;
      });
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  const CURLcode code = curl_easy_perform(curl);
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(curl);
  return code == CURLE_OK && status == 200 ? body : "";
}

// The value of the sample `name` whose labels are exactly `labels`; nullopt when absent.
inline std::optional<double> Sample(const std::string& exposition, const std::string& name,
                                    const std::map<std::string, std::string>& labels = {}) {
  std::istringstream lines(exposition);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == std::string::npos) continue;
    const std::string series = line.substr(0, space);
    const size_t brace = series.find('{');
    if (series.substr(0, brace) != name) continue;
    std::map<std::string, std::string> found;
    if (brace != std::string::npos) {
      // key="value",key="value"}
      size_t at = brace + 1;
      while (at < series.size() && series[at] != '}') {
        const size_t eq = series.find('=', at);
        const size_t close = series.find('"', eq + 2);
        found[series.substr(at, eq - at)] = series.substr(eq + 2, close - eq - 2);
        at = close + 1;
        if (at < series.size() && series[at] == ',') ++at;
      }
    }
    if (found == labels) return std::stod(line.substr(space + 1));
  }
  return std::nullopt;
}

}  // namespace baton::testing
