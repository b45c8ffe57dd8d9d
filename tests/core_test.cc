// Status/Result, dtypes, options from the environment, and the FileSystem seam with its
// fault-injecting wrapper.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>

#include "cairn/dtype.h"
#include "cairn/options.h"
#include "cairn/status.h"
#include "core/arith.h"
#include "core/bytes.h"
#include "core/filesystem.h"
#include "core/trusted_path.h"
#include "testing/fault_injection_filesystem.h"
#include "tests/test_util.h"
#include "wire/codec.h"

namespace cairn {
namespace {

Result<int> Half(int v) {
  if (v % 2) return Status::InvalidArgument(std::to_string(v) + " is odd");
  return v / 2;
}

Result<int> Quarter(int v) {
  CAIRN_ASSIGN_OR_RETURN(int h, Half(v));
  CAIRN_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(Status, ResultPropagatesErrors) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().ToString(), "InvalidArgument: 3 is odd");
  EXPECT_EQ(Status::FromErrno(ENOSPC, "write x").code(), StatusCode::kNoSpace);
  EXPECT_EQ(Status::FromErrno(EIO, "write x").code(), StatusCode::kIOError);
  EXPECT_EQ(Status::IOError("b").WithContext("a").message(), "a: b");
  EXPECT_TRUE(Status::OK().WithContext("a").ok());
  // A Result may not hold an OK status without a value.
  Result<int> bad(Status::OK());
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInternal);
}

TEST(Arith, RoundingNeverWrapsNearTheTypesMaximum) {
  EXPECT_EQ(CeilDiv<uint64_t>(0, 8), 0u);
  EXPECT_EQ(CeilDiv<uint64_t>(1, 8), 1u);
  EXPECT_EQ(CeilDiv<uint64_t>(8, 8), 1u);
  EXPECT_EQ(CeilDiv<uint64_t>(9, 8), 2u);
  EXPECT_EQ(CeilDiv<int64_t>(17, 4), 5);
  // (v + d - 1) / d wraps here and gives 0 or 1; the answer is 2^63 and 2^64 / 3 rounded up.
  constexpr uint64_t kMax = ~uint64_t{0};
  EXPECT_EQ(CeilDiv(kMax, uint64_t{2}), uint64_t{1} << 63);
  EXPECT_EQ(CeilDiv(kMax, uint64_t{3}), kMax / 3);  // 2^64 - 1 is a multiple of 3
  EXPECT_EQ(CeilDiv(kMax - 1, kMax), 1u);
  EXPECT_EQ(RoundUp<uint64_t>(0, 4096), 0u);
  EXPECT_EQ(RoundUp<uint64_t>(1, 4096), 4096u);
  EXPECT_EQ(RoundUp<uint64_t>(4096, 4096), 4096u);
  EXPECT_EQ(RoundUp<int64_t>(4097, 4096), 8192);
  EXPECT_EQ(RoundUp(kMaxFileOffset - 1, kMaxChunkBytes), kMaxFileOffset);
}

TEST(ByteReader, AFailedGetConsumesNothing) {
  ByteWriter w;
  w.Put<uint32_t>(7);
  w.PutString("abcdef");
  const std::string bytes = w.out();
  ByteReader r(std::string_view(bytes).substr(0, bytes.size() - 1));  // the string cut short
  uint32_t v = 0;
  ASSERT_TRUE(r.Get(&v));
  const size_t left = r.remaining();
  std::string s;
  EXPECT_FALSE(r.GetString(&s, 100));
  EXPECT_EQ(r.remaining(), left);
  ByteReader whole(bytes);
  ASSERT_TRUE(whole.Get(&v));
  EXPECT_FALSE(whole.GetString(&s, 3));  // longer than allowed
  EXPECT_EQ(whole.remaining(), left + 1);
  ASSERT_TRUE(whole.GetString(&s, 100));
  EXPECT_EQ(s, "abcdef");
}

