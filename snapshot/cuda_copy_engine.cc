// The CUDA copy engine: device -> pinned host slot copies on a dedicated stream.
// Compiled only when CMake finds the CUDA toolkit; without a usable device every entry
// point reports Unavailable and cairn uses the host engine.
#include <cuda_runtime_api.h>

#include <string>

#include "snapshot/copy_engine.h"

// Turns a failed CUDA runtime call into a Status naming the call and the error.
#define CAIRN_CUDA_CHECK(call)                                                                  \
  do {                                                                                          \
    cudaError_t _e = (call);                                                                    \
    if (_e != cudaSuccess)                                                                      \
      return ::cairn::Status::IOError(std::string(#call) + " failed: " + cudaGetErrorName(_e) + \
                                      " (" + cudaGetErrorString(_e) + ")");                     \
  } while (0)

namespace cairn {
namespace {

class CudaCopyEngine final : public CopyEngine {
 public:
  CudaCopyEngine(int device, cudaStream_t stream, cudaEvent_t done,
                 std::unique_ptr<CopyEngine> host)
      : device_(device), stream_(stream), done_(done), host_(std::move(host)) {}
  ~CudaCopyEngine() override {
    cudaEventDestroy(done_);
    cudaStreamDestroy(stream_);
  }

  std::string_view name() const override { return "cuda"; }
  bool checksums_while_copying() const override { return false; }

  Status Copy(std::span<const CopyChunk> chunks, uint64_t* checksums) override {
    (void)checksums;  // computed by the caller from the host slot after the copy
    CAIRN_CUDA_CHECK(cudaSetDevice(device_));
    for (const CopyChunk& c : chunks)
      CAIRN_CUDA_CHECK(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDefault, stream_));
    CAIRN_CUDA_CHECK(cudaEventRecord(done_, stream_));
    CAIRN_CUDA_CHECK(cudaEventSynchronize(done_));
    return Status::OK();
  }

  void ChecksumHost(std::span<const HostRange> ranges, uint64_t* out) override {
    host_->ChecksumHost(ranges, out);
  }

  Status RegisterHost(void* p, size_t n) override {
    CAIRN_CUDA_CHECK(cudaSetDevice(device_));
    cudaError_t e = cudaHostRegister(p, n, cudaHostRegisterDefault);
    if (e == cudaErrorHostMemoryAlreadyRegistered) {
      cudaGetLastError();
      return Status::OK();
    }
    CAIRN_CUDA_CHECK(e);
    return Status::OK();
  }
  void UnregisterHost(void* p, size_t n) override {
    (void)n;
    cudaHostUnregister(p);
  }

 private:
  int device_;
  cudaStream_t stream_;
  cudaEvent_t done_;
  std::unique_ptr<CopyEngine> host_;
};

Status OpenDevice(int* device) {
  int count = 0;
  CAIRN_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (count == 0) return Status::Unavailable("no CUDA device");
  CAIRN_CUDA_CHECK(cudaGetDevice(device));
  return Status::OK();
}

}  // namespace

bool CudaDeviceAvailable() {
  int device = 0;
  return OpenDevice(&device).ok();
}

Result<std::unique_ptr<CopyEngine>> MakeCudaCopyEngine(int threads) {
  int device = 0;
  Status st = OpenDevice(&device);
  if (!st.ok())
    return Status::Unavailable("the CUDA copy engine needs a usable CUDA device: " + st.message());
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  CAIRN_CUDA_CHECK(cudaSetDevice(device));
  CAIRN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaError_t e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    cudaStreamDestroy(stream);
    CAIRN_CUDA_CHECK(e);
  }
  return std::unique_ptr<CopyEngine>(
      new CudaCopyEngine(device, stream, done, MakeHostCopyEngine(threads)));
}

}  // namespace cairn
