// The observability pack against the real binaries: `baton up` on loopback, scraped every
// second by Debian's Prometheus with helm/baton/files/prometheus/baton-rules.yaml loaded, and a
// few requests. Then every query of the Grafana dashboard (helm/baton/files/grafana) and every
// rule expression goes through Prometheus's HTTP API:
//   - each parses and evaluates; a dashboard query and a recording rule return series;
//   - every metric a query names (baton_* and the recorded namespace:baton_* series) has
//     series, every label a matcher names exists on that metric (except `namespace`, which the
//     Prometheus Operator adds), and a selector of equality matchers only (le="2.5",
//     slo="ttft") selects series, so a misspelt name, label or bucket bound fails here;
//   - Prometheus's rule manager has evaluated every rule of the file and reports it healthy.
// Each failure names the query. Every wait is bounded by a deadline. Without a prometheus
// binary (apt-get install prometheus) the test exits 77, which ctest reports as skipped.
#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "e2e/baton_up.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "test_dir.h"
#include "testing/eventually.h"
#include "testing/free_port.h"
#include "yaml-cpp/yaml.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using ::baton::testing::Eventually;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

// How often a poll asks Prometheus again (it scrapes and evaluates every second).
constexpr auto kPoll = std::chrono::milliseconds(100);

const fs::path kSource = BATON_SOURCE_DIR;
const fs::path kRules = kSource / "helm/baton/files/prometheus/baton-rules.yaml";
const fs::path kDashboard = kSource / "helm/baton/files/grafana/baton-dashboard.json";

// The binary `name` on PATH; "" when there is none.
std::string FindProgram(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  for (size_t at = 0; at <= dirs.size();) {
    const size_t end = std::min(dirs.find(':', at), dirs.size());
    const fs::path candidate = fs::path(dirs.substr(at, end - at)) / name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
    at = end + 1;
  }
  return "";
}

// GET (form empty) or POST (form-encoded `form`) http://address/path; the body and the HTTP
// status (0 when the request failed).
std::pair<std::string, long> Http(const std::string& address, const std::string& path,
                                  const std::string& form = "") {
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return {"", 0};
  std::string body;
  const std::string url = "http://" + address + path;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, 10L);
  if (!form.empty()) curl_easy_setopt(curl, CURLOPT_POSTFIELDS, form.c_str());
  curl_easy_setopt(
      curl, CURLOPT_WRITEFUNCTION, +[](char* data, size_t size, size_t n, void* out) {
        static_cast<std::string*>(out)->append(data, size * n);
        return size * n;
      });
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  long status = 0;
  if (curl_easy_perform(curl) == CURLE_OK) {
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  }
  curl_easy_cleanup(curl);
  return {body, status};
}

// Prometheus on 127.0.0.1, scraping `targets` (job name -> host:port) every second and
// evaluating the rules file every second; stopped with SIGTERM when the object goes.
class Prometheus {
 public:
  Prometheus(const std::string& program, const fs::path& dir,
             const std::map<std::string, std::string>& targets)
      : address_("127.0.0.1:" + std::to_string(baton::testing::FreePort())) {
    fs::create_directories(dir);
    std::ofstream config(dir / "prometheus.yml");
    config << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
           << "  evaluation_interval: 1s\n"
           << "rule_files:\n  - " << kRules.string() << "\n"
           << "scrape_configs:\n";
    for (const auto& [job, target] : targets) {
      config << "  - job_name: " << job << "\n    static_configs:\n      - targets: ['" << target
             << "']\n";
    }
    config.close();
    pid_ = testing::Spawn({program, "--config.file=" + (dir / "prometheus.yml").string(),
                           "--storage.tsdb.path=" + (dir / "tsdb").string(),
                           "--web.listen-address=" + address_, "--log.level=warn"},
                          (dir / "prometheus.log").string());
    log_ = dir / "prometheus.log";
  }
  ~Prometheus() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    int status;
    waitpid(pid_, &status, 0);
  }
  Prometheus(const Prometheus&) = delete;
  Prometheus& operator=(const Prometheus&) = delete;

  // Whether /-/ready answers 200 before `deadline` (false at once if the process has exited).
  bool WaitReady(Clock::time_point deadline) {
    return Eventually(
               [&] {
                 int status;
                 if (pid_ <= 0 || waitpid(pid_, &status, WNOHANG) == pid_) {
                   pid_ = -1;
                   return true;
                 }
                 return Http(address_, "/-/ready").second == 200;
               },
               deadline, kPoll) &&
           pid_ > 0;
  }
  // An instant query: the API's answer, or {"status": "error", "error": why}.
  json Query(const std::string& expr) const {
    CURL* curl = curl_easy_init();
    char* escaped = curl_easy_escape(curl, expr.c_str(), static_cast<int>(expr.size()));
    const std::string form = std::string("query=") + escaped;
    curl_free(escaped);
    curl_easy_cleanup(curl);
    return Api("/api/v1/query", form);
  }
  json Api(const std::string& path, const std::string& form = "") const {
    const auto [body, status] = Http(address_, path, form);
    json answer = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (answer.is_discarded() || !answer.is_object()) {
      return {{"status", "error"}, {"error", "HTTP " + std::to_string(status) + ": " + body}};
    }
    return answer;
  }
  std::string log() const { return testing::ReadFile(log_); }

 private:
  std::string address_;
  fs::path log_;
  pid_t pid_ = -1;
};

