// Note [Backend seam]: this and gloo_backend.cpp are the only translation units that name a c10d
// backend. Gloo serves CPU tensors; NCCL would be chosen here for CUDA tensors when LibTorch was
// built with it, and nowhere else, so the rest of lockstep stays device-generic.
#include "lockstep/dist/process_group.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "lockstep/core/world.h"
#include "gloo_backend.h"
#include "hierarchical_all_reduce.h"
#include "lockstep/core/names.h"
#include "rendezvous_store.h"
#include "shm_collectives.h"
#include "wire_words.h"

namespace lockstep::dist {
namespace {

using Clock = std::chrono::steady_clock;

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
    default: return c10d::ReduceOp::SUM;
  }
}

}  // namespace

const std::vector<std::string>& all_reduce_algorithm_names() {
  static const std::vector<std::string> names{"auto", "flat", "hierarchical"};
  return names;
}

ProcessGroup::ProcessGroup(c10::intrusive_ptr<c10d::Store> store,
                           c10::intrusive_ptr<c10d::Backend> backend,
                           std::chrono::milliseconds timeout, SharedMemory shared_memory,
                           std::vector<std::string> interfaces, std::string network)
    : store_(std::move(store)),
      backend_(std::move(backend)),
      timeout_(timeout),
      rank_(backend_->getRank()),
      size_(backend_->getSize()),
      shared_memory_(shared_memory),
      interfaces_(std::move(interfaces)),
      network_(std::move(network)) {
  const HostMap hosts = exchange_hosts(*store_, rank_, size_, shared_memory);
  host_of_rank_ = hosts.host_of_rank;
  if (hosts.shares_memory()) shm_ = ShmCollectives::create(*store_, rank_, size_, timeout_);
}

int64_t ProcessGroup::hosts() const { return *std::max_element(host_of_rank_.begin(), host_of_rank_.end()) + 1; }

std::string ProcessGroup::describe() const {
  const std::string all_reduce = hierarchical_ ? hierarchical_->describe()
                                               : c10::str("flat (", shm_ ? "shared memory" : "one Gloo ring", " over ",
                                                          size_, size_ == 1 ? " rank" : " ranks", " on ", hosts(),
                                                          hosts() == 1 ? " host)" : " hosts)");
  return c10::str("rank ", rank_, " of ", size_, (network_.empty() ? "" : "; " + network_),
                  "; shared memory between the ranks of a host: ", shm_ ? "on" : "off", "; all-reduce: ", all_reduce,
                  "; timeout ", seconds(timeout_), " s per collective");
}

void ProcessGroup::choose_all_reduce(AllReduceAlgorithm algorithm) {
  // See Note [Hierarchical all-reduce].
  std::vector<std::vector<int64_t>> ranks_of(hosts());
  for (int64_t r = 0; r < size_; ++r) ranks_of[host_of_rank_[r]].push_back(r);
  const size_t local = ranks_of[0].size();
  const bool even = std::all_of(ranks_of.begin(), ranks_of.end(), [&](const auto& on) { return on.size() == local; });
  if (algorithm == AllReduceAlgorithm::kHierarchical && !even) {
    std::vector<size_t> counts;
    for (const auto& on : ranks_of) counts.push_back(on.size());
    TORCH_CHECK_VALUE(false, "rank ", rank_, " of ", size_, ": a hierarchical all-reduce needs as many ranks on every ",
                      "host, but the ", ranks_of.size(), " hosts hold ", c10::Join(", ", counts),
                      " ranks; start the same number on each, or choose the flat all-reduce (--allreduce flat)");
  }
  if (algorithm == AllReduceAlgorithm::kFlat || ranks_of.size() < 2 || local < 2 || !even) return;
  std::unique_ptr<ProcessGroup> local_group, cross_group;
  for (const auto& on_host : ranks_of)  // collective: every rank makes every subgroup, in one order
    if (auto g = new_group(on_host)) local_group = std::move(g);
  for (size_t i = 0; i < local; ++i) {
    std::vector<int64_t> ranks;
    for (const auto& on_host : ranks_of) ranks.push_back(on_host[i]);
    std::sort(ranks.begin(), ranks.end());
    if (auto g = new_group(ranks)) cross_group = std::move(g);
  }
  local_group->counts_in_parent_ = cross_group->counts_in_parent_ = false;
  hierarchical_ = std::make_unique<HierarchicalAllReduce>(std::move(local_group), std::move(cross_group), timeout_);
}

