// A c10d::Store over MPI: each call is a request to the server on rank 0 of its Channel and a
// reply on a tag of the caller's own, so several threads of a process may call at once. A call
// that waits (get, wait, multi_get) is answered once its keys exist; the caller sleeps between
// checks for the reply and, at its timeout, cancels the request and raises naming the keys.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/TorchCompat.hpp"
#include "store/Channel.hpp"
#include "store/Wire.hpp"

namespace mpigpu::store {

class MpiStore : public c10d::Store {
 public:
  MpiStore(std::shared_ptr<Channel> channel, std::chrono::milliseconds timeout);

  c10::intrusive_ptr<c10d::Store> clone() override;
  using c10d::Store::set;
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  using c10d::Store::compareSet;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;
  void append(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::vector<uint8_t>>& values) override;
  std::vector<std::string> listKeys() MPIGPU_OVERRIDE_SINCE_2_10;
  bool hasExtendedApi() const override { return true; }

  int rank() const { return channel_->rank(); }
  int size() const { return channel_->size(); }

 private:
  // Sends `op` with the fields `fill` writes, waits for the reply up to `timeout` (0: no limit)
  // and returns its fields; raises DistStoreError naming the call, `keys` and this rank.
  std::vector<uint8_t> call(Op op, const std::function<void(Writer&)>& fill,
                            const std::vector<std::string>& keys,
                            std::chrono::milliseconds timeout);
  std::vector<uint8_t> call(Op op, const std::function<void(Writer&)>& fill,
                            const std::vector<std::string>& keys) {
    return call(op, fill, keys, timeout_);
  }
  // Checks for the reply until it comes; at the timeout cancels a waiting call (the server then
  // answers Cancelled), and raises where the server never answers.
  std::vector<uint8_t> awaitReply(Op op, int tag, const std::vector<std::string>& keys,
                                  std::chrono::milliseconds timeout,
                                  std::vector<MPI_Request>& sends, std::vector<uint8_t>& request);
  // One check for the reply on `tag` (completing `sends` as they finish); true once it is in
  // `reply`.
  bool poll(int tag, std::vector<MPI_Request>& sends, std::vector<uint8_t>& reply);
  void sendCancel(int tag, std::vector<MPI_Request>& sends, std::vector<uint8_t>& bytes);
  std::string error(Op op, const std::vector<std::string>& keys, const std::string& what) const;

  std::shared_ptr<Channel> channel_;
};

// Requests this process sent to MPI stores (each one message to the server and one back).
uint64_t callsMade();

// Collective over `comm`: a store whose server is `comm`'s rank 0, on a duplicate of `comm`.
c10::intrusive_ptr<MpiStore> makeMpiStore(MPI_Comm comm, std::chrono::milliseconds timeout,
                                          const char* op);

}  // namespace mpigpu::store
