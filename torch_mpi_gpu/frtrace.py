"""torch's flight-recorder analyzer (torchfrtrace) for mpigpu dumps.

    python -m torch_mpi_gpu.frtrace DUMP_DIR [-p PREFIX] [torchfrtrace's options]

It runs torch's own analyzer (torch.distributed.flight_recorder.fr_trace) unchanged, except for
one thing: torch's `Op` accepts only the communication libraries it lists (nccl, gloo, xccl, ...)
as the prefix of an entry's profiling name and refuses "mpigpu:all_reduce". Here an mpigpu entry
is checked under gloo's prefix, the only part of the name that check reads, and keeps its own
name in everything the analyzer prints. Everything else (matching collectives across ranks,
naming the ranks that did not join, size and dtype checks) is torch's code.
"""

import sys

PREFIX = "mpigpu:"


def accept_mpigpu_entries():
    """Lets torch's analyzer parse entries whose profiling name starts with "mpigpu:"."""
    from torch.distributed.flight_recorder.components import types

    op_init = types.Op.__init__
    if getattr(op_init, "_accepts_mpigpu", False):
        return

    def init(self, event, memberships, pg_name):
        name = event["profiling_name"]
        if not name.startswith(PREFIX):
            return op_init(self, event, memberships, pg_name)
        op_init(self, dict(event, profiling_name="gloo:" + name[len(PREFIX):]), memberships,
                pg_name)
        self.profiling_name = name

    init._accepts_mpigpu = True
    types.Op.__init__ = init


def main(argv=None):
    accept_mpigpu_entries()
    from torch.distributed.flight_recorder import fr_trace

    fr_trace.main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
