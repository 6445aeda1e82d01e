// Python bindings: the backend factory used by torch_mpi_gpu's registration, plus introspection.
#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <chrono>
#include <map>
#include <thread>

#include <pybind11/chrono.h>
#include <pybind11/stl.h>

#include "core/Errors.hpp"
#include "ops/Fusion.hpp"
#include "ProcessGroupMPIGPU.hpp"
#include "core/Settings.hpp"
#include "engine/Engine.hpp"
#include "engine/FlightRecorder.hpp"
#include "engine/FutureCompleter.hpp"
#include "engine/Watchdog.hpp"
#include "mpi/FaultTolerance.hpp"
#include "mpi/Collectives.hpp"
#include "mpi/AnySource.hpp"
#include "mpi/DirectProbe.hpp"
#include "mpi/Env.hpp"
#include "mpi/Types.hpp"
#include "mpi/Wait.hpp"
#include "paths/Devices.hpp"
#include "algorithms/Algorithms.hpp"
#include "algorithms/NodeAlgorithms.hpp"
#include "store/Channel.hpp"
#include "store/MpiStore.hpp"
#include "testing/TestHooks.hpp"

namespace py = pybind11;
using mpigpu::ProcessGroupMPIGPU;

namespace {

void bindProcessGroup(py::module_& m) {
  py::class_<ProcessGroupMPIGPU, c10d::Backend, c10::intrusive_ptr<ProcessGroupMPIGPU>> pg(
      m, "ProcessGroupMPIGPU");
  using Options = ProcessGroupMPIGPU::CopyableOptions;
  py::class_<Options, c10d::Backend::Options, c10::intrusive_ptr<Options>>(pg, "Options")
      .def("__copy__", [](const Options& o) { return c10::make_intrusive<Options>(o); })
      .def("__deepcopy__",
           [](const Options& o, const py::dict&) { return c10::make_intrusive<Options>(o); });
  pg.def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     std::vector<int64_t> globalRanks, double timeoutSeconds,
                     std::string groupName) {
           // Communicator creation blocks in MPI; other Python threads may run meanwhile.
           py::gil_scoped_release noGil;
           return ProcessGroupMPIGPU::make(
               store, rank, size, std::move(globalRanks),
               std::chrono::milliseconds(static_cast<int64_t>(timeoutSeconds * 1000)),
               std::move(groupName));
         }),
         py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("global_ranks"),
         py::arg("timeout_seconds"), py::arg("group_name"))
      .def("describe", &ProcessGroupMPIGPU::describe)
      // ULFM: the group's ranks this process knows to have failed (torch_mpi_gpu.failed_ranks)
      .def("failed_ranks",
           [](const ProcessGroupMPIGPU& pg) { return mpigpu::mpi::ft::failedRanksOf(&pg); })
      // torch 2.13's split_group reads the parent's `options` (a property of NCCL's and gloo's
      // classes there, not of Backend's)
      .def_property_readonly("options", &ProcessGroupMPIGPU::getBackendOptions)
      // torch's new_group, where the default group has a device_id and supports splitting,
      // has the ranks outside the new group call this (NCCL builds members from the parent's
      // communicator, so all of its ranks must take part); mpigpu makes a new group over its
      // members alone, so the others have nothing to do.
      .def(
          "perform_nocolor_split", [](ProcessGroupMPIGPU&, const py::object&) {},
          py::arg("device"));
  // What torch binds on NCCL's class only, and trainers call on any group's backend:
  // get_error(); register_mem_pool (Megatron calls it unconditionally), accepted and ignored:
  // MPI needs no registration (a CUDA-aware MPI registers what it sends itself).
  pg.def("get_error", &ProcessGroupMPIGPU::getError)
      // torch's _set_pg_timeout (torch 2.8 binds set_timeout on gloo's and NCCL's classes only)
      .def("set_timeout", &ProcessGroupMPIGPU::setTimeout, py::arg("timeout"))
      .def("register_mem_pool", [](ProcessGroupMPIGPU&, const py::args&, const py::kwargs&) {})
      .def("deregister_mem_pool", [](ProcessGroupMPIGPU&, const py::args&, const py::kwargs&) {})
      // torch's _time_estimator calls these (torch 2.15 binds them on every backend; before, on
      // NCCL's class only)
      .def("_start_time_estimate", &ProcessGroupMPIGPU::startTimeEstimate)
      .def("_end_time_estimate", &ProcessGroupMPIGPU::endTimeEstimate);
}

