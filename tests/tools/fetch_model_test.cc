// `batonctl fetch-model` run as a process against a real HTTP server on 127.0.0.1 (cpp-httplib)
// that serves a small generated model folder and counts every request: each source form (an
// http folder, hf:// with a bearer token, s3:// signed with SigV4), "already complete" without
// a request, retries on 503 and on a wrong digest, no retry on 404 or a redirect to another
// scheme, the --max-bytes bound, concurrent runs on one DEST, and that a failed run leaves
// DEST as it was and no temporary directory. Waits poll with a deadline; nothing asserts time.
#include <fcntl.h>
#include <openssl/evp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "baton/common/pki.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "test_dir.h"
#include "testing/eventually.h"

namespace {

namespace fs = std::filesystem;
using ::baton::testing::EventuallyThat;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr auto kDeadline = std::chrono::seconds(30);
constexpr auto kPoll = std::chrono::milliseconds(5);

std::string Sha256Hex(const std::string& data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) {
    static const char kDigits[] = "0123456789abcdef";
    hex += kDigits[digest[i] >> 4];
    hex += kDigits[digest[i] & 15];
  }
  return hex;
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A model-like folder: config.json, a safetensors file (8-byte header length, JSON header, F32
// data) and tokenizer.json, in the order the files are fetched.
std::vector<std::pair<std::string, std::string>> SmallModel() {
  const std::string header = R"({"w":{"dtype":"F32","shape":[64,256],"data_offsets":[0,65536]}})";
  std::string safetensors(8, '\0');
  for (int i = 0; i < 8; ++i) safetensors[i] = static_cast<char>((header.size() >> (8 * i)) & 255);
  safetensors += header;
  for (int i = 0; i < 65536; ++i) safetensors += static_cast<char>((i * 131 + 7) % 251);
  return {{"config.json", R"({"hidden_size": 64, "sliding_window": 128})"},
          {"model.safetensors", safetensors},
          {"tokenizer.json", R"({"model": {"type": "BPE", "vocab": {}}})"}};
}

// Serves registered paths on 127.0.0.1 and records, per path, the requests and the headers of
// the last one. Unregistered paths answer 404.
class ModelServer {
 public:
  struct Route {
    std::string body;
    int status = 200;      // any other: always this status, without a body
    int fail_first = 0;    // the first fail_first requests answer 503
    bool chunked = false;  // no Content-Length
    std::string redirect;  // answer 302 to this Location
    bool hold = false;     // wait for Release() before answering
  };

  // Plain http, or https with `tls_dir`'s router certificate (it names 127.0.0.1).
  explicit ModelServer(const std::string& tls_dir = "")
      : server_(tls_dir.empty() ? std::make_unique<httplib::Server>()
                                : std::make_unique<httplib::SSLServer>(
                                      (tls_dir + "/router.crt").c_str(),
                                      (tls_dir + "/router.key").c_str())),
        scheme_(tls_dir.empty() ? "http" : "https") {
    server_->Get(".*",
                 [this](const httplib::Request& req, httplib::Response& res) { Handle(req, res); });
    port_ = server_->bind_to_any_port("127.0.0.1");  // listening from here on
    thread_ = std::thread([this] { server_->listen_after_bind(); });
  }
  ~ModelServer() {
    Release();
    server_->stop();
    thread_.join();
  }

  std::string Url() const { return scheme_ + "://127.0.0.1:" + std::to_string(port_); }

  void Add(const std::string& path, Route route) {
    std::lock_guard<std::mutex> lock(mu_);
    routes_[path] = std::move(route);
  }
  // Serves `model` under `folder` (e.g. "/models/small").
  void AddModel(const std::string& folder,
                const std::vector<std::pair<std::string, std::string>>& model) {
    for (const auto& [name, body] : model) Add(folder + "/" + name, {.body = body});
  }
  int Requests(const std::string& path) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = requests_.find(path);
    return it == requests_.end() ? 0 : it->second;
  }
  int TotalRequests() const {
    std::lock_guard<std::mutex> lock(mu_);
    int total = 0;
    for (const auto& [path, n] : requests_) total += n;
    return total;
  }
  std::string LastHeader(const std::string& path, const std::string& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = last_headers_.find(path);
    if (it == last_headers_.end()) return "";
    auto header = it->second.find(Lower(name));
    return header == it->second.end() ? "" : header->second;
  }
  std::string LastParam(const std::string& path, const std::string& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = last_params_.find(path);
    if (it == last_params_.end()) return "";
    auto param = it->second.find(name);
    return param == it->second.end() ? "" : param->second;
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  static std::string Lower(std::string name) {
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return name;
  }

  void Handle(const httplib::Request& req, httplib::Response& res) {
    std::unique_lock<std::mutex> lock(mu_);
    const int n = ++requests_[req.path];
    auto& headers = last_headers_[req.path];
    headers.clear();
    for (const auto& [name, value] : req.headers) headers[Lower(name)] = value;
    auto& params = last_params_[req.path];
    params.clear();
    for (const auto& [name, value] : req.params) params[name] = value;
    auto it = routes_.find(req.path);
    if (it == routes_.end()) {
      res.status = 404;
      return;
    }
    const Route route = it->second;
    if (route.hold) cv_.wait_for(lock, 2 * kDeadline, [this] { return released_; });
    lock.unlock();
    if (n <= route.fail_first) {
      res.status = 503;
    } else if (!route.redirect.empty()) {
      res.set_redirect(route.redirect);
    } else if (route.status != 200) {
      res.status = route.status;
    } else if (route.chunked) {
      res.set_chunked_content_provider(
          "application/octet-stream", [body = route.body](size_t, httplib::DataSink& sink) {
            for (size_t at = 0; at < body.size(); at += 4096) {
              if (!sink.write(body.data() + at, std::min<size_t>(4096, body.size() - at))) {
                return false;
              }
            }
            sink.done();
            return true;
          });
    } else {
      res.set_content(route.body, "application/octet-stream");
    }
  }

  std::unique_ptr<httplib::Server> server_;
  std::string scheme_;
  int port_ = 0;
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
  std::map<std::string, Route> routes_;
  std::map<std::string, int> requests_;
  std::map<std::string, std::map<std::string, std::string>> last_headers_;
  std::map<std::string, std::map<std::string, std::string>> last_params_;
};

struct ProcessResult {
  int exit_status = -1;
  std::string out;
  std::string err;
};

// One process (argv[0] its program), its stdout and stderr in files of its own, its environment
// exactly `env` plus PATH: no proxy settings or credentials leak in from the test's.
class ChildProcess {
 public:
  ChildProcess(const fs::path& dir, const std::vector<std::string>& argv_text_in,
               const std::vector<std::string>& env) {
    static int count = 0;
    const std::string tag = "process_" + std::to_string(++count);
    out_ = dir / (tag + ".out");
    err_ = dir / (tag + ".err");
    std::vector<std::string> argv_text = argv_text_in;
    std::vector<std::string> env_text = {"PATH=/usr/bin:/bin"};
    env_text.insert(env_text.end(), env.begin(), env.end());
    std::vector<char*> argv, envp;
    for (std::string& s : argv_text) argv.push_back(s.data());
    for (std::string& s : env_text) envp.push_back(s.data());
    argv.push_back(nullptr);
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, 2, err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (posix_spawn(&pid_, argv_text[0].c_str(), &actions, nullptr, argv.data(), envp.data()) !=
        0) {
      pid_ = -1;
    }
    posix_spawn_file_actions_destroy(&actions);
  }
  ~ChildProcess() {
    if (pid_ > 0 && !exited_ && kill(pid_, SIGKILL) == 0) waitpid(pid_, nullptr, 0);
  }
  std::string Stderr() const { return ReadFile(err_); }
  // True once the process has exited (its status then in Wait()).
  bool Exited() {
    if (pid_ <= 0 || exited_) return true;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) != pid_) return false;
    exited_ = true;
    exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return true;
  }
  void Stop() {
    if (pid_ > 0 && !exited_) kill(pid_, SIGKILL);
  }
  ProcessResult Wait() {
    ProcessResult run;
    int status = 0;
    if (exited_) {
      run.exit_status = exit_status_;
    } else if (pid_ > 0 && waitpid(pid_, &status, 0) == pid_ && WIFEXITED(status)) {
      run.exit_status = WEXITSTATUS(status);
    }
    exited_ = true;
    exit_status_ = run.exit_status;
    run.out = ReadFile(out_);
    run.err = ReadFile(err_);
    return run;
  }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  int exit_status_ = -1;
  fs::path out_, err_;
};

