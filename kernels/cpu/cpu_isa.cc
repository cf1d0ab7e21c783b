#include "baton/kernels/cpu_isa.h"

#include <atomic>

#include "vector.h"

namespace baton::kernels {
namespace {

bool CpuHas(CpuIsa isa) {
#if BATON_ISA_VARIANTS
  __builtin_cpu_init();  // SupportedCpuIsas may run before the constructors that would call it
  switch (isa) {
    case CpuIsa::kBaseline:
      return true;
    case CpuIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("f16c");
    case CpuIsa::kAvx512:
      return CpuHas(CpuIsa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512cd");
  }
  return false;
#else
  // Built without per-level variants (not GCC on x86-64): only the baseline code exists.
  return isa == CpuIsa::kBaseline;
#endif
}

CpuIsa Best() {
  CpuIsa best = CpuIsa::kBaseline;
  for (CpuIsa isa : SupportedCpuIsas()) best = isa;
  return best;
}

// -1 until settled.
std::atomic<int> active{-1};

}  // namespace

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kBaseline:
      return "baseline";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "baseline";
}

std::optional<CpuIsa> ParseCpuIsa(std::string_view name) {
  for (CpuIsa isa : {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (name == CpuIsaName(isa)) return isa;
  }
  return std::nullopt;
}

std::vector<CpuIsa> SupportedCpuIsas() {
  std::vector<CpuIsa> levels;
  for (CpuIsa isa : {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (CpuHas(isa)) levels.push_back(isa);
  }
  return levels;
}

std::string CpuIsaEnvironmentError(const char* value) {
  if (value == nullptr || *value == '\0') return "";
  const std::optional<CpuIsa> isa = ParseCpuIsa(value);
  if (!isa.has_value()) {
    return std::string("BATON_CPU_ISA: '") + std::string(value).substr(0, 64) +
           "' is not a level; use baseline, avx2 or avx512";
  }
  if (!CpuHas(*isa)) {
    std::string levels;
    for (CpuIsa level : SupportedCpuIsas()) {
      levels += levels.empty() ? "" : ", ";
      levels += CpuIsaName(level);
    }
    return std::string("BATON_CPU_ISA: this CPU (or this build) cannot run '") + value +
           "'; it runs " + levels;
  }
  return "";
}

std::string UseCpuIsa(const char* value) {
  std::string error = CpuIsaEnvironmentError(value);
  if (!error.empty()) return error;
  const CpuIsa isa = value != nullptr && *value != '\0' ? *ParseCpuIsa(value) : Best();
  active.store(static_cast<int>(isa));
  return "";
}

CpuIsa ActiveCpuIsa() {
  const int level = active.load(std::memory_order_relaxed);
  if (level >= 0) return static_cast<CpuIsa>(level);
  int expected = -1;
  active.compare_exchange_strong(expected, static_cast<int>(Best()));
  return static_cast<CpuIsa>(active.load());
}

bool SetCpuIsa(CpuIsa isa) {
  if (!CpuHas(isa)) return false;
  active.store(static_cast<int>(isa));
  return true;
}

}  // namespace baton::kernels
