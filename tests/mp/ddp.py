"""DDP over mpigpu trains to the same parameters as single-process training on the whole batch.
Each rank computes the single-process reference itself (no communication), so the comparison does
not trust the backend. Run under mpirun at 1-4 ranks."""


import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from common import Checker, run, use_test_device

STEPS, PER_RANK = 6, 8


def model(device=None):
    """Made on the host (the same weights whatever the device), then moved to `device` (default:
    the tests' device)."""
    torch.manual_seed(0)
    with torch.device("cpu"):
        net = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32),
                                  torch.nn.Tanh(), torch.nn.Linear(32, 4))
    return net.to(device or torch.get_default_device())


def batches(world, device=None):
    g = torch.Generator().manual_seed(1)
    dev = device or torch.get_default_device()
    return [(torch.randn(PER_RANK * world, 20, generator=g, device="cpu").to(dev),
             torch.randn(PER_RANK * world, 4, generator=g, device="cpu").to(dev))
            for _ in range(STEPS)]


def reference(world, accumulate):
    """One process on the whole batch, on the host in float64: independent of the device and the
    backend under test."""
    net = model("cpu").double()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for x, y in batches(world, "cpu"):
        opt.zero_grad()
        if accumulate:  # two micro-batches per step, gradients summed then averaged
            for part in range(2):
                sl = slice(part * PER_RANK * world // 2, (part + 1) * PER_RANK * world // 2)
                (torch.nn.functional.mse_loss(net(x[sl].double()), y[sl].double()) / 2).backward()
        else:
            torch.nn.functional.mse_loss(net(x.double()), y.double()).backward()
        opt.step()
    return [p.detach() for p in net.parameters()]


def train(rank, world, accumulate=False, hook=None, state=None, **ddp_kwargs):
    net = DDP(model(), **ddp_kwargs)
    if hook is not None:
        net.register_comm_hook(state, hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for x, y in batches(world):
        xs, ys = x[rank * PER_RANK:(rank + 1) * PER_RANK], y[rank * PER_RANK:(rank + 1) * PER_RANK]
        opt.zero_grad()
        if accumulate:
            half = PER_RANK // 2
            with net.no_sync():
                (torch.nn.functional.mse_loss(net(xs[:half]), ys[:half]) / 2).backward()
            (torch.nn.functional.mse_loss(net(xs[half:]), ys[half:]) / 2).backward()
        else:
            torch.nn.functional.mse_loss(net(xs), ys).backward()
        opt.step()
    return [p.detach() for p in net.module.parameters()]


class Bag(torch.nn.Module):
    """An embedding with sparse gradients (DDP all-reduces them as sparse COO tensors) and a
    dense head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(50, 8, sparse=True)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, ids):
        return self.head(self.emb(ids).mean(1))


def sparse_batches(world):
    g = torch.Generator().manual_seed(2)
    # on the host (the generator's device) whatever the default device; train_sparse moves them
    return [(torch.randint(0, 50, (PER_RANK * world, 5), generator=g, device="cpu"),
             torch.randn(PER_RANK * world, 4, generator=g, device="cpu")) for _ in range(STEPS)]


def train_sparse(rank, world, dev):
    """SGD on the embedding model: one process on the whole batch (rank < 0), or DDP on this
    rank's share."""
    net = Bag().to(dev)
    if rank < 0:
        net = net.double()
    model = net if rank < 0 else DDP(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    for ids, y in sparse_batches(world):
        if rank >= 0:
            ids, y = ids[rank * PER_RANK:(rank + 1) * PER_RANK], y[rank * PER_RANK:(rank + 1) * PER_RANK]
        opt.zero_grad()
        out = model(ids.to(dev))
        torch.nn.functional.mse_loss(out, y.to(dev, out.dtype)).backward()
        opt.step()
    return [p.detach().cpu() for p in net.parameters()]


def bf16_compress(state, bucket):
    buf = bucket.buffer()
    compressed = buf.to(torch.bfloat16).div_(dist.get_world_size())
    fut = dist.all_reduce(compressed, async_op=True).get_future()
    return fut.then(lambda f: buf.copy_(f.value()[0]))


def main():
    dist.init_process_group("mpigpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = use_test_device()
    c = Checker(f"ddp(np={world}, device={device})")
    # (a section without checks: its seconds alone are reported, where the GPU runs' time goes)
    c.section("the single-process references")
    ref = reference(world, accumulate=False)
    ref_acc = reference(world, accumulate=True)

    def compare(name, run_it, expected, tol=1e-5, behaviour=None):
        c.section(behaviour or name)  # (before the training: each section's seconds are its own)
        for i, (p, e) in enumerate(zip(run_it(), expected)):
            err = (p.detach().double().cpu() - e).abs().max().item()
            c.true(f"{name} param {i}", err < tol, f"max abs error {err:.3g} >= {tol}")

    compare("default", lambda: train(rank, world), ref)
    compare("gradient_as_bucket_view", lambda: train(rank, world, gradient_as_bucket_view=True), ref)
    compare("static_graph", lambda: train(rank, world, static_graph=True), ref)
    compare("small buckets", lambda: train(rank, world, bucket_cap_mb=0.001), ref)
    compare("no_sync accumulation", lambda: train(rank, world, accumulate=True), ref_acc)
    compare("allreduce_hook", lambda: train(rank, world, hook=default_hooks.allreduce_hook), ref)
    compare("fp16_compress_hook", lambda: train(rank, world, hook=default_hooks.fp16_compress_hook),
            ref, 5e-3)
    # DDP accepts torch's bf16_compress_hook only in CUDA/XPU builds of torch (it checks the
    # build, not the backend); elsewhere the same hook, ungated, stands in.
    real_bf16 = torch.version.cuda is not None and dist.is_nccl_available()
    compare("bf16_compress_hook" if real_bf16 else "bf16 compress hook (ungated copy)",
            lambda: train(rank, world, hook=default_hooks.bf16_compress_hook if real_bf16 else bf16_compress),
            ref, 3e-2, behaviour="bf16_compress_hook")
    # torch has no sparse kernels for the tests' own device: there the model runs on the CPU
    sparse_dev = device if device.type in ("cpu", "cuda") else torch.device("cpu")
    compare("sparse embedding gradients", lambda: train_sparse(rank, world, sparse_dev),
            train_sparse(-1, world, "cpu"))
    # PowerSGD is lossy by design: check it trains, stays identical on every rank and stays close
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                        start_powerSGD_iter=2, min_compression_rate=0.5)
    c.section("powerSGD_hook")
    psgd = train(rank, world, hook=powerSGD_hook.powerSGD_hook, state=state)
    for i, p in enumerate(psgd):
        gathered = [torch.empty_like(p) for _ in range(world)]
        dist.all_gather(gathered, p.contiguous())
        c.true(f"powerSGD identical on all ranks, param {i}",
               all(torch.equal(g, gathered[0]) for g in gathered))
        c.true(f"powerSGD close to reference, param {i}",
               (p.detach().double().cpu() - ref[i]).abs().max().item() < 0.2)
    return c.finish()


if __name__ == "__main__":
    run(main)
