// Tensors and boxes as the messages of wire/messages.proto carry them (layouts, templates,
// a restore's shard tables), flat: TensorsFromWire and BoxFromWire check what a peer sent
// before it is used (Corruption saying what is wrong).
// Thread-safety: plain functions.
#pragma once

#include <vector>

#include "cairn/box.h"
#include "cairn/status.h"
#include "cairn/tensor.h"
#include "wire/codec.h"

namespace cairn {

void AddTensor(const TensorMeta& t, wire::Tensors* out);
// The tensors of *w. Corruption "bad <what>: ..." for a bad name, an
// unknown dtype, too many dimensions, a shape whose element count overflows, or lists of
// different lengths.
Status TensorsFromWire(const wire::Tensors* w, std::vector<TensorMeta>* out, const char* what);

// A box of tensor `t` as flat offsets then lengths.
void AddBox(const Box& b, google::protobuf::RepeatedField<int64_t>* out);
// The box of tensor `t` at *at of `flat` (its offsets, then its lengths), *at moved past it:
// Corruption naming the tensor unless the values are there and the box lies inside t's
// shape.
Status BoxFromWire(const google::protobuf::RepeatedField<int64_t>& flat, size_t* at,
                   const TensorMeta& t, Box* box);

}  // namespace cairn
