// A rank of the transport tests, started by LocalLauncher (RANK/WORLD_SIZE) or mpirun.
//
//   group_child collectives   barrier, allgather and broadcast from every root, 3 rounds
//                             (small and >100 KB messages), every byte checked; then the
//                             endpoints and addresses read (files or PMIx lookups): every
//                             rank's in a small job, at most 2 x ceil(log2 n) in a lazy one
//                             (GROUP_CHILD_LATE_RANKS=5,12: those ranks start 1 s late)
//   group_child intruder      joins with a wrong job token: must be refused (in a lazy job:
//                             its message gets no answer)
//   group_child victim        a legitimate rank facing an intruder: must refuse it (in a
//                             lazy job: the intruder's message is dropped, its receive
//                             times out)
//   group_child imp-victim    (3 launcher ranks: imp-victim, imp-legit, impersonator) ranks 0
//   group_child imp-legit     and 1 of a 2-rank job; a third process reached rank 0's worker
//   group_child impersonator  (its address copied into a rendezvous directory of its own)
//                             and, claiming to be rank 1, sends messages with a wrong token,
//                             then again as a second incarnation with a token of its own.
//                             Rank 0 must get only rank 1's real messages on every receive
//                             path (exact tag, any rank, a posted receive into a buffer) and
//                             count the dropped ones; the impersonator must get no answer.
//                             They pace each other with flag files in GROUP_CHILD_FLAGS.
//   group_child patient       (3 launcher ranks: patient, late-legit, wrong-hello) ranks 0
//   group_child late-legit    and 1 of a 2-rank full-mesh job; before rank 1 starts, a
//   group_child wrong-hello   third process (rank 0's address copied into a rendezvous
//                             directory of its own) greets rank 0 as rank 1 with a wrong
//                             token, as a rank of another job that redialed a port rank 0
//                             now holds would. Rank 0 must refuse it, still connect to the
//                             real rank 1, and the two exchange a message (GROUP_CHILD_FLAGS)
//   group_child abandon       posts a receive nobody answers and drops its handle: the
//                             request must be counted, then cancelled and freed; then the
//                             collectives as above
//   group_child lost          (8 ranks) after a barrier rank 2 exits; every other rank's
//                             allgather, and a broadcast below rank 2, must fail naming
//                             rank 2 well before the operation timeout (relayed, not
//                             waited out); the rest of the broadcast delivers
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "api/channels.h"
#include "cairn/options.h"
#include "core/filesystem.h"
#include "transport/rendezvous.h"
#include "transport/ucx_comm.h"
#include "transport/ucx_group.h"

using namespace cairn;

namespace {

std::string Payload(int rank, int round) {
  const size_t n = static_cast<size_t>(rank + 1) * (round == 1 ? 150000 : 37);
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + rank * 7 + round) & 0xff);
  return s;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "group_child: %s\n", what.c_str());
  return 1;
}

