#include "persist/manifest.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "cairn/tensor.h"
#include "core/arith.h"
#include "core/bytes.h"
#include "core/checksum.h"
#include "layout/layout_template.h"
#include "persist/step_index.h"

namespace cairn {
namespace {

constexpr char kMagic[8] = {'C', 'A', 'I', 'R', 'N', 'M', 'F', '1'};

Status Bad(const std::string& what) {
  return Status::Corruption("bad manifest: " + what);
}

Status CheckBox(const pb::Manifest& m, uint32_t tensor,
                const google::protobuf::RepeatedField<int64_t>& offsets,
                const google::protobuf::RepeatedField<int64_t>& lengths, const std::string& what,
                Box* out) {
  if (tensor >= static_cast<uint32_t>(m.tensors_size()))
    return Bad(what + " names tensor #" + std::to_string(tensor) + " of " +
               std::to_string(m.tensors_size()));
  const pb::Tensor& t = m.tensors(static_cast<int>(tensor));
  if (offsets.size() != t.shape_size() || lengths.size() != t.shape_size())
    return Bad(what + " of tensor '" + t.name() + "' has the wrong rank");
  out->offsets.assign(offsets.begin(), offsets.end());
  out->lengths.assign(lengths.begin(), lengths.end());
  Status st = CheckBoxInShape(*out, Shape(t.shape().begin(), t.shape().end()));
  if (!st.ok()) return Bad(what + " of tensor '" + t.name() + "': " + st.message());
  return Status::OK();
}

}  // namespace

std::string PfsJobDir(const std::string& pfs_root, const std::string& job) {
  return JoinPath(pfs_root, job);
}

std::string StepDirName(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%06lld", static_cast<long long>(step));
  return buf;
}

std::optional<int64_t> ParseStepDirName(std::string_view name) {
  if (name.size() < 11 || name.size() > 24 || name.substr(0, 5) != "step-") return std::nullopt;
  int64_t v = 0;
  for (char c : name.substr(5)) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  if (StepDirName(v) != name) return std::nullopt;
  return v;
}

std::string DataFileName(int rank) {
  return "data/" + std::to_string(rank) + ".bin";
}

std::string EncodeManifest(const pb::Manifest& m) {
  std::string body = m.SerializeAsString();
  ByteWriter w;
  w.PutBytes(kMagic, sizeof(kMagic));
  w.Put<uint64_t>(body.size());
  w.PutBytes(body.data(), body.size());
  w.Put<uint64_t>(Checksum(body.data(), body.size()));
  return std::move(w.out());
}

Result<pb::Manifest> DecodeManifest(std::string_view bytes) {
  if (bytes.size() < 24 || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
    return Bad("not a cairn MANIFEST (wrong magic or too short)");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data() + 8, 8);
  if (n != bytes.size() - 24)
    return Bad("length field says " + std::to_string(n) + " bytes but the file has " +
               std::to_string(bytes.size() - 24) + " (truncated or padded)");
  uint64_t sum = 0;
  std::memcpy(&sum, bytes.data() + 16 + n, 8);
  if (sum != Checksum(bytes.data() + 16, n)) return Bad("checksum mismatch");
  pb::Manifest m;
  if (!m.ParseFromArray(bytes.data() + 16, static_cast<int>(n)))
    return Bad("protobuf does not parse");
  CAIRN_RETURN_IF_ERROR(ValidateManifest(m));
  return m;
}

namespace {

// Format 2: templates and per-rank tables instead of shards, lists and boxes.
Status ValidateTemplated(const pb::Manifest& m) {
  if (m.shards_size() || m.lists_size() || m.rank_list_size() || m.files_size() || m.boxes_size())
    return Bad("format 2 with format 1 layout fields");
  std::vector<uint32_t> parts;
  for (const std::string& bytes : m.templates()) {
    auto t = DecodeTemplate(bytes);
    if (!t.ok()) return Bad(t.status().message());
    if (t->parts > m.world_size()) return Bad("a template of more parts than ranks");
    parts.push_back(t->parts);
  }
  const int world = static_cast<int>(m.world_size());
  if (m.rank_template_size() != world || m.rank_index_size() != world ||
      m.index_pieces_size() != world || m.index_bytes_size() != world ||
      m.index_checksums_size() != world)
    return Bad("per-rank tables are not of the world size " + std::to_string(world));
  for (int r = 0; r < world; ++r)
    if (m.rank_template(r) >= parts.size() || m.rank_index(r) >= parts[m.rank_template(r)])
      return Bad("rank " + std::to_string(r) + " names a missing template or part");
  for (const pb::Blob& b : m.blobs()) {
    Status st = CheckTensorName(b.name());
    if (!st.ok()) return Bad("blob: " + st.message());
    if (b.rank() >= m.world_size() || b.offset() > kMaxFileOffset || b.length() > kMaxBlobBytes)
      return Bad("blob '" + b.name() + "' has a bad rank or range");
  }
  return Status::OK();
}

}  // namespace

Status ValidateManifest(const pb::Manifest& m) {
  if (m.format_version() != kManifestFormatVersion &&
      m.format_version() != kTemplatedManifestVersion)
    return Bad("format version " + std::to_string(m.format_version()) + " (this cairn reads " +
               std::to_string(kManifestFormatVersion) + " and " +
               std::to_string(kTemplatedManifestVersion) + ")");
  if (m.step() < 0) return Bad("negative step");
  if (m.world_size() < 1 || m.world_size() > (1u << 24))
    return Bad("world size " + std::to_string(m.world_size()));
  if (m.chunk_bytes() < 1 || m.chunk_bytes() > kMaxChunkBytes)
    return Bad("chunk size " + std::to_string(m.chunk_bytes()));
  for (const pb::Tensor& t : m.tensors()) {
    Status st = CheckTensorName(t.name());
    if (!st.ok()) return Bad(st.message());
    if (t.dtype() > 255 || !IsValidDType(static_cast<uint8_t>(t.dtype())))
      return Bad("tensor '" + t.name() + "' has unknown dtype " + std::to_string(t.dtype()));
    if (static_cast<size_t>(t.shape_size()) > kMaxTensorRank ||
        !CheckedNumElements(Shape(t.shape().begin(), t.shape().end())))
      return Bad("tensor '" + t.name() + "' has a bad shape");
  }
  if (m.format_version() == kTemplatedManifestVersion) return ValidateTemplated(m);
  Box box;
  for (int i = 0; i < m.shards_size(); ++i) {
    const pb::Shard& s = m.shards(i);
    CAIRN_RETURN_IF_ERROR(
        CheckBox(m, s.tensor(), s.offsets(), s.lengths(), "shard #" + std::to_string(i), &box));
  }
  for (const pb::ShardList& l : m.lists())
    for (uint32_t s : l.shards())
      if (s >= static_cast<uint32_t>(m.shards_size())) return Bad("a layout names a missing shard");
  if (m.rank_list_size() != static_cast<int>(m.world_size()))
    return Bad("layout has " + std::to_string(m.rank_list_size()) + " ranks, world size is " +
               std::to_string(m.world_size()));
  for (uint32_t l : m.rank_list())
    if (l >= static_cast<uint32_t>(m.lists_size())) return Bad("a rank names a missing layout");
  for (const std::string& f : m.files()) {
    // Only "data/<n>.bin": a name can never leave the step directory.
    bool ok = f.size() > 9 && f.compare(0, 5, "data/") == 0 && f.size() <= 5 + 8 + 4 &&
              f.compare(f.size() - 4, 4, ".bin") == 0;
    for (size_t i = 5; ok && i + 4 < f.size(); ++i) ok = f[i] >= '0' && f[i] <= '9';
    if (!ok) return Bad("data file name '" + f + "' is not data/<rank>.bin");
  }
  const auto nfiles = static_cast<uint32_t>(m.files_size());
  for (int i = 0; i < m.boxes_size(); ++i) {
    const pb::SavedBox& b = m.boxes(i);
    const std::string what = "saved box #" + std::to_string(i);
    CAIRN_RETURN_IF_ERROR(CheckBox(m, b.tensor(), b.offsets(), b.lengths(), what, &box));
    const pb::Tensor& t = m.tensors(static_cast<int>(b.tensor()));
    const uint64_t want =
        static_cast<uint64_t>(box.numel()) * DTypeSize(static_cast<DType>(t.dtype()));
    if (b.length() != want)
      return Bad(what + " of tensor '" + t.name() + "' has " + std::to_string(b.length()) +
                 " bytes, its box needs " + std::to_string(want));
    if (b.file() >= nfiles) return Bad(what + " names a missing data file");
    if (b.offset() > kMaxFileOffset || b.length() > kMaxFileOffset)
      return Bad(what + " has an impossible offset");
    const uint64_t chunks = CeilDiv(b.length(), m.chunk_bytes());
    if (static_cast<uint64_t>(b.chunk_checksums_size()) != chunks)
      return Bad(what + " of tensor '" + t.name() + "' has " +
                 std::to_string(b.chunk_checksums_size()) + " chunk checksums, needs " +
                 std::to_string(chunks));
  }
  for (const pb::Blob& b : m.blobs()) {
    Status st = CheckTensorName(b.name());
    if (!st.ok()) return Bad("blob: " + st.message());
    if (b.rank() >= m.world_size() || b.file() >= nfiles || b.offset() > kMaxFileOffset ||
        b.length() > kMaxBlobBytes)
      return Bad("blob '" + b.name() + "' has a bad rank, file or range");
  }
  return Status::OK();
}

Result<pb::Manifest> ReadManifestFile(FileSystem* fs, const std::string& step_dir) {
  const std::string path = JoinPath(step_dir, "MANIFEST");
  auto bytes = ReadWholeFile(fs, path, kMaxManifestBytes);
  if (!bytes.ok()) return bytes.status();
  auto m = DecodeManifest(*bytes);
  if (!m.ok()) return m.status().WithContext(path);
  return m;
}

Result<pb::Manifest> ReadManifest(FileSystem* fs, const std::string& step_dir) {
  CAIRN_ASSIGN_OR_RETURN(pb::Manifest m, ReadManifestFile(fs, step_dir));
  if (m.format_version() != kTemplatedManifestVersion) return m;
  auto full = ExpandManifest(m, FileIndexReader(fs, step_dir));
  if (!full.ok()) return full.status().WithContext(step_dir);
  return full;
}

Result<int64_t> ReadLatest(FileSystem* fs, const std::string& job_dir) {
  const std::string path = JoinPath(job_dir, "LATEST");
  if (!fs->Exists(path)) return Status::NotFound("no committed step: " + path + " does not exist");
  CAIRN_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(fs, path, 64));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  int64_t v = 0;
  bool ok = !text.empty() && text.size() <= 18;
  for (char c : text) {
    ok = ok && c >= '0' && c <= '9';
    if (ok) v = v * 10 + (c - '0');
  }
  if (!ok) return Status::Corruption(path + ": does not hold a step number");
  return v;
}

