// The OpenAI-compatible HTTP API end to end, with the real binaries: `baton up` serving its
// default model (tokenizer trained by scripts/setup.sh) to curl and to the official openai
// Node client, streamed and not; stop strings; bad bodies refused naming the field; API keys;
// 429 when the router's queue is full and 503 without nodes; 256 concurrent SSE streams.
#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "baton/common/hash.h"
#include "baton/common/trace.h"
#include "baton/model/model_factory.h"
#include "baton/text/tokenizer.h"
#include "baton_up.h"
#include "cluster.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "test_dir.h"
#include "text_model.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::BatonUp;
using testing::Cluster;
using testing::EventuallyThat;
using ::testing::HasSubstr;
using testing::TextModel;

struct HttpResult {
  long status = 0;  // 0: no response
  std::string body;
  std::map<std::string, std::string> headers;  // lower-case names
};

// One HTTP request with libcurl.
HttpResult Http(const std::string& method, const std::string& url, const std::string& body = "",
                const std::vector<std::string>& headers = {}, long timeout_s = 300,
                const std::string& ca = "") {
  HttpResult result;
  CURL* curl = curl_easy_init();
  curl_slist* list = curl_slist_append(nullptr, "Content-Type: application/json");
  for (const std::string& h : headers) list = curl_slist_append(list, h.c_str());
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
  if (method == "POST") curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, timeout_s);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  if (!ca.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, ca.c_str());
  curl_easy_setopt(
      curl, CURLOPT_WRITEFUNCTION, +[](char* data, size_t size, size_t n, void* out) {
        static_cast<std::string*>(out)->append(data, size * n);
        return size * n;
      });
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &result.body);
  curl_easy_setopt(
      curl, CURLOPT_HEADERFUNCTION, +[](char* data, size_t size, size_t n, void* out) {
        const std::string line(data, size * n);
        const size_t colon = line.find(':');
        if (colon != std::string::npos) {
          std::string name = line.substr(0, colon);
          for (char& c : name) c = static_cast<char>(std::tolower(c));
          std::string value = line.substr(colon + 1);
          value.erase(0, value.find_first_not_of(' '));
          value.erase(value.find_last_not_of("\r\n") + 1);
          (*static_cast<std::map<std::string, std::string>*>(out))[name] = value;
        }
        return size * n;
      });
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &result.headers);
  if (curl_easy_perform(curl) == CURLE_OK) {
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &result.status);
  }
  curl_slist_free_all(list);
  curl_easy_cleanup(curl);
  return result;
}

// The JSON events of a server-sent-event body; `done` says whether it ended with [DONE].
std::vector<json> Events(const std::string& body, bool* done) {
  std::vector<json> events;
  *done = false;
  size_t at = 0;
  while (at < body.size()) {
    size_t end = body.find("\n\n", at);
    if (end == std::string::npos) end = body.size();
    const std::string event = body.substr(at, end - at);
    at = end + 2;
    if (event.rfind("data: ", 0) != 0) continue;
    if (event == "data: [DONE]") {
      *done = at >= body.size();
      continue;
    }
    events.push_back(json::parse(event.substr(6), nullptr, false));
  }
  return events;
}

// The text a stream's chunks carry (completions' text or chat's delta content).
std::string StreamedText(const std::vector<json>& events) {
  std::string text;
  for (const json& e : events) {
    if (!e.contains("choices") || e["choices"].empty()) continue;
    const json& choice = e["choices"][0];
    if (choice.contains("text")) text += choice["text"].get<std::string>();
    if (choice.contains("delta") && choice["delta"].contains("content")) {
      text += choice["delta"]["content"].get<std::string>();
    }
  }
  return text;
}

