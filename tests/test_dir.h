// A scratch folder private to this test process. ctest runs every test case of a binary as
// its own process, in parallel; fixtures that write models or files must not share paths.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace baton::testing {

inline std::string ProcessTempDir() {
  static const std::string dir = [] {
    const std::filesystem::path path =
        std::filesystem::path(::testing::TempDir()) / ("baton_test_" + std::to_string(getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
    return path.string();
  }();
  return dir;
}

}  // namespace baton::testing
