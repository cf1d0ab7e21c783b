// `batonctl fetch-model`: delivers model weights into a directory, usually on a volume that
// several pods share (the Helm chart's init container runs it before the roles start).
//
// What it promises:
//  - DEST is, after any run, either absent, as it was before, or complete: every requested file
//    with its SHA-256 verified, plus the marker DEST/.baton-source naming the source and every
//    file's digest and size. Files are fetched into a temporary sibling directory on the same
//    file system and DEST is replaced by a rename; a failed run removes that directory.
//  - Runs on one DEST are serialized by an exclusive flock on DEST.lock (the lock file stays:
//    removing it would let a later run lock a new file while a waiter still locks the old one).
//    Under the lock, a marker that matches the request, with every file present at its recorded
//    size, means "already complete": nothing is downloaded. Temporary directories left by a run
//    that was killed are removed under the lock too.
//  - A server can make it write at most --max-bytes per file, and every attempt is bounded by
//    --timeout and a low-speed limit; redirects are followed to http and https only, never
//    from https to http, and credentials go only to the source's origin.
// Exit status: 0 done, 1 a download or file-system failure (the message names the file and the
// cause), 2 a bad flag (the message names it).
#include <curl/curl.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "baton/common/model_files.h"
#include "commands.h"
#include "nlohmann/json.hpp"

