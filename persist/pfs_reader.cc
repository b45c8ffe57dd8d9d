#include "persist/pfs_reader.h"

#include <fcntl.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/box_copy.h"
#include "core/checksum.h"

namespace cairn {
namespace {

Box BoxOf(const pb::SavedBox& b) {
  Box box;
  box.offsets.assign(b.offsets().begin(), b.offsets().end());
  box.lengths.assign(b.lengths().begin(), b.lengths().end());
  return box;
}

// Open data files of a step, by file index.
class Files {
 public:
  Files(FileSystem* fs, const std::string& step_dir, const pb::Manifest& m)
      : fs_(fs), dir_(step_dir), m_(m), files_(static_cast<size_t>(m.files_size())) {}
  std::string Path(uint32_t file) const { return JoinPath(dir_, m_.files(static_cast<int>(file))); }
  Result<File*> Get(uint32_t file) {
    File& f = files_[file];
    if (!f.is_open()) {
      CAIRN_ASSIGN_OR_RETURN(f, fs_->OpenFile(Path(file), O_RDONLY | O_CLOEXEC, 0));
    }
    return &f;
  }

 private:
  FileSystem* fs_;
  std::string dir_;
  const pb::Manifest& m_;
  std::vector<File> files_;
};

// Reads saved box `b` into `buf` and checks every chunk.
Status ReadVerified(Files& files, const pb::Manifest& m, const pb::SavedBox& b,
                    std::vector<std::byte>* buf) {
  CAIRN_ASSIGN_OR_RETURN(File * f, files.Get(b.file()));
  buf->resize(b.length());
  CAIRN_RETURN_IF_ERROR(
      f->ReadAt(buf->data(), b.length(), b.offset()).WithContext(files.Path(b.file())));
  const uint64_t chunk = m.chunk_bytes();
  for (uint64_t lo = 0; lo < b.length(); lo += chunk)
    CAIRN_RETURN_IF_ERROR(CheckSavedChunk(m, b, lo, buf->data() + lo, files.Path(b.file())));
  return Status::OK();
}

Status ReadBlobs(Files& files, const pb::Manifest& m, int rank,
                 std::map<std::string, std::string>* out) {
  for (const pb::Blob& b : m.blobs()) {
    if (rank >= 0 && b.rank() != static_cast<uint32_t>(rank)) continue;
    CAIRN_ASSIGN_OR_RETURN(File * f, files.Get(b.file()));
    std::string bytes(b.length(), '\0');
    CAIRN_RETURN_IF_ERROR(
        f->ReadAt(bytes.data(), b.length(), b.offset()).WithContext(files.Path(b.file())));
    if (Checksum(bytes.data(), bytes.size()) != b.checksum())
      return Status::Corruption("checksum mismatch in blob '" + b.name() + "' of rank " +
                                std::to_string(b.rank()) + " in " + files.Path(b.file()));
    if (out) (*out)[b.name()] = std::move(bytes);
  }
  return Status::OK();
}

}  // namespace

Status CheckSavedChunk(const pb::Manifest& m, const pb::SavedBox& b, uint64_t lo,
                       const std::byte* data, const std::string& path) {
  const uint64_t hi = std::min(lo + m.chunk_bytes(), b.length());
  const int c = static_cast<int>(lo / m.chunk_bytes());
  if (c < b.chunk_checksums_size() && Checksum(data, hi - lo) == b.chunk_checksums(c))
    return Status::OK();
  return Status::Corruption("checksum mismatch in tensor '" +
                            m.tensors(static_cast<int>(b.tensor())).name() + "' box " +
                            BoxOf(b).ToString() + ", bytes [" + std::to_string(b.offset() + lo) +
                            ", " + std::to_string(b.offset() + hi) + ") of " + path);
}

Status ReadRankBlobs(FileSystem* fs, const std::string& step_dir, const pb::Manifest& m, int rank,
                     std::map<std::string, std::string>* out) {
  Files files(fs, step_dir, m);
  return ReadBlobs(files, m, rank, out)
      .WithContext("step " + std::to_string(m.step()) + " in " + step_dir);
}

Status VerifyStep(FileSystem* fs, const std::string& step_dir, const pb::Manifest& m,
                  const std::function<void(uint64_t, uint64_t)>& progress) {
  Files files(fs, step_dir, m);
  std::vector<std::byte> buf;
  uint64_t total = 0, done = 0;
  for (const pb::SavedBox& b : m.boxes()) total += b.length();
  for (const pb::SavedBox& b : m.boxes()) {
    CAIRN_RETURN_IF_ERROR(ReadVerified(files, m, b, &buf));
    done += b.length();
    if (progress) progress(done, total);
  }
  return ReadBlobs(files, m, -1, nullptr);
}

Status ReadShards(FileSystem* fs, const std::string& step_dir, const pb::Manifest& m,
                  std::span<const ShardSpec> targets, int blob_rank,
                  std::map<std::string, std::string>* blobs) {
  const std::string who = "step " + std::to_string(m.step()) + " in " + step_dir;
  std::unordered_map<std::string, uint32_t> tensor_ids;
  for (int t = 0; t < m.tensors_size(); ++t) tensor_ids.emplace(m.tensors(t).name(), t);
  // Which targets each saved box meets, and how much of each target is covered.
  std::vector<std::vector<std::pair<size_t, Box>>> meets(static_cast<size_t>(m.boxes_size()));
  std::vector<std::vector<int>> boxes_of(static_cast<size_t>(m.tensors_size()));
  for (int i = 0; i < m.boxes_size(); ++i) boxes_of[m.boxes(i).tensor()].push_back(i);
  for (size_t ti = 0; ti < targets.size(); ++ti) {
    const ShardSpec& t = targets[ti];
    auto it = tensor_ids.find(t.meta.name);
    if (it == tensor_ids.end())
      return Status::NotFound(who + ": tensor '" + t.meta.name + "' was not saved");
    const pb::Tensor& saved = m.tensors(static_cast<int>(it->second));
    if (saved.dtype() != static_cast<uint32_t>(t.meta.dtype))
      return Status::InvalidArgument(who + ": tensor '" + t.meta.name + "' was saved as " +
                                     std::string(DTypeName(static_cast<DType>(saved.dtype()))) +
                                     " but the target is " + std::string(DTypeName(t.meta.dtype)));
    if (Shape(saved.shape().begin(), saved.shape().end()) != t.meta.global_shape)
      return Status::InvalidArgument(
          who + ": tensor '" + t.meta.name + "' was saved with shape " +
          ShapeToString(Shape(saved.shape().begin(), saved.shape().end())) +
          " but the target has " + ShapeToString(t.meta.global_shape));
    int64_t covered = 0;
    for (int bi : boxes_of[it->second]) {
      auto inter = Intersect(BoxOf(m.boxes(bi)), t.box);
      if (!inter || inter->empty()) continue;
      covered += inter->numel();
      meets[static_cast<size_t>(bi)].emplace_back(ti, std::move(*inter));
    }
    if (covered < t.box.numel())
      return Status::Corruption(who + ": tensor '" + t.meta.name + "' box " + t.box.ToString() +
                                " is not fully covered by the saved boxes");
  }
  Files files(fs, step_dir, m);
  std::vector<std::byte> buf;
  for (int bi = 0; bi < m.boxes_size(); ++bi) {
    if (meets[static_cast<size_t>(bi)].empty()) continue;
    const pb::SavedBox& b = m.boxes(bi);
    CAIRN_RETURN_IF_ERROR(ReadVerified(files, m, b, &buf).WithContext(who));
    const Box sbox = BoxOf(b);
    const size_t elem =
        DTypeSize(static_cast<DType>(m.tensors(static_cast<int>(b.tensor())).dtype()));
    for (const auto& [ti, region] : meets[static_cast<size_t>(bi)])
      CopyBoxRegion(buf.data(), sbox, targets[ti].data, targets[ti].box, region, elem);
  }
  if (blob_rank >= 0) CAIRN_RETURN_IF_ERROR(ReadBlobs(files, m, blob_rank, blobs).WithContext(who));
  return Status::OK();
}

}  // namespace cairn
