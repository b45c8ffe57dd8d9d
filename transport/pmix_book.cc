#include "transport/pmix_book.h"

#include <cstdlib>
#include <string>

#include "transport/rendezvous.h"

#if CAIRN_HAVE_PMIX
#include <pmix.h>
#endif

namespace cairn {

#if CAIRN_HAVE_PMIX
namespace {

constexpr const char* kAddressKey = "cairn.address";
constexpr const char* kTokenKey = "cairn.token";

std::string PmixError(pmix_status_t st) {
  return PMIx_Error_string(st);
}

// pmix_info_t directives that destruct themselves.
class Infos {
 public:
  ~Infos() {
    for (size_t i = 0; i < n_; ++i) PMIX_INFO_DESTRUCT(&infos_[i]);  // only those loaded
  }
  void Add(const char* key, const void* value, pmix_data_type_t type) {
    pmix_info_t& i = infos_[n_++];
    PMIX_INFO_CONSTRUCT(&i);
    (void)PMIx_Info_load(&i, key, value, type);
  }
  pmix_info_t* get() { return infos_; }
  size_t size() const { return n_; }

 private:
  pmix_info_t infos_[2];
  size_t n_ = 0;
};

class PmixAddressBook final : public AddressBook {
 public:
  PmixAddressBook(const pmix_proc_t& me, int world, bool collect, double timeout_s)
      : me_(me),
        world_(world),
        collect_(collect),
        timeout_s_(static_cast<int>(timeout_s + 0.999)),
        where_(std::string("PMIx namespace ") + me.nspace) {}
  ~PmixAddressBook() override { (void)PMIx_Finalize(nullptr, 0); }

