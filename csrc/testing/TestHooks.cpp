// Hooks the unit tests call (names start with `_`, or say they are for tests): each drives one
// layer's logic directly from Python, with no group and often no MPI peer. Kept apart from the
// public bindings (csrc/init.cpp) so that the product's surface reads on its own.
#include "testing/TestHooks.hpp"

#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include <pybind11/stl.h>

#include "core/Config.hpp"
#include "ops/Fusion.hpp"
#include "algorithms/Algorithms.hpp"
#include "engine/Watchdog.hpp"
#include "mpi/AnySource.hpp"
#include "mpi/DirectProbe.hpp"
#include "mpi/Env.hpp"
#include "mpi/Types.hpp"
#include "paths/Devices.hpp"

namespace py = pybind11;

namespace mpigpu::testing {

namespace {

// A ReduceOp's name (SUM, AVG, ...) as the test hooks take it: the names messages use.
c10d::ReduceOp::RedOpType reduceOpKind(const std::string& opName) {
  std::string known;
  for (int k = 0; k < c10d::ReduceOp::UNUSED; ++k) {
    const auto kind = static_cast<c10d::ReduceOp::RedOpType>(k);
    if (opName == mpigpu::mpi::reduceOpName(kind)) return kind;
    known += (k ? ", " : "") + std::string(mpigpu::mpi::reduceOpName(kind));
  }
  throw py::value_error("unknown reduce op " + opName + "; one of " + known);
}

void reduceStep(const at::Tensor& dst, const at::Tensor& a, const at::Tensor& b,
                const std::string& opName, double scale, const std::optional<at::Tensor>& also) {
  auto reducer = mpigpu::paths::makeReducer(dst.device().type(), reduceOpKind(opName));
  py::gil_scoped_release noGil;
  if (also.has_value())
    reducer->combineToBoth(dst, *also, a, b, scale);
  else
    reducer->combine(dst, a, b, scale);
}

// _auto_algorithm: algo::choose for facts given by a test, under the current settings.
std::string autoAlgorithm(const std::string& op, int64_t bytes, at::ScalarType dtype, int world,
                          bool groupHasGpu, bool nodeSuits, bool spansNodes, bool onSharedDevice,
                          bool crowded) {
  using mpigpu::algo::OpKind;
  static const std::map<std::string, OpKind> kinds{{"all_reduce", OpKind::Allreduce},
                                                   {"reduce_scatter", OpKind::ReduceScatter},
                                                   {"reduce", OpKind::Reduce},
                                                   {"all_gather", OpKind::Allgather},
                                                   {"broadcast", OpKind::Broadcast}};
  auto kind = kinds.find(op);
  if (kind == kinds.end()) throw py::value_error("_auto_algorithm: no op named " + op);
  const auto config = mpigpu::Config::fromEnv();
  const mpigpu::algo::Facts facts{kind->second, bytes,      dtype,          world,  groupHasGpu,
                                  nodeSuits,    spansNodes, onSharedDevice, crowded};
  const auto* a = mpigpu::algo::choose(mpigpu::algo::policyFor(config.algo), config, facts);
  return a != nullptr ? a->name : "mpi";
}

// Unit-test hook of the watchdog's pollers.
void bindWatchdogHooks(py::module_& m) {
  m.def(
      "_watchdog_polls",
      [](double seconds) {
        struct Counter final : mpigpu::Watchdog::Poller {
          std::atomic<int> polls{0};
          void poll() override { polls.fetch_add(1); }
        };
        auto counter = std::make_shared<Counter>();
        mpigpu::Watchdog::addPoller(counter);
        std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
        return counter->polls.load();
      },
      py::arg("seconds"), py::call_guard<py::gil_scoped_release>(),
      "Tests: how often the watchdog's thread polled a poller registered for `seconds`.");
}

// The CUDA-awareness probe's exchanges and agreement on host buffers (tests).
void bindProbeHooks(py::module_& m) {
  m.def(
      "_direct_probe",
      [](bool corrupt) {
        mpigpu::mpi::ProbeOutcome out;
        {
          py::gil_scoped_release released;  // collective: other ranks may take a while
          const auto job = mpigpu::mpi::jobComm();
          out = mpigpu::mpi::probeDirect({job.comm, job.rank, job.size}, at::Device(at::kCPU),
                                         corrupt, "direct_probe");
        }
        return py::make_tuple(out.ok, out.detail, out.seconds);
      },
      py::arg("corrupt") = false,
      "CUDA-awareness probe (tests): its exchanges and agreement on host buffers over the job "
      "communicator, collective; corrupt fails this rank's check. Returns (ok, detail, seconds).");
  m.def(
      "_mpich_netmod",
      [](const std::string& libraryVersion, const std::string& netmodVariable) {
        return mpigpu::mpi::mpichNetmod(libraryVersion, netmodVariable.c_str());
      },
      py::arg("library_version"), py::arg("netmod_variable") = "",
      "The MPICH ch4 netmod in use (unit tests of TORCH_MPIGPU_ANY_SOURCE_RECV=auto) from "
      "MPI_Get_library_version's text and MPIR_CVAR_CH4_NETMOD; '' for other libraries.");
}

void bindAlgorithmHooks(py::module_& m) {
  m.def("_fusion_buckets", &mpigpu::fusionBuckets, py::arg("tensors"), py::arg("limit_bytes"),
        py::arg("alone_bytes"),
        "Fusion policy (unit tests): indices of `tensors` per MPI call, grouped by dtype in "
        "first-seen order, runs of at most limit_bytes; tensors of at least alone_bytes travel "
        "alone.");
  m.def("_auto_algorithm", &autoAlgorithm, py::arg("op"), py::arg("bytes"), py::arg("dtype"),
        py::arg("world"), py::arg("group_has_gpu"), py::arg("node_suits"), py::arg("spans_nodes"),
        py::arg("on_shared_device"), py::arg("crowded") = false,
        "The algorithm auto (or TORCH_MPIGPU_ALGO) takes for an op of these facts with the current "
        "settings (unit tests of the table's rules): a row's name, or 'mpi' for MPI's own.");
  m.def(
      "_resolve_reduction",
      [](const std::string& reduceOp, const at::Tensor& sample, std::optional<double> premul) {
        mpigpu::mpi::ensureInitialized();  // our fp16/bf16 types and ops exist from then on
        c10d::ReduceOp rop;  // (torch's constructors refuse PREMUL_SUM without its factor)
        rop.op_ = reduceOpKind(reduceOp);
        if (premul) rop.supplement_ = c10::make_intrusive<c10d::NCCLPreMulSumSupplement>(*premul);
        const auto r = mpigpu::mpi::resolveReduction(rop, sample.scalar_type(), "allreduce", 0);
        py::dict d;
        d["type"] = mpigpu::mpi::typeName(r.type);
        d["op"] = mpigpu::mpi::opName(r.op);
        d["divide_by_size"] = r.divideBySize;
        d["premul"] = r.premulScalar ? py::cast(*r.premulScalar) : py::none();
        return d;
      },
      py::arg("reduce_op"), py::arg("sample"), py::arg("premul") = py::none(),
      "Reduction resolution (unit tests): the MPI datatype and op, and the steps around the MPI "
      "call, for ReduceOp `reduce_op` (its name: SUM, AVG, ...) on tensors of sample's dtype.");
  m.def("reduce_step", &reduceStep, py::arg("dst"), py::arg("a"), py::arg("b"), py::arg("op"),
        py::arg("scale") = 1.0, py::arg("also") = py::none(),
        "One local reduction step of our algorithms, dst = (a op b) * scale, with the reducer of "
        "dst's device (the host's, or the CUDA kernels), the result written to `also` too where "
        "given (it may be a: the leader form's last step); for tests against torch's own ops.");
}

}  // namespace

void bindTestHooks(py::module_& m) {
  bindWatchdogHooks(m);
  bindProbeHooks(m);
  bindAlgorithmHooks(m);
}

}  // namespace mpigpu::testing