struct Command {
  int exit = -1;
  std::string out;
};
Command RunShell(const std::string& command) {
  Command result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.out.append(buffer, n);
  const int status = pclose(pipe);
  result.exit = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// curl's own binary, as a user would run it: the body, then the status code on its own line.
HttpResult Curl(const std::string& url, const json& body, bool stream = false) {
  const Command c = RunShell("curl -sS " + std::string(stream ? "-N " : "") +
                             "-H 'Content-Type: application/json' -w '\\n%{http_code}' -d " +
                             ShellQuote(body.dump()) + " " + url);
  HttpResult result;
  const size_t last = c.out.rfind('\n');
  if (c.exit != 0 || last == std::string::npos) return result;
  result.status = std::stol(c.out.substr(last + 1));
  result.body = c.out.substr(0, last);
  return result;
}


// The OpenAI base URL `baton up` printed on its ready line.
std::string BaseUrl(const BatonUp& up) {
  std::smatch match;
  const std::string log = up.log();
  if (!std::regex_search(log, match, std::regex("OpenAI API at (https?://[0-9.]+:[0-9]+/v1)"))) {
    return "";
  }
  return match[1];
}

TEST(HttpTest, BatonUpServesItsDefaultModelToCurlAndTheOfficialOpenAiClient) {
  // No --model: baton up serves the trained model models/ced-brown-shared as "baton-small".
  BatonUp up(fs::path(testing::ProcessTempDir()) / "up", "");
  ASSERT_TRUE(up.WaitUntilUp()) << up.log();
  const std::string base = BaseUrl(up);
  ASSERT_FALSE(base.empty()) << "no http://HOST:PORT/v1 on the ready line:\n" << up.log();
  EXPECT_EQ(Http("GET", base.substr(0, base.size() - 3) + "/health").status, 200);
  const HttpResult models = Http("GET", base + "/models");
  ASSERT_EQ(models.status, 200) << models.body;
  EXPECT_EQ(json::parse(models.body)["data"][0]["id"], "baton-small");

  // Completions with curl, whole and streamed: greedy decoding gives the same text.
  const json completion = {{"model", "baton-small"},
                           {"prompt", "The jury said"},
                           {"max_tokens", 12},
                           {"temperature", 0},
                           {"ignore_eos", true}};
  const HttpResult whole = Curl(base + "/completions", completion);
  ASSERT_EQ(whole.status, 200) << whole.body;
  const json reply = json::parse(whole.body);
  const std::string text = reply["choices"][0]["text"];
  // The trained default writes words: letters and spaces more than half of it.
  EXPECT_GT(std::count_if(text.begin(), text.end(),
                          [](unsigned char c) { return std::isalpha(c) || c == ' '; }),
            static_cast<std::ptrdiff_t>(text.size() / 2))
      << text;
  EXPECT_EQ(reply["object"], "text_completion");
  EXPECT_EQ(reply["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(reply["usage"]["completion_tokens"], 12);
  EXPECT_GT(reply["usage"]["prompt_tokens"].get<int>(), 1);
  EXPECT_TRUE(reply["usage"]["prompt_tokens_details"].contains("cached_tokens"));
  json streamed_request = completion;
  streamed_request["stream"] = true;
  streamed_request["stream_options"] = {{"include_usage", true}};
  const HttpResult streamed = Curl(base + "/completions", streamed_request, /*stream=*/true);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  bool done = false;
  const std::vector<json> events = Events(streamed.body, &done);
  EXPECT_TRUE(done) << "the stream must end with data: [DONE]";
  EXPECT_EQ(StreamedText(events), text);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 12);

  // batonctl generate --prompt prints the same text (greedy by default).
  const Command batonctl =
      RunShell(std::string(BATONCTL_PATH) + " generate --addr " + up.Address("router.addr") +
               " --prompt 'The jury said' --max-tokens 12 --ignore-eos --json");
  ASSERT_EQ(batonctl.exit, 0) << batonctl.out;
  const json generated = json::parse(batonctl.out);
  EXPECT_EQ(generated["text"], text);
  // The streamed text is the detokenization of the tokens streamed, after the prompt.
  auto tokenizer =
      text::Tokenizer::Load(std::string(BATON_SOURCE_DIR) + "/models/ced-brown-shared", 4096);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  std::vector<int32_t> all = (*tokenizer)->Encode("The jury said", true);
  const std::string prompt_text = (*tokenizer)->Decode(all);
  for (int32_t id : generated["tokens"]) all.push_back(id);
  EXPECT_EQ(text, (*tokenizer)->Decode(all).substr(prompt_text.size()));

  // A stop string taken from the middle of that text, spanning tokens, ends it there.
  const size_t cut = text.size() / 2;
  const std::string stop = text.substr(cut, 4);
  json stopped_request = completion;
  stopped_request["stop"] = stop;
  const HttpResult stopped = Curl(base + "/completions", stopped_request);
  ASSERT_EQ(stopped.status, 200) << stopped.body;
  const json stopped_reply = json::parse(stopped.body);
  EXPECT_EQ(stopped_reply["choices"][0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(stopped_reply["choices"][0]["finish_reason"], "stop");
  EXPECT_LT(stopped_reply["usage"]["completion_tokens"].get<int>(), 12);

  // Chat with curl, whole and streamed.
  const json chat = {{"model", "baton-small"},
                     {"messages", {{{"role", "user"}, {"content", "Hello there"}}}},
                     {"max_tokens", 8},
                     {"temperature", 0},
                     {"ignore_eos", true}};
  const HttpResult chat_whole = Curl(base + "/chat/completions", chat);
  ASSERT_EQ(chat_whole.status, 200) << chat_whole.body;
  const json chat_reply = json::parse(chat_whole.body);
  EXPECT_EQ(chat_reply["object"], "chat.completion");
  EXPECT_EQ(chat_reply["choices"][0]["message"]["role"], "assistant");
  json chat_stream = chat;
  chat_stream["stream"] = true;
  const HttpResult chat_streamed = Curl(base + "/chat/completions", chat_stream, true);
  const std::vector<json> chat_events = Events(chat_streamed.body, &done);
  EXPECT_TRUE(done);
  EXPECT_EQ(StreamedText(chat_events), chat_reply["choices"][0]["message"]["content"]);

  // The official openai client for Node (tests/http/openai_client.js): completions and chat,
  // streamed and not, a 400 naming the field, and the model list.
  const Command node =
      RunShell("BATON_NPM_DIR=" + std::string(BATON_NPM_DIR) + " node " + BATON_SOURCE_DIR +
               "/tests/http/openai_client.js --base-url " + base + " --model baton-small 2>&1");
  EXPECT_EQ(node.exit, 0) << node.out;
  EXPECT_THAT(node.out, HasSubstr("\"ok\":true"));
}

TEST(HttpTest, BadBodiesAre400NamingTheFieldAndAKeyIsNeededWhenKeysAreSet) {
  const fs::path dir = fs::path(testing::ProcessTempDir()) / "keys";
  fs::create_directories(dir);
  std::ofstream(dir / "keys.yaml") << "\"http-test-key-0123456789\": team-a\n";
  BatonUp up(dir / "up", TextModel(), {"--api-keys", (dir / "keys.yaml").string()});
  ASSERT_TRUE(up.WaitUntilUp()) << up.log();
  const std::string base = BaseUrl(up);
  ASSERT_FALSE(base.empty()) << up.log();
  const std::string key = "Authorization: Bearer http-test-key-0123456789";
  const json good = {{"prompt", "Hello"}, {"max_tokens", 2}};

  // No key, a wrong key: 401 in OpenAI's error shape, on every /v1 endpoint.
  for (const std::vector<std::string>& headers :
       {std::vector<std::string>{},
        std::vector<std::string>{"Authorization: Bearer wrong-key-0123456789"}}) {
    for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
             {"POST", "/completions"}, {"POST", "/chat/completions"}, {"GET", "/models"}}) {
      const HttpResult r = Http(method, base + path, good.dump(), headers);
      EXPECT_EQ(r.status, 401) << path << ": " << r.body;
      const json error = json::parse(r.body, nullptr, false);
      EXPECT_EQ(error["error"]["type"], "authentication_error") << r.body;
    }
  }
  // With the key: served.
  const HttpResult served = Http("POST", base + "/completions", good.dump(), {key});
  EXPECT_EQ(served.status, 200) << served.body;

  // Bad bodies: 400 naming the field, refused by the front or by the router's checks.
  const std::vector<std::pair<json, std::string>> bad = {
      {{{"prompt", "x"}, {"max_tokens", -5}}, "max_tokens"},
      {{{"prompt", "x"}, {"max_tokens", 100000}}, "max_tokens"},  // the router's limit
      {{{"prompt", "x"}, {"temperature", "hot"}}, "temperature"},
      {{{"prompt", "x"}, {"n", 3}}, "n"},
      {{{"prompt", {1, 2, 99999}}}, "prompt[2]"},  // outside the vocabulary (the router)
      {{{"prompt", "x"}, {"truncation_mode", "compact"}, {"truncation_keep", 1}},
       "truncation_keep"},
      {{{"max_tokens", 2}}, "prompt"},
  };
  for (const auto& [body, param] : bad) {
    const HttpResult r = Http("POST", base + "/completions", body.dump(), {key});
    EXPECT_EQ(r.status, 400) << body.dump() << ": " << r.body;
    const json error = json::parse(r.body, nullptr, false);
    EXPECT_EQ(error["error"]["param"], param) << r.body;
    EXPECT_THAT(error["error"]["message"].get<std::string>(), HasSubstr(param));
  }
  const HttpResult not_json = Http("POST", base + "/chat/completions", "{\"messages\": [", {key});
  EXPECT_EQ(not_json.status, 400);
  EXPECT_EQ(json::parse(not_json.body)["error"]["param"], "body");
  const HttpResult unknown = Http("POST", base + "/embeddings", good.dump(), {key});
  EXPECT_EQ(unknown.status, 404);
  EXPECT_TRUE(json::parse(unknown.body, nullptr, false)["error"].is_object()) << unknown.body;
  // Streamed requests get their error status too, before any event.
  json streamed = {{"prompt", "x"}, {"max_tokens", -1}, {"stream", true}};
  EXPECT_EQ(Http("POST", base + "/completions", streamed.dump(), {key}).status, 400);
  // The cluster serves on after all of that.
  EXPECT_EQ(Http("POST", base + "/completions", good.dump(), {key}).status, 200);
}

TEST(HttpTest, WithClientTlsTheApiIsServedOverHttpsOnly) {
  const fs::path dir = fs::path(testing::ProcessTempDir()) / "tls";
  BatonUp up(dir, TextModel(), {"--client-tls"});
  ASSERT_TRUE(up.WaitUntilUp()) << up.log();
  const std::string base = BaseUrl(up);
  ASSERT_EQ(base.rfind("https://", 0), 0u) << up.log();
  const std::string ca = (dir / "tls" / "ca.crt").string();
  const json body = {{"prompt", "Hello"}, {"max_tokens", 3}, {"stream", true}};
  const HttpResult served = Http("POST", base + "/completions", body.dump(), {}, 60, ca);
  EXPECT_EQ(served.status, 200) << served.body;
  bool done = false;
  Events(served.body, &done);
  EXPECT_TRUE(done);
  // Plaintext gets no HTTP answer; neither does a client that does not trust the CA.
  EXPECT_EQ(Http("GET", "http://" + base.substr(8) + "/models", "", {}, 10).status, 0);
  EXPECT_EQ(Http("GET", base + "/models", "", {}, 10).status, 0);
}

// Issue 49 item 2: the HTTPS front serves a renewed certificate without a restart. The router
// starts with a certificate of serial 1001; the files are replaced (renamed over, as a
// Secret's are) by one of serial 2002, and new connections get it, with the router's pid
// unchanged. A half-replaced pair (the new key beside the old certificate) is not taken: the
// old certificate is served until the pair matches.
TEST(HttpTest, TheHttpsFrontServesARenewedCertificateWithoutARestart) {
  const fs::path dir = fs::path(testing::ProcessTempDir()) / "https_renewal";
  fs::create_directories(dir);
  const std::string d = ShellQuote(dir.string());
  auto issue = [&](const std::string& serial, const std::string& name) {
    return RunShell("cd " + d + " && openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 "
                    "-nodes -subj /CN=localhost -keyout " + name + ".key -out " + name +
                    ".csr 2>&1 && printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > ext &&"
                    " openssl x509 -req -in " + name + ".csr -CA ca.crt -CAkey ca.key -set_serial " +
                    serial + " -days 1 -extfile ext -out " + name + ".crt 2>&1")
               .exit == 0;
  };
  ASSERT_EQ(RunShell("cd " + d + " && openssl req -x509 -newkey ec -pkeyopt "
                     "ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=ca -keyout ca.key -out "
                     "ca.crt 2>&1").exit, 0);
  ASSERT_TRUE(issue("0x1001", "first"));
  ASSERT_TRUE(issue("0x2002", "second"));
  fs::copy_file(dir / "first.crt", dir / "tls.crt");
  fs::copy_file(dir / "first.key", dir / "tls.key");
  Cluster cluster(TextModel());
  const std::string http_ready = cluster.dir() + "/router-https.addr";
  ASSERT_FALSE(cluster
                   .StartRouter({"--http-port", "0", "--http-ready-file", http_ready,
                                 "--client-tls-cert", (dir / "tls.crt").string(),
                                 "--client-tls-key", (dir / "tls.key").string()})
                   .empty());
  std::string http;
  std::ifstream(http_ready) >> http;
  ASSERT_FALSE(http.empty());
  auto served_serial = [&] {
    return RunShell("openssl s_client -connect " + ShellQuote(http) +
                    " </dev/null 2>/dev/null | openssl x509 -noout -serial 2>/dev/null")
        .out;
  };
  EXPECT_EQ(served_serial(), "serial=1001\n");
  // The new key alone: the pair does not match, so the old certificate stays served.
  fs::copy_file(dir / "second.key", dir / "tls.key.new");
  fs::rename(dir / "tls.key.new", dir / "tls.key");
  EXPECT_TRUE(testing::Eventually(
      [&] {
        served_serial();  // a new connection is what looks at the files
        return cluster.Log("router").find("not reloaded") != std::string::npos;
      },
      std::chrono::seconds(15)))
      << cluster.Log("router");
  EXPECT_EQ(served_serial(), "serial=1001\n");
  fs::copy_file(dir / "second.crt", dir / "tls.crt.new");
  fs::rename(dir / "tls.crt.new", dir / "tls.crt");
  EXPECT_TRUE(testing::Eventually([&] { return served_serial() == "serial=2002\n"; },
                                  std::chrono::seconds(15)))
      << served_serial() << cluster.Log("router");
}

// Issue 49 item 2: API keys follow their file. A key revoked from the file (replaced as a
// Secret's is) is refused without a restart, a key added is taken, a key given only as its
// SHA-256 works like the key itself, and a file that no longer parses leaves the keys before
// it in force. Over the gRPC port too: the revoked key's call is refused there.
TEST(HttpTest, ARevokedKeyIsRefusedWithoutARestart) {
  const fs::path dir = fs::path(testing::ProcessTempDir()) / "key_reload";
  fs::create_directories(dir);
  const std::string keys = (dir / "keys.yaml").string();
  auto write_keys = [&](const std::string& text) {
    std::ofstream(keys + ".new") << text;
    fs::rename(keys + ".new", keys);
  };
  const std::string hashed = HexDigest(Sha256Of("hashed-key-0123456789", 21));
  write_keys("old-key-0123456789: team-a\n\"sha256:" + hashed + "\": team-c\n");
  Cluster cluster(TextModel());
  const std::string http_ready = cluster.dir() + "/router-keys.addr";
  ASSERT_FALSE(cluster.StartRouter({"--http-port", "0", "--http-ready-file", http_ready,
                                    "--api-keys", keys})
                   .empty());
  std::string http;
  std::ifstream(http_ready) >> http;
  const std::string models = "http://" + http + "/v1/models";
  auto status = [&](const std::string& key) {
    return Http("GET", models, "", {"Authorization: Bearer " + key}, 10).status;
  };
  EXPECT_EQ(status("old-key-0123456789"), 200);
  EXPECT_EQ(status("hashed-key-0123456789"), 200);
  EXPECT_EQ(status("new-key-0123456789"), 401);
  write_keys("new-key-0123456789: team-b\n\"sha256:" + hashed + "\": team-c\n");
  EXPECT_TRUE(testing::Eventually([&] { return status("old-key-0123456789") == 401; },
                                  std::chrono::seconds(15)))
      << cluster.Log("router");
  EXPECT_EQ(status("new-key-0123456789"), 200);
  EXPECT_EQ(status("hashed-key-0123456789"), 200);
  {
    auto stub = cluster.Client();
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer old-key-0123456789");
    v1::ListModelsResponse reply;
    EXPECT_EQ(stub->ListModels(&context, v1::ListModelsRequest(), &reply).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  // A broken file: logged, and the keys before it stay.
  write_keys("new-key-0123456789: [not a tenant\n");
  EXPECT_TRUE(testing::Eventually(
      [&] {
        status("new-key-0123456789");
        return cluster.Log("router").find("API keys not reloaded") != std::string::npos;
      },
      std::chrono::seconds(15)))
      << cluster.Log("router");
  EXPECT_EQ(status("new-key-0123456789"), 200);
  EXPECT_EQ(status("old-key-0123456789"), 401);
}

TEST(HttpTest, NoNodesIs503AndAFullQueueIs429WithARetryHint) {
  Cluster cluster(TextModel());
  const std::string http_ready = cluster.dir() + "/router-http.addr";
  ASSERT_FALSE(cluster
                   .StartRouter({"--http-port", "0", "--http-ready-file", http_ready,
                                 "--prefill-slots", "1", "--max-queued", "1"})
                   .empty());
  std::string http;
  std::ifstream(http_ready) >> http;
  ASSERT_FALSE(http.empty());
  const std::string base = "http://" + http + "/v1";
  EXPECT_EQ(Http("GET", "http://" + http + "/health").status, 503);
  const HttpResult none =
      Http("POST", base + "/completions", json{{"prompt", "x"}, {"max_tokens", 2}}.dump());
  EXPECT_EQ(none.status, 503) << none.body;
  EXPECT_EQ(json::parse(none.body)["error"]["type"], "service_unavailable_error");

  ASSERT_FALSE(cluster.StartDecode("decode").empty());
  ASSERT_FALSE(cluster.StartPrefill("prefill").empty());
  ASSERT_TRUE(cluster.WaitForHealth(true));
  EXPECT_EQ(Http("GET", "http://" + http + "/health").status, 200);
  // One prefill slot and room for one waiting request: of eight long prompts sent at once,
  // at least one is refused at once with 429 and a Retry-After.
  std::vector<int32_t> prompt(1500);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(100 + i % 3000);
  const json body = {{"prompt", prompt}, {"max_tokens", 2}, {"truncation_mode", "off"}};
  std::vector<HttpResult> results(8);
  std::vector<std::thread> threads;
  for (HttpResult& r : results) {
    threads.emplace_back([&] { r = Http("POST", base + "/completions", body.dump()); });
  }
  for (std::thread& t : threads) t.join();
  int ok = 0, refused = 0;
  for (const HttpResult& r : results) {
    if (r.status == 200) ++ok;
    if (r.status == 429) {
      ++refused;
      EXPECT_EQ(json::parse(r.body)["error"]["type"], "rate_limit_error") << r.body;
      EXPECT_TRUE(r.headers.count("retry-after")) << r.body;
    }
  }
  EXPECT_GE(ok, 1);
  EXPECT_GE(refused, 1);
  EXPECT_EQ(ok + refused, 8);
}

TEST(HttpTest, TwoHundredFiftySixConcurrentSseStreamsComplete) {
  BatonUp up(fs::path(testing::ProcessTempDir()) / "up", TextModel());
  ASSERT_TRUE(up.WaitUntilUp()) << up.log();
  const std::string base = BaseUrl(up);
  ASSERT_FALSE(base.empty()) << up.log();
  constexpr int kStreams = 256;
  std::vector<HttpResult> results(kStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      const json body = {{"prompt", "Stream number " + std::to_string(i) + " says"},
                         {"max_tokens", 4},
                         {"temperature", 0},
                         {"ignore_eos", true},
                         {"stream", true},
                         {"stream_options", {{"include_usage", true}}}};
      results[i] = Http("POST", base + "/completions", body.dump(), {}, 600);
    });
  }
  for (std::thread& t : threads) t.join();
  int complete = 0;
  for (int i = 0; i < kStreams; ++i) {
    bool done = false;
    const std::vector<json> events = Events(results[i].body, &done);
    const bool ok = results[i].status == 200 && done && !events.empty() &&
                    events.back()["usage"]["completion_tokens"] == 4;
    EXPECT_TRUE(ok) << "stream " << i << ": " << results[i].status << " " << results[i].body;
    complete += ok;
  }
  EXPECT_EQ(complete, kStreams);
}

// The JSON log events of `log` whose trace_id is `trace_id`, as "<binary>: <event>" -> event.
std::multimap<std::string, json> TraceEvents(const std::string& log, const std::string& trace_id) {
  std::multimap<std::string, json> events;
  std::istringstream lines(log);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] != '{') continue;
    const json event = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!event.is_object() || event.value("trace_id", "") != trace_id) continue;
    events.emplace(event.value("binary", "") + ": " + event.value("event", ""), event);
  }
  return events;
}