namespace baton::tools {
namespace {

namespace fs = std::filesystem;

constexpr char kCommand[] = "fetch-model";
constexpr const char* kMarkerName = kModelMarkerName;
constexpr int64_t kDefaultMaxBytes = int64_t{1} << 40;  // 1 TiB
constexpr int kMaxRetries = 100;
constexpr absl::Duration kMaxBackoff = absl::Seconds(30);
// An attempt that moves fewer bytes per second than this for kLowSpeedSeconds is abandoned
// (and retried), long before --timeout: a stalled connection must not hold the pod for hours.
constexpr long kLowSpeedBytesPerSecond = 1024;
constexpr long kLowSpeedSeconds = 60;
constexpr int kMaxRedirects = 10;
// SHA-256 of the empty body: the payload hash of a signed GET.
constexpr char kEmptyPayloadSha256[] =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

// The flags as typed; MakeRequest validates them.
struct FetchModelOptions {
  std::string source;
  std::string dest;
  std::vector<std::string> files;  // NAME=SHA256
  std::string endpoint;
  int retries = 5;
  std::string timeout = "6h";
  std::string backoff = "500ms";
  int64_t max_bytes = kDefaultMaxBytes;
  bool insecure_loopback_http = false;
  std::string ca_file;
};

// Credentials read from the environment, once, at start-up.
struct Environment {
  std::string hf_token;               // HF_TOKEN: bearer token for hf:// sources
  std::string aws_access_key_id;      // AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY: both or
  std::string aws_secret_access_key;  // neither; with both, s3:// requests are signed (SigV4)
  std::string aws_session_token;      // AWS_SESSION_TOKEN: sent as x-amz-security-token
  std::string aws_region;             // AWS_REGION, default us-east-1
};

Environment ReadEnvironment() {
  auto get = [](const char* name) {
    const char* value = std::getenv(name);
    return value == nullptr ? std::string() : std::string(value);
  };
  Environment env{.hf_token = get("HF_TOKEN"),
                  .aws_access_key_id = get("AWS_ACCESS_KEY_ID"),
                  .aws_secret_access_key = get("AWS_SECRET_ACCESS_KEY"),
                  .aws_session_token = get("AWS_SESSION_TOKEN"),
                  .aws_region = get("AWS_REGION")};
  if (env.aws_region.empty()) env.aws_region = "us-east-1";
  return env;
}

struct WantedFile {
  std::string name;       // a plain file name inside DEST
  std::string sha256;     // 64 lowercase hex digits
  std::string url;        // what is requested
  std::string shown_url;  // what messages show: url without an http(s) source's query
};

// A validated request: what to fetch, from where and how.
struct FetchRequest {
  std::string source;  // as given, less any query; recorded in the marker
  fs::path dest;       // absolute, normalized, without a trailing '/'
  std::vector<WantedFile> files;
  std::vector<std::string> headers;  // sent with every attempt
  // Sent only to `origin`: credentials (HF token, SigV4's headers and session token), and the
  // signature itself.
  std::vector<std::string> credential_headers;
  std::string origin;                // scheme://host:port of the source
  std::string ca_file;               // CURLOPT_CAINFO when set
  std::string aws_sigv4;             // CURLOPT_AWS_SIGV4; empty: requests are not signed
  std::string aws_access_key_id;
  std::string aws_secret_access_key;
  int retries = 0;
  absl::Duration timeout;
  absl::Duration backoff;
  int64_t max_bytes = 0;
};

absl::Status BadFlag(absl::string_view flag, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", message));
}

// Percent-encodes all but RFC 3986's unreserved characters: the encoding S3's SigV4 canonical
// URI expects, and safe for any file name in a URL path.
std::string EncodePathSegment(absl::string_view segment) {
  std::string out;
  for (unsigned char c : segment) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += absl::StrCat("%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return out;
}

bool IsHttpUrl(absl::string_view url) {
  return absl::StartsWith(url, "http://") || absl::StartsWith(url, "https://");
}

// A repository or bucket name: letters, digits, '.', '_' and '-', and not "." or "..".
bool IsPlainSegment(absl::string_view segment) {
  if (segment.empty() || segment == "." || segment == "..") return false;
  return std::all_of(segment.begin(), segment.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

absl::StatusOr<std::string> EndpointUrl(const std::string& endpoint, const char* fallback) {
  const std::string url = endpoint.empty() ? fallback : endpoint;
  if (!IsHttpUrl(url) || absl::StrContains(url, "?") || absl::StrContains(url, "#")) {
    return BadFlag("--endpoint", absl::StrCat("must be an http:// or https:// URL without query "
                                              "or fragment; got '",
                                              url, "'"));
  }
  return std::string(absl::StripSuffix(url, "/"));
}

// Where the files are: file NAME is at folder + "/" + encoded NAME + query.
struct Location {
  std::string folder;
  // "" or an http(s) source's "?..." (e.g. a storage access token, the same for every file):
  // sent, but kept out of messages and the marker.
  std::string query;
};

absl::StatusOr<Location> FindLocation(const std::string& source, const std::string& endpoint) {
  const std::string forms =
      "must be https://HOST/PATH or http://HOST/PATH (a folder), s3://BUCKET[/PREFIX] or "
      "hf://ORG/REPO[@REVISION]";
  absl::string_view rest = source;
  if (IsHttpUrl(source)) {
    if (!endpoint.empty()) {
      return BadFlag("--endpoint", "applies only to s3:// and hf:// sources");
    }
    const size_t query = source.find('?');
    rest = rest.substr(0, query);
    absl::string_view host_and_path = rest.substr(rest.find("//") + 2);
    if (host_and_path.empty() || host_and_path[0] == '/' || absl::StrContains(source, "#")) {
      return BadFlag("--source",
                     absl::StrCat(forms, " (a host, and no fragment); got '", rest, "'"));
    }
    while (absl::ConsumeSuffix(&rest, "/")) {
    }
    return Location{.folder = std::string(rest),
                    .query = query == std::string::npos ? "" : source.substr(query)};
  }
  if (absl::ConsumePrefix(&rest, "s3://")) {
    std::vector<absl::string_view> parts = absl::StrSplit(rest, '/', absl::SkipEmpty());
    if (parts.empty() || !IsPlainSegment(parts[0])) {
      return BadFlag("--source",
                     absl::StrCat("s3://BUCKET[/PREFIX] needs a bucket name; got '", source, "'"));
    }
    // AWS's regional endpoint by default: path-style requests to another region's endpoint
    // are redirected or refused.
    const char* region = std::getenv("AWS_REGION");
    const std::string aws =
        absl::StrCat("https://s3.", region != nullptr && *region != '\0' ? region : "us-east-1",
                     ".amazonaws.com");
    absl::StatusOr<std::string> url = EndpointUrl(endpoint, aws.c_str());
    if (!url.ok()) return url.status();
    for (absl::string_view part : parts) absl::StrAppend(&*url, "/", EncodePathSegment(part));
    return Location{.folder = *std::move(url), .query = ""};
  }
  if (absl::ConsumePrefix(&rest, "hf://")) {
    std::vector<absl::string_view> at = absl::StrSplit(rest, absl::MaxSplits('@', 1));
    const std::string revision = at.size() == 2 ? std::string(at[1]) : "main";
    std::vector<absl::string_view> repo = absl::StrSplit(at[0], '/');
    if (repo.size() != 2 || !IsPlainSegment(repo[0]) || !IsPlainSegment(repo[1]) ||
        revision.empty()) {
      return BadFlag("--source",
                     absl::StrCat("hf://ORG/REPO[@REVISION] needs an organization, a repository "
                                  "and a non-empty revision; got '",
                                  source, "'"));
    }
    absl::StatusOr<std::string> url = EndpointUrl(endpoint, "https://huggingface.co");
    if (!url.ok()) return url.status();
    // A revision such as refs/pr/1 is one path segment on the Hub: its '/' are encoded.
    absl::StrAppend(&*url, "/", repo[0], "/", repo[1], "/resolve/", EncodePathSegment(revision));
    return Location{.folder = *std::move(url), .query = ""};
  }
  return BadFlag("--source", absl::StrCat(forms, "; got '", source, "'"));
}

// Parses one --file NAME=SHA256 (the rules the roles' --model-file check shares).
absl::StatusOr<WantedFile> ParseFileFlag(const std::string& text) {
  absl::StatusOr<ModelFile> file = ParseModelFile(text, "--file");
  if (!file.ok()) return file.status();
  return WantedFile{.name = file->name, .sha256 = file->sha256, .url = "", .shown_url = ""};
}

// A duration such as 30s, 10m or 1h30m; a bare number is seconds.
absl::StatusOr<absl::Duration> ParseDurationFlag(const std::string& text, absl::string_view flag,
                                                 bool allow_zero) {
  absl::Duration d;
  int64_t seconds = 0;
  if (absl::SimpleAtoi(text, &seconds)) {
    d = absl::Seconds(seconds);
  } else if (!absl::ParseDuration(text, &d)) {
    d = -absl::InfiniteDuration();
  }
  if (d < absl::ZeroDuration() || (d == absl::ZeroDuration() && !allow_zero) ||
      d == absl::InfiniteDuration()) {
    return BadFlag(flag, absl::StrCat("must be a ", allow_zero ? "" : "positive ",
                                      "duration such as 500ms, 30s or 10m; got '", text, "'"));
  }
  return d;
}

// The origin of an http(s) URL (scheme://host:port, what credentials are bound to), parsed by
// libcurl's URL parser.
struct Origin {
  std::string text, scheme, host;
  bool loopback = false;
};
absl::StatusOr<Origin> OriginOf(const std::string& url) {
  std::unique_ptr<CURLU, decltype(&curl_url_cleanup)> parsed(curl_url(), &curl_url_cleanup);
  if (parsed == nullptr || curl_url_set(parsed.get(), CURLUPART_URL, url.c_str(), 0) != CURLUE_OK) {
    return absl::InvalidArgumentError(absl::StrCat("not a URL: '", url, "'"));
  }
  auto part = [&](CURLUPart which, unsigned flags) {
    char* value = nullptr;
    if (curl_url_get(parsed.get(), which, &value, flags) != CURLUE_OK || value == nullptr) {
      return std::string();
    }
    std::string out(value);
    curl_free(value);
    return out;
  };
  Origin origin;
  origin.scheme = absl::AsciiStrToLower(part(CURLUPART_SCHEME, 0));
  origin.host = absl::AsciiStrToLower(part(CURLUPART_HOST, 0));
  const std::string port = part(CURLUPART_PORT, CURLU_DEFAULT_PORT);
  if (origin.scheme.empty() || origin.host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no scheme or host in '", url, "'"));
  }
  origin.text = absl::StrCat(origin.scheme, "://", origin.host, ":", port);
  origin.loopback = origin.host == "localhost" || origin.host == "[::1]" ||
                    absl::StartsWith(origin.host, "127.");
  return origin;
}

absl::StatusOr<FetchRequest> MakeRequest(const FetchModelOptions& o, const Environment& env) {
  FetchRequest r;
  absl::StatusOr<Location> location = FindLocation(o.source, o.endpoint);
  if (!location.ok()) return location.status();
  r.source = o.source.substr(0, o.source.size() - location->query.size());

  std::set<std::string> names;
  for (const std::string& text : o.files) {
    absl::StatusOr<WantedFile> file = ParseFileFlag(text);
    if (!file.ok()) return file.status();
    if (!names.insert(file->name).second) {
      return BadFlag("--file", absl::StrCat(file->name, " is given twice"));
    }
    file->shown_url = absl::StrCat(location->folder, "/", EncodePathSegment(file->name));
    file->url = file->shown_url + location->query;
    r.files.push_back(*std::move(file));
  }
  if (r.files.empty()) return BadFlag("--file", "give at least one NAME=SHA256");

  if (o.dest.empty()) return BadFlag("--dest", "must not be empty");
  r.dest = fs::absolute(o.dest).lexically_normal();
  if (!r.dest.has_filename()) r.dest = r.dest.parent_path();
  if (r.dest == r.dest.root_path()) {
    return BadFlag("--dest", absl::StrCat("must name a directory below /; got '", o.dest, "'"));
  }

  if (o.retries < 0 || o.retries > kMaxRetries) {
    return BadFlag("--retries", absl::StrCat("must be in [0, ", kMaxRetries, "]; got ", o.retries));
  }
  r.retries = o.retries;
  if (o.max_bytes <= 0) {
    return BadFlag("--max-bytes", absl::StrCat("must be positive; got ", o.max_bytes));
  }
  r.max_bytes = o.max_bytes;
  absl::StatusOr<absl::Duration> timeout = ParseDurationFlag(o.timeout, "--timeout", false);
  if (!timeout.ok()) return timeout.status();
  r.timeout = *timeout;
  absl::StatusOr<absl::Duration> backoff = ParseDurationFlag(o.backoff, "--backoff", true);
  if (!backoff.ok()) return backoff.status();
  r.backoff = *backoff;

  if (absl::StartsWith(o.source, "hf://") && !env.hf_token.empty()) {
    r.credential_headers.push_back(absl::StrCat("Authorization: Bearer ", env.hf_token));
  }
  if (absl::StartsWith(o.source, "s3://")) {
    if (env.aws_access_key_id.empty() != env.aws_secret_access_key.empty()) {
      return absl::InvalidArgumentError(
          "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set together (or neither, for "
          "a public bucket)");
    }
    if (!env.aws_access_key_id.empty()) {
      r.aws_sigv4 = absl::StrCat("aws:amz:", env.aws_region, ":s3");
      r.aws_access_key_id = env.aws_access_key_id;
      r.aws_secret_access_key = env.aws_secret_access_key;
      // S3 wants the payload hash as a (signed) header; libcurl signs every header given.
      r.credential_headers.push_back(
          absl::StrCat("x-amz-content-sha256: ", kEmptyPayloadSha256));
      if (!env.aws_session_token.empty()) {
        r.credential_headers.push_back(
            absl::StrCat("x-amz-security-token: ", env.aws_session_token));
      }
    }
  }
  absl::StatusOr<Origin> origin = OriginOf(location->folder);
  if (!origin.ok()) return BadFlag("--source", origin.status().message());
  r.origin = origin->text;
  // Credentials travel only over https: plain http only to a loopback test endpoint, and only
  // when asked for.
  if ((!r.credential_headers.empty() || !r.aws_sigv4.empty()) && origin->scheme != "https" &&
      !(o.insecure_loopback_http && origin->loopback)) {
    return BadFlag(
        "--source", absl::StrCat("credentials (HF_TOKEN, AWS_*) are sent only over https; ",
                                 r.origin, " is plain http (--insecure-loopback-http allows it for "
                                 "a test endpoint on 127.0.0.1, ::1 or localhost only)"));
  }
  r.ca_file = o.ca_file;
  return r;
}

// Owns a file descriptor; closing it releases any flock taken through it.
class UniqueFd {
 public:
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&&) = delete;
  ~UniqueFd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

absl::Status ErrnoError(absl::string_view what, const fs::path& path) {
  return absl::InternalError(absl::StrCat(what, " ", path.string(), ": ", std::strerror(errno)));
}

absl::Status FsyncPath(const fs::path& path) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0 || fsync(fd.get()) != 0) return ErrnoError("cannot sync", path);
  return absl::OkStatus();
}

// Blocks until this process holds the exclusive flock on `path` (created if absent).
absl::StatusOr<UniqueFd> LockExclusive(const fs::path& path) {
  UniqueFd fd(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (fd.get() < 0) return ErrnoError("cannot open the lock file", path);
  if (flock(fd.get(), LOCK_EX | LOCK_NB) == 0) return fd;
  if (errno != EWOULDBLOCK) return ErrnoError("cannot lock", path);
  std::cerr << "batonctl fetch-model: waiting for " << path.string()
            << " (another fetch-model holds it)" << std::endl;
  while (flock(fd.get(), LOCK_EX) != 0) {
    if (errno != EINTR) return ErrnoError("cannot lock", path);
  }
  return fd;
}

// DEST is replaced as a whole by a rename, so it must be a directory of its own: not a file, a
// link or a mount point (the volume's root cannot be renamed; mount a folder above it).
absl::Status CheckDestReplaceable(const fs::path& dest) {
  struct stat d, parent;
  if (lstat(dest.c_str(), &d) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoError("cannot inspect", dest);
  }
  if (!S_ISDIR(d.st_mode)) {
    return BadFlag("--dest", absl::StrCat(dest.string(), " exists and is not a directory"));
  }
  if (stat(dest.parent_path().c_str(), &parent) == 0 && parent.st_dev != d.st_dev) {
    return BadFlag("--dest", absl::StrCat(dest.string(),
                                          " is a mount point; give a directory inside the "
                                          "volume (it is replaced as a whole)"));
  }
  return absl::OkStatus();
}

// The marker: {"source": S, "files": {NAME: {"sha256": HEX, "bytes": N}}}.
nlohmann::json MarkerJson(const FetchRequest& r, const std::vector<int64_t>& sizes) {
  nlohmann::json files = nlohmann::json::object();
  for (size_t i = 0; i < r.files.size(); ++i) {
    files[r.files[i].name] = {{"sha256", r.files[i].sha256}, {"bytes", sizes[i]}};
  }
  return {{"source", r.source}, {"files", std::move(files)}};
}

// The total size of DEST's files when its marker names this source and exactly the requested
// files and digests, and every file is there at its recorded size; nullopt otherwise. Digests
// are not recomputed: DEST only ever receives verified files.
std::optional<int64_t> CompleteBytes(const FetchRequest& r) {
  std::ifstream in(r.dest / kMarkerName);
  if (!in) return std::nullopt;
  const nlohmann::json marker = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!marker.is_object() || marker.value("source", nlohmann::json()) != r.source) {
    return std::nullopt;
  }
  const nlohmann::json files = marker.value("files", nlohmann::json());
  if (!files.is_object() || files.size() != r.files.size()) return std::nullopt;
  int64_t total = 0;
  for (const WantedFile& want : r.files) {
    auto entry = files.find(want.name);
    if (entry == files.end() || !entry->is_object()) return std::nullopt;
    const nlohmann::json bytes = entry->value("bytes", nlohmann::json());
    if (entry->value("sha256", nlohmann::json()) != want.sha256 || !bytes.is_number_integer()) {
      return std::nullopt;
    }
    std::error_code ec;
    const fs::path path = r.dest / want.name;
    if (!fs::is_regular_file(fs::symlink_status(path, ec)) ||
        static_cast<int64_t>(fs::file_size(path, ec)) != bytes.get<int64_t>() || ec) {
      return std::nullopt;
    }
    total += bytes.get<int64_t>();
  }
  return total;
}

// Removes temporary directories of runs that were killed: only a run holding the lock writes
// them, and this one holds it now.
void RemoveLeftovers(const fs::path& dest) {
  const std::string name = dest.filename().string();
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dest.parent_path(), ec)) {
    const std::string other = entry.path().filename().string();
    if (absl::StartsWith(other, absl::StrCat(".", name, ".tmp-")) ||
        absl::StartsWith(other, absl::StrCat(".", name, ".old-"))) {
      std::cerr << "batonctl fetch-model: removing " << entry.path().string()
                << ", left by an interrupted run" << std::endl;
      fs::remove_all(entry.path(), ec);
    }
  }
}

// A new empty sibling of DEST named ".DEST.<kind>-XXXXXX", readable by every user: the roles
// may run under another uid than this init container.
absl::StatusOr<fs::path> MakeSibling(const fs::path& dest, absl::string_view kind) {
  std::string path =
      (dest.parent_path() / absl::StrCat(".", dest.filename().string(), ".", kind, "-XXXXXX"))
          .string();
  if (mkdtemp(path.data()) == nullptr) return ErrnoError("cannot create", path);
  if (chmod(path.c_str(), 0755) != 0) return ErrnoError("cannot chmod", path);
  return fs::path(path);
}

// Receives a body: hashes and writes it, refusing more than max_bytes.
struct Sink {
  int fd = -1;
  EVP_MD_CTX* sha256 = nullptr;
  int64_t max_bytes = 0;
  int64_t bytes = 0;
  bool too_large = false;
  int write_errno = 0;
};

// libcurl's CURLOPT_WRITEFUNCTION; a short return makes the transfer fail with a write error.
size_t WriteToSink(char* data, size_t size, size_t count, void* user) {
  Sink* sink = static_cast<Sink*>(user);
  const size_t n = size * count;
  if (sink->bytes + static_cast<int64_t>(n) > sink->max_bytes) {
    sink->too_large = true;
    return 0;
  }
  EVP_DigestUpdate(sink->sha256, data, n);
  for (size_t done = 0; done < n;) {
    const ssize_t wrote = write(sink->fd, data + done, n - done);
    if (wrote < 0) {
      if (errno == EINTR) continue;
      sink->write_errno = errno;
      return 0;
    }
    done += static_cast<size_t>(wrote);
  }
  sink->bytes += static_cast<int64_t>(n);
  return n;
}

struct AttemptResult {
  absl::Status status;  // OK: the file is on disk, synced, its digest verified
  bool retryable = false;
  absl::Duration retry_after;  // the server's Retry-After; zero when absent
  int64_t bytes = 0;
};

// Failures worth another attempt: the network, not the request, went wrong.
bool IsTransient(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_HTTP3:
    case CURLE_QUIC_CONNECT_ERROR:
      return true;
    default:
      return false;
  }
}

