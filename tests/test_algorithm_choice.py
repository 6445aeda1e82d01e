"""How an op is carried out, decided without a second rank: the algorithm table (documented and
forceable), auto's rules at their thresholds, the MPI type and op of each reduction, the host
reducer against torch, fusion buckets, the path CUDA tensors take, receives from any source on
MPICH, and the node leader's kept mappings. The same choices on real groups: tests/mp/
auto_algorithm.py, fusion.py (test_multirank.py)."""

import ast
import re

import pytest

from helpers import ROOT, python


def test_every_algorithm_of_the_table_is_documented_and_forceable():
    # the algorithm table (csrc/algorithms/Algorithms.cpp) is what TORCH_MPIGPU_ALGO accepts and
    # what docs/architecture.md's table describes, row for row
    doc = (ROOT / "docs" / "architecture.md").read_text()
    import torch_mpi_gpu
    rows = torch_mpi_gpu._C.algorithms()
    assert [r["name"] for r in rows][:2] == ["node", "ring"], rows
    assert rows[0]["ops"] == ["all_reduce", "reduce_scatter", "reduce", "all_gather", "broadcast"]
    for row in rows:
        assert f"| `{row['name']}` |" in doc, f"docs/architecture.md lacks a row for {row['name']}"
        assert "all_reduce" in row["ops"] and set(row["ops"]) <= {
            "all_reduce", "reduce_scatter", "reduce", "all_gather", "broadcast"}, row
    # forced one after another in one interpreter (settings are read where they are used)
    names = [row["name"] for row in rows]
    rc, out = python("import os, torch_mpi_gpu._C as C\n"
                     f"for name in {names!r}:\n"
                     "    os.environ['TORCH_MPIGPU_ALGO'] = name\n"
                     "    print(name, '->', C.reduction_rule())")
    assert rc == 0, out
    for name in names:
        assert re.search(rf"^{name} -> .*TORCH_MPIGPU_ALGO={name} for every op it serves", out,
                         re.M), out