// `batonctl fetch-model ARGS`.
class FetchProcess : public ChildProcess {
 public:
  FetchProcess(const fs::path& dir, const std::vector<std::string>& args,
               const std::vector<std::string>& env)
      : ChildProcess(dir, WithCommand(args), env) {}

 private:
  static std::vector<std::string> WithCommand(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {BATONCTL_PATH, "fetch-model"};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }
};

class FetchModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(baton::testing::ProcessTempDir()) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::create_directories(dir_ / "volume");
    server_.AddModel("/models/small", model_);
  }

  fs::path Dest() const { return dir_ / "volume" / "small"; }

  // --source SOURCE --dest DEST --file NAME=SHA256 per file of `model`, fast retries.
  std::vector<std::string> Args(const std::string& source,
                                const std::vector<std::pair<std::string, std::string>>& model,
                                const fs::path& dest) const {
    std::vector<std::string> args = {"--source",  source, "--dest",    dest.string(),
                                     "--backoff", "10ms", "--timeout", "30s"};
    for (const auto& [name, body] : model) {
      args.insert(args.end(), {"--file", name + "=" + Sha256Hex(body)});
    }
    return args;
  }
  std::vector<std::string> Args(const std::string& source) const {
    return Args(source, model_, Dest());
  }
  std::string FolderSource() const { return server_.Url() + "/models/small"; }

  ProcessResult Fetch(std::vector<std::string> args, const std::vector<std::string>& extra = {},
                      const std::vector<std::string>& env = {}) {
    args.insert(args.end(), extra.begin(), extra.end());
    return FetchProcess(dir_, args, env).Wait();
  }

  std::vector<std::string> VolumeEntries() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_ / "volume")) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  void ExpectModelAt(const fs::path& dest) const {
    for (const auto& [name, body] : model_) {
      EXPECT_EQ(ReadFile(dest / name), body) << name;
    }
  }

  fs::path dir_;
  const std::vector<std::pair<std::string, std::string>> model_ = SmallModel();
  ModelServer server_;
};

