// The YAML config file (--config): any text is read into a server's flags or refused with
// CLI11's ConfigError, as ParseServerFlags does at start-up (the same parse of the same
// command line, with the input as the file); never an abort.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "baton/common/config_file.h"
#include "baton/common/server_flags.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  CLI::App app{"fuzz"};
  baton::ServerFlags flags;
  baton::AddServerFlags(app, flags);
  std::string router;
  int64_t pages = 0;
  app.add_option("--router", router);
  app.add_option("--pages", pages);
  static const std::string path =
      std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/baton_fuzz_config_" +
      std::to_string(getpid()) + ".yaml";
  std::ofstream(path, std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  std::string program = "baton-decode", flag = "--config", file = path;
  char* argv[] = {program.data(), flag.data(), file.data(), nullptr};
  baton::AddConfigFile(app, "decode", 3, argv);
  try {
    app.parse(3, argv);
  } catch (const CLI::ParseError&) {
    // Refused, as the binary would refuse it (exit 2 with the message).
  }
  return 0;
}
