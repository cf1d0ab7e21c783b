// The x86 instruction-set level the CPU kernels run at. Each hot loop is compiled once per
// level, with tile shapes chosen for that level's register file (AVX2 + FMA has 16 vector
// registers of 8 floats, AVX-512 32 of 16), and the level is chosen once per process: the
// best the CPU supports, or the one the process's main hands UseCpuIsa (BATON_CPU_ISA's value:
// baseline, avx2, avx512) so that a test or a benchmark can run every level the machine has.
// The kernels read no environment. SetCpuIsa switches it later (tests and benchmarks only; a
// kernel running meanwhile finishes at the level it started with).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace baton::kernels {

enum class CpuIsa {
  kBaseline = 0,  // x86-64 (SSE2), or any CPU that is not x86
  kAvx2 = 1,      // x86-64-v3: AVX2, FMA, F16C, BMI2
  kAvx512 = 2,    // x86-64-v4: AVX-512 F, BW, DQ, VL, CD
};

// "baseline", "avx2", "avx512": the names BATON_CPU_ISA and machine.isa use.
const char* CpuIsaName(CpuIsa isa);
std::optional<CpuIsa> ParseCpuIsa(std::string_view name);

// The levels this CPU (and this build) can run, lowest first; always holds kBaseline.
std::vector<CpuIsa> SupportedCpuIsas();

// The level the kernels run at now: the one set (UseCpuIsa, SetCpuIsa), else the best supported
// level, settled by the first call.
CpuIsa ActiveCpuIsa();

// The error a BATON_CPU_ISA value gives, or "" when it is usable (unset counts as usable).
std::string CpuIsaEnvironmentError(const char* value);
// Runs the kernels at the level `value` names (BATON_CPU_ISA's syntax; null or empty: the best
// this CPU has) from now on. The error (CpuIsaEnvironmentError; nothing changes), or "".
std::string UseCpuIsa(const char* value);

// Makes `isa` the level from now on; false (nothing changed) when this CPU lacks it.
bool SetCpuIsa(CpuIsa isa);

}  // namespace baton::kernels
