"""The default rendezvous under an MPI launcher: a store served over MPI (csrc/store/), no TCP
listener. Every store call is compared with torch's own HashStore doing the same calls (an
independent implementation); the ranks then use the store together (counters, compare_set races,
waits answered by another rank, threads), and the process groups made through it work
(subgroups, a DeviceMesh, object collectives, barriers). argv[1]: "mpi" (no new listening TCP
socket in any rank; with OMPI_MCA_btl=self,sm none at all), "tcp" (the TCP control:
TORCH_MPIGPU_MASTER_PORT set, where rank 0's store must be seen listening, so the check can fail)
or "serialized" (MPI at MPI_THREAD_SERIALIZED: all of "mpi", the store's calls taking turns with
the one shared engine thread). In both, rank 0's engine meets ranks that first need a store reply
from rank 0 (a collective and a new group). Run by test_multirank.py."""

import datetime
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

import torch_mpi_gpu
from common import Checker, run

TCP_SECTIONS = ["rendezvous over MPI", "store calls match HashStore", "listening TCP sockets"]
SECTIONS = ["rendezvous over MPI", "store calls match HashStore", "ranks share the store",
            "waits end at their timeout, naming the key", "listening TCP sockets",
            "subgroups, DeviceMesh, objects, barriers", "ops wait for ranks that need the store",
            "a rank leaving ends a wait"]


def listening_inodes():
    """Inodes of the TCP sockets in LISTEN state (0A) that this process holds."""
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[3] == "0A":
                        listening.add(fields[9])
        except FileNotFoundError:
            pass
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            mine.add(target[8:-1])
    return mine & listening


def base_store():
    store = dist.distributed_c10d._get_default_store()
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return store


def script(store, rank):
    """The same calls on any store; what each returned."""
    p = f"own/{rank}/"
    got = []
    store.set(p + "a", b"one")
    got.append(store.get(p + "a"))
    store.set(p + "a", "two")  # overwrite, from a str
    got.append(store.get(p + "a"))
    got.append(store.add(p + "n", 5))
    got.append(store.add(p + "n", -2))
    got.append(store.add(p + "n", 0))
    got.append(store.get(p + "n"))
    got.append(store.compare_set(p + "c", "", "first"))   # missing key, empty expected: set
    got.append(store.compare_set(p + "c", "nope", "x"))    # mismatch: unchanged
    got.append(store.compare_set(p + "c", "first", "second"))
    got.append(store.compare_set(p + "m", "absent", "x"))  # missing key, expected given
    got.append(store.check([p + "a", p + "n"]))
    got.append(store.check([p + "a", p + "missing"]))
    got.append(store.delete_key(p + "a"))
    got.append(store.delete_key(p + "a"))
    got.append(store.check([p + "a"]))
    store.append(p + "l", b"ab")
    store.append(p + "l", b"cd")
    got.append(store.get(p + "l"))
    store.multi_set([p + "x", p + "y"], [b"1", b"\x00\xff" * 3000])
    got.append(store.multi_get([p + "y", p + "x"]))
    store.wait([p + "x", p + "y"])
    store.wait([p + "x"], datetime.timedelta(seconds=5))
    big = bytes(range(256)) * 4096  # 1 MiB: MPI's rendezvous protocol, not its eager one
    store.set(p + "big", big)
    got.append(store.get(p + "big") == big)
    return got


def check_calls(c, store, rank):
    c.section("store calls match HashStore")
    reference = script(dist.HashStore(), rank)
    dist.barrier()
    before = store.num_keys()
    dist.barrier()
    mine = script(store, rank)
    for i, (g, want) in enumerate(zip(mine, reference)):
        c.true(f"call {i}", g == want, f"MPI store {g!r:.80} HashStore {want!r:.80}")
    c.true("as many results", len(mine) == len(reference), f"{len(mine)} vs {len(reference)}")
    dist.barrier()
    # every rank's script leaves 6 keys of its own (n, c, l, x, y, big; a deleted, m unset) and
    # the barrier's may add some
    world = dist.get_world_size()
    c.true("num_keys", store.num_keys() >= before + 6 * world, f"{before} -> {store.num_keys()}")


