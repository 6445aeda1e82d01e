"""Plants known defects one at a time and checks that the test meant to catch each one fails
(issue #26: a test that cannot fail is a defect). Run it after weakening or rewriting a check:

    python tests/planted_defects.py [NAME ...]      (the venv's python; ~6 min for all)

Two kinds of plant, neither touching the repository:
- the product misbehaving: a wrapper around a torch.distributed call, installed in every rank by
  a sitecustomize.py on PYTHONPATH (the pytest process itself is left alone);
- a test script that silently checks less: a text edit in a copy of tests/.
Each plant names the test that must fail and a text its failure must show. Exit status: the
number of plants the tests did not catch. Not part of CI (each plant is a test run of its own)."""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SUITE = [sys.executable, str(TESTS / "torch_suite.py"), "-np", "2", "-k"]


@dataclass
class Plant:
    name: str
    defect: str  # what the plant simulates
    target: list  # a pytest node id, or a command (list)
    must_show: str  # text the failing run's output must contain
    wrap: str = ""  # code run in each rank after `import torch.distributed as dist`
    edit: tuple = ()  # (file under tests/, old text, new text)


PLANTS = [
    Plant("gather-writes-sender", "gather changes a sender's input",
          ["test_multirank.py::test_random_ops_against_reference[2]"],
          "sender's input unchanged", wrap="""
        real = dist.gather
        def gather(tensor, gather_list=None, dst=0, *a, **k):
            out = real(tensor, gather_list, dst, *a, **k)
            if dist.get_rank() != dst:  # (every dtype: zeros become ones, the rest zeros)
                tensor.copy_((tensor == 0).to(tensor.dtype))
            return out
        dist.gather = gather"""),
    Plant("a2a-sender-result", "all_to_all_single leaves garbage on the rank whose peer failed",
          ["test_multirank.py::test_mpi_error_inside_a_collective_names_the_op_and_group"],
          "sender unaffected", wrap="""
        real = dist.all_to_all_single
        def all_to_all_single(output, input, *a, **k):
            out = real(output, input, *a, **k)
            if dist.get_rank() == 0:
                output.fill_(5)
            return out
        dist.all_to_all_single = all_to_all_single"""),
    Plant("master-port-not-the-store", "the launcher publishes a MASTER_PORT nothing listens on",
          ["test_multirank.py::test_launcher_sets_rank_local_rank_and_world_size[2]"],
          "cannot connect", wrap="""
        real = dist.init_process_group
        def init_process_group(*a, **k):
            out = real(*a, **k)
            os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + 1)
            return out
        dist.init_process_group = init_process_group"""),
    Plant("rank-dies-at-start-up", "a rank crashes before its first op (not a killed rank)",
          ["test_reliability.py::test_killed_rank_ends_the_job"], "ranks that started", wrap="""
        if sys.argv[-1] == "die" and RANK == 1:
            os._exit(1)"""),
    Plant("exit-drops-queued-ops", "async ops left unwaited at exit never run",
          ["test_reliability.py::test_exit_with_async_ops_pending_finishes_cleanly"],
          "queued ops ran", wrap="""
        real = dist.all_reduce
        class Dropped:
            def wait(self, *a):
                return True
        def all_reduce(tensor, *a, async_op=False, **k):
            return Dropped() if async_op else real(tensor, *a, **k)
        dist.all_reduce = all_reduce"""),
    Plant("all-gather-flattens-output", "all_gather_into_tensor resizes a 2-D output to 1-D",
          ["test_multirank.py::test_collectives[2]"], "shape", wrap="""
        real = dist.all_gather_into_tensor
        def all_gather_into_tensor(output, input, *a, **k):
            out = real(output, input, *a, **k)
            if output.dim() == 2:
                output.resize_(output.numel())
            return out
        dist.all_gather_into_tensor = all_gather_into_tensor"""),
    Plant("split-child-rank-order", "a split group's ranks in another order than torch's record",
          ["test_multirank.py::test_split_groups_and_device_mesh_with_a_bound_device[3]"],
          "even/odd: all_gather order on owndev", wrap="""
        real = dist.all_gather_into_tensor
        def all_gather_into_tensor(output, input, group=None, async_op=False):
            out = real(output, input, group, async_op)
            if group is not None and dist.get_world_size(group) > 1:
                output.copy_(output.view(dist.get_world_size(group), -1).flip(0).reshape(-1))
            return out
        dist.all_gather_into_tensor = all_gather_into_tensor"""),
    Plant("sparse-sum-one-rank-off", "a sparse all_reduce whose result differs on one rank",
          ["test_multirank.py::test_collectives[3]"],
          "sparse all_reduce sum", wrap="""
        real = dist.all_reduce
        def all_reduce(tensor, *a, **k):
            out = real(tensor, *a, **k)
            if tensor.is_sparse and out is None and dist.get_rank() == dist.get_world_size() - 1:
                tensor._values().add_(1)
            return out
        dist.all_reduce = all_reduce"""),
    Plant("uneven-all-gather-drops-last", "an all_gather of blocks of different sizes that loses the last block",
          ["test_multirank.py::test_collectives[2]"],
          "uneven all_gather", wrap="""
        real = dist.all_gather
        def all_gather(tensor_list, tensor, *a, **k):
            out = real(tensor_list, tensor, *a, **k)
            if len({t.numel() for t in tensor_list}) > 1 and tensor_list[-1].numel():
                tensor_list[-1].zero_()
            return out
        dist.all_gather = all_gather"""),
    Plant("soak-leaks", "every all_reduce keeps 2 KiB alive",
          ["test_multirank.py::test_soak_threads_groups_memory_flat[2]"],
          "RSS flat during the soak's second half", wrap="""
        real, kept = dist.all_reduce, []
        def all_reduce(tensor, *a, **k):
            kept.append(bytearray(2048))
            return real(tensor, *a, **k)
        dist.all_reduce = all_reduce"""),
    Plant("soak-last-op-wrong", "the last async all_reduce of each thread gets a wrong result",
          ["test_multirank.py::test_soak_threads_groups_memory_flat[2]"],
          "every soak result correct", wrap="""
        real, calls = dist.all_reduce, {}
        def all_reduce(tensor, *a, async_op=False, **k):
            n = calls[id(k.get("group"))] = calls.get(id(k.get("group")), 0) + 1
            if async_op and n == 200 + 5000:  # soak.py: per thread's group, 200 then 2 x 2500
                tensor.add_(1000)
            return real(tensor, *a, async_op=async_op, **k)
        dist.all_reduce = all_reduce"""),
    Plant("p2p-thread-stops-early", "a p2p_stress thread runs one ring round fewer",
          ["test_multirank.py::test_p2p_stress_threads_and_timings[2]"],
          "== sum(want.values())",
          edit=("mp/p2p_stress.py", "ring_rounds(tc, group, rank, world, 80,",
                "ring_rounds(tc, group, rank, world, 79,")),
    Plant("stale-session-folder-kept", "conftest no longer removes a killed mpirun's folder",
          ["test_multirank.py::test_prterun_at_a_reused_pid_starts_once_the_stale_session_folder_is_gone"], "rc_clean",
          edit=("conftest.py", 'if ended(path.name[len("ompi."):])}', "if False}")),
    Plant("launcher-keeps-stale-session-folder", "python -m torch_mpi_gpu.mpirun no longer "
          "removes its pid's stale folder", ["test_multirank.py::test_prterun_at_a_reused_pid_starts_once_the_stale_session_folder_is_gone"],
          "rc_ours",
          edit=("mp/killed_mpirun_pid.py", '"-m", "torch_mpi_gpu.mpirun",',
                '"-c", "import torch_mpi_gpu.mpirun as m; '
                'm.remove_stale_session_folder = lambda: None; m.main()",')),
    Plant("torch-suite-destroy-fails", "destroying the group after a torch test raises",
          SUITE + ["test_all_reduce_sum$"], "the barrier/destroy after the test failed", wrap="""
        real = dist.destroy_process_group
        def destroy_process_group(group=None):
            real(group)
            if group is None:
                raise RuntimeError("planted: destroy failed")
        dist.destroy_process_group = destroy_process_group"""),
    Plant("torch-suite-known-test-fails-otherwise",
          "the one known failure fails for another reason than the 'custom' backend name",
          SUITE + ["test_ddp_logging_data_cpu$"], "FAIL test_ddp_logging_data_cpu", wrap="""
        import torch.nn.parallel as par
        def broken(self):
            raise RuntimeError("planted: logging data unavailable")
        par.DistributedDataParallel._get_ddp_logging_data = broken"""),
]