def test_auto_rules_at_their_thresholds():
    # auto's table (Algorithms.cpp: nodePicks, ringPicks) asked with the facts an op would bring,
    # defaults read from the settings; each rule just below and at its threshold
    import torch
    import torch_mpi_gpu
    C, cfg = torch_mpi_gpu._C, torch_mpi_gpu.config

    def pick(op, nbytes, gpu, shared=False, suits=True, spans=False, world=2, dtype=torch.float32,
             crowded=False):
        return C._auto_algorithm(op, nbytes, dtype, world, gpu, suits, spans, shared, crowded)

    algo_min = int(cfg.get("TORCH_MPIGPU_ALGO_MIN_BYTES"))
    allreduce_min = int(cfg.get("TORCH_MPIGPU_NODE_SHARED_GPU_ALLREDUCE_BYTES"))
    assert allreduce_min < algo_min  # (the defaults: each threshold met below the other)
    across = int(cfg.get("TORCH_MPIGPU_NODE_ACROSS_MIN_BYTES"))
    # device tensors on a GPU the node's ranks share: the leader form, all_gather at any size,
    # all_reduce from NODE_SHARED_GPU_ALLREDUCE_BYTES and reduce_scatter from ALGO_MIN_BYTES (MPI's
    # own just below), never broadcast or reduce
    for nbytes in (4, allreduce_min - 4, allreduce_min, algo_min - 4, algo_min, 1 << 28):
        assert pick("all_gather", nbytes, gpu=True, shared=True) == "node"
        assert pick("broadcast", nbytes, gpu=True, shared=True) == "mpi"
        for op, threshold in (("all_reduce", allreduce_min), ("reduce_scatter", algo_min)):
            for dtype in (torch.float32, torch.bfloat16):
                want = "mpi" if nbytes < threshold else "node"
                assert pick(op, nbytes, gpu=True, shared=True, dtype=dtype) == want, (op, nbytes)
        assert pick("reduce", nbytes, gpu=True, shared=True) == ("mpi" if nbytes < algo_min else "ring")
    # a GPU per rank, groups spanning nodes, one rank per node: the node rule stays off for GPUs
    for kw in ({}, {"shared": True, "spans": True}, {"shared": True, "suits": False}):
        assert pick("all_gather", 1 << 20, gpu=True, **kw) == "mpi", kw
        assert pick("all_reduce", algo_min - 4, gpu=True, **kw) == "mpi", kw
        assert pick("all_reduce", algo_min, gpu=True, **kw) == "ring", kw
    # host tensors: the node algorithm at any size inside a node but fp32 all_reduce from
    # NODE_HOST_MPI_FROM_BYTES (NODE_HOST_MPI_CROWDED_FROM_BYTES where a host has more ranks than
    # cores) to below NODE_HOST_MPI_BELOW_BYTES, where MPI's own; from NODE_ACROSS_MIN_BYTES
    # across nodes
    assert pick("all_reduce", 4, gpu=False) == pick("broadcast", 4, gpu=False) == "node"
    window_from = int(cfg.get("TORCH_MPIGPU_NODE_HOST_MPI_FROM_BYTES"))
    window_below = int(cfg.get("TORCH_MPIGPU_NODE_HOST_MPI_BELOW_BYTES"))
    crowded_from = int(cfg.get("TORCH_MPIGPU_NODE_HOST_MPI_CROWDED_FROM_BYTES"))
    crowded_below = int(cfg.get("TORCH_MPIGPU_NODE_HOST_MPI_CROWDED_BELOW_BYTES"))
    assert 0 < window_from < crowded_from < crowded_below < window_below
    for world, crowded in ((2, False), (3, False), (8, False), (3, True), (4, True)):
        start, below = (crowded_from, crowded_below) if crowded else (window_from, window_below)
        for nbytes, want in ((start - 4, "node"), (start, "mpi"), (below - 4, "mpi"),
                             (below, "node")):
            assert pick("all_reduce", nbytes, gpu=False, world=world, crowded=crowded) == want, \
                (world, crowded, nbytes)
            assert pick("all_reduce", nbytes, gpu=False, world=world, dtype=torch.bfloat16) == "node"
            assert pick("broadcast", nbytes, gpu=False, world=world) == "node"
            assert pick("reduce_scatter", nbytes, gpu=False, world=world) == "node"
    assert pick("all_reduce", across - 4, gpu=False, spans=True) == "mpi"
    assert pick("all_gather", across, gpu=False, spans=True) == "node"
    assert pick("all_reduce", 4, gpu=False, world=1) == "mpi"
    with pytest.raises(ValueError, match="no op named"):
        pick("all_to_all", 4, gpu=False)


def test_fusion_buckets_group_by_dtype_and_cut_at_the_limit():
    import torch
    from torch_mpi_gpu import _C

    f32 = lambda n: torch.empty(n, dtype=torch.float32)  # noqa: E731
    f16 = lambda n: torch.empty(n, dtype=torch.float16)  # noqa: E731
    # 40-byte limit: 4+4 floats (32 B) fit, a third 4 would not; fp16 tensors go apart from
    # float ones (first-seen dtype order); a 100-float tensor (400 B) travels alone
    ts = [f32(4), f16(8), f32(4), f32(4), f32(100), f16(2), f32(0)]
    got = _C._fusion_buckets(ts, 40, 1 << 20)
    assert got == [[0, 2], [3], [4], [6], [1, 5]], got
    # alone_bytes: anything of at least 16 bytes travels alone, empty tensors still fuse
    got = _C._fusion_buckets([f32(4), f32(1), f32(1), f32(0)], 1 << 20, 16)
    assert got == [[0], [1, 2, 3]], got


