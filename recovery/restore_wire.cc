#include "recovery/restore_wire.h"

#include "layout/layout_template.h"
#include "layout/layout_wire.h"

namespace cairn::restore_internal {

std::string EncodeInventory(const Inventory& inv) {
  wire::Inventory w;
  w.set_layout_hash(inv.layout_hash);
  for (const HeldVersion& v : inv.held) {
    w.add_held_source(v.source);
    w.add_held_step(v.step);
    w.add_held_world(v.world_size);
  }
  bool any_blobs_only = false;
  for (const HeldVersion& v : inv.held) any_blobs_only = any_blobs_only || v.blobs_only;
  if (any_blobs_only)
    for (const HeldVersion& v : inv.held) w.add_held_blobs_only(v.blobs_only);
  w.mutable_pfs_steps()->Add(inv.pfs_steps.begin(), inv.pfs_steps.end());
  return wire::Encode(w);
}

Result<Inventory> DecodeInventory(std::string_view b) {
  wire::Inventory w;
  CAIRN_RETURN_IF_ERROR(wire::Decode(b, &w, "inventory"));
  const int n = w.held_source_size();
  if (w.held_step_size() != n || w.held_world_size() != n ||
      (w.held_blobs_only_size() != 0 && w.held_blobs_only_size() != n))
    return Status::Corruption("bad inventory: " + std::to_string(n) + " sources for " +
                              std::to_string(w.held_step_size()) + " steps");
  Inventory inv;
  inv.layout_hash = w.layout_hash();
  inv.held.resize(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k)
    inv.held[static_cast<size_t>(k)] = {w.held_source(k), w.held_step(k), w.held_world(k),
                                        w.held_blobs_only_size() != 0 && w.held_blobs_only(k)};
  inv.pfs_steps.assign(w.pfs_steps().begin(), w.pfs_steps().end());
  return inv;
}

namespace {
// A reference to a template travels as a wire::TemplateRef; one to no template is absent.
void PutRef(const TemplateRef& r, wire::TemplateRef* w) {
  w->set_template_hash(r.hash);
  w->set_index(r.index);
}
TemplateRef GetRef(bool present, const wire::TemplateRef& w) {
  return present ? TemplateRef{true, w.template_hash(), w.index()} : TemplateRef{};
}
}  // namespace

std::string EncodeLayoutRefs(const LayoutRefs& refs) {
  wire::LayoutRefs w;
  if (refs.target.templated) PutRef(refs.target, w.mutable_target());
  for (const SavedRef& s : refs.saved) {
    auto* ws = w.add_saved();
    ws->set_source(s.source);
    if (s.layout.templated) PutRef(s.layout, ws->mutable_layout());
    ws->set_chunk_bytes(s.chunk_bytes);
    ws->set_blob_bytes(s.blob_bytes);
  }
  return wire::Encode(w);
}

Result<LayoutRefs> DecodeLayoutRefs(std::string_view b) {
  CAIRN_ASSIGN_OR_RETURN(auto w, wire::Decode<wire::LayoutRefs>(b, "layout references"));
  LayoutRefs refs;
  refs.target = GetRef(w.has_target(), w.target());
  refs.saved.reserve(static_cast<size_t>(w.saved_size()));
  for (const auto& s : w.saved()) {
    if (s.source() < 0)
      return Status::Corruption("bad layout references: source rank " + std::to_string(s.source()));
    refs.saved.push_back(
        {s.source(), GetRef(s.has_layout(), s.layout()), s.chunk_bytes(), s.blob_bytes()});
  }
  return refs;
}

std::string EncodeTargeted(const std::vector<uint32_t>& ascending, uint32_t count) {
  wire::TargetedTensors w;
  uint32_t end = 0;  // of the run before
  for (size_t k = 0; k < ascending.size();) {
    size_t j = k + 1;
    while (j < ascending.size() && ascending[j] == ascending[j - 1] + 1) ++j;
    w.add_gaps(ascending[k] - end);
    w.add_lengths(static_cast<uint32_t>(j - k));
    end = ascending[j - 1] + 1;
    k = j;
  }
  // A run costs two varints of at least a byte each.
  if (static_cast<uint64_t>(w.gaps_size()) * 2 > (static_cast<uint64_t>(count) + 7) / 8) {
    std::string bits((count + 7) / 8, '\0');
    for (uint32_t i : ascending) bits[i / 8] = static_cast<char>(bits[i / 8] | (1 << (i % 8)));
    w.Clear();
    w.set_bitmap(std::move(bits));
  }
  return wire::Encode(w);
}

Result<std::vector<std::pair<uint32_t, uint32_t>>> DecodeTargeted(std::string_view bytes,
                                                                  uint32_t count, int rank) {
  const std::string who = "targeted tensors of rank " + std::to_string(rank);
  CAIRN_ASSIGN_OR_RETURN(auto w, wire::Decode<wire::TargetedTensors>(bytes, who));
  std::vector<std::pair<uint32_t, uint32_t>> runs;
  if (!w.bitmap().empty()) {
    if (w.gaps_size() > 0 || w.lengths_size() > 0 || w.bitmap().size() != (count + 7) / 8)
      return Status::Corruption("bad " + who + ": a bitmap of " +
                                std::to_string(w.bitmap().size()) + " bytes for " +
                                std::to_string(count) + " tensors");
    if (count % 8 != 0 && static_cast<uint8_t>(w.bitmap().back()) >> (count % 8) != 0)
      return Status::Corruption("bad " + who + ": a bit past the " + std::to_string(count) +
                                " tensors");
    for (uint32_t i = 0; i < count; ++i) {
      if (!((static_cast<uint8_t>(w.bitmap()[i / 8]) >> (i % 8)) & 1)) continue;
      if (!runs.empty() && runs.back().second == i)
        ++runs.back().second;
      else
        runs.push_back({i, i + 1});
    }
    return runs;
  }
  if (w.gaps_size() != w.lengths_size())
    return Status::Corruption("bad " + who + ": gaps and lengths of different counts");
  uint64_t end = 0;
  for (int k = 0; k < w.gaps_size(); ++k) {
    const uint64_t b = end + w.gaps(k), e = b + w.lengths(k);
    if (w.lengths(k) == 0 || e > count)
      return Status::Corruption("bad " + who + ": a run of indices [" + std::to_string(b) + ", " +
                                std::to_string(e) + ") of " + std::to_string(count) + " tensors");
    runs.push_back({static_cast<uint32_t>(b), static_cast<uint32_t>(e)});
    end = e;
  }
  return runs;
}

std::string EncodeTemplateList(const std::vector<std::string>& encoded) {
  wire::TemplateList w;
  for (const std::string& e : encoded) w.add_templates(e);
  return wire::Encode(w);
}

Result<std::vector<std::string>> DecodeTemplateList(std::string_view b) {
  CAIRN_ASSIGN_OR_RETURN(auto w, wire::Decode<wire::TemplateList>(b, "template list"));
  return std::vector<std::string>(std::make_move_iterator(w.mutable_templates()->begin()),
                                  std::make_move_iterator(w.mutable_templates()->end()));
}

Result<std::string> DecodeChecked(std::string_view bytes, int rank) {
  auto w = wire::Decode<wire::Checked>(bytes, "message from rank " + std::to_string(rank));
  if (!w.ok()) return w.status();
  if (w->has_status()) {
    Status st = wire::FromWire(w->status());
    if (!st.ok()) return st;
  }
  return std::move(*w->mutable_payload());
}

Result<std::vector<std::string>> GatherChecked(Group* g, const Status& mine,
                                               std::string_view payload) {
  wire::Checked w;
  wire::ToWire(mine, w.mutable_status());
  if (mine.ok()) w.set_payload(std::string(payload));
  CAIRN_ASSIGN_OR_RETURN(auto all, g->AllGather(wire::Encode(w)));
  std::vector<std::string> out(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    CAIRN_ASSIGN_OR_RETURN(out[r], DecodeChecked(all[r], static_cast<int>(r)));
  }
  return out;
}

// ---- blobs and shard tables of memory versions --------------------------------------------

std::string EncodeBlobs(const SlotHeader& h, const std::byte* data) {
  wire::Blobs w;
  for (const SlotBlob& b : h.blobs) {
    auto* wb = w.add_blobs();
    wb->set_name(b.name);
    wb->set_data(reinterpret_cast<const char*>(data + b.offset), b.nbytes);
  }
  return wire::Encode(w);
}

std::string EncodeBlobs(const Blobs& blobs) {
  wire::Blobs w;
  for (const auto& [name, data] : blobs) {
    auto* wb = w.add_blobs();
    wb->set_name(name);
    wb->set_data(data);
  }
  return wire::Encode(w);
}

Status DecodeBlobs(std::string_view bytes, Blobs* out) {
  CAIRN_ASSIGN_OR_RETURN(auto w, wire::Decode<wire::Blobs>(bytes, "blobs"));
  for (auto& b : *w.mutable_blobs()) out->emplace(b.name(), std::move(*b.mutable_data()));
  return Status::OK();
}

std::string EncodeCatalogPart(std::string_view layout,
                              const std::vector<std::unique_ptr<PinnedVersion>>* pinned) {
  wire::CatalogPart w;
  w.set_layout(std::string(layout));
  for (size_t k = 0; pinned && k < pinned->size(); ++k) {
    const PinnedVersion& p = *(*pinned)[k];
    const SlotHeader& h = p.header();
    auto* t = w.mutable_tables()->add_tables();
    t->set_source(static_cast<int32_t>(h.rank));
    t->set_chunk_bytes(h.chunk_bytes);
    t->set_blob_bytes(EncodeBlobs(h, p.data()).size());
    for (const SlotShard& s : h.shards) {
      AddTensor(TensorMeta{s.name, s.dtype, s.global_shape}, t->mutable_tensors());
      AddBox(s.box, t->mutable_boxes());
      t->add_nbytes(s.nbytes);
    }
  }
  return wire::Encode(w);
}

Result<wire::CatalogPart> DecodeCatalogPart(std::string_view bytes, int rank) {
  return wire::Decode<wire::CatalogPart>(bytes, "catalog part from rank " + std::to_string(rank));
}

// Adds rank `holder`'s shard tables to the catalog. The bytes come from a peer: every field
// is checked (source below `saved_world`, names, dtypes, boxes inside their shapes, byte
// counts) before it is used, so a garbled table is an error, never a crash or a huge
// allocation.
Status AddTables(int holder, wire::ShardTables& tables, uint32_t saved_world, MemoryCatalog* mc,
                 std::unordered_map<std::string, uint32_t>* tensor_ids,
                 std::map<std::pair<uint32_t, std::vector<int64_t>>, uint32_t>* piece_ids) {
  const auto bad = [&](const std::string& why) {
    return Status::Corruption("garbled shard table from rank " + std::to_string(holder) + ": " +
                              why);
  };
  LoadCatalog& cat = mc->cat;
  for (auto& t : *tables.mutable_tables()) {
    const int32_t source = t.source();
    const uint64_t chunk = t.chunk_bytes();
    if (source < 0 || static_cast<uint32_t>(source) >= saved_world || source >= (1 << 24))
      return bad("source rank " + std::to_string(source) + " of a job of " +
                 std::to_string(saved_world));
    if (chunk == 0 || chunk > kMaxChunkBytes) return bad("chunk size " + std::to_string(chunk));
    if (cat.chunk_bytes == 0) cat.chunk_bytes = chunk;
    if (chunk != cat.chunk_bytes)
      return Status::InvalidArgument("ranks saved step " + std::to_string(cat.step) +
                                     " with different chunk sizes (" + std::to_string(chunk) +
                                     " and " + std::to_string(cat.chunk_bytes) + ")");
    if (mc->blob_providers.size() <= static_cast<size_t>(source))
      mc->blob_providers.resize(static_cast<size_t>(source) + 1);
    mc->blob_providers[static_cast<size_t>(source)].push_back({holder, t.blob_bytes()});
    std::vector<TensorMeta> metas;
    Status st = TensorsFromWire(t.mutable_tensors(), &metas, "shard table");
    if (!st.ok()) return bad(st.message());
    if (static_cast<size_t>(t.nbytes_size()) != metas.size())
      return bad(std::to_string(metas.size()) + " shards for " + std::to_string(t.nbytes_size()) +
                 " sizes");
    size_t at = 0;
    for (size_t k = 0; k < metas.size(); ++k) {
      TensorMeta& meta = metas[k];
      Box box;
      st = BoxFromWire(t.boxes(), &at, meta, &box);
      if (!st.ok()) return bad(st.message());
      const uint64_t nbytes = t.nbytes(static_cast<int>(k));
      if (nbytes != static_cast<uint64_t>(box.numel()) * DTypeSize(meta.dtype))
        return bad("tensor '" + meta.name + "': " + std::to_string(nbytes) + " bytes for " +
                   box.ToString());
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
  if (kind == 5) return restore_internal::DecodeTargeted(bytes, saved_world, 1).status();
  if (kind == 4) {
    // A list of templates, each decoded as the restore decodes them.
    auto list = restore_internal::DecodeTemplateList(bytes);
    if (!list.ok()) return list.status();
    for (const std::string& t : *list) CAIRN_RETURN_IF_ERROR(DecodeTemplate(t).status());
    return Status::OK();
  }
  // A rank's catalog part, its shard tables added as the restore adds them.
  CAIRN_ASSIGN_OR_RETURN(auto part, restore_internal::DecodeCatalogPart(bytes, 1));
  restore_internal::MemoryCatalog mc;
  std::unordered_map<std::string, uint32_t> tensor_ids;
  std::map<std::pair<uint32_t, std::vector<int64_t>>, uint32_t> piece_ids;
  return restore_internal::AddTables(1, *part.mutable_tables(), saved_world, &mc, &tensor_ids,
                                     &piece_ids);
}

}  // namespace cairn
