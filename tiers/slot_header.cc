#include "tiers/slot_header.h"

#include <cstring>

#include "cairn/tensor.h"
#include "core/bytes.h"
#include "core/checksum.h"

namespace cairn {
namespace {

constexpr char kMagic[8] = {'C', 'A', 'I', 'R', 'N', 'S', 'L', 'T'};

using Writer = ByteWriter;
using Reader = ByteReader;

Status Bad(const std::string& what) {
  return Status::Corruption("bad slot header: " + what);
}

}  // namespace

std::pair<uint64_t, uint64_t> SlotHeader::ChunkRange(const SlotShard& s, uint32_t i) const {
  // (No sums that can wrap: i < num_chunks keeps b inside the shard.)
  const uint64_t b = s.offset + static_cast<uint64_t>(i) * chunk_bytes;
  return {b, b + std::min(chunk_bytes, s.offset + s.nbytes - b)};
}

std::string EncodeSlotHeader(const SlotHeader& h) {
  Writer w;
  w.PutBytes(kMagic, sizeof(kMagic));
  w.Put<uint32_t>(kSlotHeaderVersion);
  w.Put<uint32_t>(static_cast<uint32_t>(h.state));
  w.Put<int64_t>(h.step);
  w.Put<int64_t>(h.created_wall_ns);
  w.Put<uint32_t>(h.rank);
  w.Put<uint32_t>(h.world_size);
  w.Put<uint32_t>(h.node);
  w.Put<uint64_t>(h.data_bytes);
  w.Put<uint64_t>(h.chunk_bytes);
  w.Put<uint32_t>(static_cast<uint32_t>(h.shards.size()));
  w.Put<uint32_t>(static_cast<uint32_t>(h.blobs.size()));
  w.Put<uint32_t>(static_cast<uint32_t>(h.chunk_checksums.size()));
  for (const SlotShard& s : h.shards) {
    w.PutString(s.name);
    w.Put<uint8_t>(static_cast<uint8_t>(s.dtype));
    w.Put<uint8_t>(0);
    w.Put<uint16_t>(static_cast<uint16_t>(s.global_shape.size()));
    for (int64_t v : s.global_shape) w.Put<int64_t>(v);
    for (int64_t v : s.box.offsets) w.Put<int64_t>(v);
    for (int64_t v : s.box.lengths) w.Put<int64_t>(v);
    w.Put<uint64_t>(s.offset);
    w.Put<uint64_t>(s.nbytes);
    w.Put<uint32_t>(s.first_chunk);
    w.Put<uint32_t>(s.num_chunks);
  }
  for (const SlotBlob& b : h.blobs) {
    w.PutString(b.name);
    w.Put<uint64_t>(b.offset);
    w.Put<uint64_t>(b.nbytes);
    w.Put<uint64_t>(b.checksum);
  }
  for (uint64_t c : h.chunk_checksums) w.Put<uint64_t>(c);
  w.Put<uint64_t>(Checksum(w.out().data(), w.out().size()));
  return std::move(w.out());
}

namespace {

// Shard record i of a header whose fixed fields are in `h` (`n_chunks` checksums).
Status DecodeShard(Reader& r, uint32_t i, const SlotHeader& h, uint32_t n_chunks, SlotShard* s) {
  uint8_t dtype = 0, pad = 0;
  uint16_t ndim = 0;
  if (!r.GetString(&s->name, kMaxTensorNameBytes) || !r.Get(&dtype) || !r.Get(&pad) ||
      !r.Get(&ndim))
    return Bad("truncated shard " + std::to_string(i));
  Status ns = CheckTensorName(s->name);
  if (!ns.ok()) return Bad("shard " + std::to_string(i) + ": " + ns.message());
  if (!IsValidDType(dtype)) return Bad("tensor '" + s->name + "': unknown dtype");
  s->dtype = static_cast<DType>(dtype);
  if (ndim > kMaxTensorRank) return Bad("tensor '" + s->name + "': rank too large");
  s->global_shape.resize(ndim);
  s->box.offsets.resize(ndim);
  s->box.lengths.resize(ndim);
  bool ok = true;
  for (auto& v : s->global_shape) ok = ok && r.Get(&v);
  for (auto& v : s->box.offsets) ok = ok && r.Get(&v);
  for (auto& v : s->box.lengths) ok = ok && r.Get(&v);
  ok = ok && r.Get(&s->offset) && r.Get(&s->nbytes) && r.Get(&s->first_chunk) &&
       r.Get(&s->num_chunks);
  if (!ok) return Bad("truncated shard '" + s->name + "'");
  Status bs = CheckBoxInShape(s->box, s->global_shape);
  if (!bs.ok()) return Bad("tensor '" + s->name + "': " + bs.message());
  auto numel = CheckedNumElements(s->global_shape);
  if (!numel) return Bad("tensor '" + s->name + "': shape too large");
  const unsigned __int128 want =
      static_cast<unsigned __int128>(s->box.numel()) * DTypeSize(s->dtype);
  if (want != s->nbytes) return Bad("tensor '" + s->name + "': byte count does not match box");
  if (s->offset > h.data_bytes || s->nbytes > h.data_bytes - s->offset)
    return Bad("tensor '" + s->name + "': bytes lie outside the data file");
  const uint64_t chunks = s->nbytes == 0 ? 0 : (s->nbytes - 1) / h.chunk_bytes + 1;
  if (s->num_chunks != chunks || s->first_chunk > n_chunks ||
      s->num_chunks > n_chunks - s->first_chunk)
    return Bad("tensor '" + s->name + "': chunk table inconsistent");
  return Status::OK();
}

}  // namespace

Result<SlotHeader> DecodeSlotHeader(std::string_view bytes) {
  if (bytes.size() < sizeof(kMagic) + 8)
    return Bad("only " + std::to_string(bytes.size()) + " bytes (truncated)");
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) return Bad("wrong magic");
  uint64_t stored = 0;
  std::memcpy(&stored, bytes.data() + bytes.size() - 8, 8);
  if (Checksum(bytes.data(), bytes.size() - 8) != stored)
    return Bad("header checksum mismatch (torn or corrupted)");
  Reader r(bytes.substr(sizeof(kMagic), bytes.size() - sizeof(kMagic) - 8));
  SlotHeader h;
  uint32_t version = 0, state = 0, n_shards = 0, n_blobs = 0, n_chunks = 0;
  if (!r.Get(&version)) return Bad("truncated");
  if (version != kSlotHeaderVersion)
    return Bad("format version " + std::to_string(version) + " (this build reads " +
               std::to_string(kSlotHeaderVersion) + ")");
  if (!r.Get(&state) || !r.Get(&h.step) || !r.Get(&h.created_wall_ns) || !r.Get(&h.rank) ||
      !r.Get(&h.world_size) || !r.Get(&h.node) || !r.Get(&h.data_bytes) || !r.Get(&h.chunk_bytes) ||
      !r.Get(&n_shards) || !r.Get(&n_blobs) || !r.Get(&n_chunks))
    return Bad("truncated fixed fields");
  if (state < static_cast<uint32_t>(VersionState::kCapturing) ||
      state > static_cast<uint32_t>(VersionState::kReplicatedPersisted))
    return Bad("unknown state " + std::to_string(state));
  h.state = static_cast<VersionState>(state);
  if (h.chunk_bytes == 0 || h.chunk_bytes > kMaxChunkBytes)
    return Bad("chunk size " + std::to_string(h.chunk_bytes) + " (1 byte to 1 TiB)");
  // Every record takes at least this many bytes; counts beyond what is present are lies.
  if (n_shards > r.remaining() / 32 || n_blobs > r.remaining() / 28 || n_chunks > r.remaining() / 8)
    return Bad("counts larger than the header (" + std::to_string(n_shards) + " shards, " +
               std::to_string(n_blobs) + " blobs, " + std::to_string(n_chunks) + " chunks)");
  h.shards.reserve(n_shards);
  for (uint32_t i = 0; i < n_shards; ++i) {
    SlotShard s;
    CAIRN_RETURN_IF_ERROR(DecodeShard(r, i, h, n_chunks, &s));
    h.shards.push_back(std::move(s));
  }
  h.blobs.reserve(n_blobs);
  for (uint32_t i = 0; i < n_blobs; ++i) {
    SlotBlob b;
    if (!r.GetString(&b.name, kMaxTensorNameBytes) || !r.Get(&b.offset) || !r.Get(&b.nbytes) ||
        !r.Get(&b.checksum))
      return Bad("truncated blob " + std::to_string(i));
    Status ns = CheckTensorName(b.name);
    if (!ns.ok()) return Bad("blob " + std::to_string(i) + ": " + ns.message());
    if (b.offset > h.data_bytes || b.nbytes > h.data_bytes - b.offset)
      return Bad("blob '" + b.name + "': bytes lie outside the data file");
    h.blobs.push_back(std::move(b));
  }
  h.chunk_checksums.resize(n_chunks);
  for (auto& c : h.chunk_checksums)
    if (!r.Get(&c)) return Bad("truncated checksum table");
  if (r.remaining() != 0) return Bad(std::to_string(r.remaining()) + " trailing bytes");
  return h;
}

}  // namespace cairn
