// What save() reports (Checkpointer::save). A header of its own so that the capture
// pipeline (snapshot/) can return it without depending on the Checkpointer.
#pragma once

namespace cairn {

enum class SaveOutcome {
  kQueued,   // the version will be captured (check fence() / wait_captured() for errors)
  kSkipped,  // no slot was free under the skip policy; counted in Stats::save.skipped
};

}  // namespace cairn