// Flag files in GROUP_CHILD_FLAGS, by which the impersonation test's processes pace
// each other.
std::string FlagPath(const std::string& name) {
  const char* dir = std::getenv("GROUP_CHILD_FLAGS");
  return JoinPath(dir ? dir : ".", name);
}
void Raise(const std::string& name) {
  (void)WriteFileAtomic(DefaultFileSystem(), FlagPath(name), "");
}
// Waits for flag `name`, driving `comm`'s worker meanwhile (a rank's service thread does:
// others' connections to it are made by its progress).
bool Await(const std::string& name, UcxComm* comm = nullptr, double seconds = 60) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!DefaultFileSystem()->Exists(FlagPath(name))) {
    if (std::chrono::steady_clock::now() > end) return false;
    if (comm) comm->Progress();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// What rank 1 sends rank 0, real or forged, in the impersonation test: (channel, seq).
constexpr Channel kImpExact{40}, kImpAny{41}, kImpPosted{42}, kImpReply{43};
constexpr size_t kPostedBytes = 1 << 20;  // a rendezvous-sized message

// Makes `o` claim rank 1, lazily (it dials rank 0, and greets it, when sending to it), in
// a rendezvous directory of its own (flag `dir`) holding a copy of the job's rank-0 address
// file: a process outside the job that reached rank 0's worker.
Status PoseAsRankOne(Options& o, const std::string& dir) {
  const std::string addr_file = JoinPath(o.RendezvousDir(), "rank-0.addr");
  o.rank = 1;
  o.connect_all_max = 0;
  o.rendezvous_dir = FlagPath(dir);
  CAIRN_RETURN_IF_ERROR(DefaultFileSystem()->MakeDirs(o.rendezvous_dir, 0700));
  // A token of its own, as that directory's rank 0 would have made it.
  CAIRN_RETURN_IF_ERROR(LoadOrCreateJobToken(o.rendezvous_dir).status());
  CAIRN_ASSIGN_OR_RETURN(std::string addr, ReadWholeFile(DefaultFileSystem(), addr_file, 1 << 20));
  return WriteFileAtomic(DefaultFileSystem(), JoinPath(o.rendezvous_dir, "rank-0.addr"), addr);
}

int WrongHello(const std::string& mode, Options o, const Logger& log) {
  o.world_size = 2;
  o.local_world_size = 1;
  if (mode == "wrong-hello") {
    const std::string addr_file = JoinPath(o.RendezvousDir(), "rank-0.addr");
    for (int i = 0; i < 30000 && !DefaultFileSystem()->Exists(addr_file); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (Status st = PoseAsRankOne(o, "wrong-rdv"); !st.ok()) return Fail(st.ToString());
    auto c = UcxComm::Connect(o, &log, std::string(64, 'f'));
    if (!c.ok()) return Fail(c.status().ToString());
    const JobChannels ch;
    if (Status st = (*c)->Send(0, MakeTag(ch.collective, 1, 9), "no", 2); !st.ok())
      return Fail("the wrong hello's message: " + st.ToString());
    Raise("greeted");
    if (!Await("done", c->get(), 90)) return Fail("rank 0 never finished");
    return 0;
  }
  if (mode == "late-legit") {
    if (!Await("greeted", nullptr, 90)) return Fail("the wrong hello was never sent");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // it reaches rank 0 first
  }
  auto c = UcxComm::Connect(o, &log);
  if (!c.ok()) return Fail(c.status().ToString());
  const JobChannels ch;
  const int other = 1 - o.rank;
  if (Status st = (*c)->Send(other, MakeTag(ch.collective, o.rank, 9), "hi", 2); !st.ok())
    return Fail("send: " + st.ToString());
  auto r = (*c)->Recv(other, MakeTag(ch.collective, other, 9), 30);
  if (!r.ok() || *r != "hi")
    return Fail("receive: " + (r.ok() ? "got '" + *r + "'" : r.status().ToString()));
  if (mode == "patient") Raise("done");
  return 0;
}

int Impersonation(const std::string& mode, Options o, const Logger& log) {
  o.world_size = 2;
  o.local_world_size = 1;
  if (mode == "impersonator") {
    // Claims rank 1 in a rendezvous directory of its own holding rank 0's address.
    if (!Await("ready")) return Fail("rank 0 never became ready");
    if (Status st = PoseAsRankOne(o, "imp-rdv"); !st.ok()) return Fail(st.ToString());
    std::vector<std::unique_ptr<UcxComm>> keep;  // alive until rank 0 is done
    std::vector<UcxComm::PendingSend> posted;
    for (int round = 1; round <= 2; ++round) {
      // A wrong token, then (a new incarnation) a token of its own directory: none is the
      // job's.
      auto c = UcxComm::Connect(o, &log, round == 1 ? std::string(64, 'f') : "");
      if (!c.ok()) return Fail(c.status().ToString());
      const uint32_t base = round * 10;
      const std::string forged = "forged";
      for (const auto& [ch, seq] : {std::pair{kImpExact, base + 1}, std::pair{kImpAny, base + 2}})
        if (Status st = (*c)->Send(0, MakeTag(ch, 1, seq), forged.data(), forged.size()); !st.ok())
          return Fail("round " + std::to_string(round) + ": " + st.ToString());
      static std::string big(kPostedBytes, 'F');
      posted.push_back(
          (*c)->StartSend(0, MakeTag(kImpPosted, 1, base + 3), big.data(), big.size()));
      Raise("forged-" + std::to_string(round));
      // Nothing comes back to it, whatever it sent.
      auto answer = (*c)->Recv(0, MakeTag(kImpReply, 0, base), 2);
      if (answer.ok()) return Fail("rank 0 answered the impersonator");
      keep.push_back(std::move(*c));
      // Its own worker must progress for its sends to reach rank 0.
      if (!Await("victim-" + std::to_string(round), keep.back().get()))
        return Fail("rank 0 never finished round " + std::to_string(round));
    }
    posted.clear();  // cancels what rank 0 never took
    return 0;
  }
  auto c = UcxComm::Connect(o, &log);
  if (!c.ok()) return Fail(c.status().ToString());
  const std::string real = "real";
  static std::string big(kPostedBytes, 'R');
  for (int round = 1; round <= 2; ++round) {
    const uint32_t base = round * 10;
    const std::string r = std::to_string(round);
    if (mode == "imp-legit") {
      if (!Await("forged-" + r)) return Fail("the impersonator never sent round " + r);
      for (const auto& [ch, seq] : {std::pair{kImpExact, base + 1}, std::pair{kImpAny, base + 2}})
        if (Status st = (*c)->Send(0, MakeTag(ch, 1, seq), real.data(), real.size()); !st.ok())
          return Fail(st.ToString());
      if (Status st = (*c)->Send(0, MakeTag(kImpPosted, 1, base + 3), big.data(), big.size());
          !st.ok())
        return Fail(st.ToString());
      if (!Await("victim-" + r)) return Fail("rank 0 never finished round " + r);
      continue;
    }
    if (round == 1) Raise("ready");  // its address file is published
    if (!Await("forged-" + r, c->get())) return Fail("the impersonator never sent round " + r);
    auto exact = (*c)->Recv(1, MakeTag(kImpExact, 1, base + 1), 30);
    if (!exact.ok() || *exact != real)
      return Fail("round " + r + ", exact receive: " +
                  (exact.ok() ? "got '" + *exact + "'" : exact.status().ToString()));
    auto any = (*c)->RecvAny(kImpAny, 30);
    if (!any.ok() || any->bytes != real || any->source != 1)
      return Fail("round " + r + ", receive from any rank: " +
                  (any.ok() ? "got '" + any->bytes + "'" : any.status().ToString()));
    // A posted receive takes whichever matching message comes first: the forged one is
    // refused, and the real one is taken by the next.
    std::string buf(kPostedBytes, '\0');
    Status posted;
    for (int attempt = 0; attempt < 2; ++attempt) {
      auto p = (*c)->StartRecv(1, MakeTag(kImpPosted, 1, base + 3), buf.data(), buf.size());
      posted = (*c)->FinishRecv(p, 30);
      if (posted.ok()) break;
    }
    if (!posted.ok() || buf != big)
      return Fail(
          "round " + r + ", posted receive: " +
          (posted.ok() ? std::string("the buffer holds the forged bytes") : posted.ToString()));
    // The forged posted message may arrive after the real one: a further receive on its
    // tag must refuse it, never fill the buffer.
    while ((*c)->refused_messages() < static_cast<uint64_t>(3 * round)) {
      auto p = (*c)->StartRecv(1, MakeTag(kImpPosted, 1, base + 3), buf.data(), buf.size());
      if ((*c)->FinishRecv(p, 30).ok()) return Fail("round " + r + ": took a forged message");
      if ((*c)->refused_messages() < static_cast<uint64_t>(3 * round))
        return Fail("round " + r + ": " + std::to_string((*c)->refused_messages()) +
                    " messages refused, fewer than the impersonator sent");
    }
    Raise("victim-" + r);
  }
  if (mode == "imp-victim")
    std::printf("rank 0: every real message taken, %llu forged ones refused\n",
                static_cast<unsigned long long>((*c)->refused_messages()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string mode = argv[1];
  auto o = Options::FromEnvironment();
  if (!o.ok()) return Fail(o.status().ToString());
  Logger log("group_child rank " + std::to_string(o->rank), LogLevel::kWarning);
  if (mode == "imp-victim" || mode == "imp-legit" || mode == "impersonator")
    return Impersonation(mode, *o, log);
  if (mode == "patient" || mode == "late-legit" || mode == "wrong-hello")
    return WrongHello(mode, *o, log);
  if (mode == "intruder" || mode == "victim") {
    auto c = UcxComm::Connect(*o, &log, mode == "intruder" ? std::string(64, 'f') : "");
    if (c.ok() && (*c)->lazy()) {
      // A lazy job checks the token of a rank's hello when its first message arrives.
      const JobChannels ch;
      if (mode == "intruder") {
        if (Status st = (*c)->Send(0, MakeTag(ch.collective, 1, 7), "x", 1); !st.ok())
          return Fail("the intruder could not even send: " + st.ToString());
        auto r = (*c)->Recv(0, MakeTag(ch.collective, 0, 8), 3);
        return r.ok() ? Fail("the victim answered the intruder") : 0;
      }
      // Its message, without the job token, is dropped: the receive waits on and times out.
      auto r = (*c)->Recv(1, MakeTag(ch.collective, 1, 7), 8);
      if (r.ok()) return Fail("accepted a message from a rank without the job token");
      if ((*c)->refused_messages() == 0)
        return Fail("the intruder's message was not refused: " + r.status().ToString());
      return 0;
    }
    if (c.ok()) return Fail("joined a job it should have been refused from");
    if (c.status().message().find("wrong job token") == std::string::npos)
      return Fail("refused for the wrong reason: " + c.status().ToString());
    return 0;
  }
  if (const char* late = std::getenv("GROUP_CHILD_LATE_RANKS")) {
    // These ranks start late: the others' first messages to them wait for their files.
    for (const char* p = late; *p;) {
      char* end = nullptr;
      if (std::strtol(p, &end, 10) == o->rank) std::this_thread::sleep_for(std::chrono::seconds(1));
      p = *end == ',' ? end + 1 : end;
    }
  }
  auto c = UcxComm::Connect(*o, &log);
  if (!c.ok()) return Fail(c.status().ToString());
  const JobChannels ch;
  UcxGroup g(c->get(), ch.collective, ch.broadcast);
  const int n = g.size();
  if (mode == "abandon") {
    const int peer = (g.rank() + 1) % n;
    std::string buf(1 << 20, '\0');
    {
      UcxComm::PendingRecv r =
          (*c)->StartRecv(peer, MakeTag(ch.collective, peer, 0xfffffff0u), buf.data(), buf.size());
      if (!r.status.ok()) return Fail(r.status.ToString());
      if (!r.request || (*c)->requests_in_flight() != 1)
        return Fail("a posted receive is not counted: " +
                    std::to_string((*c)->requests_in_flight()));
    }
    if ((*c)->requests_in_flight() != 0)
      return Fail("a dropped receive was not freed: " + std::to_string((*c)->requests_in_flight()) +
                  " requests in flight");
  }
  if (mode == "last-words") {
    // Rank 0's last message, sent just before it leaves: rank 1 takes it up only a second
    // later, when the bytes and the news of rank 0's exit come in the same progress call.
    if (Status st = g.Barrier(); !st.ok()) return Fail(st.ToString());
    const uint64_t tag = MakeTag(ch.collective, 0, 0xfffffff1u);
    if (g.rank() == 0) {
      if (Status st = (*c)->Send(1, tag, "goodbye", 7); !st.ok()) return Fail(st.ToString());
      // Without closing its endpoints, as a killed process goes; the bytes were handed over.
      for (int i = 0; i < 1000 && (*c)->requests_in_flight() > 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::fflush(nullptr);
      _exit(0);
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
    auto r = (*c)->Recv(0, tag, 10);
    if (!r.ok()) return Fail("rank 0's last message was lost: " + r.status().ToString());
    if (*r != "goodbye") return Fail("rank 0's last message came in changed: " + *r);
    return 0;
  }
  if (mode == "lost") {
    if (Status st = g.Barrier(); !st.ok()) return Fail(st.ToString());
    if (g.rank() == 2) return 0;  // lost: its peers see the process go
    // The allgather needs every rank: it fails everywhere. A broadcast from rank 0 fails
    // at the root (its send to rank 2) and below rank 2 in its tree (rank 6 of 8); the
    // others get the root's bytes.
    for (int op = 0; op < 2; ++op) {
      const auto t0 = std::chrono::steady_clock::now();
      Result<std::string> b = std::string();
      Status st;
      if (op == 0)
        st = g.AllGather(Payload(g.rank(), 0)).status();
      else
        st = (b = g.Broadcast(0, Payload(0, 1))).status();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::string what = op == 0 ? "allgather" : "broadcast";
      if (op == 1 && g.rank() != 0 && g.rank() != 6) {
        if (!b.ok() || *b != Payload(0, 1))
          return Fail("broadcast outside rank 2's subtree: " + b.status().ToString());
        continue;
      }
      if (st.ok()) return Fail(what + " without rank 2 succeeded");
      if (st.code() != StatusCode::kUnavailable || st.message().find("rank 2") == std::string::npos)
        return Fail(what + ": not an error naming rank 2: " + st.ToString());
      if (s > 20) return Fail(what + " took " + std::to_string(s) + " s to fail: " + st.ToString());
      std::fprintf(stderr, "rank %d %s failed in %.3f s: %s\n", g.rank(), what.c_str(), s,
                   st.ToString().c_str());
    }
    return 0;
  }
  for (int round = 0; round < 3; ++round) {
    Status st = g.Barrier();
    if (!st.ok()) return Fail(st.ToString());
    auto all = g.AllGather(Payload(g.rank(), round));
    if (!all.ok()) return Fail(all.status().ToString());
    if (static_cast<int>(all->size()) != n) return Fail("allgather size");
    for (int r = 0; r < n; ++r)
      if ((*all)[static_cast<size_t>(r)] != Payload(r, round))
        return Fail("allgather: wrong bytes from rank " + std::to_string(r));
    for (int root = 0; root < n; ++root) {
      auto b = g.Broadcast(root, g.rank() == root ? Payload(root, round + 10) : std::string("x"));
      if (!b.ok()) return Fail(b.status().ToString());
      if (*b != Payload(root, round + 10))
        return Fail("broadcast: wrong bytes from root " + std::to_string(root));
    }
  }
  Status st = g.Barrier();
  if (!st.ok()) return Fail(st.ToString());
  // Who this rank connected to: everyone in a small job; in a lazy one, only the ranks
  // the collectives talk to (me +- 2^k: Bruck's rounds and every root's binomial tree).
  int bound = 0;
  while ((1 << bound) < n) ++bound;
  bound *= 2;
  const int eps = (*c)->endpoints(), files = (*c)->addresses_read();
  std::printf("rank %d: %s, %d endpoints, %d addresses read\n", g.rank(),
              (*c)->lazy() ? "lazy" : "full mesh", eps, files);
  if (!(*c)->lazy() && eps != n - 1) return Fail("full mesh with " + std::to_string(eps));
  if ((*c)->lazy() && (eps > std::min(bound, n - 1) || files > std::min(bound, n - 1)))
    return Fail("lazy: " + std::to_string(eps) + " endpoints and " + std::to_string(files) +
                " addresses read, more than " + std::to_string(bound));
  return 0;
}
