"""What a user sees of a running group in one process: torch's profiler events (named as gloo's and
NCCL's, with the comms parameters), the flight recorder's ring of the last ops, and the info CLI.
The flight recorder across ranks (a stall's dumps, torch's analyzer): test_flight_recorder.py."""

import json
import re
import subprocess
import sys


from helpers import ENV, ROOT, python


def test_profiler_events_carry_the_backend_prefix_and_the_comms_parameters():
    # gloo and NCCL name their events "gloo:all_reduce", "nccl:all_reduce"; ours were bare. NCCL
    # also records each op's parameters as a record_param_comms event; we do the same.
    rc, out = python(
        "import json, torch, torch.distributed as dist, torch_mpi_gpu\n"
        "from torch.profiler import profile\n"
        "dist.init_process_group('mpigpu', store=dist.HashStore(), rank=0, world_size=1)\n"
        "with profile() as prof:\n"
        "    t = torch.ones(4, dtype=torch.float64); dist.all_reduce(t); dist.broadcast(t, 0)\n"
        "    dist.barrier()\n"
        "names = sorted({e.name for e in prof.events()})\n"
        "print('events:', names)\n"
        "prof.export_chrome_trace('trace.json')\n"
        "comms = [e['args'] for e in json.load(open('trace.json'))['traceEvents']\n"
        "         if e.get('name') == 'record_param_comms']\n"
        "print('comms:', json.dumps(comms))\n"
        "dist.destroy_process_group()", cwd_tmp=True)
    assert rc == 0, out
    for name in ("mpigpu:all_reduce", "mpigpu:broadcast", "mpigpu:barrier"):
        assert f"'{name}'" in out, out
    assert "'allreduce'" not in out, out
    comms = json.loads(out.split("comms: ", 1)[1].splitlines()[0])
    assert [c["Collective name"] for c in comms] == ["allreduce", "broadcast", "barrier"], comms
    first = comms[0]
    assert (first["In msg nelems"], first["Out msg nelems"], first["dtype"]) == (4, 4, "Double")
    assert (first["Process Group Name"], first["Process Group Description"]) == ("0", "default_pg")
    assert (first["Group size"], first["Rank"], first["Process Group Ranks"]) == (1, 0, "[0]")
    import torch
    # torch before 2.13 records neither the sequence number nor the async flag (torch 2.11 on the
    # lent GPU machine: no "Seq" in the trace)
    if tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 13):
        assert [c["Seq"] for c in comms] == [1, 2, 3], comms
        assert first["Is asynchronized op"] == 0, first  # dist.all_reduce waits (async_op=False)


def test_flight_recorder_keeps_the_last_ops():
    # TORCH_FR_BUFFER_SIZE entries, oldest overwritten first, each completed with its times
    rc, out = python(
        "import torch, torch.distributed as dist, torch_mpi_gpu\n"
        "from torch_mpi_gpu import flight_recorder\n"
        "dist.init_process_group('mpigpu', store=dist.HashStore(), rank=0, world_size=1)\n"
        "for n in range(1, 6): dist.all_reduce(torch.ones(n))\n"
        "pending = dist.all_reduce(torch.ones(7), async_op=True); pending.wait()\n"
        "for e in flight_recorder.dump(stack_traces=False)['entries']:\n"
        "    print('entry', e['record_id'], e['collective_seq_id'], e['input_sizes'], e['state'],\n"
        "          e['time_created_ns'] <= e['time_discovered_started_ns'] <=\n"
        "          e['time_discovered_completed_ns'], e['duration_ms'] >= 0)\n"
        "print('active', flight_recorder.dump(only_active=True)['entries'])\n"
        "dist.destroy_process_group()", env={"TORCH_FR_BUFFER_SIZE": "3"})
    assert rc == 0, out
    entries = re.findall(r"^entry (.*)$", out, re.M)
    assert entries == ["3 4 [[4]] completed True True", "4 5 [[5]] completed True True",
                       "5 6 [[7]] completed True True"], out
    assert "active []" in out, out


def test_info_cli_reports_mpi_paths_and_settings():
    proc = subprocess.run([sys.executable, "-m", "torch_mpi_gpu.info", "--json"], capture_output=True,
                          text=True, env=ENV, timeout=120, cwd=ROOT / "tests")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert "Open MPI" in data["mpi_library"] or "MPICH" in data["mpi_library"]
    assert data["mpi_thread_level"] == "MPI_THREAD_MULTIPLE"
    assert data["built_with"]["mpi_source"]
    assert set(data["paths"]) == {"cpu tensors", "cuda tensors", "cuda reductions",
                                  "other devices (xpu, ...)", "reductions"}
    assert data["paths"]["reductions"].startswith("auto, "), data["paths"]["reductions"]
    assert "TORCH_MPIGPU_TIMEOUT" in data["settings"]["user"]  # the user tier only, without --all
    assert set(data["settings"]) == {"user"}, data["settings"].keys()
    assert data["cuda_aware"].startswith(("yes", "no")), data["cuda_aware"]
