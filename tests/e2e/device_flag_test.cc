// `--device`, `--weights` and `--cuda-prefill-attention` on baton-prefill, baton-decode and
// `baton up`: a device the build or machine cannot provide, or an unknown name, stops the binary
// at start with exit status 2 and a message naming the flag (or variable) and the reason. (Serving
// on a GPU is checked where there is one: tests/model/engine_backends_test and
// bench/run_gpu_checks.sh.) And `baton up --set ROLE.NAME=VALUE`, any flag of a role's binary:
// checked by that binary's own table before anything starts.
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

#include "baton/model/engine_factory.h"
#include "baton/model/model_factory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spawn.h"
#include "test_dir.h"
#include "testing/eventually.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

struct Exit {
  int status = -1;  // exit status; -1 when it did not exit by the deadline (then killed)
  std::string output;
};

// Runs `args` and waits up to a minute for it to exit.
Exit RunToExit(std::vector<std::string> args) {
  const std::string log = baton::testing::ProcessTempDir() + "/device_flag.log";
  const pid_t pid = baton::testing::Spawn(std::move(args), log);
  Exit result;
  if (pid < 0) return result;
  int wait_status = 0;
  if (!baton::testing::Eventually([&] { return waitpid(pid, &wait_status, WNOHANG) != 0; },
                                  std::chrono::seconds(60))) {
    kill(pid, SIGKILL);
    waitpid(pid, &wait_status, 0);
    return result;
  }
  if (WIFEXITED(wait_status)) result.status = WEXITSTATUS(wait_status);
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  result.output = text.str();
  return result;
}

class DeviceFlagTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(model::MakeModel(*model::PresetConfig("tiny"), 1, ModelDir()).ok());
  }
  static std::string ModelDir() { return baton::testing::ProcessTempDir() + "/device_model"; }
  // Each binary's command line up to --device.
  static std::vector<std::vector<std::string>> Commands() {
    const std::string data = baton::testing::ProcessTempDir() + "/device_up";
    return {
        {BATON_PREFILL_PATH, "--model", ModelDir(), "--port", "0", "--insecure-internal",
         "--no-ucx"},
        {BATON_DECODE_PATH, "--model", ModelDir(), "--port", "0", "--insecure-internal",
         "--no-ucx"},
        {BATON_PATH, "up", "--model", ModelDir(), "--port", "0", "--data-dir", data},
    };
  }
};

TEST_F(DeviceFlagTest, AnUnknownDeviceOrWeightTypeIsRefusedByName) {
  const std::vector<std::array<std::string, 3>> cases = {
      {"--device", "tpu", "--device: 'tpu' is unknown; allowed: cpu, cuda"},
      {"--weights", "fp16", "--weights: 'fp16' is unknown; allowed: fp32, bf16"},
      {"--cuda-prefill-attention", "flash",
       "--cuda-prefill-attention: 'flash' is unknown; allowed: simple, gemm"}};
  for (const auto& [flag, value, message] : cases) {
    for (std::vector<std::string> command : Commands()) {
      command.insert(command.end(), {flag, value});
      const Exit exit = RunToExit(command);
      EXPECT_EQ(exit.status, 2) << command[0] << " " << flag << ": " << exit.output;
      EXPECT_THAT(exit.output, HasSubstr(message)) << command[0];
    }
  }
}

// The variable is read once, at start-up, by every binary that makes a backend (and by `baton
// up` before it starts a child): a name no kernel has stops it, naming the variable.
TEST_F(DeviceFlagTest, AnUnknownPrefillAttentionInTheEnvironmentIsRefusedByName) {
  ASSERT_EQ(setenv("BATON_CUDA_PREFILL_ATTENTION", "flash", 1), 0);
  for (const std::vector<std::string>& command : Commands()) {
    const Exit exit = RunToExit(command);
    EXPECT_EQ(exit.status, 2) << command[0] << ": " << exit.output;
    EXPECT_THAT(
        exit.output,
        HasSubstr("BATON_CUDA_PREFILL_ATTENTION: 'flash' is unknown; allowed: simple, gemm"))
        << command[0];
  }
  ASSERT_EQ(unsetenv("BATON_CUDA_PREFILL_ATTENTION"), 0);
}

TEST_F(DeviceFlagTest, CudaWithoutACudaBuildOrDeviceExitsTwoNamingWhy) {
  const absl::StatusOr<std::unique_ptr<model::Backend>> cuda =
      model::MakeBackend(model::Device::kCuda);
  if (cuda.ok()) GTEST_SKIP() << "this machine has a CUDA device: the nodes serve on it";
  for (std::vector<std::string> command : Commands()) {
    command.insert(command.end(), {"--device", "cuda"});
    const Exit exit = RunToExit(command);
    EXPECT_EQ(exit.status, 2) << command[0] << ": " << exit.output;
    EXPECT_THAT(exit.output, HasSubstr("--device cuda: " + std::string(cuda.status().message())))
        << command[0];
  }
}

// --set hands a role's binary any of its flags, so that binary's table checks it (an unknown
// name, a value out of range or not among those allowed), before any process starts; a flag baton
// up sets for that role itself, or an item that is not ROLE.NAME=VALUE, is refused by baton up.
TEST_F(DeviceFlagTest, BatonUpSetIsCheckedByTheRolesOwnBinaryBeforeAnythingStarts) {
  const std::vector<std::array<std::string, 2>> cases = {
      {"router.no-such-flag=1", "--set: baton-router refuses its command line"},
      {"router.no-such-flag=1", "no-such-flag"},
      {"decode.slots=0", "--slots"},
      {"router.hit-cap=none", "'none' is unknown; allowed: ring, keep"},
      {"prefill.split=replay-on-decode",
       "--set prefill.split: baton up sets --split for the prefill itself"},
      {"router", "--set: 'router' is not ROLE.NAME=VALUE"},
      {"gateway.port=1", "names no role baton up starts ('gateway')"}};
  for (const auto& [item, message] : cases) {
    std::vector<std::string> command = Commands().back();
    command.insert(command.end(), {"--set", item});
    const Exit exit = RunToExit(command);
    EXPECT_EQ(exit.status, 2) << item << ": " << exit.output;
    EXPECT_THAT(exit.output, HasSubstr(message)) << item;
    EXPECT_THAT(exit.output, ::testing::Not(HasSubstr("router at"))) << item;
  }
}

}  // namespace
}  // namespace baton
