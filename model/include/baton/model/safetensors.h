// Reading and writing safetensors files (8-byte little-endian header length, a JSON header
// of name -> {dtype, shape, data_offsets}, then the tensor bytes). baton stores F32 and BF16
// and widens BF16 to F32 on load.
//
// Read() checks the whole header before anything is used: every tensor's dtype is known, its
// byte range lies inside the file and matches its shape. A file that fails is refused with a
// message naming the tensor. Read() maps the file rather than reading it, so only the tensors
// a loader copies become resident (a prefill node of replay-on-decode never touches the
// consumer layers' bytes).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace baton::model {

enum class Dtype { kF32, kBF16 };

struct TensorInfo {
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  size_t begin = 0;  // byte offset of the data inside the data section
  size_t end = 0;
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  static absl::StatusOr<SafetensorsFile> Read(const std::string& path);
  // The same checks on a file's contents; messages name `path`.
  static absl::StatusOr<SafetensorsFile> Parse(std::string contents, const std::string& path);

  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  // The tensor widened to F32 ([numel] floats); the caller checked the shape.
  void CopyAsF32(const TensorInfo& tensor, float* out) const;
  // Every byte of the file (reading them all makes a mapped file resident).
  std::string_view bytes() const { return bytes_; }

 private:
  // Checks the header of bytes_ and fills tensors_.
  absl::Status Check(const std::string& path);
  std::shared_ptr<const void> storage_;  // the mapping or the string bytes_ views
  std::string_view bytes_;
  size_t data_start_ = 0;
  std::map<std::string, TensorInfo> tensors_;
};

struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // [numel] F32, narrowed when the file dtype is BF16
};

// Writes the tensors sorted by name, in `dtype` (BF16 rounds to nearest even).
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              Dtype dtype);

uint16_t FloatToBf16(float value);
float Bf16ToFloat(uint16_t value);

}  // namespace baton::model