TEST_F(FetchModelTest, HttpFolderDeliversVerifiedFiles) {
  const ProcessResult run = Fetch(Args(FolderSource() + "/"));
  ASSERT_EQ(run.exit_status, 0) << run.err;
  ExpectModelAt(Dest());
  const nlohmann::json result = nlohmann::json::parse(run.out);
  EXPECT_EQ(result["dest"], Dest().string());
  EXPECT_EQ(result["files"], 3);
  int64_t bytes = 0;
  for (const auto& [name, body] : model_) bytes += static_cast<int64_t>(body.size());
  EXPECT_EQ(result["bytes"], bytes);
  EXPECT_EQ(result["downloaded"], true);
  EXPECT_THAT(run.err, HasSubstr("model.safetensors: " + std::to_string(model_[1].second.size()) +
                                 " bytes, sha256 verified"));
  const nlohmann::json marker = nlohmann::json::parse(ReadFile(Dest() / ".baton-source"));
  EXPECT_EQ(marker["source"], FolderSource() + "/");
  EXPECT_EQ(marker["files"]["config.json"]["sha256"], Sha256Hex(model_[0].second));
  EXPECT_THAT(VolumeEntries(), ElementsAre("small", "small.lock"));
  EXPECT_EQ(server_.TotalRequests(), 3);
}

TEST_F(FetchModelTest, QueryOfAnHttpSourceIsSentButKeptOutOfMessagesAndMarker) {
  ProcessResult run = Fetch(Args(FolderSource() + "?sig=s3cr3t"));
  ASSERT_EQ(run.exit_status, 0) << run.err;
  EXPECT_EQ(server_.LastParam("/models/small/model.safetensors", "sig"), "s3cr3t");
  const std::string marker = ReadFile(Dest() / ".baton-source");
  EXPECT_EQ(nlohmann::json::parse(marker)["source"], FolderSource());
  EXPECT_THAT(marker + run.err + run.out, Not(HasSubstr("s3cr3t")));

  std::vector<std::pair<std::string, std::string>> model = model_;
  model.push_back({"missing.bin", "x"});
  run = Fetch(Args(FolderSource() + "?sig=s3cr3t", model, dir_ / "volume" / "other"));
  EXPECT_EQ(run.exit_status, 1);
  EXPECT_THAT(run.err, HasSubstr("missing.bin: HTTP 404 from " + FolderSource() + "/missing.bin"));
  EXPECT_THAT(run.err, Not(HasSubstr("s3cr3t")));
}

TEST_F(FetchModelTest, SecondRunIsAlreadyCompleteWithoutRequests) {
  ASSERT_EQ(Fetch(Args(FolderSource())).exit_status, 0);
  ASSERT_EQ(server_.TotalRequests(), 3);
  const ProcessResult again = Fetch(Args(FolderSource()));
  ASSERT_EQ(again.exit_status, 0) << again.err;
  EXPECT_THAT(again.err, HasSubstr("already complete"));
  EXPECT_EQ(nlohmann::json::parse(again.out)["downloaded"], false);
  EXPECT_EQ(server_.TotalRequests(), 3);
  ExpectModelAt(Dest());
}

