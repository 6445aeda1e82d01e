"""Settings (torch_mpi_gpu.config, csrc/core/Settings.cpp): the table is the one the code reads and the
docs show, defaults parse and bad values name the variable, the timeout setting, the debug log,
and the choices settings drive at start-up: MPI's yield when crowded, the CUDA device of a rank,
TORCH_MPIGPU_AUTO_ENV=0."""

import os
import re

import pytest

from helpers import ROOT, python


def test_timeout_setting_overrides_set_pg_timeout():
    code = ("import datetime, torch, torch.distributed as dist, torch_mpi_gpu\n"
            "dist.init_process_group('mpigpu', store=dist.HashStore(), rank=0, world_size=1)\n"
            "b = dist.group.WORLD._get_backend(torch.device('cpu'))\n"
            "b.set_timeout(datetime.timedelta(seconds=7))  # what ProcessGroup.set_timeout calls\n"
            "print('described:', b.describe().split('timeout ')[1].split(',')[0])\n"
            "dist.destroy_process_group()")
    rc, out = python(code)
    assert rc == 0 and "described: 7000 ms" in out, out  # torch's call takes effect
    rc, out = python(code, env={"TORCH_MPIGPU_TIMEOUT": "3"})
    assert rc == 0 and "described: 3000 ms" in out, out  # the user's override wins


def test_settings_table_is_the_one_the_code_reads_and_the_docs_show():
    from torch_mpi_gpu import config

    # every setting the C++ side or the Python side reads by name is a row of the table
    sources = [p for p in (ROOT / "csrc").rglob("*") if p.suffix in (".cpp", ".hpp", ".cu")]
    sources += list((ROOT / "torch_mpi_gpu").glob("*.py")) + [ROOT / "setup.py"]
    read = set()
    for path in sources:
        read |= set(re.findall(r'"(TORCH_MPIGPU_[A-Z_]+|MPI_HOME)"', path.read_text()))
    assert {"TORCH_MPIGPU_FR_STACKS", "TORCH_MPIGPU_TIMEOUT", "TORCH_MPIGPU_AUTO_ENV",
            "MPI_HOME"} <= read, read
    table = {s.name for s in config.SETTINGS}
    assert read - table == set(), f"read by the code but not in csrc/core/Settings.cpp: {read - table}"
    assert table - read == set(), f"in csrc/core/Settings.cpp but read nowhere: {table - read}"
    # docs/settings.md's table is the generated one, row for row
    doc = (ROOT / "docs" / "settings.md").read_text()
    assert config.markdown_table() in doc, (
        "docs/settings.md's table differs from `python -m torch_mpi_gpu.info --settings-markdown`")
    # the build reads its own defaults (it runs before the extension exists): the same ones
    setup = (ROOT / "setup.py").read_text()
    defaults = {s.name: s.default for s in config.SETTINGS}
    for name in ("TORCH_MPIGPU_WITH_CUDA", "TORCH_MPIGPU_DEBUG_INFO",
                 "TORCH_MPIGPU_PRECOMPILED_HEADER", "TORCH_MPIGPU_UNITY_BUILD"):
        assert f'"{name}", "{defaults[name]}"' in setup, name
    assert f'DEFAULT_MPI_PREFIX = "{defaults["MPI_HOME"]}"' in setup


def test_debug_log_goes_through_c10_logging_with_the_group_prefix():
    code = ("import torch, torch.distributed as dist, torch_mpi_gpu\n"
            "dist.init_process_group('mpigpu', store=dist.HashStore(), rank=0, world_size=1)\n"
            "t = torch.ones(2); dist.all_reduce(t)\n"
            "dist.destroy_process_group()\n")
    prefix = "[mpigpu group '0' rank 0/1, world rank 0] "
    rc, out = python(code, env={"TORCH_MPIGPU_DEBUG": "1", "TORCH_CPP_LOG_LEVEL": "INFO"})
    assert rc == 0, out
    assert prefix + "created: group '0' rank 0/1" in out, out
    assert prefix + "allreduce: collective #1 queued (cpu path)" in out, out
    # at torch's default log level the INFO lines are hidden: one warning says how to see them
    rc, out = python(code, env={"TORCH_MPIGPU_DEBUG": "1"})
    assert rc == 0 and "collective #1 queued" not in out, out
    assert prefix + "TORCH_MPIGPU_DEBUG=1 logs at INFO level: set TORCH_CPP_LOG_LEVEL=INFO" in out, out