// One hop's request: `url`, checked protocols, no redirects followed by libcurl, the limits
// and timeouts of `r`, the body into `sink`, and (at the source's origin only) the signature.
void SetHopOptions(CURL* c, const FetchRequest& r, const std::string& url, bool at_origin,
                   curl_slist* headers, Sink* sink, char* error) {
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);  // an error body never reaches the file
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "batonctl-fetch-model");
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(absl::ToInt64Milliseconds(r.timeout)));
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, kLowSpeedBytesPerSecond);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, kLowSpeedSeconds);
  curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(r.max_bytes));
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &WriteToSink);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, sink);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  if (!r.ca_file.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, r.ca_file.c_str());
  if (at_origin && !r.aws_sigv4.empty()) {
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, r.aws_sigv4.c_str());
    curl_easy_setopt(c, CURLOPT_USERNAME, r.aws_access_key_id.c_str());
    curl_easy_setopt(c, CURLOPT_PASSWORD, r.aws_secret_access_key.c_str());
  }
}

// A transfer that did not bring the whole file: too large, unwritable, an HTTP error (with
// whether and when to retry) or a transport error, as `result`; false when it did.
bool TransferFailed(const FetchRequest& r, const Sink& sink, CURLcode code, long http_status,
                    CURL* c, const char* error, const std::string& from, const fs::path& path,
                    AttemptResult& result) {
  if (sink.too_large || code == CURLE_FILESIZE_EXCEEDED) {
    result.status = absl::ResourceExhaustedError(
        absl::StrCat("larger than --max-bytes (", r.max_bytes, " bytes)", from));
    return true;
  }
  if (sink.write_errno != 0) {
    errno = sink.write_errno;
    result.status = ErrnoError("cannot write", path);
    return true;
  }
  if (code == CURLE_HTTP_RETURNED_ERROR || (code == CURLE_OK && http_status / 100 != 2)) {
    curl_off_t retry_after = 0;
    curl_easy_getinfo(c, CURLINFO_RETRY_AFTER, &retry_after);
    result.retry_after = absl::Seconds(retry_after);
    result.retryable = http_status >= 500 || http_status == 429;
    result.status = absl::UnavailableError(absl::StrCat("HTTP ", http_status, from));
    return true;
  }
  if (code != CURLE_OK) {
    result.retryable = IsTransient(code);
    result.status = absl::UnavailableError(
        absl::StrCat(error[0] != '\0' ? error : curl_easy_strerror(code), from));
    return true;
  }
  return false;
}

