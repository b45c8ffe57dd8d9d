#include "persist/commit.h"

#include <algorithm>

#include "core/kill_point.h"
#include "wire/codec.h"

namespace cairn {
namespace {

Status Bad(const std::string& what) {
  return Status::Corruption("bad location table: " + what);
}

}  // namespace

std::string EncodeLocationTable(const LocationTable& t) {
  wire::LocationTable w;
  wire::ToWire(t.status, w.mutable_status());
  if (!t.status.ok()) return wire::Encode(w);
  if (t.indexed) {
    auto* d = w.mutable_index();
    d->set_pieces(t.index_pieces);
    d->set_bytes(t.index_bytes);
    d->set_checksum(t.index_checksum);
  }
  for (const auto& p : t.pieces) {
    auto* wp = w.add_pieces();
    wp->set_offset(p.offset);
    wp->mutable_chunk_checksums()->Add(p.chunk_checksums.begin(), p.chunk_checksums.end());
  }
  for (const auto& b : t.blobs) {
    auto* wb = w.add_blobs();
    wb->set_name(b.name);
    wb->set_offset(b.offset);
    wb->set_length(b.length);
    wb->set_checksum(b.checksum);
  }
  return wire::Encode(w);
}

Result<LocationTable> DecodeLocationTable(std::string_view bytes) {
  CAIRN_ASSIGN_OR_RETURN(auto w, wire::Decode<wire::LocationTable>(bytes, "location table"));
  LocationTable t;
  t.status = wire::FromWire(w.status());
  if (!t.status.ok()) return t;
  t.indexed = w.has_index();
  if (t.indexed) {
    t.index_pieces = w.index().pieces();
    t.index_bytes = w.index().bytes();
    t.index_checksum = w.index().checksum();
  }
  t.pieces.resize(static_cast<size_t>(w.pieces_size()));
  for (size_t k = 0; k < t.pieces.size(); ++k) {
    const auto& p = w.pieces(static_cast<int>(k));
    t.pieces[k].offset = p.offset();
    t.pieces[k].chunk_checksums.assign(p.chunk_checksums().begin(), p.chunk_checksums().end());
  }
  t.blobs.resize(static_cast<size_t>(w.blobs_size()));
  for (size_t k = 0; k < t.blobs.size(); ++k) {
    const auto& b = w.blobs(static_cast<int>(k));
    if (b.name().size() > (1u << 16))
      return Bad("a blob name of " + std::to_string(b.name().size()) + " bytes");
    t.blobs[k] = {b.name(), b.offset(), b.length(), b.checksum()};
  }
  return t;
}

Result<pb::Manifest> ManifestHead(uint32_t version, const std::vector<TensorMeta>& tensors,
                                  size_t tables, int world, const std::string& job, int64_t step,
                                  uint64_t chunk_bytes) {
  if (static_cast<int>(tables) != world)
    return Status::InvalidArgument("manifest: " + std::to_string(tables) + " location tables for " +
                                   std::to_string(world) + " ranks");
  pb::Manifest m;
  m.set_format_version(version);
  m.set_job(job);
  m.set_step(step);
  m.set_world_size(static_cast<uint32_t>(world));
  m.set_chunk_bytes(chunk_bytes);
  m.mutable_tensors()->Reserve(static_cast<int>(tensors.size()));
  for (const TensorMeta& t : tensors) {
    pb::Tensor* pt = m.add_tensors();
    pt->set_name(t.name);
    pt->set_dtype(static_cast<uint32_t>(t.dtype));
    pt->mutable_shape()->Add(t.global_shape.begin(), t.global_shape.end());
  }
  return m;
}

Result<pb::Manifest> BuildManifest(const SavePlan& plan, const std::vector<LocationTable>& tables,
                                   const std::string& job, int64_t step, uint64_t chunk_bytes) {
  const int world = plan.world_size();
  CAIRN_ASSIGN_OR_RETURN(
      pb::Manifest m, ManifestHead(kManifestFormatVersion, plan.tensors, tables.size(), world, job,
                                   step, chunk_bytes));
  m.mutable_shards()->Reserve(static_cast<int>(plan.shards.size()));
  for (const PlanShard& s : plan.shards) {
    pb::Shard* ps = m.add_shards();
    ps->set_tensor(s.tensor);
    ps->mutable_offsets()->Add(s.box.offsets.begin(), s.box.offsets.end());
    ps->mutable_lengths()->Add(s.box.lengths.begin(), s.box.lengths.end());
  }
  for (const auto& l : plan.lists) m.add_lists()->mutable_shards()->Add(l.begin(), l.end());
  m.mutable_rank_list()->Add(plan.rank_list.begin(), plan.rank_list.end());
  // One file per rank that wrote anything.
  std::vector<int> file_of(static_cast<size_t>(world), -1);
  auto file = [&](int r) {
    if (file_of[static_cast<size_t>(r)] < 0) {
      file_of[static_cast<size_t>(r)] = m.files_size();
      m.add_files(DataFileName(r));
    }
    return static_cast<uint32_t>(file_of[static_cast<size_t>(r)]);
  };
  m.mutable_boxes()->Reserve(static_cast<int>(plan.pieces.size()));
  std::vector<size_t> used(static_cast<size_t>(world), 0);
  for (const PlannedPiece& p : plan.pieces) {
    const LocationTable& t = tables[static_cast<size_t>(p.writer)];
    size_t& k = used[static_cast<size_t>(p.writer)];
    if (k >= t.pieces.size())
      return Status::InvalidArgument("manifest: rank " + std::to_string(p.writer) +
                                     " reported fewer pieces than it was planned to write");
    const LocationTable::Piece& loc = t.pieces[k++];
    pb::SavedBox* b = m.add_boxes();
    b->set_tensor(plan.shards[p.shard].tensor);
    b->mutable_offsets()->Add(p.box.offsets.begin(), p.box.offsets.end());
    b->mutable_lengths()->Add(p.box.lengths.begin(), p.box.lengths.end());
    b->set_file(file(p.writer));
    b->set_offset(loc.offset);
    b->set_length(p.nbytes);
    b->set_writer(static_cast<uint32_t>(p.writer));
    b->mutable_chunk_checksums()->Add(loc.chunk_checksums.begin(), loc.chunk_checksums.end());
  }
  for (int r = 0; r < world; ++r) {
    if (used[static_cast<size_t>(r)] != tables[static_cast<size_t>(r)].pieces.size())
      return Status::InvalidArgument("manifest: rank " + std::to_string(r) +
                                     " reported more pieces than it was planned to write");
    for (const auto& bl : tables[static_cast<size_t>(r)].blobs) {
      pb::Blob* b = m.add_blobs();
      b->set_rank(static_cast<uint32_t>(r));
      b->set_name(bl.name);
      b->set_file(file(r));
      b->set_offset(bl.offset);
      b->set_length(bl.length);
      b->set_checksum(bl.checksum);
    }
  }
  return m;
}

Status CommitStep(FileSystem* fs, const std::string& job_dir, int64_t step,
                  const pb::Manifest& manifest, bool* left_published) {
  *left_published = false;
  const std::string dir = JoinPath(job_dir, StepDirName(step));
  const std::string latest = JoinPath(job_dir, "LATEST");
  auto prev = ReadLatest(fs, job_dir);
  if (!prev.ok() && prev.status().code() != StatusCode::kNotFound) return prev.status();
  CAIRN_RETURN_IF_ERROR(WriteFileAtomic(fs, JoinPath(dir, "MANIFEST"), EncodeManifest(manifest)));
  CAIRN_KILL_POINT("commit.manifest_written");
  Status st = WriteFileAtomic(fs, latest, std::to_string(step) + "\n");
  if (st.ok()) CAIRN_KILL_POINT("commit.latest_written");
  if (st.ok()) return st;
  auto now = ReadLatest(fs, job_dir);
  if (!now.ok() || *now == step) {
    // The rename happened (or LATEST cannot even be read to tell) but a later call failed:
    // put the previous LATEST back.
    Status back =
        prev.ok() ? WriteFileAtomic(fs, latest, std::to_string(*prev) + "\n") : fs->Unlink(latest);
    if (back.ok() && !prev.ok()) back = fs->SyncDir(job_dir);
    if (!back.ok()) {
      *left_published = true;
      return st.WithContext("LATEST names step " + std::to_string(step) +
                            " (or cannot be read) although committing it failed, and putting "
                            "the previous LATEST back failed too (" +
                            back.ToString() +
                            "); the step is complete and verified, so it was left");
    }
  }
  return st;
}

void CollectPfsGarbage(FileSystem* fs, const std::string& job_dir, int keep, int64_t in_flight,
                       const Logger* log) {
  auto names = fs->ListDir(job_dir);
  if (!names.ok()) {
    if (log && names.status().code() != StatusCode::kNotFound)
      log->Warning("garbage collection: " + names.status().ToString());
    return;
  }
  auto latest = ReadLatest(fs, job_dir);
  std::vector<int64_t> committed;
  std::vector<std::string> remove;
  for (const std::string& n : *names) {
    if (n.find(".tmp.") != std::string::npos) {
      remove.push_back(n);
      continue;
    }
    auto step = ParseStepDirName(n);
    if (!step) continue;
    const std::string dir = JoinPath(job_dir, n);
    if (fs->Exists(JoinPath(dir, "MANIFEST"))) {
      committed.push_back(*step);
      if (auto inner = fs->ListDir(dir); inner.ok())
        for (const std::string& f : *inner)
          if (f.find(".tmp.") != std::string::npos) remove.push_back(JoinPath(n, f));
    } else if (*step != in_flight) {
      remove.push_back(n);
    }
  }
  std::sort(committed.rbegin(), committed.rend());
  for (size_t i = static_cast<size_t>(std::max(keep, 1)); i < committed.size(); ++i)
    if (!latest.ok() || committed[i] != *latest) remove.push_back(StepDirName(committed[i]));
  for (const std::string& n : remove) {
    Status st = fs->RemoveAll(JoinPath(job_dir, n));
    if (!st.ok() && log) log->Warning("garbage collection: " + st.ToString());
  }
  if (!remove.empty()) (void)fs->SyncDir(job_dir);
}

}  // namespace cairn
