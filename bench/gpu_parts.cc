// bench/gpu_parts: where a device capture loses time against the raw copy, part by part.
//
// bench/gpu_capture.py measures cairn's capture of a model's state against a raw chunked
// copy into cudaHostAlloc memory. This takes the capture apart, on the same device and the
// same bytes, each arm timed from its first queued copy to its last landed (and
// checksummed) byte, the arms alternated round by round:
//   raw_alloc      one cudaMemcpyAsync per chunk into cudaHostAlloc memory (the reference)
//   raw_slot       the same into a slot: a file of --host-root mapped as cairn maps it
//                  (MappedFile, pre-faulted) and pinned with cudaHostRegister
//   raw_anon       the same into anonymous memory (MADV_HUGEPAGE), pinned likewise
//   raw_huge_slot  the same into a slot file of --huge-root (a tmpfs with huge=always)
//   events_slot    raw_slot with an event after each chunk, waited for in order
//   stream_slot_T  cairn's CUDA engine capturing into the slot with T checksum threads
//                  (the engine uses at least 8): groups of up to 16 MiB queued a window
//                  (64 MiB) at a time, the next once the last has landed, each group's
//                  chunks checksummed as it lands
//   all_slot_T     the same with the whole version queued at once (window 0)
//   stream_big_T   stream_slot_T with --big-chunk chunks
//   raw_slot_under_checksum_T  raw_slot while T threads checksum other memory: whether
//                  host memory traffic alone slows the link's writes; and how fast those
//                  threads checksum while the link writes (checksum_under_copy_T)
//   checksum_T     the engine's checksums alone of the slot's bytes, T threads (host only)
//   persist        MappedFile::Persist of the slot (the commit's msync)
// While each arm runs, another thread queues tiny cudaMemsetAsync calls on a stream of its
// own, as a training thread queues kernels, and the mean host time of one such call is
// reported per arm (launch_us_<arm>; idle: launch_us_idle): what a capture costs the
// training thread's launches (the driver's locks it may contend for). Every 16th call it
// also copies 4 bytes from the device to the host and waits for them: the mean and the
// longest such wait (d2h_ms_<arm>, d2h_max_ms_<arm>) are what a loss.item() of the training
// waits behind the arm's copies.
//
//   gpu_parts [--bytes 4G] [--chunk 4M] [--big-chunk 64M] [--threads 8,16] [--rounds 3]
//             [--host-root /dev/shm] [--huge-root DIR]
//
// Prints one line per arm and round, then one JSON line with every arm's median GB/s.
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "core/clock.h"
#include "core/filesystem.h"
#include "snapshot/copy_engine.h"
#include "tiers/mapped_file.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

using namespace cairn;

namespace {

void Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "gpu_parts: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}
void Check(const Status& st, const char* what) {
  if (st.ok()) return;
  std::fprintf(stderr, "gpu_parts: %s: %s\n", what, st.ToString().c_str());
  std::exit(1);
}

// A slot file under `root`, sized, mapped and pre-faulted as the host tier does.
std::unique_ptr<MappedFile> SlotFile(FileSystem* fs, const std::string& root, uint64_t bytes) {
  const std::string path = root + "/gpu_parts." + std::to_string(::getpid());
  auto f = MappedFile::Open(fs, path);
  Check(f.status(), "opening the slot file");
  Check((*f)->Resize(bytes), "sizing the slot file");
  Check((*f)->Prefault(), "pre-faulting the slot file");
  ::unlink(path.c_str());  // the mapping keeps it
  return std::move(*f);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Where a device capture loses time against the raw copy, part by part"};
  std::string bytes_s = "4G", chunk_s = "4M", big_s = "64M", threads_s = "8,16";
  std::string host_root = "/dev/shm", huge_root;
  int rounds = 3;
  app.add_option("--bytes", bytes_s, "bytes on the device, copied per arm");
  app.add_option("--chunk", chunk_s, "copy chunk (cairn's CAIRN_CHUNK_BYTES)");
  app.add_option("--big-chunk", big_s, "the larger chunk of the engine_big arms");
  app.add_option("--threads", threads_s, "checksum thread counts to try");
  app.add_option("--rounds", rounds, "rounds, arms alternated within each");
  app.add_option("--host-root", host_root, "where the slot file lives (a tmpfs)");
  app.add_option("--huge-root", huge_root, "a tmpfs mounted huge=always (optional arm)");
  CLI11_PARSE(app, argc, argv);
  const uint64_t n = bench::ParseSizes(bytes_s).at(0);
  const uint64_t chunk = bench::ParseSizes(chunk_s).at(0);
  const uint64_t big = bench::ParseSizes(big_s).at(0);
  std::vector<int> threads;
  for (const std::string& t : bench::SplitList(threads_s)) threads.push_back(std::stoi(t));

  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("{\"bench\": \"gpu_parts\", \"skipped\": \"no CUDA device\"}\n");
    return 0;
  }
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  void* src = nullptr;
  Check(cudaMalloc(&src, n), "cudaMalloc");
  Check(cudaMemset(src, 0x5a, n), "cudaMemset");
  cudaStream_t stream = nullptr;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