TEST_F(FetchModelTest, HfSourceUsesResolvePathAndBearerToken) {
  server_.AddModel("/acme/tiny-model/resolve/v1.0", model_);
  server_.AddModel("/acme/tiny-model/resolve/main", model_);
  const std::vector<std::string> endpoint = {"--endpoint", server_.Url(),
                                             "--insecure-loopback-http"};
  ProcessResult run = Fetch(Args("hf://acme/tiny-model@v1.0"), endpoint, {"HF_TOKEN=hf_secret"});
  ASSERT_EQ(run.exit_status, 0) << run.err;
  ExpectModelAt(Dest());
  for (const auto& [name, body] : model_) {
    const std::string path = "/acme/tiny-model/resolve/v1.0/" + name;
    EXPECT_EQ(server_.Requests(path), 1) << path;
    EXPECT_EQ(server_.LastHeader(path, "Authorization"), "Bearer hf_secret") << path;
  }

  const fs::path main_dest = dir_ / "volume" / "main";
  run = Fetch(Args("hf://acme/tiny-model", model_, main_dest), endpoint);
  ASSERT_EQ(run.exit_status, 0) << run.err;
  ExpectModelAt(main_dest);
  EXPECT_EQ(server_.Requests("/acme/tiny-model/resolve/main/config.json"), 1);
  EXPECT_EQ(server_.LastHeader("/acme/tiny-model/resolve/main/config.json", "Authorization"), "");
}

TEST_F(FetchModelTest, S3SourceIsSignedWithSigV4WhenCredentialsAreSet) {
  server_.AddModel("/weights/models/small", model_);
  const std::vector<std::string> endpoint = {"--endpoint", server_.Url() + "/",
                                             "--insecure-loopback-http"};
  ProcessResult run = Fetch(Args("s3://weights/models/small"), endpoint,
                            {"AWS_ACCESS_KEY_ID=AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY=not-a-secret",
                             "AWS_SESSION_TOKEN=session-token", "AWS_REGION=eu-west-1"});
  ASSERT_EQ(run.exit_status, 0) << run.err;
  ExpectModelAt(Dest());
  const std::string path = "/weights/models/small/model.safetensors";
  EXPECT_EQ(server_.Requests(path), 1);
  const std::string authorization = server_.LastHeader(path, "Authorization");
  EXPECT_THAT(authorization, StartsWith("AWS4-HMAC-SHA256"));
  EXPECT_THAT(authorization, HasSubstr("Credential=AKIDEXAMPLE/"));
  EXPECT_THAT(authorization, HasSubstr("/eu-west-1/s3/aws4_request"));
  EXPECT_THAT(authorization, HasSubstr("x-amz-security-token"));  // a signed header
  EXPECT_EQ(server_.LastHeader(path, "x-amz-security-token"), "session-token");

  // Without credentials: anonymous requests to a public bucket.
  const fs::path public_dest = dir_ / "volume" / "public";
  run = Fetch(Args("s3://weights/models/small", model_, public_dest), endpoint);
  ASSERT_EQ(run.exit_status, 0) << run.err;
  EXPECT_EQ(server_.Requests(path), 2);
  EXPECT_EQ(server_.LastHeader(path, "Authorization"), "");
}

TEST_F(FetchModelTest, RetriesServerErrorsUntilServed) {
  server_.Add("/models/small/model.safetensors", {.body = model_[1].second, .fail_first = 2});
  const ProcessResult run = Fetch(Args(FolderSource()));
  ASSERT_EQ(run.exit_status, 0) << run.err;
  EXPECT_EQ(server_.Requests("/models/small/model.safetensors"), 3);
  EXPECT_THAT(run.err, HasSubstr("model.safetensors: attempt 2 of 6 failed: HTTP 503"));
  ExpectModelAt(Dest());
}

TEST_F(FetchModelTest, WrongDigestFailsAfterRetriesLeavingNothing) {
  std::vector<std::pair<std::string, std::string>> wrong = model_;
  wrong[1].second += "tampered";
  const ProcessResult run = Fetch(Args(FolderSource(), wrong, Dest()), {"--retries", "2"});
  EXPECT_EQ(run.exit_status, 1);
  EXPECT_THAT(run.err,
              HasSubstr("error: model.safetensors: sha256 mismatch: expected " +
                        Sha256Hex(wrong[1].second) + ", got " + Sha256Hex(model_[1].second)));
  // Tried once more, not --retries times: the same mismatch twice means a wrong digest.
  EXPECT_THAT(run.err, HasSubstr("(after 2 attempts)"));
  EXPECT_EQ(server_.Requests("/models/small/model.safetensors"), 2);
  EXPECT_EQ(server_.Requests("/models/small/tokenizer.json"), 0);
  EXPECT_THAT(VolumeEntries(), ElementsAre("small.lock"));
  EXPECT_EQ(run.out, "");
}