// The series an instant query returned (0 when it failed).
size_t SeriesCount(const json& answer) {
  if (answer.value("status", "") != "success") return 0;
  const json& result = answer["data"]["result"];
  return result.is_array() ? result.size() : 1;  // a scalar or string result is one value
}

// The number an instant query returned as its only sample; -1 when there is none.
double OnlyValue(const json& answer) {
  if (SeriesCount(answer) != 1 || !answer["data"]["result"].is_array()) return -1;
  return std::stod(answer["data"]["result"][0]["value"][1].get<std::string>());
}

// A query of the dashboard or the rules file, and where it comes from for failure messages.
struct Query {
  std::string where;
  std::string expr;
  bool needs_series;  // dashboard queries and recording rules must return series
};

// One metric selector of a query: the metric's name and its label matchers.
struct Selector {
  std::string name;
  struct Matcher {
    std::string label, op, value;
  };
  std::vector<Matcher> matchers;
};

// The selectors of `expr` whose metric names contain "baton" (identifiers that are functions,
// keywords or label names never do in these queries).
std::vector<Selector> Selectors(const std::string& expr) {
  static const std::regex selector(R"(([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{([^}]*)\})?)");
  static const std::regex matcher(
      R"re(([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)")re");
  std::vector<Selector> out;
  for (auto it = std::sregex_iterator(expr.begin(), expr.end(), selector);
       it != std::sregex_iterator(); ++it) {
    const std::string name = (*it)[1].str();
    if (name.find("baton") == std::string::npos) continue;
    Selector s{name, {}};
    const std::string body = (*it)[3].str();
    for (auto m = std::sregex_iterator(body.begin(), body.end(), matcher);
         m != std::sregex_iterator(); ++m) {
      s.matchers.push_back({(*m)[1].str(), (*m)[2].str(), (*m)[3].str()});
    }
    out.push_back(std::move(s));
  }
  return out;
}

// Every target expression of the dashboard's panels (rows' panels included), with Grafana's
// variables set as for all namespaces over a one-minute rate window.
void DashboardQueries(const json& panels, std::vector<Query>& out) {
  for (const json& panel : panels) {
    if (panel.contains("panels")) DashboardQueries(panel["panels"], out);
    for (const json& target : panel.value("targets", json::array())) {
      std::string expr = target.value("expr", "");
      expr = std::regex_replace(expr, std::regex(R"(\$__rate_interval)"), "1m");
      expr = std::regex_replace(expr, std::regex(R"(\$namespace)"), ".*");
      out.push_back({"dashboard panel \"" + panel.value("title", "?") + "\" target " +
                         target.value("refId", "?"),
                     expr, true});
    }
  }
}

// What the test runs: the dashboard's queries, then the rules file's expressions.
struct Queries {
  std::vector<Query> all;
  std::set<std::string> variable_metrics;  // label_values(<metric>, ...) of the variables
  int rules = 0;                           // rules in the file
};

