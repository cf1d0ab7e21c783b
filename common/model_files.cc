#include "baton/common/model_files.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace baton {
namespace {

// A marker lists a handful of files; anything larger is not one fetch-model wrote.
constexpr std::streamsize kMaxMarkerBytes = 1 << 20;

bool IsSha256(const std::string& text) {
  if (text.size() != 64) return false;
  for (char c : text) {
    if (!absl::ascii_isdigit(c) && !(c >= 'a' && c <= 'f')) return false;
  }
  return true;
}

// Where the release's expectations and the directory part, said the same way everywhere.
absl::Status Mismatch(const std::string& model_dir, const ModelFile& want,
                      const std::string& what) {
  return absl::FailedPreconditionError(absl::StrCat(
      "--model-file ", want.name, "=", want.sha256, ": ", model_dir, "/", want.name, " ", what,
      "; this pod's release was rendered for other weights than the directory holds (a rollback "
      "onto weights replaced in place, or a volume filled by hand): point --model at the "
      "directory fetched for this release (the chart's /models/<digest>/baton) or fetch it"));
}

}  // namespace

absl::StatusOr<ModelFile> ParseModelFile(const std::string& text, const std::string& flag) {
  const size_t eq = text.rfind('=');  // a name may hold '=', a digest never does
  if (eq == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": must be NAME=SHA256 (e.g. model.safetensors=<64 hex>); got '", text,
                     "'"));
  }
  ModelFile file{text.substr(0, eq), absl::AsciiStrToLower(text.substr(eq + 1))};
  if (file.name.empty() || file.name == "." || file.name == ".." || file.name.size() > 255 ||
      file.name.find('/') != std::string::npos ||
      std::any_of(file.name.begin(), file.name.end(),
                  [](char c) { return absl::ascii_iscntrl(static_cast<unsigned char>(c)); })) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": NAME must be a plain file name (no '/', not '.' or '..', at most 255 bytes); "
        "got '", text, "'"));
  }
  if (file.name == kModelMarkerName) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": NAME ", kModelMarkerName, " is reserved for the marker"));
  }
  if (!IsSha256(file.sha256)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": SHA256 must be 64 hex digits; got '",
                                                   text.substr(eq + 1), "' for ", file.name));
  }
  return file;
}

void AddModelFileFlag(CLI::App& app, std::vector<std::string>& files) {
  app.add_option("--model-file", files,
                 "NAME=SHA256 (repeatable): at start, refuse a --model directory whose fetch "
                 "marker (.baton-source, written by batonctl fetch-model) does not record this "
                 "file with this digest, or whose file is not at its recorded size. Nothing is "
                 "hashed: the check costs a stat per file");
}

absl::Status CheckModelFiles(const std::string& model_dir, const std::vector<std::string>& files) {
  std::vector<ModelFile> wanted;
  std::set<std::string> names;
  for (const std::string& text : files) {
    absl::StatusOr<ModelFile> file = ParseModelFile(text, "--model-file");
    if (!file.ok()) return file.status();
    if (!names.insert(file->name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model-file: ", file->name, " is given twice"));
    }
    wanted.push_back(*std::move(file));
  }
  if (wanted.empty()) return absl::OkStatus();
  const std::string marker_path = absl::StrCat(model_dir, "/", kModelMarkerName);
  std::ifstream in(marker_path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--model-file: ", marker_path, " cannot be read, so nothing says which weights ",
        model_dir, " holds; fill the directory with batonctl fetch-model (which records every "
        "file's verified digest there), or drop --model-file"));
  }
  std::string text(kMaxMarkerBytes + 1, '\0');
  in.read(text.data(), kMaxMarkerBytes + 1);
  text.resize(static_cast<size_t>(in.gcount()));
  const nlohmann::json marker =
      text.size() > static_cast<size_t>(kMaxMarkerBytes)
          ? nlohmann::json()
          : nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  const auto recorded = marker.is_object() ? marker.find("files") : marker.end();
  if (recorded == marker.end() || !recorded->is_object()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--model-file: ", marker_path, " is not a fetch marker ({\"source\": ..., \"files\": "
        "{NAME: {\"sha256\": ..., \"bytes\": N}}}, at most 1 MiB)"));
  }
  for (const ModelFile& want : wanted) {
    const auto entry = recorded->find(want.name);
    if (entry == recorded->end() || !entry->is_object()) {
      return Mismatch(model_dir, want, "was not fetched (the marker does not list it)");
    }
    const nlohmann::json sha256 = entry->value("sha256", nlohmann::json());
    const nlohmann::json bytes = entry->value("bytes", nlohmann::json());
    if (!sha256.is_string() || !bytes.is_number_integer() || bytes.get<int64_t>() < 0) {
      return Mismatch(model_dir, want, "has a malformed entry in the marker");
    }
    if (sha256.get<std::string>() != want.sha256) {
      return Mismatch(model_dir, want,
                      absl::StrCat("has SHA-256 ", sha256.get<std::string>(), " (per ",
                                   kModelMarkerName, ")"));
    }
    const std::string path = absl::StrCat(model_dir, "/", want.name);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return Mismatch(model_dir, want, "is missing");
    }
    if (static_cast<int64_t>(st.st_size) != bytes.get<int64_t>()) {
      return Mismatch(model_dir, want,
                      absl::StrCat("is ", st.st_size, " bytes, not the ", bytes.get<int64_t>(),
                                   " fetched (changed since)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace baton
