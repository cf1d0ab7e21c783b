#include "baton/kernels/backend_options.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace baton::kernels {

absl::StatusOr<PrefillAttention> ParsePrefillAttention(absl::string_view name,
                                                       absl::string_view what) {
  if (name == "simple") return PrefillAttention::kSimple;
  if (name == "gemm") return PrefillAttention::kGemm;
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": '", name, "' is unknown; allowed: simple, gemm"));
}

const char* PrefillAttentionName(PrefillAttention mode) {
  return mode == PrefillAttention::kGemm ? "gemm" : "simple";
}

}  // namespace baton::kernels
