#include "baton/model/engine_factory.h"

#include <dlfcn.h>

#include <array>
#include <cstdlib>
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

absl::StatusOr<kernels::CudaOptions> CudaOptionsFrom(const std::string& prefill_attention,
                                                     const std::string& flag) {
  kernels::CudaOptions options;
  std::string name = prefill_attention, from = flag;
  if (name.empty()) {
    const char* variable = std::getenv(kernels::kPrefillAttentionVariable);
    if (variable == nullptr || *variable == '\0') return options;
    name = variable;
    from = kernels::kPrefillAttentionVariable;
  }
  absl::StatusOr<kernels::PrefillAttention> mode = kernels::ParsePrefillAttention(name, from);
  if (!mode.ok()) return mode.status();
  options.prefill_attention = *mode;
  return options;
}

absl::StatusOr<std::unique_ptr<Engine>> LoadEngineOnDevice(const std::string& model_dir,
                                                           const DeviceFlags& flags,
                                                           HeldLayers held) {
  absl::StatusOr<Device> device = ParseDevice(flags.device, "--device");
  if (!device.ok()) return device.status();
  absl::StatusOr<WeightType> weight_type = ParseWeightType(flags.weights, "--weights");
  if (!weight_type.ok()) return weight_type.status();
  if (*weight_type == WeightType::kBf16 && *device != Device::kCpu) {  // before any loading
    return absl::InvalidArgumentError("--weights bf16 is for --device cpu");
  }
  absl::StatusOr<kernels::CudaOptions> cuda =
      CudaOptionsFrom(flags.cuda_prefill_attention, "--cuda-prefill-attention");
  if (!cuda.ok()) return cuda.status();
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(*device, 0, *cuda);
  if (!backend.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device ", flags.device, ": ", backend.status().message()));
  }
  return LoadOnto(model_dir, *std::move(backend), *weight_type, held);
}

}  // namespace baton::model
