// The main of every GoogleTest binary of the project (tests/CMakeLists.txt, baton_add_test):
// as each binary's main does, it reads the environment once and hands the CPU kernels what it
// says (BATON_CPU_ISA; OMP_WAIT_POLICY, which ctest sets to PASSIVE so that the test processes
// sharing the cores do not spin), then runs the tests.
#include <cstdio>
#include <cstdlib>

#include "baton/kernels/cpu_team.h"
#include "gmock/gmock.h"

int main(int argc, char** argv) {
  testing::InitGoogleMock(&argc, argv);
  if (std::string error = baton::kernels::ConfigureCpuKernels(std::getenv("BATON_CPU_ISA"),
                                                              std::getenv("OMP_WAIT_POLICY"));
      !error.empty()) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 2;
  }
  return RUN_ALL_TESTS();
}
