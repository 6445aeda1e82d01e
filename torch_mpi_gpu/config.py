"""Every TORCH_MPIGPU_* setting: name, default, when it is read, meaning.

The table itself is C++ (csrc/Settings.cpp), so the code that parses a setting and the text that
documents it cannot drift apart; this module exposes it to Python (`info`, the launcher) and
prints docs/settings.md's table:

    python -m torch_mpi_gpu.info --settings-markdown
"""

import os
from dataclasses import dataclass

from . import _C


@dataclass(frozen=True)
class Setting:
    name: str
    default: str  # "" when unset means "no value" (the row's shown_default says what happens)
    shown_default: str
    read_at: str
    meaning: str

    @property
    def value(self) -> str:
        return os.environ.get(self.name, self.default)

    @property
    def is_set(self) -> bool:
        return self.name in os.environ

    def markdown_row(self) -> str:
        default = self.shown_default or f"`{self.default}`"
        return f"| `{self.name}` | {default} | {self.read_at} | {self.meaning} |"


SETTINGS = [Setting(*row) for row in _C.settings()]


def get(name: str) -> str:
    for s in SETTINGS:
        if s.name == name:
            return s.value
    raise KeyError(f"unknown torch_mpi_gpu setting {name}")


def markdown_table() -> str:
    head = ["| variable | default | read at | meaning |", "|---|---|---|---|"]
    return "\n".join(head + [s.markdown_row() for s in SETTINGS])

