// A rank of the persistence tests, started by LocalLauncher (settings from CAIRN_*).
//
//   persist_child once ROWS STEP   saves STEP, flushes, prints "committed <step> share <s>
//                                  bytes <b>", exits 0 when the flush committed STEP
//   persist_child many ROWS START  saves START..START+19 with a barrier per step (as a
//                                  gradient allreduce would), background drains as
//                                  configured, then flushes; exits 0 when the flush
//                                  committed START+19
//   persist_child loop ROWS START  saves START, START+1, ... forever (a fence and, with
//                                  several ranks, a barrier between saves), printing
//                                  "saved <step>"; the parent kills it
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cairn/checkpointer.h"
#include "tests/child_util.h"
#include "tests/persist_state.h"

using namespace cairn;

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  const std::string mode = argv[1];
  const int64_t rows = std::atoll(argv[2]);
  const int64_t first = std::atoll(argv[3]);
  Options opts;
  auto ck = testing::OpenFromEnvironmentOrExit("persist_child", &opts);
  Checkpointer& c = *ck;
  testing::PersistState s(rows);
  auto save = [&](int64_t step) {
    s.Fill(step);
    auto out = c.save(step, s.Shards(), {{"who", testing::PersistState::Blob(opts.rank, step)}});
    if (!out.ok()) {
      std::fprintf(stderr, "persist_child: %s\n", out.status().ToString().c_str());
      std::exit(1);
    }
    Status f = c.fence();
    if (!f.ok()) std::fprintf(stderr, "persist_child: %s\n", f.ToString().c_str());
  };
  if (mode == "once") {
    save(first);
    auto r = c.flush();
    if (!r.ok()) {
      std::fprintf(stderr, "persist_child: %s\n", r.status().ToString().c_str());
      return 1;
    }
    Stats st = c.stats();
    std::printf("committed %lld share %.4f bytes %llu\n", static_cast<long long>(*r),
                st.persist.max_writer_share, static_cast<unsigned long long>(st.persist.bytes));
    return *r == first ? 0 : 1;
  }
  if (mode == "many") {
    for (int64_t t = first; t < first + 20; ++t) {
      save(t);
      if (c.group()) {
        Status b = c.group()->Barrier();
        if (!b.ok()) std::fprintf(stderr, "persist_child: %s\n", b.ToString().c_str());
      }
    }
    auto r = c.flush();
    if (!r.ok()) {
      std::fprintf(stderr, "persist_child: %s\n", r.status().ToString().c_str());
      return 1;
    }
    Stats st = c.stats();
    std::printf("committed %lld persisted %llu failed %llu replicated %llu\n",
                static_cast<long long>(*r), static_cast<unsigned long long>(st.persist.persisted),
                static_cast<unsigned long long>(st.persist.failed),
                static_cast<unsigned long long>(st.replication.replicated));
    return *r == first + 19 ? 0 : 1;
  }
  if (mode == "loop") {
    for (int64_t t = first;; ++t) {
      save(t);
      if (c.group()) (void)c.group()->Barrier();  // ranks advance together, as in training
      std::printf("saved %lld\n", static_cast<long long>(t));
      std::fflush(stdout);
    }
  }
  return 2;
}
