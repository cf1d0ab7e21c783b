// The CUDA backend of model::Backend (backend.h): kernels::cuda's ops on one Context (one
// device, one stream), device memory through cudaMalloc. Built only with the CUDA kernels
// (BATON_CUDA_ENABLED), as the shared library baton_backend_cuda, whose one entry point
// baton_engine looks up with dlsym (engine_factory.cc). It includes no CUDA header (DESIGN
// section 1).
#pragma once

#include <cstddef>

#include "baton/model/backend.h"

// A new CUDA backend on device `ordinal` (the caller owns it), or null with the reason in
// `error` (NUL-terminated, at most error_bytes): no device, or the runtime's error.
extern "C" baton::model::Backend* BatonMakeCudaBackend(int ordinal, char* error,
                                                       size_t error_bytes);