// The codec of messages between ranks: a message cut short, with a bit flipped, or of
// another type is a Corruption naming what was expected, never a half-read message.
TEST(Wire, AMessageCutShortDamagedOrOfAnotherTypeIsRefused) {
  wire::PersistOffer offer;
  offer.set_newest_mark(3);
  for (int64_t s : {20, 30}) offer.add_held()->set_step(s);
  const std::string bytes = wire::Encode(offer);
  auto back = wire::Decode<wire::PersistOffer>(bytes, "offer");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->newest_mark(), 3u);
  ASSERT_EQ(back->held_size(), 2);
  EXPECT_EQ(back->held(1).step(), 30);
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto cut = wire::Decode<wire::PersistOffer>(bytes.substr(0, n), "offer");
    EXPECT_EQ(cut.status().code(), StatusCode::kCorruption) << n;
    std::string flipped = bytes;
    flipped[n] ^= 1;
    EXPECT_FALSE(wire::Decode<wire::PersistOffer>(flipped, "offer").ok()) << n;
  }
  auto other = wire::Decode<wire::Inventory>(bytes, "inventory from rank 2");
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("inventory from rank 2"), std::string::npos)
      << other.status().ToString();
  // Statuses travel with their code and message.
  wire::StatusMessage sm;
  wire::ToWire(Status::NotFound("no version"), &sm);
  EXPECT_EQ(wire::FromWire(sm).code(), StatusCode::kNotFound);
  EXPECT_EQ(wire::FromWire(sm).message(), "no version");
  sm.set_code(9999);
  EXPECT_EQ(wire::FromWire(sm).code(), StatusCode::kInternal);
}

TEST(DType, SizesNamesAndParsing) {
  const std::map<DType, size_t> sizes = {
      {DType::kF64, 8},    {DType::kF32, 4},    {DType::kF16, 2}, {DType::kBF16, 2},
      {DType::kF8E4M3, 1}, {DType::kF8E5M2, 1}, {DType::kI64, 8}, {DType::kI32, 4},
      {DType::kI16, 2},    {DType::kI8, 1},     {DType::kU8, 1},  {DType::kBool, 1}};
  for (auto [t, n] : sizes) {
    EXPECT_EQ(DTypeSize(t), n) << DTypeName(t);
    EXPECT_EQ(ParseDType(DTypeName(t)), t);
    EXPECT_TRUE(IsValidDType(static_cast<uint8_t>(t)));
  }
  EXPECT_EQ(ParseDType("bf16"), DType::kBF16);
  EXPECT_EQ(ParseDType("float8_e4m3fn"), DType::kF8E4M3);
  EXPECT_FALSE(ParseDType("complex64").has_value());
  EXPECT_FALSE(IsValidDType(0));
  EXPECT_FALSE(IsValidDType(200));
  EXPECT_EQ(DTypeSize(static_cast<DType>(99)), 0u);
}

