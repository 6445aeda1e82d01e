"""Libraries nobody here wrote, on mpigpu, under mpirun (argv[1]):
  accelerate  Hugging Face Accelerate on CPU tensors: the process group is created first (on CPU
              Accelerate only knows "mpi" and "gloo" and would refuse "mpigpu"), then
              Accelerator(cpu=True) uses it; a few training steps on rank-dependent data must
              leave every rank with the parameters of single-process training on all the data.
  lightning   Lightning's Trainer with DDPStrategy(process_group_backend="mpigpu") on CPU: the
              parameters after fit() must equal single-process training on all the data.
Run by test_multirank.py at 2 ranks (skipped when the library is not installed)."""

import sys

import torch
import torch.distributed as dist

import torch_mpi_gpu  # noqa: F401
from common import Checker, run

STEPS, PER_RANK = 4, 8


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def data(world):
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(PER_RANK * world, 6, generator=g), torch.randn(PER_RANK * world, 2,
                                                                        generator=g))
            for _ in range(STEPS)]


def reference(world):
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for x, y in data(world):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return net


def accelerate_run(c):
    from accelerate import Accelerator

    dist.init_process_group("mpigpu")  # first: Accelerate then uses this group
    rank, world = dist.get_rank(), dist.get_world_size()
    acc = Accelerator(cpu=True)
    c.true("accelerate sees the group", acc.num_processes == world and acc.process_index == rank,
           f"{acc.num_processes} processes, index {acc.process_index}")
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    net, opt = acc.prepare(net, opt)
    for x, y in data(world):
        sl = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
        opt.zero_grad()
        acc.backward(torch.nn.functional.mse_loss(net(x[sl]), y[sl]))
        opt.step()
    ref = reference(world)
    for (name, p), q in zip(acc.unwrap_model(net).named_parameters(), ref.parameters()):
        c.close(f"accelerate {name}", p.detach(), q.detach().double(), dtype=torch.float32, world=world)


def lightning_run(c):
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = model()

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    world = int(torch_mpi_gpu.launcher.detect_launcher()["size"])
    batches = data(world)

    class Shard(torch.utils.data.Dataset):
        def __init__(self, rank):
            self.items = [(x[rank * PER_RANK:(rank + 1) * PER_RANK],
                           y[rank * PER_RANK:(rank + 1) * PER_RANK]) for x, y in batches]

        def __len__(self):
            return len(self.items)

        def __getitem__(self, i):
            return self.items[i]

    module = Module()
    trainer = L.Trainer(accelerator="cpu", devices=world, num_nodes=1, max_epochs=1,
                        strategy=DDPStrategy(process_group_backend="mpigpu"),
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False,
                        use_distributed_sampler=False)  # each rank feeds its own shard
    rank = trainer.global_rank
    loader = torch.utils.data.DataLoader(Shard(rank), batch_size=None, shuffle=False)
    trainer.fit(module, loader)
    c.true("lightning uses mpigpu", dist.get_backend() == "mpigpu", dist.get_backend())
    ref = reference(world)
    for (name, p), q in zip(module.net.named_parameters(), ref.parameters()):
        c.close(f"lightning {name}", p.detach(), q.detach().double(), dtype=torch.float32,
                world=world)


def main():
    c = Checker(f"ecosystem {sys.argv[1]}")
    {"accelerate": accelerate_run, "lightning": lightning_run}[sys.argv[1]](c)
    c.rank = dist.get_rank()  # the library created or joined the group after the Checker
    return c.finish()


if __name__ == "__main__":
    run(main)
