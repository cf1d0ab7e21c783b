#include "baton/model/engine_factory.h"

#include <dlfcn.h>

#include <array>
#include <filesystem>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace baton::model {

namespace {

#ifdef BATON_CUDA_BACKEND_FILE
// The CUDA backend library: beside the executable (an installed layout), else where the build
// wrote it. Loaded once, never unloaded.
absl::StatusOr<void*> LoadCudaBackendLibrary() {
  static void* handle = nullptr;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    std::error_code ignored;
    const std::filesystem::path beside =
        std::filesystem::read_symlink("/proc/self/exe", ignored).parent_path() /
        std::filesystem::path(BATON_CUDA_BACKEND_FILE).filename();
    for (const std::string& path : {beside.string(), std::string(BATON_CUDA_BACKEND_FILE)}) {
      handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle != nullptr) return;
      error = dlerror();
    }
  });
  if (handle == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load the CUDA backend library: ", error));
  }
  return handle;
}
#endif

absl::StatusOr<std::unique_ptr<Engine>> LoadOnto(const std::string& model_dir,
                                                 std::unique_ptr<Backend> backend,
                                                 WeightType weight_type, HeldLayers held) {
  absl::StatusOr<CedWeights> weights = LoadCedWeights(model_dir, held);
  if (!weights.ok()) return weights.status();
  absl::StatusOr<std::unique_ptr<CedEngine>> engine =
      CedEngine::Create(*std::move(weights), std::move(backend), weight_type);
  if (!engine.ok()) return engine.status();
  return std::unique_ptr<Engine>(*std::move(engine));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(Device device, int ordinal,
                                                     const kernels::CudaOptions& cuda) {
  if (device == Device::kCpu) return MakeCpuBackend();
#ifdef BATON_CUDA_BACKEND_FILE
  absl::StatusOr<void*> library = LoadCudaBackendLibrary();
  if (!library.ok()) return library.status();
  using Entry = Backend* (*)(int, const kernels::CudaOptions*, char*, size_t);
  auto entry = reinterpret_cast<Entry>(dlsym(*library, "BatonMakeCudaBackend"));
  if (entry == nullptr) {
    return absl::FailedPreconditionError(
        "the CUDA backend library has no BatonMakeCudaBackend entry point");
  }
  std::array<char, 512> error{};
  std::unique_ptr<Backend> backend(entry(ordinal, &cuda, error.data(), error.size()));
  if (backend == nullptr) return absl::FailedPreconditionError(error.data());
  return backend;
#else
  (void)ordinal;
  (void)cuda;
  return absl::FailedPreconditionError(
      "this build has no CUDA kernels (configure where nvcc is found, or with BATON_WITH_CUDA=ON)");
#endif
}

absl::StatusOr<std::unique_ptr<Engine>> LoadEngine(const std::string& model_dir, Device device,
                                                   WeightType weight_type, HeldLayers held) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(device);
  if (!backend.ok()) return backend.status();
  return LoadOnto(model_dir, *std::move(backend), weight_type, held);
}

absl::Status ApplyPrefillAttentionVariable(const char* value, DeviceFlags& flags) {
  if (flags.cuda_prefill_attention.has_value() || value == nullptr || *value == '\0') {
    return absl::OkStatus();
  }
  absl::StatusOr<kernels::PrefillAttention> mode =
      kernels::ParsePrefillAttention(value, kernels::kPrefillAttentionVariable);
  if (!mode.ok()) return mode.status();
  flags.cuda_prefill_attention = *mode;
  return absl::OkStatus();
}

kernels::CudaOptions CudaOptionsOf(const DeviceFlags& flags) {
  kernels::CudaOptions options;
  if (flags.cuda_prefill_attention) options.prefill_attention = *flags.cuda_prefill_attention;
  return options;
}

absl::StatusOr<std::unique_ptr<Engine>> LoadEngineOnDevice(const std::string& model_dir,
                                                           const DeviceFlags& flags,
                                                           HeldLayers held) {
  if (flags.weights == WeightType::kBf16 && flags.device != Device::kCpu) {  // before loading
    return absl::InvalidArgumentError("--weights bf16 is for --device cpu");
  }
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      MakeBackend(flags.device, 0, CudaOptionsOf(flags));
  if (!backend.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device ", DeviceName(flags.device), ": ", backend.status().message()));
  }
  return LoadOnto(model_dir, *std::move(backend), flags.weights, held);
}

}  // namespace baton::model