struct FakeEnv {
  std::map<std::string, std::string> vars;
  std::function<const char*(const char*)> fn() {
    return [this](const char* k) -> const char* {
      auto it = vars.find(k);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

TEST(Options, DefaultsWhenNothingIsSet) {
  FakeEnv env;
  auto o = Options::FromEnvironment(env.fn());
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->rank, 0);
  EXPECT_EQ(o->world_size, 1);
  EXPECT_EQ(o->slots, 3);
  EXPECT_EQ(o->host_root, "/dev/shm/cairn-" + std::to_string(::geteuid()));  // one per user
  EXPECT_EQ(o->job_id, "default");
  EXPECT_EQ(o->chunk_bytes, 4u << 20);
  EXPECT_EQ(o->full_policy, FullPolicy::kSkip);
  EXPECT_EQ(o->log_level, LogLevel::kWarning);
}

// CAIRN_LOG_LEVEL takes the level's name, and the numbers it took when it was an int.
TEST(Options, LogLevelByNameOrNumber) {
  for (auto [text, want] :
       {std::pair{"error", LogLevel::kError}, std::pair{"0", LogLevel::kError},
        std::pair{"info", LogLevel::kInfo}, std::pair{"2", LogLevel::kInfo},
        std::pair{"debug", LogLevel::kDebug}, std::pair{"3", LogLevel::kDebug}}) {
    FakeEnv env;
    env.vars = {{"CAIRN_LOG_LEVEL", text}};
    auto o = Options::FromEnvironment(env.fn());
    ASSERT_TRUE(o.ok()) << text << ": " << o.status().ToString();
    EXPECT_EQ(o->log_level, want) << text;
  }
}

TEST(Options, TorchrunVariablesAndCairnOverrides) {
  FakeEnv env;
  env.vars = {{"RANK", "5"},
              {"WORLD_SIZE", "8"},
              {"LOCAL_RANK", "1"},
              {"LOCAL_WORLD_SIZE", "4"},
              {"TORCHELASTIC_RUN_ID", "run7"},
              {"CAIRN_SLOTS", "5"},
              {"CAIRN_CHUNK_BYTES", "8M"},
              {"CAIRN_FULL_POLICY", "block"},
              {"CAIRN_SLOT_BYTES", "1G"},
              {"CAIRN_PERSIST_EVERY", "5"},
              {"CAIRN_KEEP_ON_PFS", "2"},
              {"CAIRN_PERSIST_THREADS", "3"},
              {"CAIRN_PERSIST_DIRECT", "1"},
              {"CAIRN_PERSIST_PRIORITY", "low"},
              {"CAIRN_PERSIST_RATE", "200M"},
              {"CAIRN_REPLICATE_PRIORITY", "idle"},
              {"CAIRN_RESTORE_HUGE_PAGES", "0"},
              {"CAIRN_CUT_TEMPLATE_MIN_LAYOUTS", "0"}};
  auto o = Options::FromEnvironment(env.fn());
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->rank, 5);
  EXPECT_EQ(o->local_rank, 1);
  EXPECT_EQ(o->node, 1);  // RANK / LOCAL_WORLD_SIZE
  EXPECT_EQ(o->job_id, "run7");
  EXPECT_EQ(o->slots, 5);
  EXPECT_EQ(o->chunk_bytes, 8u << 20);
  EXPECT_EQ(o->slot_bytes, 1ull << 30);
  EXPECT_EQ(o->full_policy, FullPolicy::kBlock);
  EXPECT_EQ(o->persist_every, 5);
  EXPECT_EQ(o->keep_on_pfs, 2);
  EXPECT_EQ(o->persist_threads, 3);
  EXPECT_TRUE(o->persist_direct);
  EXPECT_EQ(o->persist_priority, BackgroundPriority::kLow);
  EXPECT_EQ(o->persist_rate, 200ull << 20);
  EXPECT_EQ(o->replicate_priority, BackgroundPriority::kIdle);
  EXPECT_EQ(o->restore_huge_pages, RestoreHugePages::kOff);
  EXPECT_EQ(o->cut_template_min_layouts, 0);
  env.vars["CAIRN_RANK"] = "6";
  env.vars["CAIRN_NODE"] = "3";
  env.vars["CAIRN_JOB_ID"] = "mine";
  o = Options::FromEnvironment(env.fn());
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->rank, 6);
  EXPECT_EQ(o->node, 3);
  EXPECT_EQ(o->job_id, "mine");
}