void bindSettings(py::module_& m) {
  m.def(
      "settings",
      [] {
        py::list rows;
        for (const auto& s : mpigpu::settings()) {
          rows.append(py::make_tuple(s.name, s.defaultValue, s.shownDefault,
                                     mpigpu::readAtName(s.readAt), s.meaning,
                                     mpigpu::tierName(s.tier), s.basis));
        }
        return rows;
      },
      "The settings table (csrc/core/Settings.cpp): (name, default, shown default, read at, "
      "meaning, "
      "tier, basis).");
}

// MPI itself: describe it, and rendezvous through it.
void bindMpi(py::module_& m) {
  m.def(
      "mpi_info",
      [] {
        const auto& e = mpigpu::mpi::ensureInitialized();
        py::dict d;
        d["library_version"] = e.libraryVersion;
        d["standard"] = std::to_string(e.standardMajor) + "." + std::to_string(e.standardMinor);
        d["thread_level"] = mpigpu::mpi::threadLevelName(e.threadLevel);
        d["initialized_by_us"] = e.initializedByUs;
        d["world_rank"] = e.worldRank;
        d["world_size"] = e.worldSize;
        d["cuda_aware_compile_time"] = e.cudaAwareCompileTime;
        d["cuda_aware_run_time"] = e.cudaAwareRunTime;
        d["cuda_aware_probe"] = mpigpu::mpi::probeStatus();
        d["fault_tolerance"] = mpigpu::mpi::ft::describe();
        return d;
      },
      "Initialises MPI if needed and describes it.");
}

// A program's communicator as Python hands it: None is MPI_COMM_WORLD, else its Fortran handle.
std::optional<int64_t> commHandle(const py::object& handle) {
  if (handle.is_none()) return std::nullopt;
  return handle.cast<int64_t>();
}

MPI_Comm resolveComm(std::optional<int64_t> handle, const char* op) {
  return handle ? mpigpu::mpi::userComm(*handle, op) : MPI_COMM_WORLD;
}

// MPI calls Python makes outside any group's ops (the rendezvous, a program's communicator).
// Below MPI_THREAD_MULTIPLE they run on the one shared MPI thread, as every group's ops do, so
// every blocking MPI call is made there (the store's calls, which never block, take turns with
// it: mpi/Wait.hpp); otherwise on the caller. Without the GIL.
void onMpiThread(const char* op, const std::function<void()>& fn) {
  py::gil_scoped_release noGil;
  if (!mpigpu::mpi::needsSerializedAccess()) {
    fn();
    return;
  }
  mpigpu::Engine::create("mpigpu-shared")->runAndWait(op, "", -1, fn);
}

// Rendezvous through MPI, over MPI_COMM_WORLD or a program's own communicator (comm=None:
// MPI_COMM_WORLD, else its Fortran handle), and the job communicator's choice.
void bindRendezvous(py::module_& m) {
  m.def(
      "bootstrap_address",
      [](const std::string& host, int port, const py::object& comm) {
        const auto handle = commHandle(comm);
        mpigpu::mpi::Bootstrap b;
        onMpiThread("init_process_group", [&] {
          b = mpigpu::mpi::bootstrapAddress(host, port, resolveComm(handle, "init_process_group"));
        });
        return py::make_tuple(b.host, b.port, b.singleHost, b.rank, b.size, b.localRank,
                              b.localSize);
      },
      py::arg("host"), py::arg("port"), py::arg("comm") = py::none(),
      "Collective over comm: rank 0's (host, port) to every rank, whether all share a host, this "
      "process's rank and size in comm, and its rank and count among the ranks on its host (from "
      "the gathered host names).");
  m.def(
      "allgather_bytes",
      [](const py::bytes& mine, const py::object& comm) {
        const auto handle = commHandle(comm);
        const std::string copy = mine;
        std::vector<std::string> all;
        onMpiThread("init_process_group", [&] {
          all = mpigpu::mpi::allgatherStrings(copy, resolveComm(handle, "init_process_group"));
        });
        py::list out;
        for (const auto& s : all) out.append(py::bytes(s));
        return out;
      },
      py::arg("mine"), py::arg("comm") = py::none(),
      "Collective over comm: every rank's bytes, in rank order.");
}

