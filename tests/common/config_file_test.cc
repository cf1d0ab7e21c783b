// The config file: which values reach a binary's flags, in which order, and what is refused.
#include "baton/common/config_file.h"

#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_dir.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

struct Flags {
  std::string model, host = "127.0.0.1";
  int slots = 1;
  bool no_ucx = false;
  std::vector<int> layers;
};

// A decode-like app: parses `args` after writing `yaml` to a file passed as --config.
std::string Parse(const std::string& yaml, std::vector<std::string> args, Flags& flags) {
  const std::string path = testing::ProcessTempDir() + "/config.yaml";
  std::ofstream(path, std::ios::trunc) << yaml;
  CLI::App app{"test"};
  app.add_option("--model", flags.model);
  app.add_option("--host", flags.host);
  app.add_option("--slots", flags.slots)->check(CLI::Range(1, 64));
  app.add_flag("--no-ucx", flags.no_ucx);
  app.add_option("--layers", flags.layers);
  args.insert(args.begin(), {"test", "--config", path});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  AddConfigFile(app, "decode", static_cast<int>(argv.size()), argv.data());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigFile, SectionBeatsCommonAndTheCommandLineBeatsBoth) {
  Flags flags;
  const std::string yaml =
      "common:\n  model: /common\n  host: 0.0.0.0\n  router: r:1\n  data-dir: /d\n"
      "decode:\n  model: /own\n  slots: 8\n  no-ucx: true\n  layers: [1, 2, 3]\n"
      "router:\n  anything: 1\n";  // other binaries' sections are theirs to check
  ASSERT_EQ(Parse(yaml, {"--slots", "4"}, flags), "");
  EXPECT_EQ(flags.model, "/own");     // own section over common
  EXPECT_EQ(flags.host, "0.0.0.0");   // common
  EXPECT_EQ(flags.slots, 4);          // command line over the file
  EXPECT_TRUE(flags.no_ucx);          // a flag set from the file
  EXPECT_EQ(flags.layers, (std::vector<int>{1, 2, 3}));
}

TEST(ConfigFile, AnEmptyFileChangesNothing) {
  Flags flags;
  ASSERT_EQ(Parse("", {}, flags), "");
  EXPECT_EQ(flags.slots, 1);
  EXPECT_EQ(flags.host, "127.0.0.1");
}

TEST(ConfigFile, RefusesWhatNoBinaryTakes) {
  struct Case {
    std::string yaml, message;
  };
  const std::vector<Case> cases = {
      {"decoder: {}\n", "section 'decoder' is unknown; allowed: common, router"},
      {"decode:\n  slot: 2\n", "decode.slot: unknown key; test takes: "},
      {"decode:\n  config: other.yaml\n", "decode.config: unknown key"},
      {"common:\n  slots: 2\n", "common.slots: not a shared key"},
      {"decode:\n  slots: 0\n", "--slots"},
      {"decode:\n  slots: two\n", "--slots"},
      {"decode:\n  model: {path: x}\n", "decode.model: must be a value or a list"},
      {"- decode\n", "the top level must be a map"},
      {"decode: 3\n", "section 'decode' must be a map"},
      {"decode:\n  slots: [2\n", "not valid YAML"},
  };
  for (const Case& c : cases) {
    Flags flags;
    EXPECT_THAT(Parse(c.yaml, {}, flags), HasSubstr(c.message)) << c.yaml;
  }
}

TEST(ConfigFile, KeysThatAreListsOrMapsAreAnErrorNotAnAbort) {
  // yaml-cpp's conversion of such a key to a name used to escape as an exception and abort
  // the binary (exit 134); in any section, this binary's or another's.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"router: {? [a, b] : 1}\n", "line 1: router: a key must be a plain name, not a list"},
      {"decode:\n  ? {a: 1}\n  : 2\n", "line 2: decode: a key must be a plain name, not a map"},
      {"? [decode]\n: {}\n", "line 1: the top level: a key must be a plain name, not a list"},
      {"common:\n  ? [model]\n  : x\n", "line 2: common: a key must be a plain name"},
  };
  for (const auto& [yaml, message] : cases) {
    Flags flags;
    const std::string error = Parse(yaml, {}, flags);
    EXPECT_THAT(error, HasSubstr(message)) << yaml;
    EXPECT_THAT(error, HasSubstr("config.yaml")) << yaml;  // the message names the file
  }
}

}  // namespace
}  // namespace baton
