"""Every TORCH_MPIGPU_* setting: name, default, when it is read, who it is for, meaning.

The table itself is C++ (csrc/core/Settings.cpp), so the code that parses a setting and the text that
documents it cannot drift apart; this module exposes it to Python (`info`, the launcher) and
prints the tables of docs/settings.md (user, tuning, build) and docs/testing.md (test):

    python -m torch_mpi_gpu.info --settings-markdown user
"""

import os
from dataclasses import dataclass

from . import _C

TIERS = ("user", "tuning", "build", "test")


@dataclass(frozen=True)
class Setting:
    name: str
    default: str  # "" when unset means "no value" (the row's shown_default says what happens)
    shown_default: str
    read_at: str
    meaning: str
    tier: str  # user, tuning, build or test (csrc/core/Settings.hpp says who each is for)
    basis: str  # tuning: what set the default

    @property
    def value(self) -> str:
        return os.environ.get(self.name, self.default)

    @property
    def is_set(self) -> bool:
        return self.name in os.environ

    def markdown_row(self) -> str:
        default = self.shown_default or f"`{self.default}`"
        cells = [f"`{self.name}`", default, self.read_at, self.meaning]
        if self.tier == "tuning":
            cells.append(self.basis)
        return "| " + " | ".join(cells) + " |"


SETTINGS = [Setting(*row) for row in _C.settings()]


def get(name: str) -> str:
    for s in SETTINGS:
        if s.name == name:
            return s.value
    raise KeyError(f"unknown torch_mpi_gpu setting {name}")


def of_tier(tier: str):
    if tier not in TIERS:
        raise ValueError(f"unknown settings tier {tier!r}: one of {', '.join(TIERS)}")
    return [s for s in SETTINGS if s.tier == tier]


def markdown_table(tier: str = "user") -> str:
    """The Markdown table of one tier's settings, as the docs show it."""
    if tier == "tuning":
        head = ["| variable | default | read at | meaning | what set the default |",
                "|---|---|---|---|---|"]
    else:
        head = ["| variable | default | read at | meaning |", "|---|---|---|---|"]
    return "\n".join(head + [s.markdown_row() for s in of_tier(tier)])