// Under mpirun (OMPI_COMM_WORLD_*) or srun (SLURM_*) a rank needs no CAIRN_* variable;
// torchrun's names come first, and CAIRN_* over all.
TEST(Options, LauncherVariablesInOrder) {
  FakeEnv env;
  env.vars = {{"OMPI_COMM_WORLD_RANK", "5"},
              {"OMPI_COMM_WORLD_SIZE", "8"},
              {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
              {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
              {"SLURM_PROCID", "7"},
              {"SLURM_NODEID", "0"}};
  auto o = Options::FromEnvironment(env.fn());
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->rank, 5);
  EXPECT_EQ(o->world_size, 8);
  EXPECT_EQ(o->local_rank, 1);
  EXPECT_EQ(o->local_world_size, 4);
  EXPECT_EQ(o->node, 0);  // SLURM_NODEID
  EXPECT_EQ(o->bootstrap, BootstrapKind::kAuto);
  env.vars["RANK"] = "6";
  env.vars["CAIRN_BOOTSTRAP"] = "files";
  o = Options::FromEnvironment(env.fn());
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->rank, 6);
  EXPECT_EQ(o->bootstrap, BootstrapKind::kFiles);
  env.vars["CAIRN_RANK"] = "2";
  env.vars["OMPI_COMM_WORLD_SIZE"] = "x";
  o = Options::FromEnvironment(env.fn());
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("OMPI_COMM_WORLD_SIZE='x'"), std::string::npos)
      << o.status().message();
  env.vars["OMPI_COMM_WORLD_SIZE"] = "8";
  env.vars["CAIRN_BOOTSTRAP"] = "mpi";
  o = Options::FromEnvironment(env.fn());
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("CAIRN_BOOTSTRAP='mpi': use auto, pmix or files"),
            std::string::npos)
      << o.status().message();
}

TEST(Options, BadValuesNameTheVariable) {
  const std::vector<std::pair<std::string, std::string>> bad{{"CAIRN_SLOTS", "1"},
                                                             {"CAIRN_SLOTS", "two"},
                                                             {"RANK", "-1"},
                                                             {"CAIRN_CHUNK_BYTES", "4X"},
                                                             {"CAIRN_FULL_POLICY", "sometimes"},
                                                             {"CAIRN_COPY_ENGINE", "gpu"},
                                                             {"CAIRN_LOG_LEVEL", "4"},
                                                             {"CAIRN_LOG_LEVEL", "verbose"},
                                                             {"CAIRN_JOB_ID", "../etc"},
                                                             {"CAIRN_PERSIST_EVERY", "-1"},
                                                             {"CAIRN_KEEP_ON_PFS", "0"},
                                                             {"CAIRN_PERSIST_DIRECT", "yes"},
                                                             {"CAIRN_PERSIST_PRIORITY", "high"},
                                                             {"CAIRN_PERSIST_RATE", "fast"},
                                                             {"CAIRN_REPLICATE_PRIORITY", "high"},
                                                             {"CAIRN_RESTORE_HUGE_PAGES", "yes"},
                                                             {"WORLD_SIZE", "0"}};
  for (const auto& [k, v] : bad) {
    FakeEnv env;
    env.vars[k] = v;
    auto o = Options::FromEnvironment(env.fn());
    ASSERT_FALSE(o.ok()) << k << "=" << v;
    EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
    const std::string m = o.status().message();
    const bool named = m.find(k) != std::string::npos || m.find("job id") != std::string::npos ||
                       m.find("rank") != std::string::npos;
    EXPECT_TRUE(named) << k << ": " << m;
  }
  FakeEnv env;
  env.vars = {{"RANK", "4"}, {"WORLD_SIZE", "4"}};
  EXPECT_FALSE(Options::FromEnvironment(env.fn()).ok());
}

TEST(FileSystem, WriteFileAtomicPublishesWholeFiles) {
  testing::TempDir dir("fs");
  FileSystem* fs = DefaultFileSystem();
  const std::string path = JoinPath(dir.path(), "f");
  ASSERT_TRUE(WriteFileAtomic(fs, path, "hello").ok());
  EXPECT_EQ(*ReadWholeFile(fs, path, 100), "hello");
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto big = ReadWholeFile(fs, path, 3);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find(path), std::string::npos);
  EXPECT_EQ(ReadWholeFile(fs, path + "x", 3).status().code(), StatusCode::kNotFound);
}

