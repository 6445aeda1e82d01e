"""The docs and the checkout as a reader meets them: every shell command in README.md and docs/ is
marked (run, needs=..., illustration), the settings tables are the generated ones in tiers, and
`import torch_mpi_gpu` from the repository root either works (an in-place build) or says in one
sentence what to do. scripts/doc_commands.py runs the runnable commands themselves (a step of
scripts/test.sh). Every relative link of README.md and docs/ resolves, and our code calls torch's
current collective names."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def run(args, cwd, timeout=120):
    proc = subprocess.run(args, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def test_every_shell_block_of_the_docs_is_marked_and_every_example_is_run():
    code, out = run([sys.executable, str(ROOT / "scripts" / "doc_commands.py"), "--list"], ROOT)
    assert code == 0, out
    assert "doc commands: " in out and " runnable" in out, out
    runnable = int(out.split("doc commands: ")[1].split()[0])
    assert runnable >= 3, out  # the README's own: run_main.sh, the install, the launcher helper


def test_an_unmarked_shell_block_fails_the_check(tmp_path):
    # the checker itself, on a copy of the repository's shape with one unmarked block
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "doc_commands.py", tmp_path / "scripts")
    (tmp_path / "docs").mkdir()
    (tmp_path / "examples").mkdir()
    (tmp_path / "README.md").write_text("# x\n\n```bash run\ntrue\n```\n")
    (tmp_path / "docs" / "a.md").write_text("```bash\nls\n```\n\n```sh needs=moon\nls\n```\n")
    code, out = run([sys.executable, "scripts/doc_commands.py", "--list"], tmp_path)
    assert code == 1, out
    assert "docs/a.md:1: shell block marked 'nothing'" in out, out
    assert "docs/a.md:5: shell block marked 'needs=moon'" in out, out
    # an example no block runs is named too
    (tmp_path / "docs" / "a.md").write_text("")
    (tmp_path / "examples" / "lonely.py").write_text("")
    code, out = run([sys.executable, "scripts/doc_commands.py", "--list"], tmp_path)
    assert code == 1 and "examples/lonely.py is run by no" in out, out
    # and a failing runnable block fails the run, with its output
    (tmp_path / "examples" / "lonely.py").unlink()
    (tmp_path / "README.md").write_text("```bash run\necho before; false\n```\n")
    code, out = run([sys.executable, "scripts/doc_commands.py"], tmp_path)
    assert code == 1 and "FAILED README.md:1" in out and "before" in out, out


def test_settings_tables_in_the_docs_are_the_generated_ones():
    code, out = run([sys.executable, str(ROOT / "scripts" / "settings_docs.py"), "--check"], ROOT)
    assert code == 0, out


def test_settings_come_in_tiers():
    from torch_mpi_gpu import config

    tiers = {s.name: s.tier for s in config.SETTINGS}
    assert set(tiers.values()) <= set(config.TIERS), tiers
    user = [name for name, tier in tiers.items() if tier == "user"]
    assert 0 < len(user) <= 12, user  # a short table a user reads first
    for name, tier in tiers.items():  # test hooks carry their own prefix, and only they do
        assert (tier == "test") == name.startswith("TORCH_MPIGPU_TEST_"), (name, tier)
    for s in config.of_tier("tuning"):  # every tuning default says what set it
        assert s.basis.strip(), f"{s.name}: no basis for its default in csrc/core/Settings.cpp"
    settings_md = (ROOT / "docs" / "settings.md").read_text()
    for s in config.of_tier("test"):
        assert s.name not in settings_md, f"{s.name}: test-only settings belong in docs/testing.md"
    with pytest.raises(ValueError, match="unknown settings tier"):
        config.of_tier("everything")


def unbuilt_checkout(tmp_path):
    """A copy of the checkout's Python package with setup.py beside it, and no extension."""
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "torch_mpi_gpu", checkout / "torch_mpi_gpu",
                    ignore=shutil.ignore_patterns("_C.*", "_build_info.json", "__pycache__"))
    shutil.copy(ROOT / "setup.py", checkout / "setup.py")
    return checkout