// A redirect is followed only to http or https, never from https down to http, and at most
// kMaxRedirects times.
absl::Status CheckRedirect(int hop, const absl::StatusOr<Origin>& next, const std::string& scheme,
                           const std::string& from) {
  if (hop < kMaxRedirects && next.ok() && (next->scheme == "http" || next->scheme == "https") &&
      !(scheme == "https" && next->scheme != "https")) {
    return absl::OkStatus();
  }
  return absl::UnavailableError(
      absl::StrCat(hop >= kMaxRedirects ? absl::StrCat("more than ", kMaxRedirects, " redirects")
                   : next.ok() && scheme == "https" && next->scheme == "http"
                       ? "a redirect from https down to http is refused"
                       : "a redirect to anything but an http or https URL is refused",
                   from));
}

// A hop's headers: --header's, and the credentials' only at the source's origin.
curl_slist* HopHeaders(const FetchRequest& r, bool at_origin) {
  curl_slist* headers = nullptr;
  for (const std::string& header : r.headers) headers = curl_slist_append(headers, header.c_str());
  if (at_origin) {
    for (const std::string& header : r.credential_headers) {
      headers = curl_slist_append(headers, header.c_str());
    }
  }
  return headers;
}

// The finished digest of `sha256`, in lower-case hex.
std::string HexDigest(EVP_MD_CTX* sha256) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int digest_len = 0;
  EVP_DigestFinal_ex(sha256, digest, &digest_len);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(digest), digest_len));
}