SITECUSTOMIZE = """\
import os, sys
RANK = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "-1")))
if RANK >= 0:  # a rank of an MPI job (not pytest, not the launcher's helpers)
    import torch.distributed as dist
{body}
"""


def run_plant(plant, work):
    tests = work / "tests"
    shutil.copytree(TESTS, tests, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    shutil.copy(TESTS.parent / "pyproject.toml", work)  # pytest's settings and markers
    env = dict(os.environ)
    if plant.wrap:
        site = work / "site"
        site.mkdir()
        body = textwrap.indent(textwrap.dedent(plant.wrap).strip(), "    ")
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(body=body))
        env["PYTHONPATH"] = f"{site}{os.pathsep}{env.get('PYTHONPATH', '')}"
    if plant.edit:
        path, old, new = plant.edit
        text = (tests / path).read_text()
        assert text.count(old) == 1, f"{plant.name}: {old!r} is not in tests/{path} once"
        (tests / path).write_text(text.replace(old, new))
    cmd = plant.target if len(plant.target) > 1 else \
        [sys.executable, "-m", "pytest", "-x", "-q", "--tb=short", "-p", "no:cacheprovider", plant.target[0]]
    cmd = [str(tests / "torch_suite.py") if c == str(TESTS / "torch_suite.py") else c for c in cmd]
    proc = subprocess.run(cmd, cwd=tests, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    caught = proc.returncode != 0 and plant.must_show in out
    lines = [ln for ln in out.splitlines() if plant.must_show in ln]
    return caught, proc.returncode, (lines[0].strip()[:220] if lines else out[-600:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="plants to run (default: all): "
                    + ", ".join(p.name for p in PLANTS))
    args = ap.parse_args()
    chosen = [p for p in PLANTS if not args.names or p.name in args.names]
    missed = 0
    print(f"{'plant':40} {'caught':6} exit  evidence")
    for plant in chosen:
        with tempfile.TemporaryDirectory(prefix="mpigpu-plant-") as tmp:
            caught, rc, evidence = run_plant(plant, Path(tmp))
        missed += not caught
        print(f"{plant.name:40} {'yes' if caught else 'NO':6} {rc:4}  {evidence}", flush=True)
    print(f"{len(chosen) - missed} of {len(chosen)} planted defects caught")
    return missed


if __name__ == "__main__":
    sys.exit(main())
