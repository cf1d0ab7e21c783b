// How a backend's kernels are configured. A program settles these once at start-up (its flag,
// else its config file, else the environment variable named here, in that order: STYLE rule 3)
// and hands them to the backend it makes (model::MakeBackend); no kernel reads the environment.
// Plain C++, so that the parts that choose a backend parse the names without the CUDA library.
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace baton::kernels {

// How the CUDA backend runs attention entries of at least kGemmAttentionMinRows rows (prefill
// chunks; kernels/cuda/context.h).
enum class PrefillAttention {
  // One block per (row, head), FP32 on CUDA cores, one online softmax: the CPU's results to
  // FP32 rounding. The default.
  kSimple,
  // Tiles of query rows per KV head through cuBLAS BF16 tensor-core GEMMs with a fused
  // mask-and-softmax kernel between them (attention_gemm.cu): BF16 rounding of Q, K, V and
  // the weights, about 1e-2 relative.
  kGemm,
};

// "simple" or "gemm"; INVALID_ARGUMENT naming `what` (the flag or variable it came from) and the
// allowed names otherwise.
absl::StatusOr<PrefillAttention> ParsePrefillAttention(absl::string_view name,
                                                       absl::string_view what);
const char* PrefillAttentionName(PrefillAttention mode);

// The variable a program reads for the prefill attention kernel when no flag or config file
// names it, so that a whole deployment (every node `baton up` starts) can be switched at once.
inline constexpr char kPrefillAttentionVariable[] = "BATON_CUDA_PREFILL_ATTENTION";

// What the CUDA backend is made with; the CPU backend has no options.
struct CudaOptions {
  PrefillAttention prefill_attention = PrefillAttention::kSimple;
};

}  // namespace baton::kernels