// One GET of `file` into `path` (truncated first), hashed while it streams.
AttemptResult FetchOnce(const FetchRequest& r, const WantedFile& file, const fs::path& path) {
  AttemptResult result;
  UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0 || fchmod(fd.get(), 0644) != 0) {
    result.status = ErrnoError("cannot create", path);
    return result;
  }
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> sha256(EVP_MD_CTX_new(),
                                                                 &EVP_MD_CTX_free);
  std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> curl(curl_easy_init(), &curl_easy_cleanup);
  if (sha256 == nullptr || curl == nullptr ||
      EVP_DigestInit_ex(sha256.get(), EVP_sha256(), nullptr) != 1) {
    result.status = absl::InternalError("cannot set up libcurl or OpenSSL");
    return result;
  }
  std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)> headers(nullptr,
                                                                      &curl_slist_free_all);
  Sink sink;
  char error[CURL_ERROR_SIZE] = "";
  CURL* c = curl.get();
  const std::string from = absl::StrCat(" from ", file.shown_url);
  // Redirects are followed here rather than by libcurl, so that each hop is checked: http or
  // https only, never from https down to http, and credentials (headers and signature) go to
  // the source's origin only, never to a host it redirects to.
  std::string url = file.url;
  std::string scheme = absl::StartsWith(url, "https://") ? "https" : "http";
  bool at_origin = true;
  CURLcode code = CURLE_OK;
  long http_status = 0;
  for (int hop = 0;; ++hop) {
    curl_easy_reset(c);
    headers.reset(HopHeaders(r, at_origin));
    // Each hop starts the file afresh (a redirect's own body is not the file).
    if (ftruncate(fd.get(), 0) != 0 || lseek(fd.get(), 0, SEEK_SET) != 0 ||
        EVP_DigestInit_ex(sha256.get(), EVP_sha256(), nullptr) != 1) {
      result.status = ErrnoError("cannot truncate", path);
      return result;
    }
    sink = Sink{.fd = fd.get(), .sha256 = sha256.get(), .max_bytes = r.max_bytes};
    error[0] = '\0';
    SetHopOptions(c, r, url, at_origin, headers.get(), &sink, error);
    code = curl_easy_perform(c);
    http_status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &http_status);
    char* location = nullptr;
    if (code != CURLE_OK || http_status / 100 != 3 ||
        curl_easy_getinfo(c, CURLINFO_REDIRECT_URL, &location) != CURLE_OK ||
        location == nullptr) {
      break;
    }
    absl::StatusOr<Origin> next = OriginOf(location);
    if (absl::Status s = CheckRedirect(hop, next, scheme, from); !s.ok()) {
      result.status = s;
      return result;
    }
    if (next->text != r.origin) at_origin = false;
    scheme = next->scheme;
    url = location;
  }

  if (TransferFailed(r, sink, code, http_status, c, error, from, path, result)) return result;

  const std::string got = HexDigest(sha256.get());
  if (got != file.sha256) {
    result.retryable = true;
    result.status =
        absl::DataLossError(absl::StrCat("sha256 mismatch: expected ", file.sha256, ", got ", got,
                                         " (", sink.bytes, " bytes", from, ")"));
    return result;
  }
  if (fsync(fd.get()) != 0) {
    result.status = ErrnoError("cannot sync", path);
    return result;
  }
  result.bytes = sink.bytes;
  return result;
}

