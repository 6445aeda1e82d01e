"""The compiled extension, `_C`, or one sentence on what to do where this folder has none.

Run from the root of a source checkout, Python imports the checkout's `torch_mpi_gpu/` before any
installed copy (the current folder comes first on sys.path). A checkout built in place
(`pip install --no-build-isolation -e .`) holds its `_C` and imports; an unbuilt one would fail
with a confusing "circular import" message (or, beside an editable install elsewhere, load that
install's extension), so it is named here instead.
"""

import importlib
from pathlib import Path


def _unbuilt_checkout():
    here = Path(__file__).resolve().parent
    return here if (here.parent / "setup.py").exists() and not any(here.glob("_C.*")) else None


_folder = _unbuilt_checkout()
if _folder is not None:  # checked first: another install's finder could hand us its own _C
    raise ImportError(
        f"torch_mpi_gpu: {_folder} is a source checkout without its built extension, and Python "
        f"takes it before any installed copy; build it in place with `pip install "
        f"--no-build-isolation -e {_folder.parent}` or run from outside {_folder.parent}")
_C = importlib.import_module("torch_mpi_gpu._C")
