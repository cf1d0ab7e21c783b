#include "baton/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "baton/common/checked_math.h"
#include "nlohmann/json.hpp"

namespace baton::model {
namespace {

// Refuse absurd headers before parsing them (the format caps headers at 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

size_t DtypeSize(Dtype dtype) {
  return dtype == Dtype::kF32 ? 4 : 2;
}

absl::Status TensorError(const std::string& path, const std::string& name,
                         const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "': ", what));
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint16_t FloatToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x40);  // keep NaN a NaN
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float Bf16ToFloat(uint16_t value) {
  const uint32_t bits = static_cast<uint32_t>(value) << 16;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Read(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open weights file '", path, "'"));
  struct stat info;
  if (::fstat(fd, &info) != 0 || info.st_size == 0) {
    ::close(fd);
    return Parse(std::string(), path);  // refused as shorter than its header length
  }
  const size_t size = static_cast<size_t>(info.st_size);
  void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapped == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("cannot map weights file '", path, "'"));
  }
  SafetensorsFile file;
  file.storage_ = std::shared_ptr<const void>(
      mapped, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
  file.bytes_ = std::string_view(static_cast<const char*>(mapped), size);
  if (absl::Status s = file.Check(path); !s.ok()) return s;
  return file;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::string contents,
                                                       const std::string& path) {
  SafetensorsFile file;
  auto owned = std::make_shared<const std::string>(std::move(contents));
  file.bytes_ = *owned;
  file.storage_ = std::move(owned);
  if (absl::Status s = file.Check(path); !s.ok()) return s;
  return file;
}

absl::Status SafetensorsFile::Check(const std::string& path) {
  SafetensorsFile& file = *this;
  const std::string_view bytes = bytes_;
  if (bytes.size() < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": file is ", bytes.size(), " bytes, shorter than the 8-byte header length"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | static_cast<uint8_t>(bytes[i]);
  if (header_len > kMaxHeaderBytes || header_len > bytes.size() - 8) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", header_len,
                                                   " exceeds the file (", bytes.size(),
                                                   " bytes): truncated or not safetensors"));
  }
  file.data_start_ = 8 + header_len;
  const size_t data_size = bytes.size() - file.data_start_;
  nlohmann::json header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + header_len,
                                                nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header is not a JSON object"));
  }
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets")) {
      return TensorError(path, name, "entry needs dtype, shape and data_offsets");
    }
    TensorInfo info;
    const auto& dtype = entry["dtype"];
    if (dtype == "F32") {
      info.dtype = Dtype::kF32;
    } else if (dtype == "BF16") {
      info.dtype = Dtype::kBF16;
    } else {
      return TensorError(
          path, name,
          absl::StrCat("dtype ", dtype.dump(), " is not supported; allowed: F32, BF16"));
    }
    const auto& shape = entry["shape"];
    if (!shape.is_array()) return TensorError(path, name, "shape is not an array");
    // The tensor's bytes, in checked arithmetic: [2^40, 2^40] of F32 is 2^82 bytes, which
    // would wrap to 0 and match an empty data range.
    std::optional<uint64_t> tensor_bytes = DtypeSize(info.dtype);
    for (const auto& dim : shape) {
      if (!dim.is_number_integer() || dim.get<int64_t>() < 0 || dim.get<int64_t>() > (1ll << 40)) {
        return TensorError(path, name, absl::StrCat("shape ", shape.dump(), " is not valid"));
      }
      info.shape.push_back(dim.get<int64_t>());
      if (tensor_bytes) tensor_bytes = CheckedMul<uint64_t>(*tensor_bytes, dim.get<uint64_t>());
    }
    const auto& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      return TensorError(path, name, "data_offsets must be two non-negative integers");
    }
    info.begin = offsets[0].get<size_t>();
    info.end = offsets[1].get<size_t>();
    if (info.begin > info.end || info.end > data_size) {
      return TensorError(path, name,
                         absl::StrCat("data [", info.begin, ", ", info.end, ") lies outside the ",
                                      data_size, " data bytes: the file is truncated or corrupt"));
    }
    if (!tensor_bytes || info.end - info.begin != *tensor_bytes) {
      return TensorError(
          path, name,
          absl::StrCat("holds ", info.end - info.begin, " bytes; shape ", shape.dump(), " in ",
                       dtype.get<std::string>(), " needs ",
                       tensor_bytes ? absl::StrCat(*tensor_bytes) : std::string("more than 2^64")));
    }
    file.tensors_.emplace(name, std::move(info));
  }
  return absl::OkStatus();
}

void SafetensorsFile::CopyAsF32(const TensorInfo& tensor, float* out) const {
  const char* data = bytes_.data() + data_start_ + tensor.begin;
  const int64_t n = tensor.numel();
  if (tensor.dtype == Dtype::kF32) {
    std::memcpy(out, data, n * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, data + 2 * i, 2);
    out[i] = Bf16ToFloat(bits);
  }
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              Dtype dtype) {
  std::vector<const TensorToWrite*> sorted;
  for (const TensorToWrite& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorToWrite* a, const TensorToWrite* b) { return a->name < b->name; });
  nlohmann::json header = {{"__metadata__", {{"format", "pt"}}}};
  size_t offset = 0;
  for (const TensorToWrite* t : sorted) {
    int64_t numel = 1;
    for (int64_t d : t->shape) numel *= d;
    const size_t size = static_cast<size_t>(numel) * DtypeSize(dtype);
    header[t->name] = {{"dtype", dtype == Dtype::kF32 ? "F32" : "BF16"},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + size}}};
    offset += size;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write '", path, "'"));
  const uint64_t header_len = header_text.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((header_len >> (8 * i)) & 0xff));
  out << header_text;
  for (const TensorToWrite* t : sorted) {
    int64_t numel = 1;
    for (int64_t d : t->shape) numel *= d;
    if (dtype == Dtype::kF32) {
      out.write(reinterpret_cast<const char*>(t->data), numel * sizeof(float));
    } else {
      std::vector<uint16_t> narrow(numel);
      for (int64_t i = 0; i < numel; ++i) narrow[i] = FloatToBf16(t->data[i]);
      out.write(reinterpret_cast<const char*>(narrow.data()), numel * 2);
    }
  }
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("writing '", path, "' failed"));
  return absl::OkStatus();
}

}  // namespace baton::model