TEST_F(FetchModelTest, FailedRunLeavesACompleteDestAsItWas) {
  ASSERT_EQ(Fetch(Args(FolderSource())).exit_status, 0);
  const std::string marker = ReadFile(Dest() / ".baton-source");
  std::vector<std::pair<std::string, std::string>> changed = model_;
  changed[2].second = "a tokenizer the server does not have";
  const ProcessResult run = Fetch(Args(FolderSource(), changed, Dest()), {"--retries", "0"});
  EXPECT_EQ(run.exit_status, 1);
  EXPECT_THAT(run.err, HasSubstr("tokenizer.json: sha256 mismatch"));
  EXPECT_EQ(ReadFile(Dest() / ".baton-source"), marker);
  ExpectModelAt(Dest());
  EXPECT_THAT(VolumeEntries(), ElementsAre("small", "small.lock"));
}

TEST_F(FetchModelTest, NotFoundFailsAtOnce) {
  std::vector<std::pair<std::string, std::string>> model = model_;
  model.push_back({"missing.bin", "x"});
  const ProcessResult run = Fetch(Args(FolderSource(), model, Dest()));
  EXPECT_EQ(run.exit_status, 1);
  EXPECT_THAT(run.err,
              HasSubstr("error: missing.bin: HTTP 404 from " + FolderSource() + "/missing.bin"));
  EXPECT_EQ(server_.Requests("/models/small/missing.bin"), 1);
  EXPECT_THAT(VolumeEntries(), ElementsAre("small.lock"));
}

TEST_F(FetchModelTest, BodyOverMaxBytesIsRefused) {
  const std::string big(65536, 'w');
  server_.Add("/models/big/sized.bin", {.body = big});
  server_.Add("/models/big/chunked.bin", {.body = big, .chunked = true});
  for (const char* name : {"sized.bin", "chunked.bin"}) {
    const ProcessResult run =
        Fetch(Args(server_.Url() + "/models/big", {{name, big}}, Dest()), {"--max-bytes", "1000"});
    EXPECT_EQ(run.exit_status, 1) << name;
    EXPECT_THAT(run.err, HasSubstr(std::string(name) + ": larger than --max-bytes (1000 bytes)"));
    EXPECT_EQ(server_.Requests(std::string("/models/big/") + name), 1) << name;
    EXPECT_THAT(VolumeEntries(), ElementsAre("small.lock")) << name;
  }
}

TEST_F(FetchModelTest, FollowsRedirectsToHttpOnly) {
  server_.Add("/models/small/config.json", {.redirect = "/blobs/config"});
  server_.Add("/blobs/config", {.body = model_[0].second});
  ProcessResult run = Fetch(Args(FolderSource()));
  ASSERT_EQ(run.exit_status, 0) << run.err;
  EXPECT_EQ(server_.Requests("/blobs/config"), 1);
  ExpectModelAt(Dest());

  server_.Add("/models/small/config.json", {.redirect = "ftp://127.0.0.1/config.json"});
  run = Fetch(Args(FolderSource(), model_, dir_ / "volume" / "other"));
  EXPECT_EQ(run.exit_status, 1);
  EXPECT_THAT(run.err, HasSubstr("error: config.json: "));
  EXPECT_EQ(server_.Requests("/models/small/config.json"), 2);
  EXPECT_THAT(VolumeEntries(), ElementsAre("other.lock", "small", "small.lock"));
}

// Credentials go over https only: to a plain-http endpoint only with the loopback test flag,
// and never to another host's.
TEST_F(FetchModelTest, CredentialsAreRefusedOverPlainHttpWithoutTheLoopbackFlag) {
  server_.AddModel("/acme/tiny-model/resolve/main", model_);
  const ProcessResult run = Fetch(Args("hf://acme/tiny-model"), {"--endpoint", server_.Url()},
                                  {"HF_TOKEN=hf_secret"});
  EXPECT_EQ(run.exit_status, 2) << run.err;
  EXPECT_THAT(run.err, HasSubstr("--insecure-loopback-http"));
  EXPECT_EQ(server_.TotalRequests(), 0);
  const ProcessResult s3 = Fetch(Args("s3://weights/models/small"), {"--endpoint", server_.Url()},
                                 {"AWS_ACCESS_KEY_ID=AKIDEXAMPLE",
                                  "AWS_SECRET_ACCESS_KEY=not-a-secret"});
  EXPECT_EQ(s3.exit_status, 2) << s3.err;
  EXPECT_EQ(server_.TotalRequests(), 0);
}