// SQLite style: fail the 1st, 2nd, ... call of an atomic publish, once and persistently;
// the old contents must survive and no temporary file may remain.
TEST(FileSystem, AtomicWriteSurvivesEveryInjectedFault) {
  testing::TempDir dir("fsfault");
  FaultInjectionFileSystem fs(DefaultFileSystem());
  const std::string path = JoinPath(dir.path(), "f");
  ASSERT_TRUE(WriteFileAtomic(&fs, path, "old").ok());
  for (int err : {EIO, ENOSPC}) {
    for (bool persistent : {false, true}) {
      for (uint64_t n = 1;; ++n) {
        fs.FailNth(n, err, persistent);
        Status st = WriteFileAtomic(&fs, path, "new contents");
        fs.Disarm();
        auto now = ReadWholeFile(DefaultFileSystem(), path, 100);
        ASSERT_TRUE(now.ok());
        if (st.ok()) {
          EXPECT_EQ(*now, "new contents");
        } else {
          // Either the old file or, when only the directory fsync failed, the new one.
          EXPECT_TRUE(*now == "old" || *now == "new contents") << *now;
          if (err == ENOSPC) {
            EXPECT_EQ(st.code(), StatusCode::kNoSpace) << st.ToString();
          }
        }
        auto names = DefaultFileSystem()->ListDir(dir.path());
        ASSERT_TRUE(names.ok());
        for (const auto& name : *names) {
          // A single fault never leaves a temporary (the cleanup unlink works); a persistent
          // one may also fail the cleanup, and the next publish reuses the name.
          if (!persistent) {
            ASSERT_EQ(name.find(".tmp."), std::string::npos) << "after fault " << n;
          }
        }
        ASSERT_TRUE(WriteFileAtomic(&fs, path, "old").ok());
        names = DefaultFileSystem()->ListDir(dir.path());
        ASSERT_EQ(names->size(), 1u) << "a temporary survived the next publish";
        if (st.ok()) break;
        ASSERT_LT(n, 20u) << "never succeeded";
      }
    }
  }
}

// rename(2) answering EEXIST (a GlusterFS distributed volume with a stale link file left by
// a storage server that died mid-rename: every later commit of LATEST failed so) is met
// by publishing under another temporary name; an EEXIST that never ends still fails,
// naming the rename, with the old contents intact and no temporary left.
TEST(FileSystem, AnAtomicWriteWhoseRenameAnswersEexistTriesAnotherTemporaryName) {
  testing::TempDir dir("fseexist");
  FaultInjectionFileSystem fs(DefaultFileSystem());
  const std::string path = JoinPath(dir.path(), "LATEST");
  ASSERT_TRUE(WriteFileAtomic(&fs, path, "old").ok());
  for (const bool persistent : {false, true}) {
    SCOPED_TRACE(persistent ? "every rename" : "the first rename");
    fs.FailNth(1, EEXIST, persistent, kFsRename);
    Status st = WriteFileAtomic(&fs, path, "new");
    fs.Disarm();
    auto now = ReadWholeFile(DefaultFileSystem(), path, 100);
    ASSERT_TRUE(now.ok());
    if (persistent) {
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.error_number(), EEXIST) << st.ToString();
      EXPECT_NE(st.message().find("rename"), std::string::npos) << st.ToString();
      EXPECT_EQ(*now, "old");
    } else {
      EXPECT_TRUE(st.ok()) << st.ToString();
      EXPECT_EQ(*now, "new");
    }
    auto names = DefaultFileSystem()->ListDir(dir.path());
    ASSERT_TRUE(names.ok());
    EXPECT_EQ(names->size(), 1u) << "a temporary was left";
    ASSERT_TRUE(WriteFileAtomic(&fs, path, "old").ok());
  }
}