// A program's communicator: checked, made the job's, its members located in the default group.
void bindProgramComm(py::module_& m) {
  m.def(
      "comm_rank_size",
      [](const py::object& comm, const std::string& op) {
        const auto handle = commHandle(comm);
        int rank = 0, size = 1;
        onMpiThread(op.c_str(), [&] {
          const MPI_Comm c = resolveComm(handle, op.c_str());
          MPI_Comm_rank(c, &rank);
          MPI_Comm_size(c, &size);
        });
        return py::make_tuple(rank, size);
      },
      "(rank, size) in comm; ValueError naming op for MPI_COMM_NULL or an intercommunicator.");
  m.def(
      "use_job_comm",
      [](const py::object& comm) {
        const auto handle = commHandle(comm);
        onMpiThread("init_process_group",
                    [&] { mpigpu::mpi::useJobComm(resolveComm(handle, "init_process_group")); });
      },
      py::arg("comm") = py::none(),
      "Collective over comm: a duplicate of it (MPI_COMM_WORLD for None) becomes the communicator "
      "whose ranks are torch's global ranks. Called as the default group is made.");
  m.def(
      "job_ranks_of",
      [](const py::object& comm) {
        const auto handle = commHandle(comm);
        std::vector<int> ranks;
        onMpiThread("new_group", [&] {
          ranks = mpigpu::mpi::jobRanksOf(resolveComm(handle, "new_group"), "new_group");
        });
        return ranks;
      },
      "The default group's ranks of comm's members, in comm's rank order.");
}

// The store over MPI (csrc/store/): what the mpi:// rendezvous hands torch.
void bindStore(py::module_& m) {
  using mpigpu::store::MpiStore;
  py::class_<MpiStore, c10d::Store, c10::intrusive_ptr<MpiStore>>(m, "MPIStore")
      .def_property_readonly("rank", &MpiStore::rank)
      .def_property_readonly("size", &MpiStore::size);
  m.def(
      "mpi_store",
      [](const py::object& comm, double timeoutSeconds) {
        const auto handle = commHandle(comm);
        const char* op = "init_process_group";
        c10::intrusive_ptr<MpiStore> store;
        const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeoutSeconds * 1000));
        // (serialized: its blocking MPI_Comm_dup on the shared engine's thread, as blocking MPI
        // calls all are there; it lets go of the GIL)
        onMpiThread(
            op, [&] { store = mpigpu::store::makeMpiStore(resolveComm(handle, op), timeout, op); });
        return py::make_tuple(store, store->rank(), store->size());
      },
      py::arg("comm") = py::none(), py::arg("timeout_seconds") = 1800.0,
      "Collective over comm (None: MPI_COMM_WORLD, else its Fortran handle): a c10d Store whose "
      "server is comm's rank 0, on a duplicate of comm. Returns (store, rank, size).");
  m.def("mpi_store_calls", &mpigpu::store::callsMade,
        "Requests this process has sent to MPI stores (benchmarks count them).");
}

