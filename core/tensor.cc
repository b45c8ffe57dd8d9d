#include "cairn/tensor.h"

namespace cairn {

ShardSpec ShardSpec::Whole(TensorMeta meta, void* data, MemoryKind memory) {
  ShardSpec s;
  s.box = Box::Whole(meta.global_shape);
  s.meta = std::move(meta);
  s.data = data;
  s.memory = memory;
  return s;
}

Result<std::vector<ShardSpec>> ShardSpec::FromFlatRange(const TensorMeta& meta, int64_t begin,
                                                        int64_t end, void* data,
                                                        MemoryKind memory) {
  auto boxes = FlatRangeToBoxes(meta.global_shape, begin, end);
  if (!boxes.ok()) return boxes.status().WithContext("tensor '" + meta.name + "'");
  std::vector<ShardSpec> out;
  auto* p = static_cast<std::byte*>(data);
  const size_t esize = DTypeSize(meta.dtype);
  for (Box& b : *boxes) {
    ShardSpec s;
    s.meta = meta;
    s.data = p;
    s.memory = memory;
    p += static_cast<size_t>(b.numel()) * esize;
    s.box = std::move(b);
    out.push_back(std::move(s));
  }
  return out;
}

Status CheckTensorName(const std::string& name) {
  if (name.empty()) return Status::InvalidArgument("tensor name is empty");
  if (name.size() > kMaxTensorNameBytes)
    return Status::InvalidArgument("tensor name of " + std::to_string(name.size()) +
                                   " bytes is longer than the limit of " +
                                   std::to_string(kMaxTensorNameBytes));
  for (unsigned char c : name)
    if (c < 0x20 || c == 0x7f)
      return Status::InvalidArgument("tensor name '" + name +
                                     "' contains a NUL or control character");
  return Status::OK();
}

Status CheckShard(const ShardSpec& shard) {
  CAIRN_RETURN_IF_ERROR(CheckTensorName(shard.meta.name));
  // Built only for an error: save() checks every shard of every version.
  const auto who = [&] { return "tensor '" + shard.meta.name + "'"; };
  if (DTypeSize(shard.meta.dtype) == 0)
    return Status::InvalidArgument(who() + ": invalid dtype value " +
                                   std::to_string(static_cast<int>(shard.meta.dtype)));
  if (shard.meta.global_shape.size() > kMaxTensorRank)
    return Status::InvalidArgument(who() + ": rank " +
                                   std::to_string(shard.meta.global_shape.size()) +
                                   " exceeds the limit of " + std::to_string(kMaxTensorRank));
  auto numel = CheckedNumElements(shard.meta.global_shape);
  if (!numel || *numel > (int64_t{1} << 56) / static_cast<int64_t>(DTypeSize(shard.meta.dtype)))
    return Status::InvalidArgument(who() + ": global shape " +
                                   ShapeToString(shard.meta.global_shape) +
                                   " is negative or too large");
  if (Status st = CheckBoxInShape(shard.box, shard.meta.global_shape); !st.ok())
    return st.WithContext(who());
  if (shard.data == nullptr && shard.nbytes() > 0)
    return Status::InvalidArgument(who() + " box " + shard.box.ToString() +
                                   ": data pointer is null");
  return Status::OK();
}

}  // namespace cairn