// Fetches one file with retries and exponential backoff; the error names the file.
absl::StatusOr<int64_t> FetchWithRetries(const FetchRequest& r, const WantedFile& file,
                                         const fs::path& path) {
  const int attempts = r.retries + 1;
  const absl::Duration cap = std::max(kMaxBackoff, r.backoff);
  absl::Duration delay = r.backoff;
  int mismatches = 0;
  for (int attempt = 1;; ++attempt) {
    const AttemptResult result = FetchOnce(r, file, path);
    if (result.status.ok()) return result.bytes;
    // A digest mismatch is tried once more (a corrupted transfer); the same mismatch twice
    // means the digest given or the source is wrong, and more downloads would not help.
    const bool mismatch = absl::IsDataLoss(result.status) && ++mismatches >= 2;
    if (!result.retryable || mismatch || attempt == attempts) {
      return absl::Status(
          result.status.code(),
          absl::StrCat(file.name, ": ", result.status.message(),
                       attempt > 1 ? absl::StrCat(" (after ", attempt, " attempts)") : ""));
    }
    const absl::Duration wait = std::min(std::max(delay, result.retry_after), cap);
    std::cerr << "batonctl fetch-model: " << file.name << ": attempt " << attempt << " of "
              << attempts << " failed: " << result.status.message() << "; retrying in "
              << absl::FormatDuration(wait) << std::endl;
    absl::SleepFor(wait);
    delay = std::min(delay * 2, cap);
  }
}