  Result<Joined> Join(std::string_view address, const std::string& token_override) override {
    Joined j;
    CAIRN_ASSIGN_OR_RETURN(j.nonce, RandomHex(8));
    const int rank = static_cast<int>(me_.rank);
    CAIRN_RETURN_IF_ERROR(Put(kAddressKey, EncodeAddressFile(rank, world_, j.nonce, address)));
    if (rank == 0 && token_override.empty()) {
      CAIRN_ASSIGN_OR_RETURN(std::string token, RandomHex(kTokenHexBytes / 2));
      CAIRN_RETURN_IF_ERROR(Put(kTokenKey, token));
    }
    pmix_status_t st = PMIx_Commit();
    if (st != PMIX_SUCCESS)
      return Status::IOError("PMIx_Commit in " + where_ + ": " + PmixError(st));
    // Every rank has put its address once the fence completes; with `collect_` the
    // launcher's daemons have also exchanged them (a full mesh reads them all next).
    pmix_proc_t all;
    PMIX_LOAD_PROCID(&all, me_.nspace, PMIX_RANK_WILDCARD);
    bool collect = collect_;
    Infos info;
    info.Add(PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
    info.Add(PMIX_TIMEOUT, &timeout_s_, PMIX_INT);
    st = PMIx_Fence(&all, 1, info.get(), info.size());
    if (st != PMIX_SUCCESS)
      return Status::Unavailable("PMIx_Fence in " + where_ + ": " + PmixError(st) + " within " +
                                 std::to_string(timeout_s_) +
                                 " s (a rank of the job failed to start?)");
    if (!token_override.empty()) {
      j.token = token_override;
      return j;
    }
    CAIRN_ASSIGN_OR_RETURN(j.token, Get(0, kTokenKey));
    if (j.token.size() != kTokenHexBytes)
      return Status::Corruption("the job token rank 0 put in " + where_ + " has " +
                                std::to_string(j.token.size()) + " characters, not " +
                                std::to_string(kTokenHexBytes));
    return j;
  }

  Status Read(int peer, std::string* address, std::string* nonce) override {
    CAIRN_ASSIGN_OR_RETURN(std::string b, Get(peer, kAddressKey));
    return ParseAddressFile(b, peer, world_, address, nonce)
        .WithContext("rank " + std::to_string(peer) + "'s " + kAddressKey + " in " + where_);
  }

  void Withdraw() override {}  // the launcher drops the namespace's data with the job
  const std::string& where() const override { return where_; }

 private:
  Status Put(const char* key, const std::string& bytes) {
    pmix_value_t v;
    PMIX_VALUE_CONSTRUCT(&v);
    v.type = PMIX_BYTE_OBJECT;
    v.data.bo.bytes = const_cast<char*>(bytes.data());  // PMIx_Put copies it
    v.data.bo.size = bytes.size();
    const pmix_status_t st = PMIx_Put(PMIX_GLOBAL, key, &v);
    if (st != PMIX_SUCCESS)
      return Status::IOError(std::string("PMIx_Put ") + key + " in " + where_ + ": " +
                             PmixError(st));
    return Status::OK();
  }

  // The bytes `peer` put under `key`: NotFound when it has not (yet), Unavailable when
  // PMIx cannot answer within the connect timeout.
  Result<std::string> Get(int peer, const char* key) {
    pmix_proc_t p;
    PMIX_LOAD_PROCID(&p, me_.nspace, static_cast<pmix_rank_t>(peer));
    Infos info;
    info.Add(PMIX_TIMEOUT, &timeout_s_, PMIX_INT);
    pmix_value_t* v = nullptr;
    const pmix_status_t st = PMIx_Get(&p, key, info.get(), info.size(), &v);
    const std::string what =
        std::string(key) + " of rank " + std::to_string(peer) + " in " + where_;
    if (st == PMIX_ERR_NOT_FOUND) return Status::NotFound("no " + what);
    if (st != PMIX_SUCCESS) return Status::Unavailable("PMIx_Get " + what + ": " + PmixError(st));
    std::string out;
    const bool bytes = v->type == PMIX_BYTE_OBJECT;
    if (bytes) out.assign(v->data.bo.bytes, v->data.bo.size);
    PMIX_VALUE_RELEASE(v);
    if (!bytes) return Status::Corruption(what + " is not a byte object");
    return out;
  }

  pmix_proc_t me_;
  int world_;
  bool collect_;
  int timeout_s_;
  std::string where_;
};

}  // namespace

bool PmixAvailable() {
  return true;
}

Result<std::unique_ptr<AddressBook>> OpenPmixAddressBook(const Options& o, bool collect,
                                                         bool* other_job) {
  if (!std::getenv("PMIX_NAMESPACE"))
    return Status::FailedPrecondition(
        "CAIRN_BOOTSTRAP=pmix, but this process was not started by a PMIx launcher "
        "(PMIX_NAMESPACE is not set; use mpirun or srun --mpi=pmix, or CAIRN_BOOTSTRAP=files)");
  pmix_proc_t me;
  pmix_status_t st = PMIx_Init(&me, nullptr, 0);
  if (st != PMIX_SUCCESS)
    return Status::Unavailable("PMIx_Init: " + PmixError(st) +
                               " (is the launcher's PMIx server reachable?)");
  auto book = std::make_unique<PmixAddressBook>(me, o.world_size, collect, o.connect_timeout_s);
  pmix_proc_t job;
  PMIX_LOAD_PROCID(&job, me.nspace, PMIX_RANK_WILDCARD);
  pmix_value_t* v = nullptr;
  st = PMIx_Get(&job, PMIX_JOB_SIZE, nullptr, 0, &v);
  if (st != PMIX_SUCCESS)
    return Status::Unavailable("PMIx_Get job size in " + book->where() + ": " + PmixError(st));
  uint32_t size = 0;
  if (v->type == PMIX_UINT32) size = v->data.uint32;
  PMIX_VALUE_RELEASE(v);
  const std::string says = "the launcher's PMIx says this process is rank " +
                           std::to_string(me.rank) + " of " + std::to_string(size);
  if (other_job && static_cast<int>(size) != o.world_size) {
    // Another launcher inside the PMIx one (torchrun under srun --mpi=pmix): the PMIx job
    // is not cairn's. Every rank sees the same two sizes, so every rank decides alike.
    *other_job = true;
    return Status::FailedPrecondition(says + ", but cairn's job has " +
                                      std::to_string(o.world_size) + " ranks");
  }
  if (static_cast<int>(me.rank) != o.rank || static_cast<int>(size) != o.world_size)
    return Status::FailedPrecondition(
        says + ", but cairn was configured as rank " + std::to_string(o.rank) + " of " +
        std::to_string(o.world_size) +
        " (CAIRN_RANK / CAIRN_WORLD_SIZE, or RANK / WORLD_SIZE, disagree with the launcher)");
  return std::unique_ptr<AddressBook>(std::move(book));
}

#else

bool PmixAvailable() {
  return false;
}

Result<std::unique_ptr<AddressBook>> OpenPmixAddressBook(const Options&, bool, bool*) {
  return Status::FailedPrecondition(
      "CAIRN_BOOTSTRAP=pmix, but this cairn was built without PMIx (install libpmix-dev and "
      "rebuild, or use CAIRN_BOOTSTRAP=files)");
}

#endif

}  // namespace cairn