def test_settings_defaults_parse_and_bad_values_name_the_variable():
    # every default in the table parses (a group is created with all of them), and a bad value
    # is a ValueError naming the variable and the accepted values
    # (the algorithm's name is checked against the algorithm table: where a group resolves it);
    # one interpreter, the settings read at each call
    rc, out = python(
        "import os, torch_mpi_gpu._C as C\n"
        "print('defaults:', C.cuda_path()[0], C.reduction_rule()[:20])\n"
        "for name, value, call in [('TORCH_MPIGPU_ALGO', 'fastest', C.reduction_rule),\n"
        "                          ('TORCH_MPIGPU_FUSION_BYTES', '-1', C.cuda_path)]:\n"
        "    os.environ[name] = value\n"
        "    try:\n"
        "        call()\n"
        "        print(name, 'accepted', value)\n"
        "    except ValueError as e:\n"
        "        print(name, 'ValueError:', e)\n"
        "    del os.environ[name]")
    assert rc == 0 and "defaults: " in out and "accepted" not in out, out
    assert re.search(r"^TORCH_MPIGPU_ALGO ValueError: .*TORCH_MPIGPU_ALGO=fastest must be one of: "
                     r"auto, mpi", out, re.M), out
    assert re.search(r"^TORCH_MPIGPU_FUSION_BYTES ValueError: .*TORCH_MPIGPU_FUSION_BYTES=-1 is not "
                     r"an integer in \[0,", out, re.M), out


def test_bad_setting_is_a_value_error_naming_it():
    rc, out = python(
        "import torch.distributed as dist, torch_mpi_gpu\n"
        "dist.init_process_group('mpigpu', store=dist.HashStore(), rank=0, world_size=1)",
        env={"TORCH_MPIGPU_MAX_ELEMENTS_PER_CALL": "lots"})
    assert rc != 0 and "ValueError" in out and "TORCH_MPIGPU_MAX_ELEMENTS_PER_CALL=lots" in out, out


def test_bad_cuda_reduce_setting_names_it():
    rc, out = python("from torch_mpi_gpu import _C\n_C.cuda_reduce_path()",
                     env={"TORCH_MPIGPU_CUDA_REDUCE": "sometimes"})
    assert rc != 0 and "ValueError" in out and "TORCH_MPIGPU_CUDA_REDUCE=sometimes" in out, out


@pytest.mark.parametrize("cores, node, local_size, user, setting, expect", [
    (8, 8, 2, None, "auto", None),      # 4 cores per rank: leave MPI spinning
    (2, 2, 2, None, "auto", None),      # a core per rank: not oversubscribed
    (2, 2, 4, None, "auto", "1"),       # 4 ranks on 2 cores: yield
    (1, 16, 4, None, "auto", None),     # bound to one core of a big node: the launcher's choice
    (2, 2, 4, "0", "auto", "0"),        # the user's own Open MPI setting wins
    (2, 2, 4, None, "0", None),         # off
    (8, 8, 1, None, "1", "1"),          # forced on
])
def test_mpi_yield_choice(monkeypatch, cores, node, local_size, user, setting, expect):
    from torch_mpi_gpu import _C, launcher
    was = _C.oversubscribed()
    monkeypatch.setattr(launcher.os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(launcher.os, "cpu_count", lambda: node)
    monkeypatch.setenv("TORCH_MPIGPU_MPI_YIELD", setting)
    environ = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": str(local_size),
               "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size)}
    if user is not None:
        environ["OMPI_MCA_mpi_yield_when_idle"] = user
    launcher.choose_mpi_yield(environ)
    assert environ.get("OMPI_MCA_mpi_yield_when_idle") == expect
    # the engines are told too: a caller in wait() then sleeps at once
    try:
        assert _C.oversubscribed() == (setting == "1" or (setting == "auto" and local_size > cores
                                                          and cores == node))
    finally:
        _C.set_oversubscribed(was)


def test_bad_mpi_yield_setting_names_it(monkeypatch):
    from torch_mpi_gpu import launcher
    monkeypatch.setenv("TORCH_MPIGPU_MPI_YIELD", "sometimes")
    with pytest.raises(ValueError, match="TORCH_MPIGPU_MPI_YIELD=sometimes"):
        launcher.choose_mpi_yield({})


@pytest.mark.parametrize("setting, local_rank, devices, expect", [
    ("1", 5, 4, 1),      # local rank mod device count
    ("1", 2, 8, 2),
    ("0", 5, 4, None),   # TORCH_MPIGPU_SET_DEVICE=0: left to the user
])
def test_cuda_device_is_local_rank_mod_device_count(monkeypatch, setting, local_rank, devices,
                                                    expect):
    import torch
    from torch_mpi_gpu import launcher
    chosen = []
    monkeypatch.setenv("TORCH_MPIGPU_SET_DEVICE", setting)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: devices)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    environ = {"OMPI_COMM_WORLD_RANK": str(local_rank), "OMPI_COMM_WORLD_SIZE": "16",
               "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank), "OMPI_COMM_WORLD_LOCAL_SIZE": "8"}
    assert launcher.select_cuda_device(environ) == expect
    assert chosen == ([] if expect is None else [expect])


def test_auto_env_off_leaves_the_rendezvous_variables_alone(monkeypatch):
    from torch_mpi_gpu import launcher
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    for var, value in {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
                       "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("TORCH_MPIGPU_AUTO_ENV", "0")
    assert launcher.setup_env() is None  # returns before MPI is touched
    assert "RANK" not in os.environ and "MASTER_ADDR" not in os.environ
