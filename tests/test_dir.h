// A scratch folder private to this test process. ctest runs every test case of a binary as
// its own process, in parallel; fixtures that write models or files must not share paths.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace baton::testing {

// Removed, with everything in it, when the process exits: every test case runs as a process of
// its own and an e2e case writes a model of a few hundred MB, so a suite run must leave nothing
// behind (a few runs would otherwise fill the disk).
inline std::string ProcessTempDir() {
  struct Dir {
    std::string path;
    Dir()
        : path((std::filesystem::path(::testing::TempDir()) /
                ("baton_test_" + std::to_string(getpid())))
                   .string()) {
      std::filesystem::remove_all(path);
      std::filesystem::create_directories(path);
    }
    ~Dir() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static const Dir dir;
  return dir.path;
}

}  // namespace baton::testing