ProcessGroup::~ProcessGroup() = default;  // backend before store: members die in reverse order

void ProcessGroup::wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what) {
  try {
    work->wait(timeout_);
  } catch (const std::exception& e) {
    const std::string why = e.what();
    TORCH_CHECK(false, what, " failed on rank ", rank_, " of ", size_, parent_ranks_, " (timeout ", seconds(timeout_),
                " s): ", why.substr(0, why.find('\n')), ". ", roll_call());
  }
}

// Note [Naming the rank that did not arrive]
// A collective that times out says only that it timed out, on every rank that was waiting, and a
// launcher that reports the first rank to exit would then blame a healthy rank for a stalled one.
// After a failed collective each rank that is still running signs in under its own key in the
// store and looks, for a few seconds, for the others' keys: whoever never signs in is the rank
// that stalled (stopped, deadlocked, far slower) or died. The keys are written once: a failed
// collective ends the group.
std::string ProcessGroup::roll_call() {
  const auto window = std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(5));
  const auto key = [](int64_t r) { return std::string("lockstep/roll_call/") + std::to_string(r); };
  std::vector<int64_t> absent;
  try {
    store_->setTimeout(window);  // rank 0 hosts the store: if it is the stalled one, the store is too
    store_->set(key(rank_), std::vector<uint8_t>{1});
    const auto deadline = Clock::now() + window;
    do {
      absent.clear();
      for (int64_t r = 0; r < size_; ++r)
        if (r != rank_ && !store_->check({key(r)})) absent.push_back(r);
      if (absent.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // polling the store, bounded by `deadline`
    } while (Clock::now() < deadline);
  } catch (const std::exception&) {
    return "The store on rank 0 does not answer either: rank 0 stalled or exited";
  }
  if (absent.empty())
    return "Every rank is still running: they called different collectives, or the network failed";
  std::string ranks;
  for (int64_t r : absent) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  return c10::str(absent.size() == 1 ? "Rank " : "Ranks ", ranks, " did not sign in within ", seconds(window),
                  " s of the failure: ", absent.size() == 1 ? "it" : "they",
                  " stalled (stopped by a signal or a debugger, deadlocked, or far slower than the others) or "
                  "exited. If it is only slow, raise the timeout (lockstep train --timeout)");
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::start_all_reduce(torch::Tensor& tensor, ReduceOp op, bool waits_next) {
  count_sent(2.0 * ring_share() * static_cast<double>(tensor.nbytes()));
  // See Note [Collectives through shared memory] and Note [Hierarchical all-reduce].
  if (shm_ && ShmCollectives::accepts(tensor, op))
    return shm_->all_reduce(tensor, waits_next ? ShmCollectives::When::kNowIfIdle : ShmCollectives::When::kQueue);
  if (hierarchical_ && HierarchicalAllReduce::accepts(tensor, op)) return hierarchical_->all_reduce(tensor);
  std::vector<torch::Tensor> ts{tensor};
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  return backend_->allreduce(ts, o);
}

void ProcessGroup::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  wait(start_all_reduce(tensor, op, /*waits_next=*/true), "all_reduce");
  if (op == ReduceOp::kMean) tensor.div_(size_);
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::all_reduce_async(torch::Tensor& tensor) {
  return start_all_reduce(tensor, ReduceOp::kSum, /*waits_next=*/false);
}

void ProcessGroup::broadcast(torch::Tensor& tensor, int64_t root) {
  wait(start_broadcast(tensor, root, /*waits_next=*/true), "broadcast");
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::broadcast_async(torch::Tensor& tensor, int64_t root) {
  return start_broadcast(tensor, root, /*waits_next=*/false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::start_broadcast(torch::Tensor& tensor, int64_t root, bool waits_next) {
  TORCH_CHECK_VALUE(root >= 0 && root < size_, "broadcast root ", root, " is not a rank of a group of ", size_);
  count_sent(ring_share() * static_cast<double>(tensor.nbytes()));
  // See Note [Collectives through shared memory] and Note [Collectives on the calling thread].
  if (shm_ && ShmCollectives::accepts_broadcast(tensor))
    return shm_->broadcast(tensor, root, waits_next ? ShmCollectives::When::kNowIfIdle : ShmCollectives::When::kQueue);
  std::vector<torch::Tensor> ts{as_wire_words(tensor)};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  return backend_->broadcast(ts, o);
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::all_gather_async(const torch::Tensor& tensor,
                                                              std::vector<torch::Tensor>& out) {
  out.clear();
  for (int64_t r = 0; r < size_; ++r) out.push_back(torch::empty_like(tensor));
  count_sent(static_cast<double>((size_ - 1) * static_cast<int64_t>(tensor.nbytes())));
  std::vector<torch::Tensor> in{as_wire_words(tensor)};
  std::vector<std::vector<torch::Tensor>> outs(1);  // views sharing storage with `out`
  for (const auto& t : out) outs[0].push_back(as_wire_words(t));
  return backend_->allgather(outs, in);
}

std::vector<torch::Tensor> ProcessGroup::all_gather(const torch::Tensor& tensor) {
  std::vector<torch::Tensor> out;
  wait(all_gather_async(tensor.contiguous(), out), "all_gather");
  return out;
}

void ProcessGroup::barrier() {
  c10d::BarrierOptions o;
  o.timeout = timeout_;
  try {
    // Gloo's monitored barrier makes rank 0 name every rank that did not arrive.
    backend_->monitoredBarrier(o, /*waitAllRanks=*/true);
  } catch (const std::exception& e) {
    const std::string why = e.what();
    TORCH_CHECK(false, "barrier failed on rank ", rank_, " of ", size_, parent_ranks_, " after ", seconds(timeout_),
                " s: ", why.substr(0, why.find("Exception raised from")));
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroup::send_async(const torch::Tensor& tensor, int64_t peer, int64_t tag) {
  TORCH_CHECK_VALUE(peer >= 0 && peer < size_ && peer != rank_, "send from rank ", rank_, ": peer ", peer,
                    " is not another rank of a group of ", size_);
  TORCH_CHECK_VALUE(tensor.is_contiguous(), "send from rank ", rank_, " to rank ", peer, ": the tensor must be contiguous");
  std::vector<torch::Tensor> ts{as_wire_words(tensor)};
  return backend_->send(ts, static_cast<int>(peer), static_cast<int>(tag));
}

void ProcessGroup::recv(torch::Tensor& tensor, int64_t peer, int64_t tag, const std::string& what) {
  TORCH_CHECK_VALUE(peer >= 0 && peer < size_ && peer != rank_, "recv on rank ", rank_, ": peer ", peer,
                    " is not another rank of a group of ", size_);
  TORCH_CHECK_VALUE(tensor.is_contiguous(), "recv on rank ", rank_, " from rank ", peer, ": the tensor must be contiguous");
  std::vector<torch::Tensor> ts{as_wire_words(tensor)};
  const std::string description = "receiving " + what + " from rank " + std::to_string(peer);
  wait(backend_->recv(ts, static_cast<int>(peer), static_cast<int>(tag)), description.c_str());
}

double ProcessGroup::average(double value) {
  torch::Tensor t = torch::tensor({value}, torch::kFloat64);
  all_reduce(t, ReduceOp::kMean);
  return t.item<double>();
}

std::unique_ptr<ProcessGroup> ProcessGroup::new_group(const std::vector<int64_t>& ranks, AllReduceAlgorithm allreduce) {
  // See Note [Subgroups].
  TORCH_CHECK_VALUE(!ranks.empty(), "new_group on rank ", rank_, ": the list of ranks is empty");
  for (size_t i = 0; i < ranks.size(); ++i)
    TORCH_CHECK_VALUE(ranks[i] >= 0 && ranks[i] < size_ && (i == 0 || ranks[i] > ranks[i - 1]), "new_group on rank ",
                      rank_, ": ranks [", c10::Join(", ", ranks), "] must be ascending ranks of a group of ", size_,
                      " (0 to ", size_ - 1, "), each once");
  const int64_t index = subgroups_made_++;
  const auto me = std::find(ranks.begin(), ranks.end(), rank_);
  if (me == ranks.end()) return nullptr;
  auto store = c10::make_intrusive<c10d::PrefixStore>("lockstep/subgroup/" + std::to_string(index), store_);
  const int64_t rank = me - ranks.begin(), size = static_cast<int64_t>(ranks.size());
  c10::intrusive_ptr<c10d::Backend> backend;
  try {
    backend = gloo_backend(store, rank, size, timeout_, interfaces_);
  } catch (const std::exception& e) {
    const std::string why = e.what();
    TORCH_CHECK(false, "rank ", rank_, " of ", size_, ": subgroup ", index, " of ranks [", c10::Join(", ", ranks),
                "] did not connect within ", seconds(timeout_), " s (", why.substr(0, why.find('\n')),
                "); every rank must call new_group for the same subgroups in the same order");
  }
  auto group = std::make_unique<ProcessGroup>(store, backend, timeout_, shared_memory_, interfaces_);
  group->parent_ = this;
  group->parent_ranks_ = " (ranks " + c10::Join(", ", ranks) + " of the parent)";
  group->choose_all_reduce(allreduce);
  return group;
}

std::unique_ptr<ProcessGroup> init_process_group(const InitOptions& options) {
  const std::string& method = options.init_method();
  TORCH_CHECK_VALUE(options.timeout().count() > 0, "timeout must be positive, got ", options.timeout().count(), " ms");
  const std::chrono::milliseconds meet = options.rendezvous_timeout().value_or(options.timeout());
  TORCH_CHECK_VALUE(meet.count() > 0, "rendezvous_timeout must be positive, got ", meet.count(), " ms");
  const std::string& backend = options.backend();
  TORCH_CHECK_VALUE(backend == "auto" || backend == "gloo" || backend == "nccl", "unknown backend '", backend,
                    "'; choose auto, gloo or nccl");
  // See Note [Backend seam].
  TORCH_CHECK_VALUE(backend != "nccl", "backend 'nccl' is not available: this LibTorch ",
                    "was built without CUDA/NCCL; use backend 'gloo' (or 'auto')");

  WorldInfo env = world_from_env();
  const int64_t rank = options.rank() >= 0 ? options.rank() : env.rank;
  const int64_t world = options.world_size() >= 0 ? options.world_size() : env.world_size;
  TORCH_CHECK_VALUE(world >= 1, "world size ", world, " must be at least 1");
  TORCH_CHECK_VALUE(rank >= 0 && rank < world, "rank ", rank, " is not smaller than world size ",
                    world, "; ranks run from 0 to ", world - 1);
  const std::vector<std::string> interfaces = chosen_interfaces(options.iface(), rank, world);  // before anyone waits

  c10::intrusive_ptr<c10d::Store> store;
  std::string where;
  if (method.rfind("env://", 0) == 0 || method.rfind("tcp://", 0) == 0) {
    if (method.rfind("env://", 0) == 0) check_master_addr_reaches(env, rank, world);
    Endpoint at = method.rfind("env://", 0) == 0 ? Endpoint{env.master_addr, env.master_port}
                                                 : parse_tcp(method);
    where = at.host + ":" + std::to_string(at.port);
    store = tcp_store(at, rank, world, meet);
  } else if (method.rfind("file://", 0) == 0) {
    where = method;
    try {
      store = c10::make_intrusive<c10d::FileStore>(method.substr(7), static_cast<int>(world));
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "rank ", rank, ": cannot open the rendezvous file '", method.substr(7),
                  "': ", e.what(), "; it must be on a filesystem every rank can write");
    }
  } else {
    TORCH_CHECK_VALUE(false, "init_method '", method, "' is not env://, tcp://HOST:PORT or file://PATH");
  }
  store->setTimeout(meet);
  rendezvous(*store, rank, world, meet, where);
  store->setTimeout(options.timeout());  // the collectives' from here on
  std::string bound;
  auto gloo = gloo_backend(store, rank, world, options.timeout(), interfaces, &bound);
  auto group = std::make_unique<ProcessGroup>(store, gloo, options.timeout(), options.shared_memory(), interfaces,
                                              c10::str("store ", where, " (", method.substr(0, method.find(':')),
                                                       ", rendezvous timeout ", seconds(meet), " s); Gloo over ", bound));
  AllReduceAlgorithm algorithm = options.allreduce();
  const char* chosen = std::getenv("LOCKSTEP_ALLREDUCE");
  if (algorithm == AllReduceAlgorithm::kAuto && chosen != nullptr && *chosen != '\0')
    algorithm = enum_from_name<AllReduceAlgorithm>(all_reduce_algorithm_names(), chosen, "LOCKSTEP_ALLREDUCE value");
  group->choose_all_reduce(algorithm);
  return group;
}

}  // namespace lockstep::dist
