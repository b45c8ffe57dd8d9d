// The composition root: Checkpointer::Impl builds the stages of a rank (host tier, copy
// engine, capture pipeline, UCX connections and collectives, replicator, persister) and
// wires them together; the stages know nothing of each other.
#include "cairn/checkpointer.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <unordered_set>

#include "api/channels.h"
#include "api/open_with.h"
#include "core/clock.h"
#include "core/host_pages.h"
#include "core/trace.h"
#include "persist/manifest.h"
#include "persist/persister.h"
#include "persist/slot_layout.h"
#include "recovery/rebuild.h"
#include "recovery/restore.h"
#include "recovery/tier_memory.h"
#include "recovery/ucx_transport.h"
#include "redundancy/host_memory.h"
#include "redundancy/replica_store.h"
#include "redundancy/replicator.h"
#include "snapshot/capture_pipeline.h"
#include "snapshot/copy_engine.h"
#include "snapshot/step_agreement.h"
#include "tiers/host_tier.h"
#include "transport/ucx_comm.h"
#include "transport/ucx_group.h"

namespace cairn {

class Checkpointer::Impl {
 public:
  Impl(Options options, FileSystems fs, std::unique_ptr<CopyEngine> engine)
      : options_(std::move(options)),
        fs_(fs.host ? fs.host : DefaultFileSystem()),
        pfs_fs_(fs.pfs ? fs.pfs : fs_),
        log_("cairn rank " + std::to_string(options_.rank), options_.log_level),
        engine_(std::move(engine)) {}
  ~Impl();

  Status Open();
  Status OpenTier(FileSystem* fs);
  Status OpenReplication(FileSystem* fs);
  // CAIRN_REDUNDANCY=xor|rs: the set, the parity store and the replicator in erasure mode.
  Status OpenErasure(FileSystem* fs, int nodes);
  void OpenPersister();
  std::string Who() const { return "rank " + std::to_string(options_.rank); }
  Result<RestoreReport> Restore(std::span<const ShardSpec> targets, const RestoreOptions& options);
  Status WaitReplicated(double timeout_s);
  Result<bool> WaitReplicated(int64_t step, double timeout_s);
  // FailedPrecondition for a job without replication (one node, or CAIRN_REPLICAS=0).
  Status NotReplicating() const;
  Result<int64_t> Flush();
  Stats GetStats() const;

