#include "baton/common/config_file.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace baton {
namespace {

bool Contains(const auto& names, const std::string& name) {
  return std::find_if(std::begin(names), std::end(names), [&](const char* n) {
           return name == n;
         }) != std::end(names);
}

// Reads the YAML file into CLI11 config items for one binary's section.
class YamlSectionConfig : public CLI::Config {
 public:
  YamlSectionConfig(const CLI::App* app, std::string section, std::string file)
      : app_(app), section_(std::move(section)), file_(std::move(file)) {}

  // The options given on the command line or in the file, as this binary's section.
  std::string to_config(const CLI::App* app, bool, bool, std::string) const override {
    std::string out = section_ + ":\n";
    for (const CLI::Option* option : app->get_options()) {
      const std::string name = option->get_single_name();
      if (option->get_lnames().empty() || !Known(name) || option->count() == 0) continue;
      const std::vector<std::string>& results = option->results();
      out += "  " + name + ": ";
      if (results.size() == 1) {
        out += results.front().empty() ? "\"\"" : results.front();
      } else {
        out += "[" + absl::StrJoin(results, ", ") + "]";
      }
      out += "\n";
    }
    return out;
  }

  // yaml-cpp reports every problem (syntax, a conversion it cannot make) with an exception;
  // they all become ConfigError here, which the binary turns into exit status 2 and a message,
  // instead of escaping CLI11 and aborting the process.
  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
    try {
      return Items(YAML::Load(input));
    } catch (const YAML::Exception& e) {
      throw CLI::ConfigError(absl::StrCat(
          "config ", file_, e.mark.is_null() ? "" : absl::StrCat(" line ", e.mark.line + 1),
          ": not valid YAML: ", e.msg));
    }
  }

 private:
  std::vector<CLI::ConfigItem> Items(const YAML::Node& root) const {
    if (root.IsNull()) return {};
    if (!root.IsMap()) {
      throw CLI::ConfigError(absl::StrCat("config ", file_, ": the top level must be a map of ",
                                          "sections (", absl::StrJoin(kConfigSections, ", "), ")"));
    }
    for (const auto& entry : root) {
      const std::string name = KeyName(entry.first, "the top level");
      if (!Contains(kConfigSections, name)) {
        throw CLI::ConfigError(absl::StrCat("config ", file_, ": section '", name,
                                            "' is unknown; allowed: ",
                                            absl::StrJoin(kConfigSections, ", ")));
      }
      if (!entry.second.IsNull() && !entry.second.IsMap()) {
        throw CLI::ConfigError(
            absl::StrCat("config ", file_, ": section '", name, "' must be a map of key: value"));
      }
      // Every section's keys, not only this binary's: a malformed file fails in every binary.
      if (entry.second.IsMap()) {
        for (const auto& key_value : entry.second) KeyName(key_value.first, name);
      }
    }
    std::vector<CLI::ConfigItem> items;
    std::set<std::string> own_keys;
    if (const YAML::Node own = root[section_]; own && own.IsMap()) {
      for (const auto& entry : own) {
        const std::string key = entry.first.Scalar();
        if (!Known(key)) {
          throw CLI::ConfigError(absl::StrCat("config ", file_, ": ", section_, ".", key,
                                              ": unknown key; ", app_->get_name(),
                                              " takes: ", absl::StrJoin(Keys(), ", ")));
        }
        items.push_back(Item(section_, key, entry.second));
        own_keys.insert(key);
      }
    }
    if (const YAML::Node common = root["common"]; common && common.IsMap()) {
      for (const auto& entry : common) {
        const std::string key = entry.first.Scalar();
        if (!Contains(kCommonConfigKeys, key)) {
          throw CLI::ConfigError(
              absl::StrCat("config ", file_, ": common.", key, ": not a shared key; common ",
                           "takes: ", absl::StrJoin(kCommonConfigKeys, ", "),
                           " (put the others in a binary's section)"));
        }
        // The binary's own section wins over common; keys it lacks are for other binaries.
        if (own_keys.count(key) != 0 || !Known(key)) continue;
        items.push_back(Item("common", key, entry.second));
      }
    }
    return items;
  }

  // The text of a map key; a key that is a list or a map (YAML's `? [a, b] : 1`) names no
  // flag and is refused. `where` is the section, for the message.
  std::string KeyName(const YAML::Node& key, const std::string& where) const {
    if (!key.IsScalar()) {
      throw CLI::ConfigError(absl::StrCat("config ", file_, " line ", key.Mark().line + 1, ": ",
                                          where, ": a key must be a plain name, not a ",
                                          key.IsSequence() ? "list" : "map"));
    }
    return key.Scalar();
  }

  bool Known(const std::string& key) const {
    if (key == "config" || key == "help" || key == "check-config") return false;
    const CLI::Option* option = app_->get_option_no_throw("--" + key);
    return option != nullptr && option->get_configurable();
  }

  std::vector<std::string> Keys() const {
    std::vector<std::string> keys;
    for (const CLI::Option* option : app_->get_options()) {
      const std::string name = option->get_single_name();
      if (!option->get_lnames().empty() && Known(name)) keys.push_back(name);
    }
    return keys;
  }

  CLI::ConfigItem Item(const std::string& where, const std::string& key,
                       const YAML::Node& value) const {
    CLI::ConfigItem item;
    item.name = key;
    auto scalar = [&](const YAML::Node& node) {
      if (!node.IsScalar()) {
        throw CLI::ConfigError(absl::StrCat("config ", file_, ": ", where, ".", key,
                                            ": must be a value or a list of values"));
      }
      return node.as<std::string>();
    };
    if (value.IsSequence()) {
      for (const YAML::Node& element : value) item.inputs.push_back(scalar(element));
    } else {
      item.inputs.push_back(scalar(value));
    }
    return item;
  }

  const CLI::App* app_;
  std::string section_;
  std::string file_;
};

}  // namespace

void AddConfigFile(CLI::App& app, const std::string& section, int argc, char** argv) {
  std::string file = "FILE";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--config") == 0 && i + 1 < argc) file = argv[i + 1];
    if (std::strncmp(argv[i], "--config=", 9) == 0) file = argv[i] + 9;
  }
  app.set_config("--config", "",
                 absl::StrCat("YAML file: `common` and `", section,
                              "` sections of flag: value (flags given here win)"));
  app.config_formatter(std::make_shared<YamlSectionConfig>(&app, section, file));
  app.allow_config_extras(CLI::config_extras_mode::error);
}

}  // namespace baton
