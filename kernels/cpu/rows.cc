#include "baton/kernels/rows.h"

#include <cstring>

namespace baton::kernels {

void GatherRows(const GatherRowsParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    if (p.index[r] < 0) continue;
    std::memcpy(p.dst + r * p.dst_stride, p.src + p.index[r] * p.src_stride,
                sizeof(float) * p.width);
  }
}

void ScatterRows(const ScatterRowsParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    if (p.index[r] < 0) continue;
    std::memcpy(p.dst + p.index[r] * p.dst_stride, p.src + r * p.src_stride,
                sizeof(float) * p.width);
  }
}

void WriteBlockKv(const WriteBlockKvParams& p) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t pos = p.positions[r];
    float* row = p.pages[pos / p.block_size] + p.offset + (pos % p.block_size) * p.width;
    std::memcpy(row, p.src + r * p.src_stride, sizeof(float) * p.width);
  }
}

}  // namespace baton::kernels
