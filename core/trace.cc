#include "core/trace.h"

#include <functional>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/clock.h"
#include "core/filesystem.h"
#include "core/mutex.h"

namespace cairn {
namespace {

struct Event {
  const char* name;
  const char* category;
  int64_t start_ns;
  int64_t end_ns;
  uint64_t tid;
};

Mutex mu;
std::vector<Event>* events = nullptr;  // leaked on purpose: spans may end during exit
int trace_pid = 0;

}  // namespace

std::atomic<bool> Trace::enabled_{false};

void Trace::Enable(int pid) {
  MutexLock lk(mu);
  if (!events) events = new std::vector<Event>();
  trace_pid = pid;
  enabled_.store(true, std::memory_order_relaxed);
}

void Trace::Record(const char* name, const char* category, int64_t start_ns, int64_t end_ns) {
  if (!enabled()) return;
  const uint64_t tid = std::hash<std::thread::id>()(std::this_thread::get_id()) % 100000;
  MutexLock lk(mu);
  if (events) events->push_back({name, category, start_ns, end_ns, tid});
}

Status Trace::Write(const std::string& path) {
  std::string out = "{\"traceEvents\":[";
  {
    MutexLock lk(mu);
    bool first = true;
    if (events)
      for (const Event& e : *events) {
        char buf[512];
        std::snprintf(buf, sizeof buf,
                      "%s\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,"
                      "\"pid\":%d,\"tid\":%llu}",
                      first ? "" : ",", e.name, e.category, static_cast<double>(e.start_ns) / 1e3,
                      static_cast<double>(e.end_ns - e.start_ns) / 1e3, trace_pid,
                      static_cast<unsigned long long>(e.tid));
        out += buf;
        first = false;
      }
  }
  out += "\n]}\n";
  return WriteFileAtomic(DefaultFileSystem(), path, out).WithContext("writing trace " + path);
}

std::string Trace::RankPath(const std::string& path, int rank, int world_size) {
  if (world_size <= 1) return path;
  std::string base = path;
  if (base.size() > 5 && base.compare(base.size() - 5, 5, ".json") == 0)
    base.resize(base.size() - 5);
  return base + ".rank-" + std::to_string(rank) + ".json";
}

Status Trace::Merge(const std::string& out, const std::vector<std::string>& inputs) {
  nlohmann::json events = nlohmann::json::array();
  for (const std::string& in : inputs) {
    CAIRN_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(DefaultFileSystem(), in, 1ull << 32));
    const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded() || !doc.is_object() || !doc.contains("traceEvents") ||
        !doc["traceEvents"].is_array())
      return Status::InvalidArgument(in + " is not a cairn trace file (no JSON traceEvents array)");
    for (const nlohmann::json& e : doc["traceEvents"]) events.push_back(e);
  }
  const nlohmann::json merged = {{"traceEvents", std::move(events)}};
  return WriteFileAtomic(DefaultFileSystem(), out, merged.dump() + "\n")
      .WithContext("writing " + out);
}

TraceSpan::TraceSpan(const char* name, const char* category) : name_(name), category_(category) {
  if (Trace::enabled()) start_ = NowNanos();
}

TraceSpan::~TraceSpan() {
  if (start_ != 0) Trace::Record(name_, category_, start_, NowNanos());
}

}  // namespace cairn
