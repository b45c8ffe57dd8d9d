#include "persist/step_index.h"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "core/arith.h"
#include "core/bytes.h"
#include "core/checksum.h"

namespace cairn {
namespace {

constexpr char kIndexMagic[4] = {'C', 'I', 'X', '1'};

Status Bad(const std::string& what) {
  return Status::Corruption("bad index file: " + what);
}

// Writer `w`'s index pieces, read and checked against the MANIFEST and the plan
// (`nbytes`: the length of each piece the plan has it write).
Result<std::vector<LocationTable::Piece>> ReadIndex(const pb::Manifest& m, int w,
                                                    const IndexReader& read_index,
                                                    const std::vector<uint64_t>& nbytes,
                                                    uint64_t* bytes_read) {
  const std::string name = IndexFileName(w);
  CAIRN_ASSIGN_OR_RETURN(std::string bytes, read_index(w));
  if (bytes_read) *bytes_read += bytes.size();
  if (bytes.size() != m.index_bytes(w) ||
      Checksum(bytes.data(), bytes.size()) != m.index_checksums(w))
    return Status::Corruption(name + ": " + std::to_string(bytes.size()) +
                              " bytes that do not match the MANIFEST's length (" +
                              std::to_string(m.index_bytes(w)) + ") and checksum");
  auto pieces = DecodeWriterIndex(bytes);
  if (!pieces.ok()) return pieces.status().WithContext(name);
  if (pieces->size() != m.index_pieces(w) || pieces->size() != nbytes.size())
    return Status::Corruption(name + ": " + std::to_string(pieces->size()) +
                              " pieces, the plan of the MANIFEST has " +
                              std::to_string(nbytes.size()));
  const uint64_t chunk = m.chunk_bytes();
  for (size_t k = 0; k < nbytes.size(); ++k) {
    const auto& p = (*pieces)[k];
    if (p.offset > kMaxFileOffset || p.chunk_checksums.size() != CeilDiv(nbytes[k], chunk))
      return Status::Corruption(name + ": piece " + std::to_string(k) +
                                " has an impossible offset or the wrong number of checksums");
  }
  return pieces;
}

// Adds writer `w`'s piece `k` (`wp`, located by `loc`) to a format-1-shaped manifest.
void AddPiece(pb::Manifest* out, uint32_t file, int w, const WritePiece& wp,
              const LocationTable::Piece& loc) {
  pb::SavedBox* b = out->add_boxes();
  b->set_tensor(wp.tensor);
  b->mutable_offsets()->Add(wp.box.offsets.begin(), wp.box.offsets.end());
  b->mutable_lengths()->Add(wp.box.lengths.begin(), wp.box.lengths.end());
  b->set_file(file);
  b->set_offset(loc.offset);
  b->set_length(wp.nbytes);
  b->set_writer(static_cast<uint32_t>(w));
  b->mutable_chunk_checksums()->Add(loc.chunk_checksums.begin(), loc.chunk_checksums.end());
  pb::Shard* s = out->add_shards();
  s->set_tensor(wp.tensor);
  s->mutable_offsets()->Add(wp.box.offsets.begin(), wp.box.offsets.end());
  s->mutable_lengths()->Add(wp.box.lengths.begin(), wp.box.lengths.end());
}

}  // namespace

std::string IndexFileName(int rank) {
  return "data/" + std::to_string(rank) + ".idx";
}

std::string EncodeWriterIndex(const std::vector<LocationTable::Piece>& pieces) {
  ByteWriter w;
  w.PutBytes(kIndexMagic, sizeof(kIndexMagic));
  w.Put<uint32_t>(static_cast<uint32_t>(pieces.size()));
  for (const auto& p : pieces) {
    w.Put<uint64_t>(p.offset);
    w.Put<uint32_t>(static_cast<uint32_t>(p.chunk_checksums.size()));
    w.PutBytes(p.chunk_checksums.data(), p.chunk_checksums.size() * sizeof(uint64_t));
  }
  return std::move(w.out());
}

Result<std::vector<LocationTable::Piece>> DecodeWriterIndex(std::string_view bytes) {
  ByteReader r(bytes);
  char magic[4];
  for (char& c : magic)
    if (!r.Get(&c)) return Bad("truncated magic");
  if (std::string_view(magic, 4) != std::string_view(kIndexMagic, 4)) return Bad("wrong magic");
  uint32_t n = 0;
  if (!r.Get(&n) || n > r.remaining() / 12) return Bad("piece count");
  std::vector<LocationTable::Piece> out(n);
  for (auto& p : out) {
    uint32_t c = 0;
    if (!r.Get(&p.offset) || !r.Get(&c) || c > r.remaining() / 8) return Bad("truncated piece");
    p.chunk_checksums.resize(c);
    for (uint64_t& s : p.chunk_checksums) r.Get(&s);
  }
  if (r.remaining() != 0) return Bad("trailing bytes");
  return out;
}

Result<pb::Manifest> BuildTemplatedManifest(const TemplatedPlan& plan,
                                            const std::vector<LocationTable>& tables,
                                            const std::string& job, int64_t step,
                                            uint64_t chunk_bytes) {
  const int world = plan.world_size();
  CAIRN_ASSIGN_OR_RETURN(pb::Manifest m,
                         ManifestHead(kTemplatedManifestVersion, plan.tensors, tables.size(), world,
                                      job, step, chunk_bytes));
  for (const LayoutTemplate& t : plan.templates) m.add_templates(EncodeTemplate(t));
  m.mutable_rank_template()->Add(plan.rank_template.begin(), plan.rank_template.end());
  m.mutable_rank_index()->Add(plan.rank_index.begin(), plan.rank_index.end());
  for (int r = 0; r < world; ++r) {
    const LocationTable& t = tables[static_cast<size_t>(r)];
    if (!t.indexed)
      return Status::InvalidArgument("manifest: rank " + std::to_string(r) +
                                     " reported its pieces, not an index file");
    m.add_index_pieces(t.index_pieces);
    m.add_index_bytes(t.index_bytes);
    m.add_index_checksums(t.index_checksum);
    for (const auto& bl : t.blobs) {
      pb::Blob* b = m.add_blobs();
      b->set_rank(static_cast<uint32_t>(r));
      b->set_name(bl.name);
      b->set_offset(bl.offset);
      b->set_length(bl.length);
      b->set_checksum(bl.checksum);
    }
  }
  return m;
}

Result<TemplatedPlan> PlanOfManifest(const pb::Manifest& m) {
  std::vector<LayoutTemplate> templates;
  for (const std::string& bytes : m.templates()) {
    CAIRN_ASSIGN_OR_RETURN(LayoutTemplate t, DecodeTemplate(bytes));
    templates.push_back(std::move(t));
  }
  std::string why;
  auto plan =
      MakeTemplatedPlan(std::move(templates), {m.rank_template().begin(), m.rank_template().end()},
                        {m.rank_index().begin(), m.rank_index().end()},
                        std::vector<uint64_t>(m.world_size(), 0), nullptr, &why);
  if (!plan) return Status::Corruption("bad manifest: its templates make no plan: " + why);
  bool same = plan->tensors.size() == static_cast<size_t>(m.tensors_size());
  for (size_t g = 0; same && g < plan->tensors.size(); ++g) {
    const pb::Tensor& t = m.tensors(static_cast<int>(g));
    same = plan->tensors[g] == TensorMeta{t.name(), static_cast<DType>(t.dtype()),
                                          Shape(t.shape().begin(), t.shape().end())};
  }
  if (!same) return Status::Corruption("bad manifest: its tensors are not its templates'");
  return std::move(*plan);
}

IndexReader FileIndexReader(FileSystem* fs, const std::string& step_dir) {
  return [fs, step_dir](int rank) -> Result<std::string> {
    return ReadWholeFile(fs, JoinPath(step_dir, IndexFileName(rank)), 1ull << 32);
  };
}

Result<pb::Manifest> PartialManifest(const pb::Manifest& m,
                                     const std::vector<std::pair<std::string, Box>>& targets,
                                     int blob_rank, const IndexReader& read_index,
                                     uint64_t* index_bytes) {
  CAIRN_ASSIGN_OR_RETURN(TemplatedPlan plan, PlanOfManifest(m));
  return PartialManifest(m, plan, targets, blob_rank, read_index, index_bytes);
}

Result<pb::Manifest> PartialManifest(const pb::Manifest& m, const TemplatedPlan& plan,
                                     const std::vector<std::pair<std::string, Box>>& targets,
                                     int blob_rank, const IndexReader& read_index,
                                     uint64_t* index_bytes) {
  if (index_bytes) *index_bytes = 0;
  std::unordered_map<std::string_view, uint32_t> ids;
  for (uint32_t g = 0; g < plan.tensors.size(); ++g) ids.emplace(plan.tensors[g].name, g);
  // The saved boxes each writer holds that some target meets.
  std::map<int, std::set<std::pair<uint32_t, std::vector<int64_t>>>> need;
  auto key = [](const Box& b) {
    std::vector<int64_t> k = b.offsets;
    k.insert(k.end(), b.lengths.begin(), b.lengths.end());
    return k;
  };
  for (const auto& [name, box] : targets) {
    auto it = ids.find(name);
    if (it == ids.end()) continue;
    const uint32_t g = it->second;
    const Shape& shape = plan.tensors[g].global_shape;
    if (!CheckBoxInShape(box, shape).ok()) continue;
    const SplitRule& rule = plan.rules[g];
    if (!rule.split()) {
      if (plan.whole_writer[g] >= 0) need[plan.whole_writer[g]].insert({g, key(Box::Whole(shape))});
      continue;
    }
    for (uint32_t i : PartsMeeting(shape, rule, plan.parts[g], box,
                                   static_cast<uint32_t>(plan.index_classes.size()))) {
      const int w = plan.SplitWriter(g, i);
      if (w < 0) continue;
      for (const Box& b : PartBoxes(shape, rule, i, plan.parts[g]))
        if (Intersect(b, box)) need[w].insert({g, key(b)});
    }
  }
  pb::Manifest out;
  out.set_format_version(kManifestFormatVersion);
  out.set_job(m.job());
  out.set_step(m.step());
  out.set_created_wall_ns(m.created_wall_ns());
  out.set_world_size(m.world_size());
  out.set_chunk_bytes(m.chunk_bytes());
  *out.mutable_tensors() = m.tensors();
  for (auto& [w, wanted] : need) {
    const std::vector<WritePiece> pieces = plan.PiecesOf(w);
    std::vector<uint64_t> nbytes;
    for (const WritePiece& p : pieces) nbytes.push_back(p.nbytes);
    CAIRN_ASSIGN_OR_RETURN(auto locs, ReadIndex(m, w, read_index, nbytes, index_bytes));
    const auto file = static_cast<uint32_t>(out.files_size());
    out.add_files(DataFileName(w));
    for (size_t k = 0; k < pieces.size(); ++k)
      if (wanted.count({pieces[k].tensor, key(pieces[k].box)}))
        AddPiece(&out, file, w, pieces[k], locs[k]);
  }
  if (blob_rank >= 0) {
    int file = -1;
    for (const pb::Blob& b : m.blobs()) {
      if (b.rank() != static_cast<uint32_t>(blob_rank)) continue;
      if (file < 0) {
        for (int f = 0; f < out.files_size() && file < 0; ++f)
          if (out.files(f) == DataFileName(blob_rank)) file = f;
        if (file < 0) {
          file = out.files_size();
          out.add_files(DataFileName(blob_rank));
        }
      }
      pb::Blob* nb = out.add_blobs();
      *nb = b;
      nb->set_file(static_cast<uint32_t>(file));
    }
  }
  return out;
}

Result<pb::Manifest> ExpandManifest(const pb::Manifest& m, const IndexReader& read_index) {
  CAIRN_ASSIGN_OR_RETURN(TemplatedPlan plan, PlanOfManifest(m));
  const SavePlan full = plan.Expand();
  std::vector<LocationTable> tables(m.world_size());
  std::vector<std::vector<uint64_t>> nbytes(m.world_size());
  for (const PlannedPiece& p : full.pieces)
    nbytes[static_cast<size_t>(p.writer)].push_back(p.nbytes);
  for (int w = 0; w < static_cast<int>(m.world_size()); ++w) {
    CAIRN_ASSIGN_OR_RETURN(tables[static_cast<size_t>(w)].pieces,
                           ReadIndex(m, w, read_index, nbytes[static_cast<size_t>(w)], nullptr));
  }
  for (const pb::Blob& b : m.blobs())
    tables[b.rank()].blobs.push_back({b.name(), b.offset(), b.length(), b.checksum()});
  CAIRN_ASSIGN_OR_RETURN(pb::Manifest out,
                         BuildManifest(full, tables, m.job(), m.step(), m.chunk_bytes()));
  out.set_created_wall_ns(m.created_wall_ns());
  CAIRN_RETURN_IF_ERROR(ValidateManifest(out));
  return out;
}

}  // namespace cairn
