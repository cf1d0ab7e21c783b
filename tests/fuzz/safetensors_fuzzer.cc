// safetensors files: any bytes are parsed or refused with a message naming the problem; never
// a crash, an overflow or an allocation beyond the input.
#include <cstddef>
#include <cstdint>
#include <string>

#include "baton/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)baton::model::SafetensorsFile::Parse(std::string(reinterpret_cast<const char*>(data), size),
                                             "fuzz.safetensors");
  return 0;
}
