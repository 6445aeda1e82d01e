"""The Hugging Face Trainer over mpigpu, on the CPU, under mpirun:

    python -m torch_mpi_gpu.mpirun -np 2 examples/hf_trainer.py

The group is made first (dist.init_process_group("mpigpu")); the Trainer (through Accelerate)
then runs DDP on it. `TrainingArguments(ddp_backend="mpigpu")` is refused by Accelerate's own
list of backends, so leave ddp_backend unset. A small regression model trains a few SGD steps on
batches taken in order (rank r gets batch r of every `world` batches, as Accelerate shards them);
every rank then checks its parameters against single-process training on the same data (computed
here, without the Trainer) and prints "hf trainer: OK". Needs `pip install transformers`.
"""

import sys
import tempfile

import torch
import torch.distributed as dist

import torch_mpi_gpu  # noqa: F401  (registers "mpigpu")

STEPS, PER_RANK, LR = 4, 8, 0.1


class Regression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                                       torch.nn.Linear(16, 2))

    def forward(self, x, labels=None):
        out = self.net(x)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


def samples(world):
    g = torch.Generator().manual_seed(3)
    n = STEPS * PER_RANK * world
    return torch.randn(n, 6, generator=g), torch.randn(n, 2, generator=g)


class Data(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


def reference(world):
    """Single-process SGD, one step per `world` consecutive batches of PER_RANK samples."""
    model = Regression()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = samples(world)
    step = PER_RANK * world
    for s in range(STEPS):
        opt.zero_grad()
        model(x[s * step:(s + 1) * step], y[s * step:(s + 1) * step])["loss"].backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def main():
    from transformers import Trainer, TrainingArguments

    class InOrder(Trainer):  # the samples in order, so the reference can follow them
        def _get_train_sampler(self, *args, **kwargs):
            return torch.utils.data.SequentialSampler(self.train_dataset)

    torch.set_num_threads(1)
    dist.init_process_group("mpigpu")  # first: the Trainer then uses this group
    rank, world = dist.get_rank(), dist.get_world_size()
    model = Regression()
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=PER_RANK,
                                 max_steps=STEPS, learning_rate=LR, optim="sgd",
                                 lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=0.0,
                                 use_cpu=True,
                                 report_to=[], save_strategy="no", logging_strategy="no",
                                 dataloader_drop_last=True, disable_tqdm=True)
        trainer = InOrder(model=model, args=args, train_dataset=Data(*samples(world)))
        trainer.train()
    assert dist.get_backend() == "mpigpu", dist.get_backend()
    got = [p.detach().clone() for p in model.parameters()]
    expected = reference(world)
    worst = max(float((a - b).abs().max()) for a, b in zip(got, expected))
    ok = worst <= 1e-5
    print(f"[rank {rank}/{world}] hf trainer (ddp over mpigpu): {'OK' if ok else 'WRONG'}, "
          f"largest difference from single-process training {worst:.2e}", flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