// Downloads and verifies every file into `staging`, then writes the marker; returns the total
// size.
absl::StatusOr<int64_t> FillStaging(const FetchRequest& r, const fs::path& staging) {
  std::vector<int64_t> sizes;
  for (const WantedFile& file : r.files) {
    absl::StatusOr<int64_t> bytes = FetchWithRetries(r, file, staging / file.name);
    if (!bytes.ok()) return bytes.status();
    std::cerr << "batonctl fetch-model: " << file.name << ": " << *bytes
              << " bytes, sha256 verified" << std::endl;
    sizes.push_back(*bytes);
  }
  const fs::path marker = staging / kMarkerName;
  {
    std::ofstream out(marker);
    out << MarkerJson(r, sizes).dump(2) << "\n";
    if (!out.flush()) return ErrnoError("cannot write", marker);
  }
  if (chmod(marker.c_str(), 0644) != 0) return ErrnoError("cannot chmod", marker);
  for (const fs::path& path : {marker, staging}) {
    if (absl::Status s = FsyncPath(path); !s.ok()) return s;
  }
  int64_t total = 0;
  for (int64_t size : sizes) total += size;
  return total;
}

// Puts the complete `staging` directory in DEST's place. DEST absent or empty: one rename.
// Otherwise the two are exchanged atomically (renameat2) and the old one removed; where the
// file system cannot exchange (NFS), the old DEST is moved aside first, so a reader that does not
// take the lock may find DEST missing for a moment, but never incomplete.
absl::Status ReplaceDest(const fs::path& staging, const fs::path& dest) {
  fs::path old = staging;  // after an exchange, staging holds the old DEST
  if (rename(staging.c_str(), dest.c_str()) == 0) {
    old.clear();
  } else if (errno != ENOTEMPTY && errno != EEXIST) {
    return ErrnoError(absl::StrCat("cannot rename ", staging.string(), " to"), dest);
  } else if (renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, dest.c_str(), RENAME_EXCHANGE) != 0) {
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
      return ErrnoError(absl::StrCat("cannot exchange ", staging.string(), " and"), dest);
    }
    absl::StatusOr<fs::path> aside = MakeSibling(dest, "old");
    if (!aside.ok()) return aside.status();
    old = *aside;
    if (rename(dest.c_str(), old.c_str()) != 0) {
      const absl::Status error = ErrnoError("cannot move aside", dest);
      std::error_code ec;
      fs::remove(old, ec);
      return error;
    }
    if (rename(staging.c_str(), dest.c_str()) != 0) {
      const absl::Status error =
          ErrnoError(absl::StrCat("cannot rename ", staging.string(), " to"), dest);
      rename(old.c_str(), dest.c_str());
      return error;
    }
  }
  if (absl::Status s = FsyncPath(dest.parent_path()); !s.ok()) return s;
  std::error_code ec;
  if (!old.empty() && (fs::remove_all(old, ec), ec)) {
    std::cerr << "batonctl fetch-model: warning: cannot remove the old " << old.string() << ": "
              << ec.message() << " (the next run removes it)" << std::endl;
  }
  return absl::OkStatus();
}

struct FetchSummary {
  int64_t bytes = 0;
  bool downloaded = false;
};

