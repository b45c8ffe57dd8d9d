// A rank of the transport tests, started by LocalLauncher with RANK/WORLD_SIZE set.
//
//   group_child collectives   barrier, allgather and broadcast from every root, 3 rounds
//                             (small and >100 KB messages), every byte checked
//   group_child intruder      joins with a wrong job token: must be refused
//   group_child victim        a legitimate rank facing an intruder: must refuse it
//   group_child abandon       posts a receive nobody answers and drops its handle: the
//                             request must be counted, then cancelled and freed; then the
//                             collectives as above
//   group_child lost          (8 ranks) after a barrier rank 2 exits; every other rank's
//                             allgather, and a broadcast below rank 2, must fail naming
//                             rank 2 well before the operation timeout (relayed, not
//                             waited out); the rest of the broadcast delivers
#include <chrono>
#include <cstdio>
#include <string>

#include "api/channels.h"
#include "cairn/options.h"
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

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string mode = argv[1];
  auto o = Options::FromEnvironment();
  if (!o.ok()) return Fail(o.status().ToString());
  Logger log("group_child rank " + std::to_string(o->rank), 1);
  if (mode == "intruder" || mode == "victim") {
    auto c = UcxComm::Connect(*o, &log, mode == "intruder" ? std::string(64, 'f') : "");
    if (c.ok()) return Fail("joined a job it should have been refused from");
    if (c.status().message().find("wrong job token") == std::string::npos)
      return Fail("refused for the wrong reason: " + c.status().ToString());
    return 0;
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
  return 0;
}
