// DType: the element types a checkpointed tensor can have, with their sizes and names.
// The numeric values are part of the on-disk formats: never renumber, only append.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace cairn {

enum class DType : uint8_t {
  kF64 = 1,
  kF32 = 2,
  kF16 = 3,
  kBF16 = 4,
  kF8E4M3 = 5,
  kF8E5M2 = 6,
  kI64 = 7,
  kI32 = 8,
  kI16 = 9,
  kI8 = 10,
  kU8 = 11,
  kBool = 12,
};

// Size of one element in bytes; 0 for a value that is not a valid DType.
size_t DTypeSize(DType t);
// Short name as PyTorch spells it without the "torch." prefix ("float32", "bfloat16",
// "float8_e4m3fn", ...); "invalid" for a value that is not a valid DType.
std::string_view DTypeName(DType t);
// Parses a DTypeName (also accepts "f32", "bf16", "fp8_e4m3", ...).
std::optional<DType> ParseDType(std::string_view name);
// True when `raw` is the value of a DType enumerator (for bytes read from a file).
bool IsValidDType(uint8_t raw);

}  // namespace cairn
