// The message channels of a job: every stage that talks over the job's UcxComm gets its
// own here, in the composition root, so transport/ names none of its callers and no two
// stages can take each other's messages. The ids are part of the wire format between
// ranks (a restarted rank must use the ones the running ranks use).
#pragma once

#include <array>

#include "redundancy/replicator.h"
#include "transport/ucx_comm.h"

namespace cairn {

struct JobChannels {
  Channel collective{2};  // the job's Group (restore discovery and agreement)
  Channel broadcast{3};
  ReplicatorChannels replication{{4}, {5}, {6}, {7}};
  Channel persist_collective{8};  // the persister's own Group (its collectives run on its thread)
  Channel persist_broadcast{9};
  Channel restore_data{10};      // bytes of saved pieces, holder or PFS reader -> target rank
  Channel agree_collective{11};  // the step agreement's own Group (its thread)
  Channel agree_broadcast{12};
  Channel rebuild_data{13};  // pieces and parity sent to the rank rebuilding a lost version
};

// Every channel above, for the check below.
constexpr std::array<Channel, 12> AllChannels(const JobChannels& c) {
  return {c.collective,       c.broadcast,        c.replication.offer,  c.replication.ready,
          c.replication.data, c.replication.ack,  c.persist_collective, c.persist_broadcast,
          c.restore_data,     c.agree_collective, c.agree_broadcast,    c.rebuild_data};
}

constexpr bool ChannelsAreDistinctAndFree(const JobChannels& c) {
  const auto all = AllChannels(c);
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].id < kFirstChannel) return false;
    for (size_t j = 0; j < i; ++j)
      if (all[i] == all[j]) return false;
  }
  return true;
}
static_assert(ChannelsAreDistinctAndFree(JobChannels{}),
              "every stage needs channels of its own, above the transport's");

}  // namespace cairn