Result<std::vector<int64_t>> ListCommittedSteps(FileSystem* fs, const std::string& job_dir) {
  CAIRN_ASSIGN_OR_RETURN(std::vector<std::string> names, fs->ListDir(job_dir));
  std::vector<int64_t> steps;
  for (const std::string& n : names) {
    auto s = ParseStepDirName(n);
    if (s && fs->Exists(JoinPath(JoinPath(job_dir, n), "MANIFEST"))) steps.push_back(*s);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

void CatalogFromManifest(const pb::Manifest& m, LoadCatalog* cat) {
  cat->chunk_bytes = m.chunk_bytes();
  cat->tensors.reserve(cat->tensors.size() + static_cast<size_t>(m.tensors_size()));
  for (const pb::Tensor& t : m.tensors())
    cat->tensors.push_back(
        {t.name(), static_cast<DType>(t.dtype()), Shape(t.shape().begin(), t.shape().end())});
  cat->pieces.reserve(cat->pieces.size() + static_cast<size_t>(m.boxes_size()));
  for (int i = 0; i < m.boxes_size(); ++i) {
    const pb::SavedBox& b = m.boxes(i);
    LoadPiece piece;
    piece.tensor = b.tensor();
    piece.box.offsets.assign(b.offsets().begin(), b.offsets().end());
    piece.box.lengths.assign(b.lengths().begin(), b.lengths().end());
    piece.nbytes = b.length();
    piece.pfs_box = i;
    piece.writer = static_cast<int>(b.writer());
    cat->pieces.push_back(std::move(piece));
  }
}

}  // namespace cairn
