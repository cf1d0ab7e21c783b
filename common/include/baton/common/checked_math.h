// Overflow-checked integer arithmetic for sizes that come from outside the process (config
// files, file headers, wire messages). A size computed from untrusted factors must go through
// these so that a product that wraps is refused instead of becoming a small, plausible number
// (vocab_size 2^40 times hidden_size 2^24 is 0 in int64).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>

namespace baton {

// a * b, or nullopt when it does not fit T.
template <typename T>
std::optional<T> CheckedMul(T a, T b) {
  T out;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// a + b, or nullopt when it does not fit T.
template <typename T>
std::optional<T> CheckedAdd(T a, T b) {
  T out;
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// The product of every factor, or nullopt when any partial product does not fit T.
template <typename T>
std::optional<T> CheckedProduct(std::initializer_list<T> factors) {
  T out = 1;
  for (T f : factors) {
    std::optional<T> next = CheckedMul(out, f);
    if (!next) return std::nullopt;
    out = *next;
  }
  return out;
}

}  // namespace baton