// A File closes its descriptor exactly once, wherever it is moved; Close() errors name the
// file; the helpers leave no descriptor open on any path, errors included.
TEST(FileSystem, FilesCloseTheirDescriptorOnceWhereverTheyGo) {
  testing::TempDir dir("fsfile");
  CountingFileSystem fs(DefaultFileSystem());
  const std::string a_path = JoinPath(dir.path(), "a"), b_path = JoinPath(dir.path(), "b");
  {
    auto a = fs.OpenFile(a_path, O_RDWR | O_CREAT, 0600);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    File moved = std::move(*a);
    EXPECT_FALSE(a->is_open());
    auto b = fs.OpenFile(b_path, O_RDWR | O_CREAT, 0600);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(fs.open(), 2);
    *b = std::move(moved);  // closes b's own descriptor
    EXPECT_EQ(fs.open(), 1);
    EXPECT_EQ(b->path(), a_path);
    ASSERT_TRUE(b->WriteAt("xy", 2, 0).ok());
    ASSERT_TRUE(b->Close().ok());
    ASSERT_TRUE(b->Close().ok());  // closing twice is a no-op
  }
  EXPECT_EQ(fs.open(), 0);
  EXPECT_EQ(fs.closed(), 2);

  fs.FailCloses(EIO);
  {
    auto f = fs.OpenFile(a_path, O_RDONLY, 0);
    ASSERT_TRUE(f.ok());
    Status st = f->Close();
    EXPECT_EQ(st.code(), StatusCode::kIOError);
    EXPECT_NE(st.message().find(a_path), std::string::npos) << st.ToString();
  }
  Status st = WriteFileAtomic(&fs, b_path, "new");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(b_path + ".tmp."), std::string::npos) << st.ToString();
  fs.FailCloses(0);
  EXPECT_FALSE(ReadWholeFile(&fs, a_path, 1).ok());  // too large: refused
  EXPECT_EQ(*ReadWholeFile(&fs, a_path, 2), "xy");
  EXPECT_EQ(fs.open(), 0);
}

TEST(FileSystem, MakeDirsAndRemoveAll) {
  testing::TempDir dir("fsdirs");
  FileSystem* fs = DefaultFileSystem();
  const std::string deep = JoinPath(dir.path(), "a/b/c");
  ASSERT_TRUE(fs->MakeDirs(deep, 0700).ok());
  ASSERT_TRUE(WriteFileAtomic(fs, JoinPath(deep, "x"), "1").ok());
  ASSERT_TRUE(fs->MakeDirs(deep, 0700).ok());  // exists: fine
  ASSERT_TRUE(fs->RemoveAll(JoinPath(dir.path(), "a")).ok());
  EXPECT_FALSE(fs->Exists(JoinPath(dir.path(), "a")));
  EXPECT_TRUE(fs->RemoveAll(JoinPath(dir.path(), "a")).ok());
}

// What counts as this user's own (core/trusted_path.h). Another user is played by chown to
// an unused uid, which only root can do.
constexpr uid_t kOtherUid = 61234;
#define CAIRN_REQUIRE_ROOT() \
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: another user is played by chown"

std::string Mk(const std::string& path, mode_t mode, uid_t owner) {
  EXPECT_EQ(::mkdir(path.c_str(), 0700), 0) << path;
  EXPECT_EQ(::chmod(path.c_str(), mode), 0) << path;  // exactly, whatever the umask
  EXPECT_EQ(::chown(path.c_str(), owner, owner), 0) << path;
  return path;
}