  void* alloc = nullptr;
  Check(cudaHostAlloc(&alloc, n, cudaHostAllocPortable), "cudaHostAlloc");
  std::memset(alloc, 0, n);
  FileSystem* fs = DefaultFileSystem();
  auto slot = SlotFile(fs, host_root, n);
  Check(cudaHostRegister(slot->data(), n, cudaHostRegisterPortable), "cudaHostRegister slot");
  void* anon = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (anon == MAP_FAILED) Check(Status::IOError("mmap"), "anonymous memory");
  ::madvise(anon, n, MADV_HUGEPAGE);
  std::memset(anon, 0, n);
  Check(cudaHostRegister(anon, n, cudaHostRegisterPortable), "cudaHostRegister anon");
  std::unique_ptr<MappedFile> huge;
  if (!huge_root.empty()) {
    huge = SlotFile(fs, huge_root, n);
    Check(cudaHostRegister(huge->data(), n, cudaHostRegisterPortable), "cudaHostRegister huge");
  }

  auto raw = [&](void* dst, uint64_t c, bool events) {
    std::vector<cudaEvent_t> evs;
    for (uint64_t off = 0; off < n; off += c) {
      Check(cudaMemcpyAsync(static_cast<char*>(dst) + off, static_cast<char*>(src) + off,
                            std::min(c, n - off), cudaMemcpyDeviceToHost, stream),
            "cudaMemcpyAsync");
      if (events) {
        cudaEvent_t e = nullptr;
        Check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync),
              "cudaEventCreate");
        Check(cudaEventRecord(e, stream), "cudaEventRecord");
        evs.push_back(e);
      }
    }
    for (cudaEvent_t e : evs) {
      Check(cudaEventSynchronize(e), "cudaEventSynchronize");
      cudaEventDestroy(e);
    }
    Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  };
  // The engine with its window, and with the whole version queued at once.
  std::map<std::pair<std::string, int>, std::unique_ptr<CopyEngine>> engines;
  for (const char* kind : {"stream", "all"}) {
    for (int t : threads) {
      auto e = MakeCudaCopyEngine(t, kind == std::string("all") ? 0 : kCudaCopyWindowBytes);
      Check(e.status(), "the CUDA engine");
      engines[{kind, t}] = std::move(*e);
    }
  }

  auto capture = [&](CopyEngine* e, uint64_t c) {
    std::vector<CopyChunk> chunks;
    for (uint64_t off = 0; off < n; off += c)
      chunks.push_back({static_cast<char*>(src) + off, slot->data() + off, std::min(c, n - off),
                        true, off > 0});  // one allocation: the chunks may be grouped
    std::vector<uint64_t> sums(chunks.size());
    Check(e->Capture(nullptr, 0, chunks, sums.data(), [](std::shared_ptr<StreamMark>) {}),
          "Capture");
  };

  std::map<std::string, std::vector<double>> hashed;  // GB/s checksummed during a copy
  std::vector<std::pair<std::string, std::function<void()>>> arms = {
      {"idle", [] { std::this_thread::sleep_for(std::chrono::milliseconds(100)); }},
      {"raw_alloc", [&] { raw(alloc, chunk, false); }},
      {"raw_slot", [&] { raw(slot->data(), chunk, false); }},
      {"raw_anon", [&] { raw(anon, chunk, false); }},
      {"events_slot", [&] { raw(slot->data(), chunk, true); }},
      {"raw_slot_big", [&] { raw(slot->data(), big, false); }},
  };
  if (huge) arms.push_back({"raw_huge_slot", [&] { raw(huge->data(), chunk, false); }});
  for (int t : threads) {
    CopyEngine* all = engines[{"all", t}].get();
    CopyEngine* e = engines[{"stream", t}].get();
    arms.push_back({"all_slot_" + std::to_string(t), [=, &capture] { capture(all, chunk); }});
    arms.push_back({"stream_slot_" + std::to_string(t), [=, &capture] { capture(e, chunk); }});
    arms.push_back({"stream_big_" + std::to_string(t), [=, &capture] { capture(e, big); }});
    // The raw copy while T threads checksum other memory at full speed: whether host
    // memory traffic alone slows the link's writes into the slot.
    arms.push_back(
        {"raw_slot_under_checksum_" + std::to_string(t), [=, &raw, &slot, &hashed] {
           std::atomic<bool> stop{false};
           uint64_t bytes = 0;
           const int64_t t0 = NowNanos();
           std::thread hog([&] {
             std::vector<HostRange> ranges;
             for (uint64_t off = 0; off < n; off += chunk)
               ranges.push_back({static_cast<std::byte*>(anon) + off, std::min(chunk, n - off)});
             std::vector<uint64_t> sums(ranges.size());
             for (size_t i = 0; !stop.load(); i = (i + 4 * t) % ranges.size()) {
               const auto batch =
                   std::span(ranges).subspan(i, std::min<size_t>(4 * t, ranges.size() - i));
               e->ChecksumHost(batch, sums.data());
               if (!stop.load())
                 for (const HostRange& r : batch) bytes += r.bytes;
             }
           });
           raw(slot->data(), chunk, false);
           const double copy_s = NanosToSeconds(NowNanos() - t0);
           stop = true;
           hog.join();
           hashed["checksum_under_copy_" + std::to_string(t)].push_back(static_cast<double>(bytes) /
                                                                        copy_s / 1e9);
         }});
    arms.push_back({"checksum_" + std::to_string(t), [=, &slot] {
                      std::vector<HostRange> ranges;
                      for (uint64_t off = 0; off < n; off += chunk)
                        ranges.push_back({slot->data() + off, std::min(chunk, n - off)});
                      std::vector<uint64_t> sums(ranges.size());
                      e->ChecksumHost(ranges, sums.data());
                    }});
  }
  arms.push_back({"persist", [&] { slot->Persist(0, n); }});

  // The launch probe: tiny memsets on a stream of its own while an arm runs.
  void* probe_buf = nullptr;
  Check(cudaMalloc(&probe_buf, 256), "cudaMalloc (probe)");
  cudaStream_t probe_stream = nullptr;
  Check(cudaStreamCreateWithFlags(&probe_stream, cudaStreamNonBlocking), "cudaStreamCreate");
  void* probe_host = nullptr;
  Check(cudaHostAlloc(&probe_host, 256, cudaHostAllocPortable), "cudaHostAlloc (probe)");
  struct Probe {
    double launch_us = 0, d2h_ms = 0, d2h_max_ms = 0;
  };
  auto probed = [&](const std::function<void()>& fn, Probe* out) {
    std::atomic<bool> stop{false};
    int64_t calls = 0, call_ns = 0, d2h = 0, d2h_ns = 0, d2h_max_ns = 0;
    std::thread probe([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        const int64_t t0 = NowNanos();
        Check(cudaMemsetAsync(probe_buf, calls & 0xff, 256, probe_stream), "cudaMemsetAsync");
        call_ns += NowNanos() - t0;
        if (++calls % 16 == 0) {  // what a loss.item() waits for
          const int64_t t1 = NowNanos();
          Check(cudaMemcpyAsync(probe_host, probe_buf, 4, cudaMemcpyDeviceToHost, probe_stream),
                "cudaMemcpyAsync (probe)");
          Check(cudaStreamSynchronize(probe_stream), "probe sync");
          const int64_t dt = NowNanos() - t1;
          ++d2h;
          d2h_ns += dt;
          d2h_max_ns = std::max(d2h_max_ns, dt);
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    });
    fn();
    stop = true;
    probe.join();
    Check(cudaStreamSynchronize(probe_stream), "probe sync");
    out->launch_us = calls ? static_cast<double>(call_ns) / static_cast<double>(calls) / 1e3 : 0;
    out->d2h_ms = d2h ? static_cast<double>(d2h_ns) / static_cast<double>(d2h) / 1e6 : 0;
    out->d2h_max_ms = static_cast<double>(d2h_max_ns) / 1e6;
  };

  for (auto& [name, fn] : arms) fn();  // warm up: every path once
  hashed.clear();
  std::map<std::string, std::vector<double>> seconds, launch, d2h, d2h_max;
  for (int r = 0; r < rounds; ++r) {
    for (auto& [name, fn] : arms) {
      const int64_t t0 = NowNanos();
      Probe p;
      probed(fn, &p);
      const double s = NanosToSeconds(NowNanos() - t0);
      seconds[name].push_back(s);
      launch[name].push_back(p.launch_us);
      d2h[name].push_back(p.d2h_ms);
      d2h_max[name].push_back(p.d2h_max_ms);
      std::printf("round %d %-28s %8.2f ms %7.2f GB/s  launch %6.2f us  d2h %7.3f ms (max %7.3f)\n",
                  r, name.c_str(), s * 1e3, static_cast<double>(n) / s / 1e9, p.launch_us, p.d2h_ms,
                  p.d2h_max_ms);
      std::fflush(stdout);
    }
  }

  nlohmann::ordered_json j;
  j["bench"] = "gpu_parts";
  j["device"] = prop.name;
  j["bytes"] = n;
  j["chunk_bytes"] = chunk;
  j["big_chunk_bytes"] = big;
  j["cores"] = std::thread::hardware_concurrency();
  for (auto& [name, fn] : arms)
    if (name != "idle")
      j[name + "_gbps"] =
          std::round(static_cast<double>(n) / bench::Median(seconds[name]) / 1e7) / 100.0;
  for (auto& [name, v] : hashed) j[name + "_gbps"] = std::round(bench::Median(v) * 100) / 100.0;
  for (auto& [name, fn] : arms)
    j["launch_us_" + name] = std::round(bench::Median(launch[name]) * 100) / 100.0;
  for (auto& [name, fn] : arms)
    j["d2h_ms_" + name] = std::round(bench::Median(d2h[name]) * 1000) / 1000.0;
  for (auto& [name, fn] : arms)
    j["d2h_max_ms_" + name] = std::round(bench::Median(d2h_max[name]) * 1000) / 1000.0;
  std::printf("%s\n", j.dump().c_str());

  cudaHostUnregister(slot->data());
  cudaHostUnregister(anon);
  if (huge) cudaHostUnregister(huge->data());
  ::munmap(anon, n);
  cudaFreeHost(alloc);
  cudaFree(src);
  cudaFree(probe_buf);
  cudaFreeHost(probe_host);
  cudaStreamDestroy(stream);
  cudaStreamDestroy(probe_stream);
  return 0;
}
