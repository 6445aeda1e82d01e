"""A stalled job for the flight recorder, at 3 ranks: every rank runs some collectives (one on a
subgroup) and a send/recv, then rank 1 stops calling collectives (it sleeps) while ranks 0 and 2
enter all_reduce #5 of the default group. Their watchdogs time out (TORCH_MPIGPU_TIMEOUT), write
their records, ask rank 1 for its own through the store, and end the job. test_flight_recorder.py
then reads the dumps with torch's analyzer. Mode `ondemand` instead checks the on-demand dump
against gloo's record of the same ops (torch's own recorder, the format reference)."""

import pickle
import sys
import time

import torch
import torch.distributed as dist

from common import Checker, run
from torch_mpi_gpu import flight_recorder

TORCH = tuple(int(x) for x in torch.__version__.split(".")[:2])


def some_ops(group_02):
    rank = dist.get_rank()
    x = torch.ones(8)
    for _ in range(3):
        dist.all_reduce(x)
    if rank in (0, 2):
        dist.broadcast(torch.ones(4), 0, group=group_02)
    if rank == 0:
        dist.send(torch.ones(3), 1)
    elif rank == 1:
        dist.recv(torch.ones(3), 0)
    out = torch.empty(8 * dist.get_world_size())
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, x)


def stall():
    dist.init_process_group("mpigpu")
    some_ops(dist.new_group([0, 2]))
    if dist.get_rank() == 1:
        print("rank 1: stalling before all_reduce #5", flush=True)
        time.sleep(60)  # never joins; the job is ended before this returns
        print("rank 1: PAST THE STALL", flush=True)
    else:
        dist.all_reduce(torch.ones(16))
        print(f"rank {dist.get_rank()}: PAST THE STALL", flush=True)


def entries_of(record):
    return [e for e in record["entries"] if not e["profiling_name"].endswith("barrier")]


def numel(sizes):
    return [torch.Size(s).numel() for s in sizes]


def ondemand():
    """Our record of some ops next to gloo's record (torch's recorder) of the same ops."""
    dist.init_process_group("gloo")
    some_ops(dist.new_group([0, 2]))
    gloo = pickle.loads(torch._C._distributed_c10d._dump_fr_trace(True, True, False))
    dist.destroy_process_group()
    dist.init_process_group("mpigpu")
    rank = dist.get_rank()
    some_ops(dist.new_group([0, 2]))
    ours = flight_recorder.dump()
    c = Checker("flight recorder on demand, against gloo's record of the same ops")
    c.true("recording", flight_recorder.enabled())
    c.true("version", ours["version"] == gloo["version"], f"{ours['version']} vs {gloo['version']}")
    c.true("top-level keys", set(ours) >= set(gloo), f"{set(ours)} vs {set(gloo)}")
    # torch 2.9 renamed the library's version key
    lib = "comm_lib_version" if TORCH >= (2, 9) else "nccl_version"
    c.true(lib, "MPI" in ours.get(lib, ""), str(ours.get(lib)))
    # gloo records collectives only (torch 2.13); we record point-to-point too
    mine = entries_of(ours)
    colls = [e for e in mine if not e["is_p2p"]]
    theirs = entries_of(gloo)
    if TORCH < (2, 10):  # gloo's recorder came in 2.10: only our own record is checked below
        c.skip("collectives recorded as gloo's", f"gloo records no ops in torch {torch.__version__}")
        theirs = [None] * len(colls)
    else:
        c.true("collectives recorded", len(colls) == len(theirs), f"{len(colls)} vs {len(theirs)}")
    for a, b in zip(colls, theirs):
        name = a["profiling_name"]
        if b is not None:
            optional = {"duration_ms"}  # torch writes it only when it measured one (gloo does not)
            c.true(f"{name} keys", set(a) - optional == set(b) - optional,
                   f"{sorted(set(a) ^ set(b))} differ")
            for key in ("collective_seq_id", "input_dtypes", "output_dtypes", "timeout_ms"):
                c.true(f"{name} {key}", a[key] == b[key], f"{a[key]} vs gloo {b[key]}")
            # element counts: gloo records all_gather_into_tensor's output as [world, n], we as
            # given
            for key in ("input_sizes", "output_sizes"):
                c.true(f"{name} {key}", numel(a[key]) == numel(b[key]), f"{a[key]} vs gloo {b[key]}")
            c.true(f"{name} group", a["process_group"][1] == b["process_group"][1],
                   a["process_group"])
        c.true(f"{name} prefix", name.startswith("mpigpu:"), name)
        c.true(f"{name} state", a["state"] == "completed" and a["retired"], a["state"])
        c.true(f"{name} times", a["duration_ms"] >= 0 and
               a["time_discovered_completed_ns"] >= a["time_discovered_started_ns"] >=
               a["time_created_ns"], str(a))
    p2p = [e["profiling_name"] for e in mine if e["is_p2p"]]
    want = {0: ["mpigpu:send 0->1"], 1: ["mpigpu:recv 1<-0"]}.get(rank, [])
    c.true("point-to-point names", p2p == want, f"{p2p} vs {want}")
    for e in mine:
        if e["is_p2p"]:  # numbered apart from collectives: the current collective number, p2p #1
            c.true("p2p numbers", e["p2p_seq_id"] == 1 and e["collective_seq_id"] == 3, str(e))
    expected = ["mpigpu:all_reduce"] * 3 + (["mpigpu:broadcast"] if rank != 1 else [])
    names = [e["profiling_name"] for e in colls]
    c.true("issue order", names[:len(expected)] == expected, f"{names}")
    status = ours["pg_status"]["0"]
    c.true("group status", status["last_completed_collective"] ==
           status["last_enqueued_collective"] == 4, str(status))
    config = {g["desc"]: g["ranks"] for g in ours["pg_config"].values()}
    c.true("default group config", config.get("default_pg") == "[0, 1, 2]", str(config))
    c.true("subgroup config", ("[0, 2]" in config.values()) == (rank != 1), str(config))
    return c.finish()


def off():
    """TORCH_FR_BUFFER_SIZE=0: ops run, nothing is recorded, a dump is empty."""
    dist.init_process_group("mpigpu")
    x = torch.ones(4)
    dist.all_reduce(x)
    c = Checker("flight recorder off")
    c.true("not recording", not flight_recorder.enabled())
    c.true("no entries", flight_recorder.dump()["entries"] == [])
    c.true("ops still run", x.eq(dist.get_world_size()).all().item())
    return c.finish()


if __name__ == "__main__":
    if sys.argv[1] == "stall":
        stall()
    else:
        run({"ondemand": ondemand, "off": off}[sys.argv[1]])
