#include "redundancy/parity_store.h"

#include <fcntl.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/arith.h"
#include "core/bytes.h"
#include "core/checksum.h"
#include "core/clock.h"
#include "core/trusted_path.h"
#include "tiers/slot_header.h"

namespace cairn {
namespace {

constexpr uint64_t kMagic = 0x5954495241504e43ull;  // "CNPARITY"
// 2: Reed-Solomon rows scaled to start with ones (redundancy/erasure.h); a format-1 record
// is read only under XOR, whose parity did not change. 3: the parity's scale
// (ParityRecord::scale; 1 in formats 1 and 2).
constexpr uint32_t kFormat = 3;
constexpr uint64_t kMaxMetaBytes = uint64_t{1} << 32;
// Unfinished records of one (stripe, row) at most (ParityStore::Begin).
constexpr size_t kMaxAccumulating = 6;

// "s<stripe>-p<row>-t": the start of the names of a (stripe, row)'s records.
std::string Stem(int stripe, int row) {
  return "s" + std::to_string(stripe) + "-p" + std::to_string(row) + "-t";
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string EncodeParityRecord(const ParityRecord& r) {
  ByteWriter w;
  w.Put(kMagic);
  w.Put(kFormat);
  w.Put(static_cast<uint32_t>(r.scheme.k));
  w.Put(static_cast<uint32_t>(r.scheme.m));
  w.Put(static_cast<uint32_t>(r.key.stripe));
  w.Put(static_cast<uint32_t>(r.key.row));
  w.Put(r.key.step);
  w.Put(r.world_size);
  w.Put(r.parity_bytes);
  w.Put(r.parity_checksum);
  w.Put(static_cast<uint32_t>(r.scale));
  w.Put(static_cast<uint32_t>(r.pieces.size()));
  for (const ParityPiece& p : r.pieces) {
    w.Put(static_cast<int32_t>(p.source));
    w.Put(p.data_bytes);
    w.PutString(p.header);
  }
  std::string& body = w.out();
  const uint64_t sum = Checksum(body.data(), body.size());
  w.Put(sum);
  return std::move(w.out());
}

Result<ParityRecord> DecodeParityRecord(std::string_view bytes, const std::string& from) {
  auto bad = [&](const std::string& why) {
    return Status::Corruption("parity record " + from + ": " + why);
  };
  if (bytes.size() < 8) return bad("too short");
  const std::string_view body = bytes.substr(0, bytes.size() - 8);
  uint64_t sum = 0;
  std::memcpy(&sum, bytes.data() + body.size(), 8);
  if (Checksum(body.data(), body.size()) != sum) return bad("checksum mismatch");
  ByteReader rd(body);
  uint64_t magic = 0;
  uint32_t format = 0, k = 0, m = 0, stripe = 0, row = 0, n = 0, scale = 1;
  ParityRecord r;
  if (!rd.Get(&magic) || magic != kMagic) return bad("not a parity record");
  if (!rd.Get(&format) || format < 1 || format > kFormat)
    return bad("format " + std::to_string(format));
  if (!rd.Get(&k) || !rd.Get(&m) || !rd.Get(&stripe) || !rd.Get(&row) || !rd.Get(&r.key.step) ||
      !rd.Get(&r.world_size) || !rd.Get(&r.parity_bytes) || !rd.Get(&r.parity_checksum) ||
      (format >= 3 && !rd.Get(&scale)) || !rd.Get(&n))
    return bad("cut short");
  if (scale == 0 || scale > 255) return bad("scale " + std::to_string(scale));
  r.scale = static_cast<unsigned char>(scale);
  r.scheme = {static_cast<int>(std::min<uint32_t>(k, 1u << 16)),
              static_cast<int>(std::min<uint32_t>(m, 1u << 16))};
  CAIRN_RETURN_IF_ERROR(ValidateErasureScheme(r.scheme).WithContext("parity record " + from));
  if (format == 1 && m != 1)
    return bad("format 1 Reed-Solomon parity (made with another matrix by an older cairn)");
  if (stripe >= k || row >= m || n != k - m || r.key.step < 0 || r.world_size == 0 ||
      r.parity_bytes > kMaxFileOffset)
    return bad("fields out of range");
  r.key.stripe = static_cast<int>(stripe);
  r.key.row = static_cast<int>(row);
  for (uint32_t j = 0; j < n; ++j) {
    ParityPiece p;
    int32_t source = 0;
    if (!rd.Get(&source) || !rd.Get(&p.data_bytes) || !rd.GetString(&p.header, kMaxSlotHeaderBytes))
      return bad("cut short in piece " + std::to_string(j));
    if (source < 0 || static_cast<uint32_t>(source) >= r.world_size ||
        p.data_bytes > kMaxFileOffset ||
        PieceBytes(p.data_bytes, static_cast<int>(n)) > r.parity_bytes)
      return bad("piece " + std::to_string(j) + " out of range");
    p.source = source;
    r.pieces.push_back(std::move(p));
  }
  if (rd.remaining() != 0) return bad("trailing bytes");
  return r;
}

ParityStore::ParityStore(std::string node_dir, int holder_rank, FileSystem* fs, const Logger* log,
                         std::string host_root, int keep)
    : dir_(Dir(node_dir, holder_rank)),
      host_root_(std::move(host_root)),
      fs_(fs),
      log_(log),
      keep_(std::max(1, keep)) {}

ParityStore::~ParityStore() = default;

std::string ParityStore::Dir(const std::string& node_dir, int holder_rank) {
  return JoinPath(JoinPath(node_dir, "parity"), "rank-" + std::to_string(holder_rank));
}

std::string ParityStore::Base(const ParityKey& k) const {
  return JoinPath(dir_, Stem(k.stripe, k.row) + std::to_string(k.step));
}

Result<const ErasureCode*> ParityStore::CodeFor(const ErasureScheme& s) {
  auto& slot = codes_[{s.k, s.m}];
  if (!slot) {
    CAIRN_ASSIGN_OR_RETURN(ErasureCode code, ErasureCode::Make(s));
    slot = std::make_unique<ErasureCode>(std::move(code));
  }
  return slot.get();
}

void ParityStore::RemoveRecord(const ParityKey& k) {
  (void)fs_->Unlink(Base(k) + ".meta");  // first: the record is gone before its bytes
  (void)fs_->Unlink(Base(k) + ".parity");
}

void ParityStore::Drop(const ParityKey& k, const std::string& why) {
  auto it = accumulating_.find(k);
  if (it == accumulating_.end()) return;
  if (log_)
    log_->Debug("parity of stripe " + std::to_string(k.stripe) + " step " + std::to_string(k.step) +
                " dropped: " + why);
  accumulating_.erase(it);
  RemoveRecord(k);
}

Status ParityStore::Begin(const ErasureScheme& scheme, uint32_t world_size, const ParityKey& key,
                          int j, const ParityPiece& piece, uint64_t piece_bytes,
                          int64_t keep_step) {
  MutexLock lk(mu_);
  int64_t& keep = keep_step_[{key.stripe, key.row}];
  const bool newer_agreed = keep_step > keep;
  keep = std::max(keep, keep_step);
  if (!dir_ready_) {
    CAIRN_RETURN_IF_ERROR(MakeTrustedDirs(fs_, host_root_.empty() ? dir_ : host_root_, dir_,
                                          TreeKind::kPrivate,
                                          "use a host directory only this user can write"));
    // What a killed process left half made: parity files without a record.
    auto names = fs_->ListDir(dir_);
    if (names.ok()) {
      for (const std::string& n : *names) {
        const bool orphan = (EndsWith(n, ".parity") &&
                             !fs_->Exists(JoinPath(dir_, n.substr(0, n.size() - 7) + ".meta"))) ||
                            n.find(".tmp.") != std::string::npos;
        if (orphan) (void)fs_->Unlink(JoinPath(dir_, n));
      }
    }
    dir_ready_ = true;
  }
  CAIRN_ASSIGN_OR_RETURN(const ErasureCode* code, CodeFor(scheme));
  const int d = scheme.data();
  if (j < 0 || j >= d || key.row < 0 || key.row >= scheme.m || key.stripe < 0 ||
      key.stripe >= scheme.k)
    return Status::InvalidArgument("parity piece " + std::to_string(j) + " of stripe " +
                                   std::to_string(key.stripe) + " row " + std::to_string(key.row) +
                                   " is not in " + scheme.Describe());
  auto it = accumulating_.find(key);
  if (it == accumulating_.end()) {
    // An unfinished record holds pieces whose senders were told they were kept: it goes only
    // once the job agreed on a newer step (the members keep that one, so no restore needs
    // this one), or, as a bound on memory, when kMaxAccumulating newer ones started.
    std::vector<ParityKey> same;
    for (const auto& [k, a] : accumulating_)
      if (k.stripe == key.stripe && k.row == key.row) same.push_back(k);
    for (const ParityKey& k : same)
      if (k.step < keep) Drop(k, "the job agreed on a newer step");
    std::erase_if(same, [&](const ParityKey& k) { return k.step < keep; });
    while (same.size() >= kMaxAccumulating) {
      if (log_)
        log_->Warning("parity of stripe " + std::to_string(same.front().stripe) + " step " +
                      std::to_string(same.front().step) +
                      " dropped unfinished: " + std::to_string(kMaxAccumulating) +
                      " newer steps of its stripe started first (a member of the set fell "
                      "behind?)");
      Drop(same.front(), "too many newer steps started");
      same.erase(same.begin());
    }
    // A newer agreed step: the published records older than it go now, before this one
    // takes its memory, not when it is published (the job holds the agreed step's parity and
    // the one being made, not a third).
    if (newer_agreed) Prune(key.stripe, key.row);
    Accumulating a;
    a.record.scheme = scheme;
    a.record.key = key;
    a.record.world_size = world_size;
    a.record.pieces.resize(static_cast<size_t>(d));
    a.added.assign(static_cast<size_t>(d), false);
    a.code = code;
    a.started_ns = NowNanos();
    RemoveRecord(key);  // an older publication of the same step (a restarted sender)
    CAIRN_ASSIGN_OR_RETURN(a.file, MappedFile::Open(fs_, Base(key) + ".parity"));
    it = accumulating_.emplace(key, std::move(a)).first;
  }
  Accumulating& a = it->second;
  if (a.record.scheme.k != scheme.k || a.record.scheme.m != scheme.m ||
      a.record.world_size != world_size)
    return Status::FailedPrecondition("parity of stripe " + std::to_string(key.stripe) + " step " +
                                      std::to_string(key.step) +
                                      " is being made for another scheme or job size");
  if (a.added[static_cast<size_t>(j)] || a.open)
    return Status::FailedPrecondition("piece " + std::to_string(j) + " of stripe " +
                                      std::to_string(key.stripe) + " step " +
                                      std::to_string(key.step) + " was already added");
  if (piece_bytes > a.file->size()) {
    // Growing keeps the bytes added so far; the new tail reads as zeros. Mappings come in
    // whole pages.
    CAIRN_RETURN_IF_ERROR(a.file->Resize(RoundUp(piece_bytes, uint64_t{4096})));
  }
  a.record.parity_bytes = std::max(a.record.parity_bytes, piece_bytes);
  a.record.pieces[static_cast<size_t>(j)] = piece;
  a.open = j;
  return Status::OK();
}

void ParityStore::Add(const ParityKey& key, int j, uint64_t offset, const std::byte* bytes,
                      uint64_t n) {
  MutexLock lk(mu_);
  auto it = accumulating_.find(key);
  if (it == accumulating_.end() || it->second.open != j) return;
  Accumulating& a = it->second;
  if (a.in_place || offset > a.record.parity_bytes || n > a.record.parity_bytes - offset) return;
  // The first piece of a record sets the parity (its bytes are zeros until then); the
  // others add into it, times their coefficient over the record's scale.
  std::byte* at = a.file->data() + offset;
  if (std::find(a.added.begin(), a.added.end(), true) == a.added.end())
    a.code->SetParity(j, key.row, bytes, n, at);
  else
    ErasureCode::MultiplyAdd(ErasureCode::Divide(a.code->Coefficient(j, key.row), a.scale), bytes,
                             n, at);
}

std::byte* ParityStore::InPlace(const ParityKey& key, int j) {
  MutexLock lk(mu_);
  auto it = accumulating_.find(key);
  if (it == accumulating_.end() || it->second.open != j) return nullptr;
  Accumulating& a = it->second;
  if (std::find(a.added.begin(), a.added.end(), true) != a.added.end()) return nullptr;
  a.in_place = true;
  a.scale = a.code->Coefficient(j, key.row);
  return a.file->data();
}

Status ParityStore::End(const ParityKey& key, int j, bool ok) {
  MutexLock lk(mu_);
  auto it = accumulating_.find(key);
  if (it == accumulating_.end() || it->second.open != j) return Status::OK();
  Accumulating& a = it->second;
  a.open.reset();
  a.in_place = false;
  if (!ok) {  // (a first piece received in place leaves its scale to a record dropped)
    Drop(key, "piece " + std::to_string(j) + " did not arrive whole");
    return Status::OK();
  }
  a.added[static_cast<size_t>(j)] = true;
  if (std::find(a.added.begin(), a.added.end(), false) != a.added.end()) return Status::OK();
  Status st = Publish(a);
  if (!st.ok()) {
    Drop(key, st.message());
    return st;
  }
  accumulating_.erase(it);
  return Status::OK();
}

Status ParityStore::Publish(Accumulating& a) {
  ParityRecord& r = a.record;
  r.scale = a.scale;
  r.parity_checksum = Checksum(a.file->data(), r.parity_bytes);
  a.file->Persist(0, r.parity_bytes);
  a.file.reset();
  CAIRN_RETURN_IF_ERROR(WriteFileAtomic(fs_, Base(r.key) + ".meta", EncodeParityRecord(r)));
  Prune(r.key.stripe, r.key.row);
  return Status::OK();
}

void ParityStore::Prune(int stripe, int row) {
  // What may still be needed of this (stripe, row): the agreed step, and the newest `keep_`
  // newer ones (the agreement lags behind the pushes, and another set may not have the
  // newest step complete: a job restores the newest step complete in every set, which may be
  // any between the agreed one and the newest). Older ones go: the members keep the agreed
  // step, not older ones, and the job agreed on it only once every member's pieces of it
  // were acknowledged, so its parity is complete in every set.
  // (From the records' names: decoding every record, headers and all, on each publish
  // would read the whole store per version.)
  std::vector<int64_t> steps;
  auto names = fs_->ListDir(dir_);
  const std::string stem = Stem(stripe, row);
  for (const std::string& n : names.ok() ? *names : std::vector<std::string>{}) {
    if (n.rfind(stem, 0) != 0 || !EndsWith(n, ".meta")) continue;
    const std::string digits = n.substr(stem.size(), n.size() - stem.size() - 5);
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos ||
        digits.size() > 18)
      continue;
    steps.push_back(std::stoll(digits));
  }
  std::sort(steps.rbegin(), steps.rend());
  const auto found = keep_step_.find({stripe, row});
  const int64_t agreed = found == keep_step_.end() ? -1 : found->second;
  int newer = 0;
  for (int64_t s : steps) {
    const bool keep = s == agreed || (s > agreed && newer++ < keep_);
    if (!keep && !accumulating_.contains({stripe, row, s})) RemoveRecord({stripe, row, s});
  }
}

std::vector<ParityRecord> ParityStore::List() {
  MutexLock lk(mu_);
  return ListLocked();
}

std::vector<ParityRecord> ParityStore::ListLocked() {
  std::vector<ParityRecord> out;
  auto names = fs_->ListDir(dir_);
  if (!names.ok()) return out;
  for (const std::string& n : *names) {
    if (!EndsWith(n, ".meta")) continue;
    const std::string path = JoinPath(dir_, n);
    auto bytes = ReadOwnFile(fs_, path, kMaxMetaBytes);
    Result<ParityRecord> r =
        bytes.ok() ? DecodeParityRecord(*bytes, path) : Result<ParityRecord>(bytes.status());
    if (!r.ok()) {
      if (log_) log_->Warning("skipping parity record " + path + ": " + r.status().message());
      continue;
    }
    if (Base(r->key) + ".meta" != path) {
      if (log_) log_->Warning("skipping parity record " + path + ": it names another record");
      continue;
    }
    out.push_back(std::move(*r));
  }
  std::sort(out.begin(), out.end(),
            [](const ParityRecord& a, const ParityRecord& b) { return a.key < b.key; });
  return out;
}

Result<std::shared_ptr<const std::byte>> ParityStore::MapParity(const ParityRecord& r) {
  std::string path;
  {
    MutexLock lk(mu_);
    path = Base(r.key) + ".parity";
  }
  CAIRN_ASSIGN_OR_RETURN(File f, OpenOwnFile(fs_, path, O_RDONLY, 0));
  CAIRN_ASSIGN_OR_RETURN(uint64_t size, f.Size());
  if (size < r.parity_bytes)
    return Status::Corruption("parity " + path + " holds " + std::to_string(size) +
                              " bytes, its record says " + std::to_string(r.parity_bytes));
  const uint64_t n = r.parity_bytes;
  std::shared_ptr<const std::byte> bytes = std::make_shared<std::byte>();  // for 0 bytes
  if (n > 0) {
    // Populated in the same call: one system call, not a fault per page in the checksum.
    void* p = ::mmap(nullptr, n, PROT_READ, MAP_SHARED | MAP_POPULATE, f.fd(), 0);
    if (p == MAP_FAILED) return Status::FromErrno(errno, "mapping " + path);
    bytes.reset(static_cast<const std::byte*>(p),
                [n](const std::byte* q) { ::munmap(const_cast<std::byte*>(q), n); });
  }
  if (Checksum(bytes.get(), n) != r.parity_checksum)
    return Status::Corruption("parity " + path + " does not match its checksum");
  if (r.scale == 1 || n == 0) return bytes;
  void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return Status::FromErrno(errno, "scaling " + path);
  ErasureCode::Multiply(r.scale, bytes.get(), n, static_cast<std::byte*>(p));
  return std::shared_ptr<const std::byte>(
      static_cast<const std::byte*>(p),
      [n](const std::byte* q) { ::munmap(const_cast<std::byte*>(q), n); });
}

size_t ParityStore::accumulating() const {
  MutexLock lk(mu_);
  return accumulating_.size();
}

}  // namespace cairn
