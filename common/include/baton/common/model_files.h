// The start-up check of a model directory against the files a release names (`--model-file
// NAME=SHA256`, the chart's model.source.files): a pod must serve the weights its release was
// rendered for. `batonctl fetch-model` leaves a marker (MODEL/.baton-source) recording each
// file's verified SHA-256 and size; the check reads it and stats each file, and hashes nothing,
// so it costs the same for a 4 KiB config as for 100 GiB of weights.
//
// It catches what an in-place model directory lets through: `helm rollback` to a release whose
// weights were replaced under the same path by a later upgrade, a volume filled by hand with
// other weights, or a download cut short. The process then refuses to start, naming the file,
// the digest the release expects and the one the directory holds.
#pragma once

#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace baton {

// The marker `batonctl fetch-model` writes in the directory it fills.
inline constexpr char kModelMarkerName[] = ".baton-source";

struct ModelFile {
  std::string name;
  std::string sha256;  // 64 lowercase hex digits
};

// "NAME=SHA256" as `--model-file` and `batonctl fetch-model --file` take it (the digest in either
// case, kept lowercase); the error names `flag` and what is allowed.
absl::StatusOr<ModelFile> ParseModelFile(const std::string& text, const std::string& flag);

// Adds the repeatable `--model-file NAME=SHA256` to `app` (config key model-file, a list).
void AddModelFileFlag(CLI::App& app, std::vector<std::string>& files);

// OK when every file of `files` is recorded in `model_dir`'s marker with the same digest and
// is there at its recorded size. FAILED_PRECONDITION otherwise (no marker, a file missing,
// another digest, another size), naming the file and both digests; INVALID_ARGUMENT naming
// --model-file for a malformed entry.
absl::Status CheckModelFiles(const std::string& model_dir, const std::vector<std::string>& files);

}  // namespace baton
