#include "layout/layout_wire.h"

#include "cairn/dtype.h"

namespace cairn {

void AddTensor(const TensorMeta& t, wire::Tensors* out) {
  out->mutable_names()->append(t.name);
  out->add_name_bytes(static_cast<uint32_t>(t.name.size()));
  out->add_dtype(static_cast<uint32_t>(t.dtype));
  out->add_ndim(static_cast<uint32_t>(t.global_shape.size()));
  out->mutable_dims()->Add(t.global_shape.begin(), t.global_shape.end());
}

Status TensorsFromWire(const wire::Tensors* w, std::vector<TensorMeta>* out, const char* what) {
  auto bad = [&](const std::string& why) {
    return Status::Corruption("bad " + std::string(what) + ": " + why);
  };
  const int n = w->name_bytes_size();
  if (w->dtype_size() != n || w->ndim_size() != n)
    return bad(std::to_string(n) + " tensor names for " + std::to_string(w->dtype_size()) +
               " dtypes and " + std::to_string(w->ndim_size()) + " ranks");
  out->resize(static_cast<size_t>(n));
  const std::string_view names = w->names();
  size_t name_at = 0, at = 0;
  const size_t ndims = static_cast<size_t>(w->dims_size());
  for (int k = 0; k < n; ++k) {
    TensorMeta& t = (*out)[static_cast<size_t>(k)];
    const size_t len = w->name_bytes(k);
    if (names.size() - name_at < len) return bad("tensor names cut short");
    t.name.assign(names.substr(name_at, len));
    name_at += len;
    CAIRN_RETURN_IF_ERROR(CheckTensorName(t.name));
    const uint32_t dt = w->dtype(k), nd = w->ndim(k);
    if (dt > 255 || !IsValidDType(static_cast<uint8_t>(dt)))
      return bad("tensor '" + t.name + "' has an unknown dtype " + std::to_string(dt));
    if (nd > kMaxTensorRank || ndims - at < nd)
      return bad("tensor '" + t.name + "' has " + std::to_string(nd) + " dimensions");
    t.dtype = static_cast<DType>(dt);
    t.global_shape.assign(w->dims().begin() + static_cast<int>(at),
                          w->dims().begin() + static_cast<int>(at + nd));
    at += nd;
    if (!CheckedNumElements(t.global_shape)) return bad("tensor '" + t.name + "' has a bad shape");
  }
  if (at != ndims || name_at != names.size()) return bad("dimensions or names left over");
  return Status::OK();
}

void AddBox(const Box& b, google::protobuf::RepeatedField<int64_t>* out) {
  out->Add(b.offsets.begin(), b.offsets.end());
  out->Add(b.lengths.begin(), b.lengths.end());
}

Status BoxFromWire(const google::protobuf::RepeatedField<int64_t>& flat, size_t* at,
                   const TensorMeta& t, Box* box) {
  const size_t nd = t.global_shape.size();
  if (static_cast<size_t>(flat.size()) - *at < 2 * nd)
    return Status::Corruption("tensor '" + t.name + "': a box cut short");
  const auto first = flat.begin() + static_cast<int>(*at);
  box->offsets.assign(first, first + static_cast<int>(nd));
  box->lengths.assign(first + static_cast<int>(nd), first + static_cast<int>(2 * nd));
  *at += 2 * nd;
  Status st = CheckBoxInShape(*box, t.global_shape);
  if (!st.ok()) return Status::Corruption("tensor '" + t.name + "': " + st.message());
  return Status::OK();
}

}  // namespace cairn