# (ReduceOp, dtype, premul factor) -> (MPI datatype, MPI op, divide by size) or the error's
# class and words. Written from MPI's and torch's semantics, not from the code: bool reduces
# with logical ops; 8/16-bit integer SUM/PRODUCT wrap as torch does (Open MPI's saturate);
# fp16/bf16 need ops of ours; AVG is SUM then a division; PREMUL_SUM scales first.
REDUCTIONS = [
    ("SUM", "float32", None, ("MPI_FLOAT", "MPI_SUM", False)),
    ("SUM", "float64", None, ("MPI_DOUBLE", "MPI_SUM", False)),
    ("SUM", "int32", None, ("MPI_INT32_T", "MPI_SUM", False)),
    ("SUM", "uint64", None, ("MPI_UINT64_T", "MPI_SUM", False)),
    ("SUM", "int8", None, ("MPI_INT8_T", "mpigpu_wrapping_int8_sum", False)),
    ("SUM", "uint16", None, ("MPI_UINT16_T", "mpigpu_wrapping_uint16_sum", False)),
    ("PRODUCT", "uint8", None, ("MPI_UINT8_T", "mpigpu_wrapping_uint8_prod", False)),
    ("PRODUCT", "int16", None, ("MPI_INT16_T", "mpigpu_wrapping_int16_prod", False)),
    ("PRODUCT", "int64", None, ("MPI_INT64_T", "MPI_PROD", False)),
    ("SUM", "bool", None, ("MPI_C_BOOL", "MPI_LOR", False)),
    ("PRODUCT", "bool", None, ("MPI_C_BOOL", "MPI_LAND", False)),
    ("MIN", "bool", None, ("MPI_C_BOOL", "MPI_LAND", False)),
    ("MAX", "bool", None, ("MPI_C_BOOL", "MPI_LOR", False)),
    ("BXOR", "bool", None, ("MPI_C_BOOL", "MPI_LXOR", False)),
    ("BAND", "int64", None, ("MPI_INT64_T", "MPI_BAND", False)),
    ("BOR", "uint8", None, ("MPI_UINT8_T", "MPI_BOR", False)),
    ("MIN", "float16", None, ("mpigpu_float16", "mpigpu_float16_min", False)),
    ("MAX", "bfloat16", None, ("mpigpu_bfloat16", "mpigpu_bfloat16_max", False)),
    ("AVG", "bfloat16", None, ("mpigpu_bfloat16", "mpigpu_bfloat16_sum", True)),
    ("AVG", "float64", None, ("MPI_DOUBLE", "MPI_SUM", True)),
    ("SUM", "complex64", None, ("MPI_C_COMPLEX", "MPI_SUM", False)),
    ("AVG", "complex128", None, ("MPI_C_DOUBLE_COMPLEX", "MPI_SUM", True)),
    ("PREMUL_SUM", "float32", 0.5, ("MPI_FLOAT", "MPI_SUM", False)),
    ("PREMUL_SUM", "float16", 0.25, ("mpigpu_float16", "mpigpu_float16_sum", False)),
    ("AVG", "int64", None, ("TypeError", "AVG is defined for floating-point")),
    ("BOR", "float32", None, ("TypeError", "bitwise ops need an integer or bool dtype")),
    ("PRODUCT", "complex64", None, ("TypeError", "complex products are not supported")),
    ("MIN", "complex128", None, ("TypeError", "complex numbers are not ordered")),
    ("PREMUL_SUM", "int32", 2.0, ("TypeError", "PREMUL_SUM needs a floating-point dtype")),
    ("PREMUL_SUM", "float32", None, ("ValueError", "PREMUL_SUM without a factor")),
    ("SUM", "float8_e4m3fn", None, ("TypeError", "Float8_e4m3fn cannot be reduced")),
]


SYNONYMS = {"MPI_C_FLOAT_COMPLEX": "MPI_C_COMPLEX"}


def test_reduction_resolution_picks_the_mpi_type_and_op():
    # one interpreter (MPI initialises once per process), every case reported as a line
    code = ("import torch, torch_mpi_gpu\n"
            f"for op, dtype, premul, _ in {REDUCTIONS!r}:\n"
            "    sample = torch.empty(0, dtype=getattr(torch, dtype))\n"
            "    try:\n"
            "        r = torch_mpi_gpu._C._resolve_reduction(op, sample, premul)\n"
            "        got = (r['type'], r['op'], r['divide_by_size'], r['premul'])\n"
            "    except (TypeError, ValueError) as e:\n"
            "        got = (type(e).__name__, str(e))\n"
            "    print(repr((op, dtype, got)))\n")
    rc, out = python(code)
    assert rc == 0, out[-3000:]
    lines = [ast.literal_eval(line) for line in out.splitlines() if line.startswith("(")]
    assert len(lines) == len(REDUCTIONS), out[-3000:]
    wrong = []
    for (op, dtype, premul, want), (_, _, got) in zip(REDUCTIONS, lines):
        if want[0] in ("TypeError", "ValueError"):
            # the error names the op and rank too, as every argument error does
            ok = got[0] == want[0] and want[1] in got[1] and "allreduce [rank 0]" in got[1]
        else:
            # MPI_C_FLOAT_COMPLEX is MPI_C_COMPLEX (MPI 3.1, 3.2.2); MPIs name it either way
            ok = (SYNONYMS.get(got[0], got[0]), *got[1:]) == (*want, premul)
        if not ok:
            wrong.append(f"{op} on {dtype}: want {want}, got {got}")
    assert not wrong, "\n".join(wrong)


