// Which model `baton up` serves, and under which name. --model serves that folder under the
// name its config gives; --preset generates the preset into <data-dir>/model-<preset> (the
// small preset into <data-dir>/model, as before --preset existed) and gives it the default
// tokenizer when its vocabulary can take it; neither serves the trained ced-brown-shared that
// ships with baton, or generates the small preset when it is not installed.
//
// Progress ("serving the trained model ...", "generating ...") goes to stdout as it happens.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "baton/launcher/launch_options.h"
#include "baton/launcher/layout.h"

namespace baton::launcher {

struct ServedModel {
  std::string dir;
  // {"--served-model-name", NAME} for the router and every node (a node of another name is
  // refused), or empty: the name the model's config gives.
  std::vector<std::string> name_flags;
  // The router serves the OpenAI API: --http-port is not -1 and `dir` has a tokenizer.model.
  bool http = false;
};

// INVALID_ARGUMENT when both --model and --preset are given or the preset is unknown (naming
// the flag); NOT_FOUND when a generated model needs the default tokenizer and none is found
// (naming --tokenizer); ABORTED when generating the model or copying its tokenizer fails.
absl::StatusOr<ServedModel> ResolveModel(const LaunchOptions& options, const Layout& layout);

}  // namespace baton::launcher
