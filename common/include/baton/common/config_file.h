// One configuration file for every baton binary (`--config FILE`, YAML):
//
//   common:            # read by every binary; keys a binary does not have are skipped there
//     model: /models/baton
//     log-format: json
//   router:            # each binary's own section: any of its long flags, without dashes
//     default-mode: compact
//   prefill: {...}
//   decode: {...}
//   kvstore: {...}
//
// (`baton up --config FILE` hands the file to each component it starts.)
// A value is a scalar (or a list, for a flag that takes several). Flags on the command line
// override the file. The file is checked when the binary starts: an unknown section, an
// unknown key in the binary's own section, a key in `common` that no binary has, a nested map
// or a value its flag refuses all stop the binary with a message naming the file and the key.
// CLI11 does the merging and the value checks; this file only reads YAML into its items.
#pragma once

#include <string>

#include "CLI/CLI.hpp"

namespace baton {

// Every section name the file may hold.
inline constexpr const char* kConfigSections[] = {"common", "router", "prefill", "decode",
                                                  "kvstore"};
// The keys `common` may hold (those that more than one binary takes).
inline constexpr const char* kCommonConfigKeys[] = {
    "model",     "host",     "metrics-host", "metrics-port",      "log-format",
    "log-level", "router",   "kvstore",      "data-dir",          "transport",
    "tls-ca",    "tls-cert", "tls-key",      "insecure-internal", "health-port",
    "model-file"};

// Adds `--config FILE` to `app`, which reads `common` and then `section`. Call after every
// other option is added and before parsing; `argc`/`argv` are scanned for the file name so
// that messages can name it.
void AddConfigFile(CLI::App& app, const std::string& section, int argc, char** argv);

}  // namespace baton