TEST(TrustedPath, APrivateTreeRefusesWhatAnotherUserMadeOrCanWriteAndNamesIt) {
  CAIRN_REQUIRE_ROOT();
  testing::TempDir dir("trust");
  FileSystem* fs = DefaultFileSystem();
  const std::string remedy = "use a directory of your own";
  struct Case {
    std::string top;
    std::string want;  // in the error ("" = accepted)
  };
  const std::string d = dir.path();
  std::vector<Case> cases = {
      {Mk(d + "/theirs-open", 0777, kOtherUid), "uid 61234"},  // the root
      {Mk(d + "/theirs-closed", 0755, kOtherUid), "belongs to another user"},
      {Mk(d + "/mine-group", 0770, 0), "can be written by other users"},
      {Mk(d + "/sticky", 01777, kOtherUid) + "/mine", ""},  // like /dev/shm: fine below
      {Mk(d + "/open", 0777, 0) + "/mine", "can be written by any user, who could replace"},
      {Mk(d + "/mine", 0700, 0), ""},
  };
  ASSERT_EQ(::symlink(Mk(d + "/linked", 0700, 0).c_str(), (d + "/link").c_str()), 0);
  cases.push_back({d + "/link", "is a symbolic link"});
  for (const Case& c : cases) {
    Status st = MakeTrustedDirs(fs, c.top, c.top + "/job/node-0", TreeKind::kPrivate, remedy);
    if (c.want.empty()) {
      EXPECT_TRUE(st.ok()) << c.top << ": " << st.ToString();
      continue;
    }
    ASSERT_FALSE(st.ok()) << c.top;
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
    EXPECT_NE(st.message().find(c.want), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find(remedy), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find(" mode "), std::string::npos) << st.ToString();
    EXPECT_FALSE(fs->Exists(c.top + "/job")) << c.top << ": written to before it was checked";
  }
  // A directory below the top that another user made first is refused too.
  const std::string top = Mk(d + "/top", 0700, 0);
  Mk(top + "/job", 0777, kOtherUid);
  Status st = MakeTrustedDirs(fs, top, top + "/job/node-0", TreeKind::kPrivate, remedy);
  EXPECT_NE(st.message().find(top + "/job ("), std::string::npos) << st.ToString();
  // A shared tree (the PFS) trusts a group that can write, never the world.
  EXPECT_TRUE(MakeTrustedDirs(fs, Mk(d + "/proj", 02770, kOtherUid), d + "/proj/job",
                              TreeKind::kShared, remedy)
                  .ok());
  EXPECT_FALSE(MakeTrustedDirs(fs, Mk(d + "/world", 0777, kOtherUid), d + "/world/job",
                               TreeKind::kShared, remedy)
                   .ok());
}

TEST(TrustedPath, OnlyThisUsersOwnPrivateRegularFilesAreOpened) {
  CAIRN_REQUIRE_ROOT();
  testing::TempDir dir("trustf");
  FileSystem* fs = DefaultFileSystem();
  auto make = [&](const std::string& name, mode_t mode, uid_t owner) {
    const std::string p = dir.path() + "/" + name;
    EXPECT_TRUE(WriteFileAtomic(fs, p, "bytes").ok());
    EXPECT_EQ(::chmod(p.c_str(), mode), 0);
    EXPECT_EQ(::chown(p.c_str(), owner, owner), 0);
    return p;
  };
  const std::string mine = make("mine", 0600, 0);
  auto ok = ReadOwnFile(fs, mine, 100);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(*ok, "bytes");
  ASSERT_EQ(::symlink(mine.c_str(), (dir.path() + "/link").c_str()), 0);
  ASSERT_EQ(::mkfifo((dir.path() + "/fifo").c_str(), 0600), 0);  // must not block the open
  const std::vector<std::pair<std::string, std::string>> refused = {
      {make("theirs", 0600, kOtherUid), "is not a file of this user"},
      {make("theirs-open", 0666, kOtherUid), "uid 61234"},
      {make("readable", 0644, 0), "can be read or written by other users"},
      {dir.path() + "/link", "is a symbolic link"},
      {dir.path() + "/fifo", "is not a regular file"},
  };
  for (const auto& [path, want] : refused) {
    auto r = ReadOwnFile(fs, path, 100);
    ASSERT_FALSE(r.ok()) << path;
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().ToString();
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().ToString();
  }
  // Writing never goes through a link someone put where a temporary file will be made.
  const std::string target = make("target", 0600, 0);
  const std::string out = dir.path() + "/published";
  ASSERT_EQ(::symlink(target.c_str(), (out + ".tmp." + std::to_string(::getpid())).c_str()), 0);
  ASSERT_TRUE(WriteFileAtomic(fs, out, "new").ok());
  EXPECT_EQ(*ReadOwnFile(fs, target, 100), "bytes") << "wrote through the planted link";
  EXPECT_EQ(*ReadOwnFile(fs, out, 100), "new");
}

}  // namespace
}  // namespace cairn
