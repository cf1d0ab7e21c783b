// The CUDA backend of model::Backend (backend.h): kernels::cuda's ops on one Context (one
// device, one stream), device memory through cudaMalloc. Built only with the CUDA kernels
// (BATON_CUDA_ENABLED), as the shared library baton_backend_cuda, whose one entry point
// baton_engine looks up with dlsym (engine_factory.cc). It includes no CUDA header (DESIGN
// section 1).
#pragma once

#include <cstddef>

#include "baton/kernels/backend_options.h"
#include "baton/model/backend.h"

// A new CUDA backend on device `ordinal` made with `options` (the caller owns it), or null with
// the reason in `error` (NUL-terminated, at most error_bytes): no device, or the runtime's
// error. Both sides of the dlsym are built from this header in one build, so the C entry point
// may pass the options struct.
extern "C" baton::model::Backend* BatonMakeCudaBackend(int ordinal,
                                                       const baton::kernels::CudaOptions* options,
                                                       char* error, size_t error_bytes);