// The process's end: stop engines, finalise or abort MPI.
void bindLifecycle(py::module_& m) {
  m.def(
      "shutdown",
      [] {
        mpigpu::Engine::shutdownAll();
        // Peers still waiting for this rank in a collective it never issued learn it now (they
        // end the job), instead of at their timeout.
        mpigpu::Watchdog::announceExit();
        mpigpu::Watchdog::stop();
        mpigpu::stopFutureCompleter();
        if (mpigpu::Engine::anyStuckInMpi() && !mpigpu::mpi::isFinalized()) {
          // MPI_Finalize would wait for the op forever: end the job instead, and say why.
          LOG(ERROR) << mpigpu::opMessage(
              "exit", mpigpu::mpi::ensureInitialized().worldRank,
              "an aborted process group left an op inside MPI that its "
              "peers never joined; ending the job with MPI_Abort instead "
              "of hanging in MPI_Finalize");
          mpigpu::mpi::abortJob(1);
        }
        // After the departure notices above; each store server waits for its ranks to close.
        mpigpu::store::Channel::closeAll();
        mpigpu::mpi::finalizeIfOwned();
        // Every rank has reached MPI_Finalize: nobody writes to a held store any more. Where
        // the program finalises MPI itself (later), held stores go with the process instead.
        if (mpigpu::mpi::isFinalized()) mpigpu::Watchdog::releaseHeldStores();
      },
      py::call_guard<py::gil_scoped_release>(),
      "Stops every engine and finalises MPI if torch_mpi_gpu initialised it (runs at exit).");
  m.def("is_finalized", &mpigpu::mpi::isFinalized);
  m.def("set_oversubscribed", &mpigpu::mpi::setCrowded, py::arg("oversubscribed"),
        "More ranks on this host than cores: waits inside MPI test and sleep instead of spinning, "
        "callers of wait() sleep at once (set at import).");
  m.def("oversubscribed", &mpigpu::mpi::crowded);
  m.def("sleeping_mpi_waits", &mpigpu::mpi::sleepingWaits,
        "Waits for MPI that slept at least once (crowded hosts; tests count them).");
  m.def(
      "running_world_size",
      [] {
        int initialized = 0, finalized = 0, size = 0;
        MPI_Initialized(&initialized);
        MPI_Finalized(&finalized);
        if (!initialized || finalized) return 0;
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        return size;
      },
      "MPI_COMM_WORLD's size while MPI is running (initialised by anyone, not finalised), else 0; "
      "never initialises MPI.");
  m.def(
      "abort_job",
      [](int code) {
        int initialized = 0;
        MPI_Initialized(&initialized);
        if (initialized && !mpigpu::mpi::isFinalized()) mpigpu::mpi::abortJob(code);
      },
      py::call_guard<py::gil_scoped_release>(),
      "MPI_Abort(MPI_COMM_WORLD, code) when MPI is running: the launcher ends every rank (this "
      "process exits by itself if MPI_Abort has not ended it within 10 s).");
}

// Which data path tensors of a device type take here for each use, and why.
void bindPaths(py::module_& m) {
  m.def("with_cuda", [] { return MPIGPU_WITH_CUDA != 0; });
  m.def(
      "device_path",
      [](const std::string& deviceType, const std::string& use) {
        using mpigpu::paths::Use;
        const std::map<std::string, Use> uses{
            {"move", Use::Move}, {"reduce", Use::Reduce}, {"algorithm", Use::Algorithm}};
        auto it = uses.find(use);
        if (it == uses.end()) throw py::value_error("use: move, reduce or algorithm, not " + use);
        const auto choice = mpigpu::paths::describePath(c10::Device(deviceType).type(), it->second,
                                                        mpigpu::Config::fromEnv());
        return py::make_tuple(choice.name, choice.reason);
      },
      py::arg("device_type"), py::arg("use") = "move",
      "(path, why) for tensors of device_type (cpu, cuda, xpu, a PrivateUse1 name) doing `use`: "
      "move (data movement, p2p), reduce (MPI's own reductions), algorithm (ours). Initialises "
      "MPI if a device's choice depends on it.");
  for (const auto& [name, use] : {std::pair{"cuda_path", mpigpu::paths::Use::Move},
                                  std::pair{"cuda_reduce_path", mpigpu::paths::Use::Reduce}}) {
    m.def(
        name,
        [use = use] {
          const auto c =
              mpigpu::paths::describePath(c10::DeviceType::CUDA, use, mpigpu::Config::fromEnv());
          return py::make_tuple(c.name, c.reason);
        },
        "device_path('cuda', 'move' / 'reduce'): the path CUDA tensors (reductions) take with "
        "this build, MPI and TORCH_MPIGPU_CUDA_AWARE / _CUDA_REDUCE, and why.");
  }
}