TEST_F(FetchModelTest, ARedirectToAnotherOriginGetsNoCredentials) {
  ModelServer other;  // another port: another origin
  other.AddModel("/cdn", model_);
  for (const auto& [name, body] : model_) {
    server_.Add("/acme/tiny-model/resolve/main/" + name, {.redirect = other.Url() + "/cdn/" + name});
    server_.Add("/weights/small/" + name, {.redirect = other.Url() + "/cdn/" + name});
  }
  const std::vector<std::string> endpoint = {"--endpoint", server_.Url(),
                                             "--insecure-loopback-http"};
  ProcessResult run = Fetch(Args("hf://acme/tiny-model"), endpoint, {"HF_TOKEN=hf_secret"});
  ASSERT_EQ(run.exit_status, 0) << run.err;
  ExpectModelAt(Dest());
  const std::string origin_path = "/acme/tiny-model/resolve/main/config.json";
  EXPECT_EQ(server_.LastHeader(origin_path, "Authorization"), "Bearer hf_secret");
  EXPECT_EQ(other.Requests("/cdn/config.json"), 1);
  EXPECT_EQ(other.LastHeader("/cdn/config.json", "Authorization"), "");
  // SigV4: neither the signature nor the session token follows the redirect.
  run = Fetch(Args("s3://weights/small", model_, dir_ / "volume" / "s3"), endpoint,
              {"AWS_ACCESS_KEY_ID=AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY=not-a-secret",
               "AWS_SESSION_TOKEN=session-token"});
  ASSERT_EQ(run.exit_status, 0) << run.err;
  EXPECT_THAT(server_.LastHeader("/weights/small/config.json", "Authorization"),
              StartsWith("AWS4-HMAC-SHA256"));
  EXPECT_EQ(other.Requests("/cdn/config.json"), 2);
  EXPECT_EQ(other.LastHeader("/cdn/config.json", "Authorization"), "");
  EXPECT_EQ(other.LastHeader("/cdn/config.json", "x-amz-security-token"), "");
}

TEST_F(FetchModelTest, ARedirectFromHttpsDownToHttpIsRefused) {
  const std::string tls = (dir_ / "pki").string();
  ASSERT_TRUE(baton::pki::EnsureLocalPki(tls, {"router"}).ok());
  ModelServer secure(tls);
  secure.AddModel("/models/small", model_);
  const std::vector<std::string> ca = {"--ca-file", tls + "/ca.crt"};
  // Served over https as it is.
  ProcessResult run = Fetch(Args(secure.Url() + "/models/small"), ca, {"HF_TOKEN=unused"});
  ASSERT_EQ(run.exit_status, 0) << run.err;
  ExpectModelAt(Dest());
  // A hop down to http is refused, credentials or not, and is not retried.
  secure.Add("/models/small/config.json", {.redirect = server_.Url() + "/models/small/config.json"});
  run = Fetch(Args(secure.Url() + "/models/small", model_, dir_ / "volume" / "down"), ca);
  EXPECT_EQ(run.exit_status, 1);
  EXPECT_THAT(run.err, HasSubstr("a redirect from https down to http is refused"));
  EXPECT_EQ(server_.Requests("/models/small/config.json"), 0);
  EXPECT_EQ(secure.Requests("/models/small/config.json"), 2);
}

TEST_F(FetchModelTest, RemovesTempDirsOfAnInterruptedRun) {
  fs::create_directories(dir_ / "volume" / ".small.tmp-AbC123" / "partial");
  const ProcessResult run = Fetch(Args(FolderSource()));
  ASSERT_EQ(run.exit_status, 0) << run.err;
  EXPECT_THAT(VolumeEntries(), ElementsAre("small", "small.lock"));
}

TEST_F(FetchModelTest, ReplacesAnIncompleteDest) {
  fs::create_directories(Dest());
  std::ofstream(Dest() / "config.json") << "truncated";
  std::ofstream(Dest() / "stale.bin") << "from an older model";
  const ProcessResult run = Fetch(Args(FolderSource()));
  ASSERT_EQ(run.exit_status, 0) << run.err;
  ExpectModelAt(Dest());
  EXPECT_FALSE(fs::exists(Dest() / "stale.bin"));
  EXPECT_THAT(VolumeEntries(), ElementsAre("small", "small.lock"));
}

