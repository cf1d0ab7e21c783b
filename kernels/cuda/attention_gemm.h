// Private to kernels/cuda: the tensor-core prefill attention (attention_gemm.cu), which
// Attention (attention.cu) runs for entries of many rows when the context selects
// PrefillAttention::kGemm.
#pragma once

#include "baton/kernels/attention.h"
#include "context_impl.h"

namespace baton::kernels::cuda {

// Queues one entry's attention on impl's stream; false when a launch or a cuBLAS call failed
// (the error is recorded).
bool GemmAttention(Context::Impl& impl, const AttentionParams& p);

}  // namespace baton::kernels::cuda