// The algorithm table, as Python sees it (info, tests, docs).
void bindAlgorithmTable(py::module_& m) {
  m.def(
      "node_waits",
      [] {
        const auto w = mpigpu::algo::nodeWaits();
        py::dict d;
        d["host"] = w.host;
        d["device"] = w.device;
        d["host_peer_on_this_cpu"] = w.hostPeerOnThisCpu;
        d["single_copy_reads"] = w.singleCopyReads;
        d["settle_us"] = static_cast<double>(w.settleNs) / 1e3;
        d["barrier_us"] = static_cast<double>(w.barrierNs) / 1e3;
        d["start_wait_us"] = static_cast<double>(mpigpu::paths::startWaitNs()) / 1e3;
        const auto events = mpigpu::paths::orderEvents();
        d["stream_events"] = events.recorded;
        d["stream_events_skipped"] = events.skipped;
        return d;
      },
      "How often this process's node-algorithm ops waited for their node's peers: barriers in "
      "host shared memory (each a cross-process hand-off where the slots are device memory) and "
      "barriers queued on the device; host_peer_on_this_cpu: peers waited for that had last run "
      "on this rank's CPU (it yielded to them at once instead of spinning); single_copy_reads: "
      "peers' buffers read in place (process_vm_readv) by all_gather; settle_us: microseconds "
      "waiting for this rank's own device work before a barrier or MPI, barrier_us: waiting at "
      "host barriers for the peers, start_wait_us: ops' start waiting for the caller's queued "
      "device work (any algorithm); stream_events: events a device path recorded to order an op "
      "after the caller's stream or its consumers after the op, stream_events_skipped: those left "
      "out because the stream had no work left (each event is a device command, a switch where "
      "ranks share a GPU).");
  m.def(
      "algorithms",
      [] {
        py::list rows;
        for (const auto* a : mpigpu::algo::algorithms()) {
          py::list ops;
          if (a->allreduce) ops.append("all_reduce");
          if (a->reduceScatter) ops.append("reduce_scatter");
          if (a->reduce) ops.append("reduce");
          if (a->allgather) ops.append("all_gather");
          if (a->broadcast) ops.append("broadcast");
          py::dict row;
          row["name"] = a->name;
          row["summary"] = a->summary;
          row["ops"] = ops;
          rows.append(row);
        }
        return rows;
      },
      "The algorithm table: each algorithm's name (its TORCH_MPIGPU_ALGO value), what it does "
      "and the ops it serves, in the order auto asks them.");
}

// Counters of the algorithms and MPI layers, and the rule auto follows.
void bindAlgorithms(py::module_& m) {
  m.def("mpi_call_count", &mpigpu::mpi::callCount,
        "MPI communication calls made by this process so far (tests use it to prove fusion).");
  m.def("mpi_comms_held", &mpigpu::mpi::commsHeld,
        "MPI communicators mpigpu has made and not freed (an MPI caps them; MPICH: 2048).");
  m.def(
      "reduction_rule",
      [] {
        const auto config = mpigpu::Config::fromEnv();
        return mpigpu::algo::describeChoice(mpigpu::algo::policyFor(config.algo), config,
                                            at::hasCUDA());
      },
      "How ops choose their algorithm with the current settings, for a group in which some "
      "member has a GPU exactly when this process sees one.");
  m.def(
      "algorithm_runs",
      [] {
        py::dict d;
        for (const auto* a : mpigpu::algo::algorithms()) d[a->name] = mpigpu::algo::runCount(*a);
        return d;
      },
      "How many reductions each of our algorithms has run in this process.");
}

void bindFlightRecorder(py::module_& m) {
  m.def("flight_recorder_enabled", [] { return mpigpu::fr::Recorder::get().enabled(); });
  m.def(
      "flight_recorder_dump",
      [](bool stackTraces, bool onlyActive) {
        return py::bytes(mpigpu::fr::Recorder::get().dump(stackTraces, onlyActive));
      },
      py::arg("stack_traces") = true, py::arg("only_active") = false,
      "This process's flight record in torch's format, pickled.");
  m.def(
      "flight_recorder_write",
      [] { return mpigpu::fr::Recorder::get().write(mpigpu::mpi::ensureInitialized().worldRank); },
      "Writes this process's flight record through torch's DebugInfoWriter; returns where.");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "torch_mpi_gpu native core: the mpigpu c10d backend over MPI";
  bindProcessGroup(m);
  bindSettings(m);
  bindMpi(m);
  bindRendezvous(m);
  bindProgramComm(m);
  bindStore(m);
  bindLifecycle(m);
  bindPaths(m);
  bindAlgorithms(m);
  bindAlgorithmTable(m);
  mpigpu::testing::bindTestHooks(m);  // csrc/testing/: hooks for the unit tests only
  bindFlightRecorder(m);
}