// The traceparent a gRPC call's response started with (the router's span of its trace).
struct Traced {
  grpc::Status status;
  std::string traceparent;
};
Traced GenerateTraced(v1::Generation::Stub& stub, const v1::GenerateRequest& request,
                      const std::string& traceparent) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  if (!traceparent.empty()) context.AddMetadata("traceparent", traceparent);
  auto reader = stub.Generate(&context, request);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
  }
  Traced traced{reader->Finish(), ""};
  const auto& metadata = context.GetServerInitialMetadata();
  if (auto it = metadata.find("traceparent"); it != metadata.end()) {
    traced.traceparent.assign(it->second.data(), it->second.size());
  }
  return traced;
}

// One request's W3C trace across the four roles' JSON logs: the client's traceparent (gRPC
// metadata or an HTTP header) is taken; the router, the prefill and decode nodes and the
// prefix store each log the request under its trace id, each span the child of its caller's
// (the store's lookup and the decode node's stream under the router's span, the store's
// write-back under the prefill node's), with the stages' timings. Without a traceparent the
// router starts a trace and returns it to the client; a malformed one is replaced, never
// passed on; an unsampled trace's store lines are written at debug, a sampled one's at info.
TEST(HttpTest, ATracedRequestIsFollowedThroughAllFourRolesLogs) {
  // Every component logs at debug (the config file baton up hands them), so that a line the
  // store writes at debug is seen.
  const std::string config = testing::ProcessTempDir() + "/traced.yaml";
  std::ofstream(config) << "common:\n  log-level: debug\n";
  BatonUp up(fs::path(testing::ProcessTempDir()) / "traced", TextModel(),
             {"--log-format", "json", "--config", config});
  ASSERT_TRUE(up.WaitUntilUp()) << up.log();
  auto stub = v1::Generation::NewStub(
      grpc::CreateChannel(up.Address("router.addr"), grpc::InsecureChannelCredentials()));
  v1::GenerateRequest request;
  for (int i = 0; i < 100; ++i) request.add_prompt_token_ids(3 + (i * 37) % 4000);
  request.mutable_sampling()->set_max_tokens(4);
  request.mutable_sampling()->set_ignore_eos(true);

  // A trace's events once each of `names` is logged (the decode node logs its line after the
  // router's; the store's write-back comes after the first token).
  auto follow = [&](const std::string& trace_id, const std::vector<std::string>& names) {
    std::multimap<std::string, json> events;
    const ::testing::AssertionResult logged = EventuallyThat(
        [&] {
          events = TraceEvents(up.log(), trace_id);
          return std::all_of(names.begin(), names.end(),
                             [&](const std::string& n) { return events.count(n) > 0; });
        },
        ::testing::IsTrue(), std::chrono::seconds(30), std::chrono::milliseconds(50));
    EXPECT_TRUE(logged) << "trace " << trace_id << " lacks one of its events:\n" << up.log();
    return events;
  };
  auto one = [](const std::multimap<std::string, json>& events, const std::string& name) {
    EXPECT_EQ(events.count(name), 1u) << name;
    return events.count(name) > 0 ? events.find(name)->second : json::object();
  };
  const std::vector<std::string> kRequestLines = {"baton-router: request finished",
                                                  "baton-prefill: prefill done",
                                                  "baton-decode: stream finished",
                                                  "baton-kvstore: prefix lookup"};
  auto with_write_back = [&] {
    std::vector<std::string> names = kRequestLines;
    names.push_back("baton-kvstore: blocks written");
    return names;
  };

  // gRPC, with the client's sampled trace.
  const std::string trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
  const std::string client_span = "00f067aa0ba902b7";
  request.set_request_id("traced-grpc");
  const Traced traced =
      GenerateTraced(*stub, request, "00-" + trace_id + "-" + client_span + "-01");
  ASSERT_TRUE(traced.status.ok()) << traced.status.error_message();
  std::multimap<std::string, json> events = follow(trace_id, with_write_back());
  const json router = one(events, "baton-router: request finished");
  EXPECT_EQ(router["parent_span_id"], client_span);
  EXPECT_EQ(router["request_id"], "traced-grpc");
  const std::string router_span = router.value("span_id", "");
  EXPECT_EQ(traced.traceparent, "00-" + trace_id + "-" + router_span + "-01");
  for (const char* stage : {"resolve", "validate", "admit", "reserve", "lookup", "prefill",
                            "first_token", "stream"}) {
    EXPECT_TRUE(router["stage_ms"].contains(stage)) << stage << ": " << router.dump();
  }
  const json prefill = one(events, "baton-prefill: prefill done");
  EXPECT_EQ(prefill["parent_span_id"], router_span);
  EXPECT_EQ(prefill["request_id"], "traced-grpc");
  for (const char* stage : {"admit", "load", "compute", "commit", "write_back"}) {
    EXPECT_TRUE(prefill["stage_ms"].contains(stage)) << stage << ": " << prefill.dump();
  }
  const json decode = one(events, "baton-decode: stream finished");
  EXPECT_EQ(decode["parent_span_id"], router_span);
  EXPECT_EQ(decode["request_id"], "traced-grpc#0");
  EXPECT_TRUE(decode["stage_ms"].contains("transfer")) << decode.dump();
  EXPECT_TRUE(decode["stage_ms"].contains("stream")) << decode.dump();
  const json lookup = one(events, "baton-kvstore: prefix lookup");
  EXPECT_EQ(lookup["parent_span_id"], router_span);
  EXPECT_EQ(lookup["level"], "info");  // sampled
  ASSERT_GT(events.count("baton-kvstore: blocks written"), 0u);
  EXPECT_EQ(events.find("baton-kvstore: blocks written")->second["parent_span_id"],
            prefill["span_id"]);
  // Each role's span is its own.
  EXPECT_EQ((std::set<std::string>{router_span, prefill.value("span_id", ""),
                                   decode.value("span_id", ""), client_span})
                .size(),
            4u);

  // HTTP, with the client's trace in the header.
  const std::string base = BaseUrl(up);
  ASSERT_FALSE(base.empty()) << up.log();
  std::string prompt;
  for (int i = 0; i < 8; ++i) prompt += "The jury said the city was well run. ";
  const std::string http_trace = "0af7651916cd43dd8448eb211c80319c";
  const HttpResult http =
      Http("POST", base + "/completions",
           json{{"prompt", prompt}, {"max_tokens", 3}, {"ignore_eos", true}}.dump(),
           {"Content-Type: application/json",
            "traceparent: 00-" + http_trace + "-b7ad6b7169203331-01"});
  ASSERT_EQ(http.status, 200) << http.body;
  events = follow(http_trace, kRequestLines);
  EXPECT_EQ(one(events, "baton-router: request finished")["parent_span_id"], "b7ad6b7169203331");
  one(events, "baton-prefill: prefill done");
  one(events, "baton-decode: stream finished");
  one(events, "baton-kvstore: prefix lookup");

  // No traceparent: the router starts the trace and the client learns it.
  request.set_request_id("untraced");
  const Traced started = GenerateTraced(*stub, request, "");
  ASSERT_TRUE(started.status.ok());
  const std::optional<trace::SpanContext> root = trace::Parse(started.traceparent);
  ASSERT_TRUE(root.has_value()) << started.traceparent;
  events = follow(root->TraceId(), kRequestLines);
  EXPECT_FALSE(one(events, "baton-router: request finished").contains("parent_span_id"));

  // A malformed traceparent is not passed on: the request gets a new trace.
  const std::string bad_trace = "7E57AB1E7E57AB1E7E57AB1E7E57AB1E";  // uppercase
  request.set_request_id("badly-traced");
  const Traced replaced =
      GenerateTraced(*stub, request, "00-" + bad_trace + "-" + client_span + "-01");
  ASSERT_TRUE(replaced.status.ok());
  const std::optional<trace::SpanContext> fresh = trace::Parse(replaced.traceparent);
  ASSERT_TRUE(fresh.has_value());
  EXPECT_NE(fresh->TraceId(), absl::AsciiStrToLower(bad_trace));
  events = follow(fresh->TraceId(), kRequestLines);
  EXPECT_EQ(one(events, "baton-router: request finished")["request_id"], "badly-traced");
  EXPECT_EQ(up.log().find(bad_trace), std::string::npos);
  EXPECT_EQ(up.log().find(absl::AsciiStrToLower(bad_trace)), std::string::npos);

  // Unsampled: the same lines, the store's at debug.
  const std::string quiet_trace = "5bf92f3577b34da6a3ce929d0e0e4737";
  request.set_request_id("unsampled");
  const Traced quiet =
      GenerateTraced(*stub, request, "00-" + quiet_trace + "-" + client_span + "-00");
  ASSERT_TRUE(quiet.status.ok());
  EXPECT_EQ(quiet.traceparent.substr(quiet.traceparent.size() - 3), "-00");
  events = follow(quiet_trace, kRequestLines);
  EXPECT_EQ(one(events, "baton-kvstore: prefix lookup")["level"], "debug");
  EXPECT_EQ(one(events, "baton-router: request finished")["level"], "info");
}

}  // namespace
}  // namespace baton
