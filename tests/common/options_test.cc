// A binary's table of options (common/options.h): what --print-options reports is what the
// flags were declared with, an enum flag holds its enum from the command line and from the
// config file, and a value outside the declared range or names is refused by name.
#include "baton/common/options.h"

#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "baton/common/config_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "test_dir.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

enum class Color { kRed, kGreen, kBlue };
const char* ColorName(Color color) {
  switch (color) {
    case Color::kRed:
      return "red";
    case Color::kGreen:
      return "green";
    case Color::kBlue:
      return "blue";
  }
  return "?";
}

struct Flags {
  int64_t slots = 4;
  double share = 0.5;
  std::string mode = "fast";
  Color color = Color::kGreen;
  std::optional<Color> accent;  // no default: unset unless given
  bool quiet = false;
  std::vector<std::string> names;
};

// A small binary's table, declared the way the servers declare theirs.
void Declare(CLI::App& app, Flags& flags) {
  CaptureDefaults(app);
  app.add_option("--slots", flags.slots, "Slots")->check(InRange(int64_t{1}, int64_t{1024}));
  app.add_option("--share", flags.share, "Share")->check(InRange(0.0, 2.5));
  app.add_option("--mode", flags.mode, "Mode")->check(OneOf({"fast", "slow"}));
  AddEnumOption(app, "--color", flags.color, {Color::kRed, Color::kGreen, Color::kBlue}, ColorName,
                "Color");
  AddEnumOption(app, "--accent", flags.accent, {Color::kRed, Color::kBlue}, ColorName, "Accent");
  app.add_flag("--quiet", flags.quiet, "Quiet");
  app.add_option("--name", flags.names, "Names");
}

// Parses `args` (after writing `yaml` as the config file when given); the error, or "".
std::string Parse(std::vector<std::string> args, Flags& flags, const std::string& yaml = "") {
  CLI::App app{"test"};
  Declare(app, flags);
  args.insert(args.begin(), "test");
  if (!yaml.empty()) {
    const std::string path = testing::ProcessTempDir() + "/options.yaml";
    std::ofstream(path, std::ios::trunc) << yaml;
    args.insert(args.end(), {"--config", path});
  }
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

TEST(Options, TheTableHoldsWhatEachFlagWasDeclaredWith) {
  Flags flags;
  CLI::App app{"test"};
  Declare(app, flags);
  const nlohmann::json table = nlohmann::json::parse(DescribeOptions(app, "baton-test", "decode"));
  EXPECT_EQ(table["program"], "baton-test");
  EXPECT_EQ(table["section"], "decode");
  std::map<std::string, nlohmann::json> by_name;
  for (const nlohmann::json& option : table["options"]) by_name[option["name"]] = option;
  ASSERT_EQ(by_name.size(), 7u);  // --help is not an option of the table
  EXPECT_EQ(by_name["slots"]["type"], "integer");
  EXPECT_EQ(by_name["slots"]["default"], "4");
  EXPECT_EQ(by_name["slots"]["min"], 1);
  EXPECT_EQ(by_name["slots"]["max"], 1024);
  EXPECT_EQ(by_name["share"]["type"], "number");
  EXPECT_EQ(by_name["share"]["max"], 2.5);
  EXPECT_EQ(by_name["mode"]["allowed"], nlohmann::json({"fast", "slow"}));
  EXPECT_EQ(by_name["color"]["allowed"], nlohmann::json({"red", "green", "blue"}));
  EXPECT_EQ(by_name["color"]["default"], "green");
  EXPECT_EQ(by_name["accent"]["allowed"], nlohmann::json({"red", "blue"}));
  EXPECT_FALSE(by_name["accent"].contains("default"));
  EXPECT_EQ(by_name["quiet"]["type"], "boolean");
  EXPECT_EQ(by_name["name"]["list"], true);
  EXPECT_FALSE(by_name["mode"].contains("min"));
  EXPECT_EQ(by_name["slots"]["help"], "Slots");
}

TEST(Options, AnEnumFlagHoldsItsEnumFromTheCommandLineAndTheConfigFile) {
  Flags flags;
  ASSERT_EQ(Parse({"--color", "blue"}, flags), "");
  EXPECT_EQ(flags.color, Color::kBlue);
  Flags from_file;
  ASSERT_EQ(Parse({}, from_file, "decode:\n  color: red\n"), "");
  EXPECT_EQ(from_file.color, Color::kRed);
  Flags untouched;
  ASSERT_EQ(Parse({}, untouched), "");
  EXPECT_EQ(untouched.color, Color::kGreen);
  EXPECT_EQ(untouched.accent, std::nullopt) << "a flag with no default stays unset";
  Flags accented;
  ASSERT_EQ(Parse({"--accent", "blue"}, accented), "");
  EXPECT_EQ(accented.accent, Color::kBlue);
  Flags accented_in_file;
  ASSERT_EQ(Parse({}, accented_in_file, "decode:\n  accent: red\n"), "");
  EXPECT_EQ(accented_in_file.accent, Color::kRed);
  Flags refused;
  EXPECT_THAT(Parse({"--accent", "green"}, refused),
              HasSubstr("'green' is unknown; allowed: red, blue"));
  EXPECT_EQ(refused.accent, std::nullopt);
}

TEST(Options, AValueOutsideTheTableIsRefusedNamingTheFlagAndWhatIsAllowed) {
  Flags flags;
  EXPECT_THAT(Parse({"--color", "pink"}, flags),
              HasSubstr("'pink' is unknown; allowed: red, green, blue"));
  EXPECT_THAT(Parse({"--color", "pink"}, flags), HasSubstr("--color"));
  EXPECT_EQ(flags.color, Color::kGreen);
  EXPECT_THAT(Parse({"--slots", "0"}, flags), HasSubstr("--slots"));
  EXPECT_THAT(Parse({"--share", "3"}, flags), HasSubstr("--share"));
  EXPECT_THAT(Parse({}, flags, "decode:\n  mode: medium\n"), HasSubstr("allowed: fast, slow"));
}

}  // namespace
}  // namespace baton