  Options options_;
  FileSystem* const fs_;      // the host tier's
  FileSystem* const pfs_fs_;  // the PFS tier's and the rendezvous directory's
  Logger log_;
  // Slot mappings pinned for device copies, and those the driver refused (Stats).
  std::atomic<uint64_t> slots_pinned_{0};
  std::atomic<uint64_t> slots_not_pinned_{0};
  std::unique_ptr<CopyEngine> engine_;  // outlives tier_ (the tier unregisters slots)
  std::unique_ptr<HostTier> tier_;
  std::unique_ptr<CapturePipeline> pipeline_;
  const JobChannels channels_;  // of every stage that talks over comm_
  std::unique_ptr<UcxComm> comm_;
  std::unique_ptr<UcxGroup> group_;
  std::unique_ptr<ReplicaStore> store_;
  std::unique_ptr<ParityStore> parity_;  // CAIRN_REDUNDANCY=xor|rs
  std::unique_ptr<Replicator> replicator_;
  std::unique_ptr<Group> persist_group_;  // the persister's own collectives
  std::unique_ptr<Persister> persister_;
  std::vector<int> replica_sources_;          // ranks whose replicas this rank holds
  std::atomic<bool> agree_cancel_{false};     // set by the agreement's close (agree_group_)
  std::unique_ptr<UcxGroup> agree_group_;     // the agreement's own collectives
  std::unique_ptr<StepAgreement> agreement_;  // several ranks only
  // Maps in the newest held version while the job wires up (HostTier::WarmNewest).
  std::atomic<bool> warm_stop_{false};
  std::thread warm_;
};

Status Checkpointer::Impl::OpenTier(FileSystem* fs) {
  HostTierConfig tc;
  tc.dir = HostTier::RankDir(options_.host_root, options_.job_id, options_.node, options_.rank);
  tc.trust_top = options_.host_root;
  tc.slots = options_.slots;
  tc.slot_bytes = options_.slot_bytes;
  CopyEngine* e = engine_.get();
  // Pinning a slot (CUDA) is for speed only: a mapping the driver will not pin (some
  // filesystems refuse long-term pins of their pages) is still copied into, more slowly.
  // Either outcome is logged and counted (Stats::capture.slots_pinned / slots_not_pinned).
  tc.on_map = [this, e](void* p, size_t n) {
    if (!e->pins_host()) return Status::OK();
    const std::string size = std::to_string(n >> 20) + " MiB";
    Status st = e->RegisterHost(p, n);
    if (st.ok()) {
      slots_pinned_.fetch_add(1, std::memory_order_relaxed);
      log_.Info("pinned a host slot mapping of " + size + " for device copies");
    } else {
      slots_not_pinned_.fetch_add(1, std::memory_order_relaxed);
      log_.Warning("a host slot mapping of " + size + " could not be pinned for device copies (" +
                   st.ToString() + "); copies into it go through the driver's staging, slower");
    }
    return Status::OK();
  };
  tc.on_unmap = [e](void* p, size_t n) { e->UnregisterHost(p, n); };
  auto tier = HostTier::Open(std::move(tc), fs, &log_);
  if (!tier.ok()) return tier.status().WithContext(Who());
  tier_ = std::move(*tier);
  auto held = tier_->Versions();
  if (!held.empty())
    log_.Info("host tier " + tier_->dir() + " holds " + std::to_string(held.size()) +
              " restorable version(s), newest step " + std::to_string(held.front().step));
  return Status::OK();
}

Status Checkpointer::Impl::OpenReplication(FileSystem* fs) {
  const Options& o = options_;
  if (o.world_size % o.local_world_size != 0)
    return Status::InvalidArgument(Who() + ": world size " + std::to_string(o.world_size) +
                                   " is not a multiple of the local world size " +
                                   std::to_string(o.local_world_size));
  const int nodes = o.world_size / o.local_world_size;
  if (o.node != o.rank / o.local_world_size)
    return Status::InvalidArgument(
        Who() + ": node id " + std::to_string(o.node) +
        " does not match RANK / LOCAL_WORLD_SIZE = " + std::to_string(o.rank / o.local_world_size) +
        " (replica placement and parity sets assume consecutive ranks per node)");
  if (o.redundancy != RedundancyKind::kReplica && nodes > 1) return OpenErasure(fs, nodes);
  CAIRN_ASSIGN_OR_RETURN(
      Placement placement,
      Placement::Make(nodes, o.local_world_size, std::min(o.replicas, nodes - 1),
                      o.group_placement ? PlacementStrategy::kGroup : PlacementStrategy::kRing));
  if (o.replicas > nodes - 1)
    log_.Warning("CAIRN_REPLICAS=" + std::to_string(o.replicas) + " but the job has only " +
                 std::to_string(nodes) + " nodes: keeping " + std::to_string(nodes - 1));
  replica_sources_ = placement.held_by(o.rank);
  // As many versions of each source as it keeps itself: a node that lost its partner
  // then still finds, among every source's replicas, the steps the partner's ranks had
  // in common when it died (with 2, a source whose pushes ran ahead had evicted them).
  store_ = std::make_unique<ReplicaStore>(
      JoinPath(JoinPath(o.host_root, o.job_id), "node-" + std::to_string(o.node)), fs, &log_,
      o.slots, o.host_root);
  if (nodes > 1)
    replicator_ = std::make_unique<Replicator>(
        comm_.get(), channels_.replication, std::move(placement), tier_.get(), store_.get(), &log_,
        o.replicate_timeout_s, std::nullopt, ToThreadPriority(o.replicate_priority),
        o.replicate_share);
  return Status::OK();
}

Status Checkpointer::Impl::OpenErasure(FileSystem* fs, int nodes) {
  const Options& o = options_;
  const ErasureScheme scheme{o.erasure_k, o.redundancy == RedundancyKind::kXor ? 1 : o.erasure_m};
  CAIRN_RETURN_IF_ERROR(ValidateErasureScheme(scheme).WithContext(Who()));
  if (nodes % scheme.k != 0)
    return Status::InvalidArgument(Who() + ": CAIRN_REDUNDANCY=" + scheme.Describe() +
                                   " cuts the nodes into sets of " + std::to_string(scheme.k) +
                                   ", but the job has " + std::to_string(nodes) +
                                   " nodes: set CAIRN_ERASURE_K to a divisor of the node count");
  // The set of this rank: the ranks of the same local rank on k consecutive nodes, which is
  // the group placement with k - 1 "replicas".
  CAIRN_ASSIGN_OR_RETURN(
      Placement placement,
      Placement::Make(nodes, o.local_world_size, scheme.k - 1, PlacementStrategy::kGroup));
  const std::string node_dir =
      JoinPath(JoinPath(o.host_root, o.job_id), "node-" + std::to_string(o.node));
  // Holders keep the agreed step's record and the newest one after it (keep 1): the
  // agreement names the one step every member pushes per round, so the next agreed step is
  // the newest record (redundancy/host_memory.h counts those, and the one being made).
  parity_ = std::make_unique<ParityStore>(node_dir, o.rank, fs, &log_, o.host_root, /*keep=*/1);
  // Rebuilt versions of lost ranks land in the replica store (redundancy/rebuild.h).
  store_ = std::make_unique<ReplicaStore>(node_dir, fs, &log_, o.slots, o.host_root);
  replicator_ = std::make_unique<Replicator>(
      comm_.get(), channels_.replication, std::move(placement), tier_.get(), nullptr, &log_,
      o.replicate_timeout_s, ErasureRole{scheme, parity_.get()},
      ToThreadPriority(o.replicate_priority));
  return Status::OK();
}

void Checkpointer::Impl::OpenPersister() {
  const Options& o = options_;
  PersistConfig pc;
  pc.job = o.job_id;
  pc.job_dir = PfsJobDir(o.pfs_root, o.job_id);
  pc.every = o.persist_every;
  pc.keep = o.keep_on_pfs;
  pc.writer.threads = o.persist_threads;
  pc.writer.direct = o.persist_direct;
  pc.writer.chunk_bytes = o.chunk_bytes;
  pc.planner.align_bytes = o.chunk_bytes;
  pc.planner.cut_template_min_layouts = static_cast<uint32_t>(o.cut_template_min_layouts);
  CapturePipeline* pipeline = pipeline_.get();
  // Drains hold back while a capture is copying (they would slow the copy a fence may be
  // waiting for), but never more than 50 ms per chunk, so they always progress.
  pc.writer.yield = [pipeline] { pipeline->YieldToCopies(std::chrono::milliseconds(50)); };
  pc.rate_bytes_per_s = o.persist_rate;
  pc.priority = o.persist_priority;
  persister_ =
      std::make_unique<Persister>(std::move(pc), tier_.get(), persist_group_.get(), pfs_fs_, &log_,
                                  [pipeline](uint64_t seq) { pipeline->WaitDone(seq); });
}

Status Checkpointer::Impl::Open() {
  FileSystem* fs = fs_;
  if (options_.host_memory > 0) {
    // Before anything is sized: the slots (and with them the replica rings) the budget allows.
    auto plan = PlanHostMemory(options_);
    if (!plan.ok()) return plan.status().WithContext(Who());
    if (options_.local_rank == 0) {
      if (plan->slots < options_.slots)
        log_.Warning(plan->summary);
      else
        log_.Info(plan->summary);
    }
    options_.slots = plan->slots;
  }
  CAIRN_RETURN_IF_ERROR(OpenTier(fs));
  // A restart restores next: the version it will read from this rank's memory is mapped
  // in while the ranks connect, instead of a page fault per 4 KiB inside the restore
  // (docs/performance.md, "Time to resume against dcp.load"). The first save stops it.
  if (!tier_->Versions().empty())
    warm_ = std::thread([this] {
      TraceSpan span("warm newest version", "restore");
      tier_->WarmNewest(warm_stop_);
    });
  CaptureConfig cc;
  cc.rank = options_.rank;
  cc.world_size = options_.world_size;
  cc.node = options_.node;
  cc.chunk_bytes = options_.chunk_bytes;
  cc.full_policy = options_.full_policy;
  cc.full_wait_s = options_.full_wait_s;
  CaptureHooks hooks;
  // Both stages exist before the first save() (made below, before Open returns).
  hooks.on_save = [this](uint64_t seq, int64_t step) {
    // Training saves: no restore comes now, and the warm-up's pin would hold a slot.
    warm_stop_.store(true, std::memory_order_relaxed);
    persister_->OnSave(seq, step);
    if (agreement_) agreement_->OnSave(seq, step);
  };
  hooks.on_captured = [this](int64_t step) {
    if (replicator_) replicator_->Notify(step);
  };
  pipeline_ =
      std::make_unique<CapturePipeline>(cc, engine_.get(), tier_.get(), &log_, std::move(hooks));
  if (options_.world_size > 1) {
    CAIRN_ASSIGN_OR_RETURN(comm_, UcxComm::Connect(options_, &log_, "", pfs_fs_));
    group_ = std::make_unique<UcxGroup>(comm_.get(), channels_.collective, channels_.broadcast);
    persist_group_ = std::make_unique<UcxGroup>(comm_.get(), channels_.persist_collective,
                                                channels_.persist_broadcast);
    // Its thread waits on the other ranks most of the time: it polls gently, and closing
    // may give its round up.
    agree_group_ = std::make_unique<UcxGroup>(comm_.get(), channels_.agree_collective,
                                              channels_.agree_broadcast,
                                              RecvWait{.gentle = true, .cancel = &agree_cancel_});
  } else {
    persist_group_ = std::make_unique<SoloGroup>();
  }
  if (options_.world_size > 1 &&
      (options_.replicas > 0 || options_.redundancy != RedundancyKind::kReplica))
    CAIRN_RETURN_IF_ERROR(OpenReplication(fs));
  OpenPersister();
  if (agree_group_) {
    CapturePipeline* pipeline = pipeline_.get();
    AgreementProtection protection;
    // The rounds' wait for a target's pushes: bounded, and given up at close.
    auto wait_tried_for = [cancel = &agree_cancel_,
                           wait_s = options_.replicate_timeout_s + 1](Replicator* replicator) {
      return [replicator, cancel, wait_s](int64_t step) {
        const int64_t until = NowNanos() + static_cast<int64_t>(wait_s * 1e9);
        while (!replicator->WaitTried(step, 0.05, /*urgent=*/false) && !cancel->load() &&
               NowNanos() < until) {
        }
      };
    };
    if (replicator_ && parity_) {
      // With parity, the agreed step is one every rank's parity covers: the survivors of a
      // lost node then keep a step its set can rebuild. (Replicas do without: each holder
      // keeps the replicas of the steps its source keeps, which every replica offer names,
      // and waiting for their acknowledgements holds one more slot while saves outpace
      // pushes: with 2 replicas and 3 slots, the fourth of four quick saves found none.)
      Replicator* replicator = replicator_.get();
      protection.wait_tried = wait_tried_for(replicator);
      protection.agreed = [replicator](int64_t step) { replicator->SetKeepStep(step); };
      // The members of a set push the steps the rounds name (snapshot/step_agreement.h),
      // so their parity records complete however far the pushes lag the saves.
      replicator->ExpectTargets();
      protection.target = [replicator](int64_t step) { replicator->SetTarget(step); };
      protection.passed = [replicator](int64_t step) { replicator->SetPassed(step); };
      protection.ended = [replicator] { replicator->EndTargets(); };
    } else if (replicator_) {
      // Replicas of a rank whose every box a rank on another node holds carry only its
      // blobs (data parallel): the rounds tell the replicator which layouts are covered.
      Replicator* replicator = replicator_.get();
      auto hash = [](const SlotHeader& h) { return LayoutHash(EncodeRankLayout(SlotLayout(h))); };
      replicator->ExpectCoverage(hash);
      for (int r = 0; r < options_.world_size; ++r)
        protection.node_of.push_back(r / options_.local_world_size);
      protection.layout_hash = hash;
      protection.covered = [replicator](uint64_t h, bool yes) { replicator->SetCovered(h, yes); };
      protection.ended = [replicator] { replicator->EndCoverage(); };
      if (replicator->Paced()) {
        // Paced (CAIRN_REPLICATE_SHARE): the rounds name the steps every rank pushes, one
        // in the largest pace any rank offers, and agree on one only once every rank's
        // pushes of it were acknowledged, so the survivors of a lost node keep a step its
        // ranks' replicas hold (each rank pacing alone pushed steps the others had dropped).
        protection.wait_tried = wait_tried_for(replicator);
        replicator->ExpectTargets();
        protection.target = [replicator](int64_t step) { replicator->SetTarget(step); };
        protection.passed = [replicator](int64_t step) { replicator->SetPassed(step); };
        protection.pace_every = [replicator] { return replicator->PaceEvery(); };
        protection.ended = [replicator] {
          replicator->EndCoverage();
          replicator->EndTargets();
        };
      }
    }
    agreement_ = std::make_unique<StepAgreement>(
        agree_group_.get(), tier_.get(), &log_,
        [pipeline](uint64_t seq) { pipeline->WaitDone(seq); }, &agree_cancel_,
        std::min(options_.op_timeout_s, 10.0), options_.replicate_timeout_s, std::move(protection));
  }
  return Status::OK();
}

Checkpointer::Impl::~Impl() {
  warm_stop_ = true;
  if (warm_.joinable()) warm_.join();
  if (pipeline_) pipeline_->Stop();  // captures everything queued; no more hooks after it
  agreement_.reset();                // its last rounds, when every rank is closing too
  persister_.reset();   // runs the persist rounds already due (every rank has the same ones)
  replicator_.reset();  // stops pushing before the tiers and the connections go
  store_.reset();
  persist_group_.reset();
  agree_group_.reset();
  group_.reset();
  comm_.reset();
  pipeline_.reset();
  tier_.reset();
  if (!options_.trace_path.empty()) {
    const std::string path =
        Trace::RankPath(options_.trace_path, options_.rank, options_.world_size);
    Status st = Trace::Write(path);
    if (!st.ok()) log_.Warning(st.ToString());
  }
}

Stats Checkpointer::Impl::GetStats() const {
  Stats s;
  s.save = pipeline_->save_stats();
  s.capture = pipeline_->capture_stats();
  if (agreement_) {
    AgreementStats a = agreement_->stats();
    s.save.agreed_step = a.agreed_step;
    s.save.not_held_by_all = a.not_held_by_all;
  } else {
    s.save.agreed_step = s.capture.newest_captured_step;  // one rank: every version is the job's
  }
  s.capture.slots_pinned = slots_pinned_.load(std::memory_order_relaxed);
  s.capture.slots_not_pinned = slots_not_pinned_.load(std::memory_order_relaxed);
  if (replicator_) {
    ReplicatorStats r = replicator_->stats();
    s.replication.replicated = r.replicated;
    s.replication.blobs_only = r.blobs_only;
    s.replication.failed = r.failed;
    s.replication.passed_over = r.passed_over;
    s.replication.bytes = r.bytes;
    s.replication.gbps = r.seconds > 0 ? static_cast<double>(r.bytes) / r.seconds / 1e9 : 0;
    s.replication.ack_ms = r.last_ack_ms;
    s.replication.push_ms = r.last_push_ms;
    s.replication.newest_replicated_step = r.newest_replicated;
    s.replication.received = r.received;
    s.replication.staging_bytes = r.staging_bytes;
    s.replication.unreplicated_s = r.unreplicated_s;
    s.replication.unreplicated_steps = r.unreplicated_steps;
    s.replication.last_error = r.last_error;
    s.replication.every = r.every;
    s.replication.behind_steps = r.behind_steps;
    s.replication.push_s = r.push_s;
    s.replication.step_s = r.step_s;
  }
  PersisterStats p = persister_->stats();
  s.persist.persisted = p.persisted;
  s.persist.failed = p.failed;
  s.persist.bytes = p.bytes;
  s.persist.gbps = p.write_seconds > 0 ? static_cast<double>(p.bytes) / p.write_seconds / 1e9 : 0;
  s.persist.round_ms = p.last_round_ms;
  s.persist.max_writer_share = p.max_writer_share;
  s.persist.plan = p.plan;
  s.persist.newest_persisted_step = p.newest_persisted_step;
  s.persist.last_error = p.last_error;
  return s;
}

Result<int64_t> Checkpointer::Impl::Flush() {
  auto r = persister_->Flush(pipeline_->submitted(), pipeline_->last_step().value_or(-1));
  if (!r.ok()) return r.status().WithContext(Who() + ": flush");
  return r;
}

Status Checkpointer::Impl::NotReplicating() const {
  return Status::FailedPrecondition(Who() +
                                    ": this job does not replicate (one node, or "
                                    "CAIRN_REPLICAS=0)");
}

Result<bool> Checkpointer::Impl::WaitReplicated(int64_t step, double timeout_s) {
  if (!replicator_) return NotReplicating();
  if (!replicator_->WaitTried(step, timeout_s)) return false;
  CAIRN_RETURN_IF_ERROR(replicator_->WaitReplicated(step, 0).WithContext(Who()));
  return true;
}

Status Checkpointer::Impl::WaitReplicated(double timeout_s) {
  if (!replicator_) return NotReplicating();
  // Let captures in flight settle without taking their errors (fence() reports them).
  pipeline_->WaitSettled();
  const int64_t newest = pipeline_->capture_stats().newest_captured_step;
  if (newest < 0) return Status::NotFound(Who() + ": nothing captured yet");
  Status st = replicator_->WaitReplicated(newest, timeout_s);
  // The step is kept until the ranks agree on it or on a newer one: a restore after a
  // failure is no older than the newest step every rank saw replicated.
  if (st.ok() && agreement_) agreement_->OnReplicated(replicator_->stats().newest_replicated);
  return st;
}

Result<RestoreReport> Checkpointer::Impl::Restore(std::span<const ShardSpec> targets,
                                                  const RestoreOptions& options) {
  TraceSpan span("restore", "restore");
  // Let captures in flight settle (a failed one is simply not among the versions); their
  // errors stay for fence() / wait_captured() to report.
  pipeline_->WaitSettled();
  int device = -1;
  for (const ShardSpec& t : targets) {
    CAIRN_RETURN_IF_ERROR(pipeline_->CheckReachable(t, Who() + ": restore target", &device));
  }
  // Device targets: the copies into them come after whatever the stream still has queued.
  if (device >= 0)
    CAIRN_RETURN_IF_ERROR(
        engine_->OrderAfter(device, options.stream).WithContext(Who() + ": restore"));
  std::unordered_set<std::string> seen;
  for (const ShardSpec& t : targets)
    if (!seen.insert(ShardKey(t.meta.name, t.box)).second)
      return Status::InvalidArgument(Who() + ": restore target '" + t.meta.name + "' box " +
                                     t.box.ToString() + " given twice");
  int64_t rebuilt_step = -1;
  if (parity_ && group_ && comm_) {
    // Versions of ranks whose node was lost, decoded from their sets' parity first
    // (recovery/rebuild.h): the restore then finds them in memory like replicas.
    auto transport = MakeUcxRestoreTransport(comm_.get(), channels_.rebuild_data);
    RebuildEnv renv;
    renv.rank = options_.rank;
    renv.world_size = options_.world_size;
    renv.group = group_.get();
    renv.transport = transport.get();
    renv.own = tier_.get();
    renv.parity = parity_.get();
    renv.store = store_.get();
    renv.log = &log_;
    renv.who = Who();
    renv.timeout_s = options_.op_timeout_s;
    auto rebuilt = RebuildLost(renv);
    if (!rebuilt.ok()) {
      log_.Warning(Who() +
                   ": rebuilding lost versions from parity failed: " + rebuilt.status().message());
    } else {
      for (int r : rebuilt->rebuilt_here) {
        if (r == options_.rank) rebuilt_step = rebuilt->step;
        if (std::find(replica_sources_.begin(), replica_sources_.end(), r) ==
            replica_sources_.end())
          replica_sources_.push_back(r);
      }
    }
  }
  TierMemory memory(tier_.get(), store_.get(), replica_sources_, &log_);
  SoloGroup solo;
  std::unique_ptr<RestoreTransport> transport;
  if (comm_) transport = MakeUcxRestoreTransport(comm_.get(), channels_.restore_data);
  RestoreEnv env;
  env.rank = options_.rank;
  env.group = group_ ? static_cast<Group*>(group_.get()) : &solo;
  env.transport = transport.get();
  env.memory = &memory;
  env.pfs_fs = pfs_fs_;
  if (!options_.pfs_root.empty()) env.pfs_job_dir = PfsJobDir(options_.pfs_root, options_.job_id);
  env.engine = engine_.get();
  env.log = &log_;
  env.who = Who();
  env.timeout_s = options_.op_timeout_s;
  env.read_threads = options_.persist_threads;
  for (const ShardSpec& t : targets) env.host_targets &= t.memory == MemoryKind::kHost;
  if (RestoreWantsHugePages(options_.restore_huge_pages))
    for (const ShardSpec& t : targets)
      if (t.memory == MemoryKind::kHost) AdviseHugePagesIfFresh(t.data, t.nbytes());
  auto report = cairn::Restore(env, targets, options);
  if (report.ok() && report->step == rebuilt_step) report->rebuilt_step = rebuilt_step;
  return report;
}

// --- the public surface: forwards to Impl ---

Checkpointer::Checkpointer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Checkpointer::~Checkpointer() = default;

Result<std::unique_ptr<Checkpointer>> Checkpointer::Open(Options options) {
  return CheckpointerInternals::Open(std::move(options), {});
}

Result<std::unique_ptr<Checkpointer>> CheckpointerInternals::Open(Options options, FileSystems fs) {
  CAIRN_RETURN_IF_ERROR(options.Validate());
  if (!options.trace_path.empty()) Trace::Enable(options.rank);
  CAIRN_ASSIGN_OR_RETURN(auto engine, MakeCopyEngine(options.copy_engine, options.copy_threads));
  auto impl = std::make_unique<Checkpointer::Impl>(std::move(options), fs, std::move(engine));
  CAIRN_RETURN_IF_ERROR(impl->Open());
  return std::unique_ptr<Checkpointer>(new Checkpointer(std::move(impl)));
}

int64_t CheckpointerInternals::UcxRequestsInFlight(const Checkpointer& c) {
  return c.impl_->comm_ ? static_cast<int64_t>(c.impl_->comm_->requests_in_flight()) : 0;
}

Result<SaveOutcome> Checkpointer::save(int64_t step, std::span<const ShardSpec> shards,
                                       const Blobs& blobs, CudaStream stream) {
  return impl_->pipeline_->Save(step, shards, blobs, stream);
}
Status Checkpointer::fence() {
  return impl_->pipeline_->Fence(FenceKind::kOwnStreams);
}
Status Checkpointer::fence(CudaStream consumer) {
  return impl_->pipeline_->Fence(FenceKind::kConsumer, consumer);
}
Status Checkpointer::fence_host() {
  return impl_->pipeline_->Fence(FenceKind::kHost);
}
uint64_t Checkpointer::copies_done() const {
  return impl_->pipeline_->CopiesDone();
}
Status Checkpointer::wait_captured() {
  return impl_->pipeline_->WaitCaptured();
}
Status Checkpointer::wait_replicated(double timeout_s) {
  return impl_->WaitReplicated(timeout_s);
}
Result<bool> Checkpointer::wait_replicated(int64_t step, double timeout_s) {
  return impl_->WaitReplicated(step, timeout_s);
}
Result<bool> Checkpointer::wait_save(uint64_t n, bool settled, double timeout_s) {
  return impl_->pipeline_->WaitSeq(n, settled, timeout_s);
}
Status Checkpointer::wait_for_slot(double timeout_s) {
  return impl_->tier_->WaitFree(timeout_s);
}
Result<int64_t> Checkpointer::flush() {
  return impl_->Flush();
}
Group* Checkpointer::group() {
  return impl_->group_.get();
}
Result<RestoreReport> Checkpointer::restore(std::span<const ShardSpec> targets,
                                            const RestoreOptions& options) {
  return impl_->Restore(targets, options);
}
std::vector<VersionInfo> Checkpointer::versions() const {
  return impl_->tier_->Versions();
}
Stats Checkpointer::stats() const {
  return impl_->GetStats();
}
const Options& Checkpointer::options() const {
  return impl_->options_;
}
const std::string& Checkpointer::host_dir() const {
  return impl_->tier_->dir();
}

}  // namespace cairn
