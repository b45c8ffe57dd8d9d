// ByteWriter / ByteReader: little-endian encoding of the on-disk and in-memory records
// cairn writes (slot headers, writer index files). Messages between live ranks use the one
// codec of wire/codec.h instead.
// Thread-safety: plain values.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "cairn/status.h"

namespace cairn {

static_assert(std::endian::native == std::endian::little,
              "cairn's records are little-endian; add byte swapping for this host");

class ByteWriter {
 public:
  template <typename T>
  void Put(T v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void PutBytes(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  // u32 length, then the bytes.
  void PutString(std::string_view s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  std::string& out() { return out_; }

 private:
  std::string out_;
};

// Every Get returns false, consuming nothing, when the bytes left are too few.
class ByteReader {
 public:
  explicit ByteReader(std::string_view b) : b_(b) {}
  template <typename T>
  bool Get(T* v) {
    if (b_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetString(std::string* s, size_t max) {
    const size_t start = pos_;
    uint32_t n = 0;
    if (!Get(&n) || n > max || b_.size() - pos_ < n) return Rewind(start);
    s->assign(b_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  size_t remaining() const { return b_.size() - pos_; }

 private:
  bool Rewind(size_t to) {
    pos_ = to;
    return false;
  }

  std::string_view b_;
  size_t pos_ = 0;
};

}  // namespace cairn