def test_an_unbuilt_checkout_says_in_one_sentence_what_to_do(tmp_path):
    checkout = unbuilt_checkout(tmp_path)
    for args in ([sys.executable, "-c", "import torch_mpi_gpu"],
                 [sys.executable, "-m", "torch_mpi_gpu.info"]):
        code, out = run(args, checkout)
        assert code != 0, out
        message = out.strip().splitlines()[-1]
        assert message.startswith("ImportError: torch_mpi_gpu: "), out
        assert f"{checkout / 'torch_mpi_gpu'} is a source checkout without its built extension" \
            in message, out
        assert "pip install --no-build-isolation -e" in message and "run from outside" in message
        assert "circular import" not in out, out


def in_place_build_of_this_python():
    import torch_mpi_gpu
    return Path(torch_mpi_gpu.__file__).resolve().parent == ROOT / "torch_mpi_gpu"


def test_the_readmes_commands_work_from_the_repository_root():
    """After the README's setup (an in-place build), from the repository root."""
    if not in_place_build_of_this_python():
        pytest.skip("this leg's venv has an ordinary install (scripts/test.sh builds in place only "
                    "in the CPU leg's venv); the unbuilt case is the test above")
    code, out = run([sys.executable, "-c", "import torch_mpi_gpu; print(torch_mpi_gpu.__file__)"],
                    ROOT)
    assert code == 0 and str(ROOT / "torch_mpi_gpu") in out, out
    code, out = run([sys.executable, "-m", "torch_mpi_gpu.info"], ROOT)
    assert code == 0, out
    lines = out.splitlines()
    assert lines[1].startswith("MPI ") and lines[2].startswith("CUDA-aware ") \
        and lines[3].startswith("launcher "), out  # what a user asks first, first
    assert "user settings" in out and "tuning settings" not in out, out
    code, out = run([sys.executable, "-m", "torch_mpi_gpu.info", "--all"], ROOT)
    assert code == 0 and "tuning settings" in out and "TORCH_MPIGPU_TEST_PRETEND_NODES" in out, out
    launch = ENV.copy()
    if os.geteuid() == 0:
        launch.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = subprocess.run([sys.executable, "-m", "torch_mpi_gpu.mpirun", "-np", "2",
                           "examples/ensembles.py", "--steps", "3"], cwd=ROOT, env=launch,
                          capture_output=True, text=True, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and out.count("parameters equal to its single-process") == 2, out


def github_anchor(heading):
    """The anchor GitHub gives a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_readme_and_docs_links_resolve():
    # every relative link of README.md and docs/*.md names a file of the repository, and its
    # #anchor a heading of that file; the README stays short (the rest lives in docs/)
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert len((ROOT / "README.md").read_bytes()) <= 12 * 1024
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor:
                headings = re.findall(r"^#+ (.*)$", dest.read_text(), re.M)
                if anchor not in {github_anchor(h) for h in headings}:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
    linked = set(re.findall(r"\(docs/([\w-]+\.md)", (ROOT / "README.md").read_text()))
    assert linked == {p.name for p in pages[1:]}, f"docs/ pages the README does not list: {linked}"


def test_our_code_calls_torchs_current_collective_names():
    # torch 2.13 deprecates all_gather_into_tensor / reduce_scatter_tensor for all_gather_single /
    # reduce_scatter_single: the package, benchmarks and examples call the new names (bench.py
    # falls back to the old ones on older torch); tests/mp/collectives.py tests both spellings
    old = re.compile(r"dist\.(all_gather_into_tensor|reduce_scatter_tensor)\(")
    files = [*(ROOT / "torch_mpi_gpu").glob("*.py"), *(ROOT / "benchmarks").glob("*.py"),
             *(ROOT / "examples").glob("*.py")]
    calls = [f"{f.relative_to(ROOT)}: {m.group(0)}" for f in files for m in old.finditer(f.read_text())]
    assert not calls, calls


def test_docs_state_the_present_and_stay_short():
    # docs/ reads as a reference, not a diary: at most 80 KB in all and 20 KB a page, the README
    # at most 12 KB, and no dates outside the links to result folders (their names carry them)
    pages = sorted((ROOT / "docs").glob("*.md"))
    sizes = {p.name: len(p.read_bytes()) for p in pages}
    assert sum(sizes.values()) <= 80_000, sizes
    assert max(sizes.values()) <= 20_000, sizes
    dated = []
    for page in [ROOT / "README.md", *pages]:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            text = re.sub(r"\]\([^)]*\)", "]()", line)  # link targets may name dated folders
            if re.search(r"\b20\d\d-\d\d-\d\d\b|\b20\d\d-\d\d\b", text):
                dated.append(f"{page.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not dated, "dated sentences:\n" + "\n".join(dated)
