#include "recovery/restore_wire.h"

#include "core/bytes.h"
#include "layout/layout_template.h"

namespace cairn::restore_internal {

std::string EncodeInventory(const Inventory& inv) {
  ByteWriter w;
  w.Put<uint64_t>(inv.layout_hash);
  w.Put<uint32_t>(static_cast<uint32_t>(inv.held.size()));
  for (const HeldVersion& v : inv.held) {
    w.Put<int32_t>(v.source);
    w.Put<int64_t>(v.step);
    w.Put<uint32_t>(v.world_size);
  }
  w.Put<uint32_t>(static_cast<uint32_t>(inv.pfs_steps.size()));
  for (int64_t s : inv.pfs_steps) w.Put<int64_t>(s);
  return std::move(w.out());
}

Result<Inventory> DecodeInventory(std::string_view b) {
  ByteReader r(b);
  Inventory inv;
  uint32_t n = 0;
  if (!r.Get(&inv.layout_hash) || !r.Get(&n) || n > r.remaining() / 16)
    return Status::Corruption("bad inventory");
  inv.held.resize(n);
  for (HeldVersion& v : inv.held)
    if (!r.Get(&v.source) || !r.Get(&v.step) || !r.Get(&v.world_size))
      return Status::Corruption("bad inventory");
  if (!r.Get(&n) || n > r.remaining() / 8) return Status::Corruption("bad inventory");
  inv.pfs_steps.resize(n);
  for (int64_t& s : inv.pfs_steps)
    if (!r.Get(&s)) return Status::Corruption("bad inventory");
  return inv;
}

namespace {
void PutRef(ByteWriter& w, const TemplateRef& r) {
  w.Put<uint8_t>(r.templated ? 1 : 0);
  w.Put<uint64_t>(r.hash);
  w.Put<uint32_t>(r.index);
}
bool GetRef(ByteReader& rd, TemplateRef* r) {
  uint8_t t = 0;
  if (!rd.Get(&t) || t > 1 || !rd.Get(&r->hash) || !rd.Get(&r->index)) return false;
  r->templated = t == 1;
  return true;
}
}  // namespace

std::string EncodeLayoutRefs(const LayoutRefs& refs) {
  ByteWriter w;
  PutRef(w, refs.target);
  w.Put<uint32_t>(static_cast<uint32_t>(refs.saved.size()));
  for (const SavedRef& s : refs.saved) {
    w.Put<int32_t>(s.source);
    PutRef(w, s.layout);
    w.Put<uint64_t>(s.chunk_bytes);
    w.Put<uint64_t>(s.blob_bytes);
  }
  return std::move(w.out());
}

Result<LayoutRefs> DecodeLayoutRefs(std::string_view b) {
  ByteReader r(b);
  LayoutRefs refs;
  uint32_t n = 0;
  if (!GetRef(r, &refs.target) || !r.Get(&n) || n > r.remaining() / 33)
    return Status::Corruption("bad layout references");
  refs.saved.resize(n);
  for (SavedRef& s : refs.saved)
    if (!r.Get(&s.source) || s.source < 0 || !GetRef(r, &s.layout) || !r.Get(&s.chunk_bytes) ||
        !r.Get(&s.blob_bytes))
      return Status::Corruption("bad layout references");
  if (r.remaining() != 0) return Status::Corruption("bad layout references: trailing bytes");
  return refs;
}

std::string EncodeTemplateList(const std::vector<std::string>& encoded) {
  ByteWriter w;
  w.Put<uint32_t>(static_cast<uint32_t>(encoded.size()));
  for (const std::string& e : encoded) w.PutString(e);
  return std::move(w.out());
}

Result<std::vector<std::string>> DecodeTemplateList(std::string_view b) {
  ByteReader r(b);
  uint32_t n = 0;
  if (!r.Get(&n) || n > r.remaining() / 4) return Status::Corruption("bad template list");
  std::vector<std::string> out(n);
  for (std::string& e : out)
    if (!r.GetString(&e, b.size())) return Status::Corruption("bad template list");
  if (r.remaining() != 0) return Status::Corruption("bad template list: trailing bytes");
  return out;
}

// One rank's (status, payload) message: the payload when the status is OK, that status
// otherwise, Corruption naming `rank` when the bytes are not such a message.
Result<std::string_view> DecodeChecked(std::string_view bytes, int rank) {
  ByteReader rd(bytes);
  Status st;
  if (!rd.GetStatus(&st, kMaxText))
    return Status::Corruption("garbled message from rank " + std::to_string(rank));
  if (!st.ok()) return st;
  return bytes.substr(bytes.size() - rd.remaining());
}

// Allgather of (status, payload): the payloads when every rank is OK, the first failing
// rank's status otherwise (the same on every rank).
Result<std::vector<std::string>> GatherChecked(Group* g, const Status& mine,
                                               std::string_view payload) {
  ByteWriter w;
  w.PutStatus(mine);
  w.PutBytes(payload.data(), payload.size());
  CAIRN_ASSIGN_OR_RETURN(auto all, g->AllGather(w.out()));
  std::vector<std::string> out(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    CAIRN_ASSIGN_OR_RETURN(std::string_view payload, DecodeChecked(all[r], static_cast<int>(r)));
    out[r] = payload;
  }
  return out;
}

// ---- shard tables of memory versions ------------------------------------------------------

void PutBox(ByteWriter& w, const Box& b) {
  w.Put<uint32_t>(static_cast<uint32_t>(b.ndim()));
  for (size_t d = 0; d < b.ndim(); ++d) {
    w.Put<int64_t>(b.offsets[d]);
    w.Put<int64_t>(b.lengths[d]);
  }
}

bool GetBox(ByteReader& r, Box* b) {
  uint32_t nd = 0;
  if (!r.Get(&nd) || nd > 64) return false;
  b->offsets.resize(nd);
  b->lengths.resize(nd);
  for (uint32_t d = 0; d < nd; ++d)
    if (!r.Get(&b->offsets[d]) || !r.Get(&b->lengths[d])) return false;
  return true;
}

std::string EncodeBlobs(const SlotHeader& h, const std::byte* data) {
  ByteWriter w;
  w.Put<uint32_t>(static_cast<uint32_t>(h.blobs.size()));
  for (const SlotBlob& b : h.blobs) {
    w.PutString(b.name);
    w.PutString(std::string_view(reinterpret_cast<const char*>(data + b.offset), b.nbytes));
  }
  return std::move(w.out());
}

// The tables of the versions of the chosen step this rank holds.
std::string EncodeTables(const std::vector<std::unique_ptr<PinnedVersion>>& pinned) {
  ByteWriter w;
  w.Put<uint32_t>(static_cast<uint32_t>(pinned.size()));
  for (const auto& p : pinned) {
    const SlotHeader& h = p->header();
    w.Put<int32_t>(static_cast<int32_t>(h.rank));
    w.Put<uint64_t>(h.chunk_bytes);
    w.Put<uint64_t>(EncodeBlobs(h, p->data()).size());
    w.Put<uint32_t>(static_cast<uint32_t>(h.shards.size()));
    for (const SlotShard& s : h.shards) {
      w.PutString(s.name);
      w.Put<uint8_t>(static_cast<uint8_t>(s.dtype));
      w.Put<uint32_t>(static_cast<uint32_t>(s.global_shape.size()));
      for (int64_t x : s.global_shape) w.Put<int64_t>(x);
      PutBox(w, s.box);
      w.Put<uint64_t>(s.nbytes);
    }
  }
  return std::move(w.out());
}

// Adds rank `holder`'s shard tables to the catalog. The bytes come from a peer: every field
// is checked (source below `saved_world`, names, dtypes, boxes inside their shapes, byte
// counts) before it is used, so a garbled table is an error, never a crash or a huge
// allocation.
Status AddTables(int holder, std::string_view bytes, uint32_t saved_world, MemoryCatalog* mc,
                 std::unordered_map<std::string, uint32_t>* tensor_ids,
                 std::map<std::pair<uint32_t, std::vector<int64_t>>, uint32_t>* piece_ids) {
  const auto bad = [&] {
    return Status::Corruption("garbled shard table from rank " + std::to_string(holder));
  };
  ByteReader r(bytes);
  uint32_t n = 0;
  if (!r.Get(&n)) return bad();
  LoadCatalog& cat = mc->cat;
  for (uint32_t t = 0; t < n; ++t) {
    int32_t source = 0;
    uint64_t chunk = 0, blob_bytes = 0;
    uint32_t nshards = 0;
    if (!r.Get(&source) || !r.Get(&chunk) || !r.Get(&blob_bytes) || !r.Get(&nshards) ||
        source < 0 || static_cast<uint32_t>(source) >= saved_world || source >= (1 << 24) ||
        chunk == 0 || chunk > kMaxChunkBytes)
      return bad();
    if (cat.chunk_bytes == 0) cat.chunk_bytes = chunk;
    if (chunk != cat.chunk_bytes)
      return Status::InvalidArgument("ranks saved step " + std::to_string(cat.step) +
                                     " with different chunk sizes (" + std::to_string(chunk) +
                                     " and " + std::to_string(cat.chunk_bytes) + ")");
    if (mc->blob_providers.size() <= static_cast<size_t>(source))
      mc->blob_providers.resize(static_cast<size_t>(source) + 1);
    mc->blob_providers[static_cast<size_t>(source)].push_back({holder, blob_bytes});
    for (uint32_t i = 0; i < nshards; ++i) {
      TensorMeta meta;
      uint8_t dt = 0;
      uint32_t nd = 0;
      if (!r.GetString(&meta.name, kMaxText) || !r.Get(&dt) || !r.Get(&nd) || nd > 64) return bad();
      meta.dtype = static_cast<DType>(dt);
      if (DTypeSize(meta.dtype) == 0 || !CheckTensorName(meta.name).ok()) return bad();
      meta.global_shape.resize(nd);
      for (int64_t& x : meta.global_shape)
        if (!r.Get(&x)) return bad();
      Box box;
      uint64_t nbytes = 0;
      if (!GetBox(r, &box) || !r.Get(&nbytes)) return bad();
      if (!CheckedNumElements(meta.global_shape) || !CheckBoxInShape(box, meta.global_shape).ok() ||
          nbytes != static_cast<uint64_t>(box.numel()) * DTypeSize(meta.dtype))
        return bad();
      auto [it, fresh] = tensor_ids->emplace(meta.name, static_cast<uint32_t>(cat.tensors.size()));
      if (fresh) {
        cat.tensors.push_back(meta);
      } else if (!(cat.tensors[it->second] == meta)) {
        return Status::InvalidArgument(
            "step " + std::to_string(cat.step) + ": tensor '" + meta.name +
            "' was saved with different dtypes or shapes by different ranks (" +
            ShapeToString(meta.global_shape) + " vs " +
            ShapeToString(cat.tensors[it->second].global_shape) + ")");
      }
      std::vector<int64_t> key = box.offsets;
      key.insert(key.end(), box.lengths.begin(), box.lengths.end());
      auto [pit, pfresh] = piece_ids->emplace(std::make_pair(it->second, std::move(key)),
                                              static_cast<uint32_t>(cat.pieces.size()));
      if (pfresh) {
        LoadPiece p;
        p.tensor = it->second;
        p.box = std::move(box);
        p.nbytes = nbytes;
        cat.pieces.push_back(std::move(p));
      }
      auto& holders = cat.pieces[pit->second].holders;
      if (holders.empty() || holders.back() != holder) holders.push_back(holder);
    }
  }
  return Status::OK();
}

}  // namespace cairn::restore_internal

namespace cairn {

Status DecodeRestoreMessageForFuzzing(int kind, std::string_view bytes, uint32_t saved_world) {
  if (kind == 0) return restore_internal::DecodeInventory(bytes).status();
  if (kind == 2) {
    // A rank's status-framed message (every restore allgather), then an inventory in it.
    auto payload = restore_internal::DecodeChecked(bytes, 1);
    return payload.ok() ? restore_internal::DecodeInventory(*payload).status() : payload.status();
  }
  if (kind == 3) return restore_internal::DecodeLayoutRefs(bytes).status();
  if (kind == 4) {
    // A list of templates, each decoded as the restore decodes them.
    auto list = restore_internal::DecodeTemplateList(bytes);
    if (!list.ok()) return list.status();
    for (const std::string& t : *list) CAIRN_RETURN_IF_ERROR(DecodeTemplate(t).status());
    return Status::OK();
  }
  restore_internal::MemoryCatalog mc;
  std::unordered_map<std::string, uint32_t> tensor_ids;
  std::map<std::pair<uint32_t, std::vector<int64_t>>, uint32_t> piece_ids;
  return restore_internal::AddTables(1, bytes, saved_world, &mc, &tensor_ids, &piece_ids);
}

}  // namespace cairn
