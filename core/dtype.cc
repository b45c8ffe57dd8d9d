#include "cairn/dtype.h"

#include <array>

namespace cairn {
namespace {

struct DTypeInfo {
  DType type;
  size_t size;
  std::string_view name;
  std::string_view alias;
};

constexpr std::array<DTypeInfo, 12> kInfos = {{
    {DType::kF64, 8, "float64", "f64"},
    {DType::kF32, 4, "float32", "f32"},
    {DType::kF16, 2, "float16", "f16"},
    {DType::kBF16, 2, "bfloat16", "bf16"},
    {DType::kF8E4M3, 1, "float8_e4m3fn", "fp8_e4m3"},
    {DType::kF8E5M2, 1, "float8_e5m2", "fp8_e5m2"},
    {DType::kI64, 8, "int64", "i64"},
    {DType::kI32, 4, "int32", "i32"},
    {DType::kI16, 2, "int16", "i16"},
    {DType::kI8, 1, "int8", "i8"},
    {DType::kU8, 1, "uint8", "u8"},
    {DType::kBool, 1, "bool", "b8"},
}};

const DTypeInfo* Find(DType t) {
  for (const auto& i : kInfos)
    if (i.type == t) return &i;
  return nullptr;
}

}  // namespace

size_t DTypeSize(DType t) {
  const DTypeInfo* i = Find(t);
  return i ? i->size : 0;
}

std::string_view DTypeName(DType t) {
  const DTypeInfo* i = Find(t);
  return i ? i->name : "invalid";
}

std::optional<DType> ParseDType(std::string_view name) {
  for (const auto& i : kInfos)
    if (i.name == name || i.alias == name) return i.type;
  return std::nullopt;
}

bool IsValidDType(uint8_t raw) {
  return Find(static_cast<DType>(raw)) != nullptr;
}

}  // namespace cairn