void LoadQueries(Queries* out) {
  std::ifstream dashboard_file(kDashboard);
  const json dashboard = json::parse(dashboard_file, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(dashboard.is_discarded()) << kDashboard << " is not JSON";
  DashboardQueries(dashboard["panels"], out->all);
  ASSERT_GE(out->all.size(), 20u) << "the dashboard's panels lost their queries";
  for (const json& variable : dashboard["templating"]["list"]) {
    const std::string definition = variable.value("definition", "");
    std::smatch m;
    if (std::regex_search(definition, m, std::regex(R"(label_values\((\w+))"))) {
      out->variable_metrics.insert(m[1].str());
    }
  }
  const YAML::Node rules = YAML::LoadFile(kRules.string());
  for (const YAML::Node& group : rules["groups"]) {
    for (const YAML::Node& rule : group["rules"]) {
      const bool record = rule["record"].IsDefined();
      std::string where = record ? "recording rule " + rule["record"].as<std::string>()
                                 : "alert " + rule["alert"].as<std::string>();
      // Recording rules share names; their labels tell them apart.
      for (const auto& label : record ? rule["labels"] : YAML::Node()) {
        where += " " + label.first.as<std::string>() + "=" + label.second.as<std::string>();
      }
      out->all.push_back({where, rule["expr"].as<std::string>(), record});
      ++out->rules;
    }
  }
  for (const Query& q : out->all) {
    EXPECT_EQ(q.expr.find('$'), std::string::npos)
        << q.where << ": an unknown variable: " << q.expr;
  }
}

// Every metric a query names has series, every label a matcher names (but `namespace`) is on
// some series of its metric, and every selector of equality matchers only selects series.
void ExpectSelectorsMatch(const Prometheus& prometheus, const Queries& queries,
                          Clock::time_point deadline) {
  std::map<std::string, std::vector<std::string>> users;  // metric -> where it is used
  for (const std::string& name : queries.variable_metrics) {
    users[name].push_back("dashboard variable");
  }
  std::map<std::string, const Query*> equality_selectors;  // selector text -> a query using it
  std::map<std::pair<std::string, std::string>, const Query*> labels;  // (metric, label) -> query
  for (const Query& q : queries.all) {
    for (const Selector& s : Selectors(q.expr)) {
      users[s.name].push_back(q.where);
      bool equality_only = !s.matchers.empty();
      std::string text = s.name + "{";
      for (const Selector::Matcher& m : s.matchers) {
        if (m.label != "namespace") labels.emplace(std::make_pair(s.name, m.label), &q);
        equality_only = equality_only && m.op == "=";
        text += m.label + m.op + "\"" + m.value + "\",";
      }
      if (equality_only) equality_selectors.emplace(text + "}", &q);
    }
  }
  auto selects = [&](const std::string& selector) {
    return Eventually([&] { return SeriesCount(prometheus.Query("count(" + selector + ")")) > 0; },
                      deadline, kPoll);
  };
  for (const auto& [name, where] : users) {
    EXPECT_TRUE(selects("{__name__=\"" + name + "\"}"))
        << name << " has no series; used by " << where.front() << " (and " << where.size() - 1
        << " more)";
  }
  for (const auto& [metric_label, q] : labels) {
    const auto& [metric, label] = metric_label;
    EXPECT_TRUE(selects("{__name__=\"" + metric + "\", " + label + "!=\"\"}"))
        << q->where << ": no " << metric << " series has the label " << label << ": " << q->expr;
  }
  for (const auto& [selector, q] : equality_selectors) {
    EXPECT_TRUE(selects(selector))
        << q->where << ": " << selector << " selects no series: " << q->expr;
  }
}

// Every query evaluates; dashboard queries and recording rules return series.
void ExpectQueriesEvaluate(const Prometheus& prometheus, const Queries& queries,
                           Clock::time_point deadline) {
  for (const Query& q : queries.all) {
    json answer;
    const ::testing::AssertionResult ok = Eventually(
        [&] {
          answer = prometheus.Query(q.expr);
          if (answer.value("status", "") != "success") return true;  // a parse error stays one
          return !q.needs_series || SeriesCount(answer) > 0;
        },
        deadline, kPoll);
    EXPECT_EQ(answer.value("status", ""), "success")
        << q.where << " does not evaluate: " << answer.value("error", answer.dump()) << "\n"
        << q.expr;
    EXPECT_TRUE(ok) << q.where << " returns no series:\n" << q.expr;
  }
}

// The rule manager loaded the whole file, has evaluated every rule, and none failed.
void ExpectRulesHealthy(const Prometheus& prometheus, int rules, Clock::time_point deadline) {
  std::string unhealthy;
  const ::testing::AssertionResult healthy = Eventually(
      [&] {
        const json answer = prometheus.Api("/api/v1/rules");
        if (answer.value("status", "") != "success") return false;
        int evaluated = 0;
        unhealthy.clear();
        for (const json& group : answer["data"]["groups"]) {
          for (const json& rule : group["rules"]) {
            if (rule.value("health", "") == "ok") {
              ++evaluated;
            } else {
              unhealthy += "\n  " + rule.value("name", "?") + ": " + rule.value("health", "") +
                           " " + rule.value("lastError", "");
            }
          }
        }
        return evaluated == rules && unhealthy.empty();
      },
      deadline, kPoll);
  EXPECT_TRUE(healthy) << "rules not all evaluated and healthy (of " << rules << "):" << unhealthy;
}

TEST(PrometheusLive, DashboardAndRulesEvaluateOnBatonUpMetrics) {
  // Queries first: a file that does not parse fails before anything starts.
  Queries queries;
  ASSERT_NO_FATAL_FAILURE(LoadQueries(&queries));

  const fs::path dir = testing::ProcessTempDir();
  const std::string model = (dir / "tiny").string();
  ASSERT_EQ(std::system((std::string(BATONCTL_PATH) + " make-model --preset tiny --out " + model +
                         " > /dev/null")
                            .c_str()),
            0);
  // Every truncated request shadow verified, so that the baton_fidelity_* series exist.
  testing::BatonUp up(dir / "up", model, {"--decode-pages", "256", "--fidelity-sample-rate", "1"});
  ASSERT_TRUE(up.WaitUntilUp()) << up.log();
  std::map<std::string, std::string> targets;
  for (const char* role : {"router", "prefill", "decode", "kvstore"}) {
    targets[std::string("baton-") + role] = up.Address(std::string(role) + ".metrics");
    ASSERT_FALSE(targets[std::string("baton-") + role].empty()) << role << ": no metrics address";
  }
  Prometheus prometheus(FindProgram("prometheus"), dir / "prometheus", targets);
  ASSERT_TRUE(prometheus.WaitReady(Clock::now() + std::chrono::seconds(30))) << prometheus.log();

  // Traffic: two requests with one prompt (the second hits the prefix store) and one with
  // another, all truncated so that the router looks prefixes up.
  const std::string router = up.Address("router.addr");
  for (const char* first : {"1", "1", "7"}) {
    std::string tokens = first;
    for (int i = 2; i <= 40; ++i) tokens += "," + std::to_string(i);
    const std::string command = std::string(BATONCTL_PATH) + " generate --addr " + router +
                                " --tokens " + tokens +
                                " --max-tokens 8 --mode compact --keep 22 > /dev/null 2>&1";
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
  }
  // Scraped: all four targets up, and the requests counted.
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  ASSERT_TRUE(Eventually(
      [&] {
        return OnlyValue(prometheus.Query("count(up == 1)")) == 4 &&
               OnlyValue(prometheus.Query("sum(baton_requests_total)")) >= 3;
      },
      deadline, kPoll))
      << "Prometheus did not scrape baton up's four targets and the three requests\n"
      << prometheus.log();

  ExpectSelectorsMatch(prometheus, queries, deadline);
  ExpectQueriesEvaluate(prometheus, queries, deadline);
  ExpectRulesHealthy(prometheus, queries.rules, deadline);
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (baton::FindProgram("prometheus").empty()) {
    std::cout << "SKIP: no prometheus binary on PATH (apt-get install prometheus; "
                 "scripts/setup.sh installs it)\n";
    return 77;
  }
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const int status = RUN_ALL_TESTS();
  curl_global_cleanup();
  return status;
}