def check_shared(c, store, rank, world):
    c.section("ranks share the store")
    store.set(f"share/{rank}", str(rank * 7))
    got = [store.get(f"share/{r}") for r in range(world)]  # waits for each rank's key
    c.true("every rank's key", got == [str(r * 7).encode() for r in range(world)], str(got))
    c.true("multi_get of every rank's key",
           store.multi_get([f"share/{r}" for r in range(world)]) == got, "")
    store.add("share/sum", rank + 1)
    won = store.compare_set("share/winner", "", str(rank)) == str(rank).encode()
    dist.barrier()
    c.true("add from every rank", int(store.get("share/sum")) == world * (world + 1) // 2,
           store.get("share/sum"))
    winners = [None] * world
    dist.all_gather_object(winners, won)
    c.true("one compare_set wins", sum(winners) == 1, str(winners))
    if world == 1:
        c.skip("a wait answered by a later set", "no other rank to set it at 1 rank")
    elif rank == 0:  # answered by another rank's set, after the wait began
        start = time.monotonic()
        store.wait(["share/late"])
        c.true("a wait answered by a later set", time.monotonic() - start >= 0.2,
               f"{time.monotonic() - start:.3f} s")
    elif rank == world - 1:
        time.sleep(0.3)
        store.set("share/late", "x")
    else:
        c.skip("a wait answered by a later set", "only rank 0 waits, the last rank sets")

    def adder(n):
        for _ in range(50):
            store.add("share/threads", 1)
        store.set(f"share/thread/{rank}/{n}", "done")

    threads = [threading.Thread(target=adder, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dist.barrier()
    c.true("4 threads per rank", int(store.get("share/threads")) == 200 * world,
           store.get("share/threads"))


def check_timeouts(c, store, rank):
    c.section("waits end at their timeout, naming the key")
    start = time.monotonic()
    c.raises("wait", dist.DistStoreError,
             lambda: store.wait([f"never/{rank}"], datetime.timedelta(seconds=1)),
             must_contain=(f"never/{rank}", f"[rank {rank}]", "store wait", "timeout"))
    took = time.monotonic() - start
    c.true("after the timeout, not long after", 1.0 <= took < 10, f"{took:.2f} s")
    store.set_timeout(datetime.timedelta(seconds=1))
    c.raises("get", dist.DistStoreError, lambda: store.get(f"never/get/{rank}"),
             must_contain=(f"never/get/{rank}", f"[rank {rank}]", "store get"))
    store.set_timeout(datetime.timedelta(minutes=5))
    store.set(f"after/{rank}", "ok")  # the store still works after a cancelled wait
    c.true("works after", store.get(f"after/{rank}") == b"ok", "")


def check_groups(c, rank, world):
    c.section("subgroups, DeviceMesh, objects, barriers")
    evens = dist.new_group([r for r in range(world) if r % 2 == 0])
    t = torch.ones(4) * (rank + 1)
    if rank % 2 == 0:
        dist.all_reduce(t, group=evens)
        c.close("subgroup all_reduce", t,
                torch.ones(4) * sum(r + 1 for r in range(world) if r % 2 == 0))
    else:
        c.skip("subgroup all_reduce", "odd ranks are not members")
    from torch.distributed.device_mesh import init_device_mesh
    shape = (2, world // 2) if world % 2 == 0 and world > 2 else (world,)
    mesh = init_device_mesh("cpu", shape)
    x = torch.full((3,), float(rank))
    dist.all_reduce(x, group=mesh.get_group(len(shape) - 1))
    row = [r for r in range(world) if r // shape[-1] == rank // shape[-1]]
    c.close("DeviceMesh all_reduce", x, torch.full((3,), float(sum(row))))
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
    c.true("all_gather_object", objs == [{"rank": r, "s": "x" * r} for r in range(world)], "")
    lst = [f"from {world - 1}", world] if rank == world - 1 else [None, None]
    dist.broadcast_object_list(lst, src=world - 1)
    c.true("broadcast_object_list", lst == [f"from {world - 1}", world], str(lst))
    for _ in range(3):
        dist.barrier()
    dist.barrier(group=evens) if rank % 2 == 0 else None
    c.true("barriers", True)


def check_store_first(c, store, rank, world):
    """Rank 0 enters an all_reduce, then a new group, while the others first make store calls
    that rank 0's server answers: its engine must let the server run while it waits for them."""
    c.section("ops wait for ranks that need the store")
    for what in ("all_reduce", "new_group"):
        if rank != 0:
            time.sleep(0.3)
            store.set(f"first/{what}/{rank}", "x")
            c.true(f"store answers before {what}", store.get(f"first/{what}/{rank}") == b"x", "")
        if what == "all_reduce":
            t = torch.ones(2)
            dist.all_reduce(t)
            c.close("all_reduce", t, torch.full((2,), float(world)))
        else:
            g = dist.new_group(list(range(world)))
            t = torch.ones(2)
            dist.all_reduce(t, group=g)
            c.close("new group's all_reduce", t, torch.full((2,), float(world)))


def check_leaving(c, store, rank, world):
    """The last rank leaves (exits normally); every other rank waits for a key nobody sets. Its
    departure must end those waits at once with an error naming the key and the rank."""
    c.section("a rank leaving ends a wait")
    if world == 1:
        c.skip("wait ended by a departure", "no other rank at 1 rank")
        return
    if rank == world - 1:
        c.skip("wait ended by a departure", "this rank is the one leaving")
        return
    start = time.monotonic()
    c.raises("wait ended by a departure", dist.DistStoreError,
             lambda: store.wait([f"left/{rank}"], datetime.timedelta(seconds=120)),
             must_contain=(f"left/{rank}", f"rank {world - 1} closed its store", f"[rank {rank}]"))
    c.true("at once, not at the timeout", time.monotonic() - start < 60,
           f"{time.monotonic() - start:.1f} s")


def main():
    mode = sys.argv[1]
    torch_mpi_gpu._C.mpi_info()  # MPI started: what it listens on itself is not ours
    before = listening_inodes()
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    c = Checker("mpi_store")
    store = base_store()
    c.section("rendezvous over MPI")
    over_mpi = mode in ("mpi", "serialized")
    want_type = torch_mpi_gpu._C.MPIStore if over_mpi else dist.TCPStore
    c.true("store type", isinstance(store, want_type), type(store).__name__)
    if over_mpi:
        c.true("no MASTER_*", "MASTER_ADDR" not in os.environ and "MASTER_PORT" not in os.environ,
               f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}")
    c.true("RANK, LOCAL_RANK", os.environ.get("RANK") == str(rank)
           and int(os.environ.get("LOCAL_RANK", -1)) >= 0, str(os.environ.get("LOCAL_RANK")))
    check_calls(c, store, rank)
    if over_mpi:  # (the TCP control checks only the listeners, and that the test can fail)
        check_shared(c, store, rank, world)
        check_timeouts(c, store, rank)
        check_groups(c, rank, world)
        check_store_first(c, store, rank, world)
    c.section("listening TCP sockets")
    new = listening_inodes() - before
    if over_mpi:
        c.true("no new listener", not new, f"inodes {sorted(new)}")
        if os.environ.get("OMPI_MCA_btl") == "self,sm":
            c.true("none at all", not listening_inodes(), f"inodes {sorted(listening_inodes())}")
    else:
        c.true("the TCP control listens on rank 0", bool(new) == (rank == 0),
               f"rank {rank}: new listening inodes {sorted(new)}")
    dist.barrier()
    if over_mpi:
        check_leaving(c, store, rank, world)
    return c.finish()


if __name__ == "__main__":
    run(main)