def test_host_reducer_matches_torch():
    # the local step of our algorithms on host tensors (ring/rhd/allgather), every reduce op x
    # dtype x size, against torch's own ops (test_gpu.py checks the CUDA kernels the same way)
    from test_gpu import host_reducer_failures, reduce_step_cases
    failures, cases = [], 0
    for op, dtype, n, shift, a, b, scale, expect in reduce_step_cases():
        if shift == 0:
            cases += 1
            failures += host_reducer_failures(op, dtype, n, a, b, scale, expect)
    assert cases > 300 and not failures, "\n".join(failures[:40])


CUDA_PATH_CASES = [
    ("1", "auto", ("cuda-direct", "cuda-staged")),   # Open MPI reduces device buffers on the host
    ("1", "direct", ("cuda-direct", "cuda-direct")),
    ("1", "staged", ("cuda-direct", "cuda-staged")),
    ("0", "direct", ("cuda-staged", "cuda-staged")),  # reductions never go direct alone
]


@pytest.fixture(scope="module")
def cuda_path_choices():
    """{(aware, reduce): output line} of every case, from one interpreter (the settings are
    read at each call)."""
    cases = [(aware, reduce) for aware, reduce, _ in CUDA_PATH_CASES]
    rc, out = python("import os\nfrom torch_mpi_gpu import _C\n"
                     f"for aware, reduce in {cases!r}:\n"
                     "    os.environ.update(TORCH_MPIGPU_CUDA_AWARE=aware, "
                     "TORCH_MPIGPU_CUDA_REDUCE=reduce)\n"
                     "    print(aware, reduce, _C.cuda_path()[0], _C.cuda_reduce_path()[0],"
                     " _C.cuda_reduce_path()[1], sep='|')")
    assert rc == 0, out
    return {tuple(line.split("|")[:2]): line for line in out.splitlines() if line.count("|") >= 4}


@pytest.mark.parametrize("aware, reduce, expect", CUDA_PATH_CASES)
def test_cuda_path_choice(aware, reduce, expect, cuda_path_choices):
    """Which path CUDA tensors and CUDA reductions take, from the settings and the MPI library
    (no GPU needed: the choice is made before any device memory is touched)."""
    out = cuda_path_choices.get((aware, reduce), f"no line for {aware}, {reduce}: {cuda_path_choices}")
    path, reduce_path, reason = (out.split("|", 4) + ["", "", "", ""])[2:5]
    import torch_mpi_gpu
    if not torch_mpi_gpu._C.with_cuda():
        assert (path, reduce_path) == ("via-cpu", "via-cpu"), out
        return
    if reduce == "auto" and "Open MPI" not in torch_mpi_gpu.info()["mpi_library"]:
        expect = ("cuda-direct", "cuda-direct")
    assert (path, reduce_path) == expect, out
    assert reason, out


MPICH_5 = ("MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25 20:45:26 UTC 2026\n"
           "MPICH Device:       {device}\nMPICH configure:    --with-device={device}\n")


@pytest.mark.parametrize("device, variable, expect", [
    ("ch4:ucx ofi", "", "ucx"), ("ch4:ucx ofi", "ofi", "ofi"), ("ch4:ofi", "", "ofi"),
    ("ch4:ofi ucx", "UCX", "ucx"), ("ch3:nemesis", "", ""), (None, "", "")])
def test_any_source_auto_reads_the_mpich_netmod(device, variable, expect):
    # TORCH_MPIGPU_ANY_SOURCE_RECV=auto probes on MPICH's ucx netmod: the first netmod the
    # library was built with, unless MPIR_CVAR_CH4_NETMOD picks another; not MPICH: none
    from torch_mpi_gpu import _C
    text = MPICH_5.format(device=device) if device else "Open MPI v5.0.11, package: Open MPI"
    assert _C._mpich_netmod(text, variable) == expect