TEST_F(FetchModelTest, ConcurrentRunsDownloadEachFileOnce) {
  // The first run holds the lock while its first request waits; the second must be seen
  // waiting for the lock before the server answers.
  server_.Add("/models/small/config.json", {.body = model_[0].second, .hold = true});
  FetchProcess first(dir_, Args(FolderSource()), {});
  ASSERT_TRUE(EventuallyThat([&] { return server_.Requests("/models/small/config.json"); }, 1,
                             kDeadline, kPoll));
  FetchProcess second(dir_, Args(FolderSource()), {});
  const ::testing::AssertionResult waiting =
      EventuallyThat([&] { return second.Stderr(); }, HasSubstr("waiting for"), kDeadline, kPoll);
  server_.Release();
  ASSERT_TRUE(waiting);
  const ProcessResult a = first.Wait();
  const ProcessResult b = second.Wait();
  ASSERT_EQ(a.exit_status, 0) << a.err;
  ASSERT_EQ(b.exit_status, 0) << b.err;
  EXPECT_EQ(nlohmann::json::parse(a.out)["downloaded"], true);
  EXPECT_EQ(nlohmann::json::parse(b.out)["downloaded"], false);
  for (const auto& [name, body] : model_) {
    EXPECT_EQ(server_.Requests("/models/small/" + name), 1) << name;
  }
  ExpectModelAt(Dest());
  EXPECT_THAT(VolumeEntries(), ElementsAre("small", "small.lock"));
}

TEST_F(FetchModelTest, BadFlagsExitTwoNamingTheFlag) {
  const std::string sha(64, 'a');
  const std::string source = FolderSource();
  const std::string dest = Dest().string();
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--source", source, "--dest", dest, "--file", "config.json=abc"}, "--file"},
      {{"--source", source, "--dest", dest, "--file", "config.json=" + std::string(64, 'g')},
       "--file"},
      {{"--source", source, "--dest", dest, "--file", "sub/config.json=" + sha}, "--file"},
      {{"--source", source, "--dest", dest, "--file", "..=" + sha}, "--file"},
      {{"--source", source, "--dest", dest, "--file", "=" + sha}, "--file"},
      {{"--source", source, "--dest", dest, "--file", std::string(256, 'n') + "=" + sha}, "--file"},
      {{"--source", source, "--dest", dest}, "--file"},
      {{"--source", "ftp://host/models", "--dest", dest, "--file", "a=" + sha}, "--source"},
      {{"--source", "hf://just-a-repo", "--dest", dest, "--file", "a=" + sha}, "--source"},
      {{"--source", source, "--dest", dest, "--file", "a=" + sha, "--endpoint", source},
       "--endpoint"},
      {{"--source", source, "--dest", dest, "--file", "a=" + sha, "--retries", "-1"}, "--retries"},
      {{"--source", source, "--dest", dest, "--file", "a=" + sha, "--timeout", "soon"},
       "--timeout"},
      {{"--source", source, "--dest", dest, "--file", "a=" + sha, "--max-bytes", "0"},
       "--max-bytes"},
  };
  for (const auto& [args, flag] : cases) {
    const ProcessResult run = Fetch(args);
    EXPECT_EQ(run.exit_status, 2) << flag << "\n" << run.err;
    EXPECT_THAT(run.err, HasSubstr(flag));
  }
  EXPECT_EQ(server_.TotalRequests(), 0);
  EXPECT_THAT(VolumeEntries(), ElementsAre());
}

