// The MPI store's messages: a request is [op][reply tag][fields], a reply [status][fields]; a
// field is an int64 or a length-prefixed byte string. Both ends run the same build, so integers
// travel in host byte order (MPI_BYTE: MPI converts nothing, and needs nothing converted).
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpi/Check.hpp"

namespace mpigpu::store {

using Clock = std::chrono::steady_clock;

// Requests go to the server on kRequestTag; each reply comes back on the tag its request named,
// one of kReplyTags from kFirstReplyTag (MPI_TAG_UB is at least 32767).
constexpr int kRequestTag = 1;
constexpr int kFirstReplyTag = 2;
constexpr int kReplyTags = 4096;

enum class Op : uint8_t {
  Set,
  Get,  // waits for the key
  Add,
  CompareSet,
  Check,
  Delete,
  NumKeys,
  Wait,  // waits for every key
  Append,
  MultiGet,  // waits for every key
  MultiSet,
  ListKeys,
  Cancel,  // a waiting request timed out: answer it now (status Cancelled) if still waiting
  Bye,     // this rank has finished with the store (at exit); no reply
};

const char* opName(Op op);

enum class Status : uint8_t { Ok, Cancelled, Failed };

class Writer {
 public:
  Writer& u8(uint8_t v) {
    bytes_.push_back(v);
    return *this;
  }
  Writer& i64(int64_t v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof v);
    return *this;
  }
  Writer& blob(const uint8_t* data, size_t n) {
    i64(static_cast<int64_t>(n));
    bytes_.insert(bytes_.end(), data, data + n);
    return *this;
  }
  Writer& blob(const std::vector<uint8_t>& v) { return blob(v.data(), v.size()); }
  Writer& str(const std::string& s) {
    return blob(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  Writer& strs(const std::vector<std::string>& v) {
    i64(static_cast<int64_t>(v.size()));
    for (const auto& s : v) str(s);
    return *this;
  }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& bytes) : bytes_(bytes) {}
  uint8_t u8() {
    need(1);
    return bytes_[at_++];
  }
  int64_t i64() {
    int64_t v;
    need(sizeof v);
    std::memcpy(&v, bytes_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  std::vector<uint8_t> blob() {
    const auto n = static_cast<size_t>(i64());
    need(n);
    std::vector<uint8_t> v(bytes_.begin() + at_, bytes_.begin() + at_ + n);
    at_ += n;
    return v;
  }
  std::string str() {
    const auto v = blob();
    return std::string(v.begin(), v.end());
  }
  std::vector<std::string> strs() {
    const auto n = static_cast<size_t>(i64());
    need(n);  // at least a byte per string: a corrupt count fails here, not in a huge reserve
    std::vector<std::string> v;
    v.reserve(n);
    for (size_t i = 0; i < n; ++i) v.push_back(str());
    return v;
  }

 private:
  void need(size_t n) const {
    if (n > bytes_.size() - at_) throw std::runtime_error("truncated MPI store message");
  }
  const std::vector<uint8_t>& bytes_;
  size_t at_ = 0;
};

// A message from `source` (MPI_ANY_SOURCE: any) with `tag`, if one has arrived: received whole
// into `into`, sized by the probe (no receive is left posted). Returns its sender, or -1 when no
// such message waits.
inline int receiveWhole(MPI_Comm comm, int source, int tag, std::vector<uint8_t>& into,
                        const char* op, int rank) {
  int flag = 0;
  MPI_Message message;
  MPI_Status status;
  MPIGPU_MPI_CHECK(MPI_Improbe(source, tag, comm, &flag, &message, &status), op, rank);
  if (!flag) return -1;
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  into.resize(static_cast<size_t>(count));
  MPIGPU_MPI_CHECK(MPI_Mrecv(into.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE), op, rank);
  return status.MPI_SOURCE;
}

}  // namespace mpigpu::store