absl::StatusOr<FetchSummary> FetchModel(const FetchRequest& r) {
  const fs::path parent = r.dest.parent_path();
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot create ", parent.string(), ": ", ec.message()));
  }
  if (absl::Status s = CheckDestReplaceable(r.dest); !s.ok()) return s;
  absl::StatusOr<UniqueFd> lock = LockExclusive(r.dest.string() + ".lock");
  if (!lock.ok()) return lock.status();
  // Checked again under the lock: another run may have replaced DEST meanwhile.
  if (absl::Status s = CheckDestReplaceable(r.dest); !s.ok()) return s;
  if (std::optional<int64_t> bytes = CompleteBytes(r)) {
    std::cerr << "batonctl fetch-model: " << r.dest.string() << " already complete (" << r.source
              << ", " << r.files.size() << " files)" << std::endl;
    return FetchSummary{.bytes = *bytes, .downloaded = false};
  }
  RemoveLeftovers(r.dest);
  absl::StatusOr<fs::path> staging = MakeSibling(r.dest, "tmp");
  if (!staging.ok()) return staging.status();
  absl::StatusOr<int64_t> bytes = FillStaging(r, *staging);
  absl::Status status = bytes.status();
  if (status.ok()) status = ReplaceDest(*staging, r.dest);
  if (!status.ok()) {
    fs::remove_all(*staging, ec);
    return status;
  }
  return FetchSummary{.bytes = *bytes, .downloaded = true};
}

int RunFetchModel(const FetchModelOptions& options) {
  absl::StatusOr<FetchRequest> request = MakeRequest(options, ReadEnvironment());
  if (!request.ok()) return ReportError(kCommand, request.status());
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
    return ReportError(kCommand, absl::InternalError("cannot initialize libcurl"));
  }
  absl::StatusOr<FetchSummary> summary = FetchModel(*request);
  curl_global_cleanup();
  if (!summary.ok()) return ReportError(kCommand, summary.status());
  std::cout << nlohmann::json{{"dest", request->dest.string()},
                              {"files", request->files.size()},
                              {"bytes", summary->bytes},
                              {"downloaded", summary->downloaded}}
                   .dump()
            << "\n";
  return kExitOk;
}

}  // namespace

Command AddFetchModelCommand(CLI::App& app) {
  auto options = std::make_shared<FetchModelOptions>();
  CLI::App* command = app.add_subcommand(
      "fetch-model",
      "Download model weights into a directory, each file verified by SHA-256 (the Helm "
      "chart's init container); safe on a volume that several pods share");
  command
      ->add_option("--source", options->source,
                   "Where the files are: https://HOST/PATH[?QUERY] or http://HOST/PATH[?QUERY] "
                   "(a folder: each file is HOST/PATH/NAME[?QUERY]), s3://BUCKET[/PREFIX] or "
                   "hf://ORG/REPO[@REVISION] (revision default main)")
      ->required();
  command
      ->add_option("--dest", options->dest,
                   "Directory to deliver into; replaced as a whole, locked through DEST.lock; "
                   "not a mount point")
      ->required();
  command
      ->add_option("--file", options->files,
                   "NAME=SHA256 of one file (a plain file name and 64 hex digits); repeat for "
                   "each file")
      ->required();
  command->add_option(
      "--endpoint", options->endpoint,
      "Server of s3:// sources (default https://s3.AWS_REGION.amazonaws.com, path-style "
      "URLs) and hf:// sources (default https://huggingface.co)");
  command->add_option("--retries", options->retries,
                      "Retries of each file after its first attempt, on connection errors, "
                      "timeouts, HTTP 5xx and 429 (default 5); a digest mismatch is retried once");
  command->add_option(
      "--timeout", options->timeout,
      "Limit of each attempt, e.g. 30s, 10m, 1h (default 6h: room for large weights); an attempt "
      "slower than 1 KiB/s for 60s is abandoned too");
  command->add_option("--backoff", options->backoff,
                      "Wait before the first retry, doubling up to 30s (default 500ms)");
  command->add_option("--max-bytes", options->max_bytes,
                      "Largest accepted file in bytes (default 1 TiB)");
  command->add_flag("--insecure-loopback-http", options->insecure_loopback_http,
                    "Send credentials over plain http to a loopback endpoint (127.0.0.1, ::1, "
                    "localhost): for a test server only; otherwise they go over https only");
  command->add_option("--ca-file", options->ca_file,
                      "PEM bundle of the CAs that sign the endpoint's certificate (a private S3 "
                      "endpoint; default: the system's)");
  command->footer(
      "Environment: HF_TOKEN is sent to hf:// sources as a bearer token. With AWS_ACCESS_KEY_ID "
      "and AWS_SECRET_ACCESS_KEY set, s3:// requests are signed (AWS SigV4; region AWS_REGION, "
      "default us-east-1; AWS_SESSION_TOKEN sent as x-amz-security-token). Credentials go "
      "over https only, and only to the source's own origin: a redirect to another host gets "
      "no credentials, and one from https down to http is refused.\n"
      "A DEST whose marker (DEST/.baton-source) matches the source and digests is left as it "
      "is. Prints one line per file on stderr and {\"dest\", \"files\", \"bytes\", "
      "\"downloaded\"} on stdout. Exit status: 0 done or already complete; 1 a download "
      "failed (DEST is as it was, nothing else is left); 2 a bad flag.");
  return {command, [options] { return RunFetchModel(*options); }};
}

}  // namespace baton::tools