// Issue 49 item 4: `helm rollback` after an upgrade to new weights. The chart fetches each
// release's files into a directory named by their digest (/models/<digest>/baton), and every
// role checks its `--model-file` list against the fetch marker at start. Release 1's pods,
// started again after release 2 was fetched, load release 1's weights (the decode node's
// fingerprint is release 1's, not release 2's). In the old layout, where the upgrade replaced
// the one directory in place, release 1's pods refuse to start, naming the file and both
// digests, instead of serving release 2's weights under release 1's name.
TEST_F(FetchModelTest, ARollbackServesThePreviousWeightsOrRefusesToStart) {
  using Files = std::vector<std::pair<std::string, std::string>>;
  // Two releases: one config, other weights (another seed), as a fine-tune would ship.
  std::vector<Files> releases;
  for (const std::string seed : {"1", "2"}) {
    const fs::path made = dir_ / ("made-" + seed);
    ProcessResult make = ChildProcess(dir_,
                                      {BATONCTL_PATH, "make-model", "--preset", "tiny", "--seed",
                                       seed, "--out", made.string()},
                                      {})
                             .Wait();
    ASSERT_EQ(make.exit_status, 0) << make.err;
    Files files;
    for (const char* name : {"config.json", "model.safetensors"}) {
      files.emplace_back(name, ReadFile(made / name));
    }
    server_.AddModel("/releases/" + seed, files);
    releases.push_back(std::move(files));
  }
  ASSERT_NE(releases[0][1].second, releases[1][1].second);
  // baton.modelDigest: SHA-256 of "NAME=SHA256\n" per file, in name order.
  auto digest_dir = [&](const Files& files) {
    std::string lines;
    for (const auto& [name, body] : files) lines += name + "=" + Sha256Hex(body) + "\n";
    return dir_ / "volume" / Sha256Hex(lines) / "baton";
  };
  auto fetch = [&](size_t release, const fs::path& dest) {
    const ProcessResult run = Fetch(Args(
        server_.Url() + "/releases/" + std::to_string(release + 1), releases[release], dest));
    EXPECT_EQ(run.exit_status, 0) << run.err;
  };
  // A decode node on `model` checking `release`'s files: its fingerprint once it serves, or
  // "exit N: stderr" when it stops first.
  auto start_decode = [&](const fs::path& model, size_t release) -> std::string {
    const std::string ready = (dir_ / "decode.ready").string();
    fs::remove(ready);
    std::vector<std::string> argv = {BATON_DECODE_PATH, "--model", model.string(),
                                     "--insecure-internal", "--no-ucx", "--port", "0",
                                     "--metrics-port", "-1", "--log-format", "json",
                                     "--ready-file", ready};
    for (const auto& [name, body] : releases[release]) {
      argv.insert(argv.end(), {"--model-file", name + "=" + Sha256Hex(body)});
    }
    ChildProcess decode(dir_, argv, {});
    EXPECT_TRUE(EventuallyThat(
        [&] { return fs::exists(ready) || decode.Exited(); }, ::testing::IsTrue(), kDeadline,
        kPoll));
    if (decode.Exited()) {
      const ProcessResult run = decode.Wait();
      return "exit " + std::to_string(run.exit_status) + ": " + run.err;
    }
    std::smatch match;
    const std::string log = decode.Stderr();
    decode.Stop();
    const std::regex fingerprint("\"fingerprint\":\"([0-9a-f]+)\"");
    return std::regex_search(log, match, fingerprint) ? match[1].str() : "no fingerprint: " + log;
  };

  // Install release 1, upgrade to release 2: two directories.
  fetch(0, digest_dir(releases[0]));
  fetch(1, digest_dir(releases[1]));
  ASSERT_NE(digest_dir(releases[0]), digest_dir(releases[1]));
  const std::string second = start_decode(digest_dir(releases[1]), 1);
  ASSERT_THAT(second, ::testing::MatchesRegex("[0-9a-f]+"));
  // Roll back: release 1's pods find release 1's weights, as fetched.
  for (const auto& [name, body] : releases[0]) {
    EXPECT_EQ(ReadFile(digest_dir(releases[0]) / name), body) << name;
  }
  const std::string first = start_decode(digest_dir(releases[0]), 0);
  ASSERT_THAT(first, ::testing::MatchesRegex("[0-9a-f]+"));
  EXPECT_NE(first, second);

  // One directory replaced in place by the upgrade: release 1's pods refuse release 2's
  // weights, naming the file, the digest they expect and the one the directory holds.
  const fs::path in_place = dir_ / "volume" / "in-place" / "baton";
  fetch(0, in_place);
  fetch(1, in_place);
  const std::string refused = start_decode(in_place, 0);
  EXPECT_THAT(refused, StartsWith("exit 2: "));
  EXPECT_THAT(refused, HasSubstr("--model-file model.safetensors=" +
                                 Sha256Hex(releases[0][1].second)));
  EXPECT_THAT(refused, HasSubstr("has SHA-256 " + Sha256Hex(releases[1][1].second)));
  // A file changed after its fetch (another size), and a directory no fetch filled.
  {
    std::ofstream grow(in_place / "config.json", std::ios::app);
    grow << " ";
  }
  EXPECT_THAT(start_decode(in_place, 1), HasSubstr("config.json is "));
  fs::remove(in_place / ".baton-source");
  EXPECT_THAT(start_decode(in_place, 1), HasSubstr(".baton-source cannot be read"));
}

}  // namespace
