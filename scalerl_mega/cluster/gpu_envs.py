"""The two GPU environments (docs/cluster_install.md): one NCCL for both, checked at launch and at install.

The trainer env holds this project (torch 2.13.0..2.14.1, transformers 5.23.0..5.24.0, megatron-core
0.16.1..0.19.2, TransformerEngine); the generator env holds SGLang 0.5.23 with its own exact pins (its wheel
METADATA: `torch==2.14.1`, `transformers==5.19.0`), so the two cannot share one interpreter. Weights travel
between them over an NCCL group (weight_sync.py), and NCCL refuses communicators whose ranks run different
NCCL versions (at init: "Mismatched NCCL version detected", ncclInvalidUsage), so the first weight push of a
run would fail. Both environments therefore install the same `nvidia-nccl-cu13` wheel: torch 2.14.1's pin
(NCCL_VERSION below), which the trainer's resolution picks too; a trainer on torch 2.13.0 (pins 2.29.7) is
overridden upwards (the NCCL library keeps its ABI across 2.x releases: an older-built torch runs on a newer
libnccl.so.2, not the reverse).

Two uses:

* `python -m scalerl_mega.cluster.gpu_envs nccl --trainer-python A --generator-python B`
  (slurm/common.sh, before any step): runs a probe in each interpreter (`torch.cuda.nccl.version()`, the
  library torch actually loaded; without a CUDA torch, the installed `nvidia-nccl-cu*` wheel's version
  from its metadata), prints both and exits 2 when they differ or cannot be read.
* `python -m scalerl_mega.cluster.gpu_envs resolve` (`make check-gpu-envs`): resolves both environments
  with pip's resolver against the package index for each of linux x86_64 and aarch64 (GB200's Grace hosts)
  and CPython 3.11 and 3.12 (`pip install --dry-run --ignore-installed --report`, binary wheels only; pip
  reads each wheel's metadata, not the wheel), one line per combination, and fails on any conflict, or when
  the NCCL of the two installs would differ.

Standard library only (the tool runs before any environment exists).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

NCCL_WHEEL = "nvidia-nccl-cu13"
NCCL_VERSION = "2.30.7"
"""The one NCCL of both environments: torch 2.14.1's (SGLang 0.5.23's) pin; torch 2.13.0 pins 2.29.7."""
SGLANG_REQUIREMENT = "sglang==0.5.23"
TE_VERSION = "2.20.2"
"""TransformerEngine for the trainer env (CUDA 13 core wheels, like torch 2.13.0's default build)."""
ARCHS = ("x86_64", "aarch64")
"""x86_64 nodes and GB200's Grace (aarch64) hosts."""
PYTHON_VERSIONS = ("3.11", "3.12")
"""The supported CPython versions (pyproject's requires-python)."""


def platforms(arch: str) -> list[str]:
    """glibc 2.17 .. 2.34 (sglang's wheel is manylinux_2_34): a node with glibc >= 2.34 installs them all."""
    return [f"manylinux_2_{minor}_{arch}" for minor in range(34, 16, -1)] + [f"manylinux2014_{arch}"]
# Pure-Python dependencies published as sdists only (hydra-core's parser runtime): built into a wheel
# here first (pip refuses sdists when resolving for another platform), the wheel then offered by --find-links.
SOURCE_ONLY = ("antlr4-python3-runtime==4.9.3",)
EXIT_MISMATCH = 2

# Runs inside each environment's interpreter (no scalerl_mega import: the generator env lacks it).
PROBE = r"""
import json, importlib.metadata as md
out = {"nccl": None, "source": None, "torch": None}
try:
    import torch
    out["torch"] = torch.__version__
    v = torch.cuda.nccl.version()
    out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    out["source"] = "torch.cuda.nccl.version()"
except Exception:
    pass
if out["nccl"] is None:
    for dist in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
        try:
            out["nccl"] = md.version(dist)
            out["source"] = dist + " wheel metadata"
            break
        except md.PackageNotFoundError:
            pass
print("SCALERL_NCCL " + json.dumps(out))
"""


# ----------------------------------------------------------------------------- launch-time check
@dataclass(frozen=True, kw_only=True)
class NcclReading:
    python: str
    nccl: str | None
    source: str | None
    torch: str | None = None

    def describe(self) -> str:
        where = f" via {self.source}" if self.source else ""
        torch = f", torch {self.torch}" if self.torch else ""
        return f"{self.nccl or 'unknown'}{where}{torch} ({self.python})"


def probe(python: str, *, timeout_s: float = 300.0) -> NcclReading:
    """The NCCL version `python`'s environment would load (see PROBE)."""
    try:
        r = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return NcclReading(python=python, nccl=None, source=f"probe failed: {exc}")
    for line in r.stdout.splitlines():
        if line.startswith("SCALERL_NCCL "):
            data = json.loads(line.split(" ", 1)[1])
            return NcclReading(python=python, nccl=data["nccl"], source=data["source"], torch=data["torch"])
    tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
    return NcclReading(python=python, nccl=None, source=f"probe exited {r.returncode}: {tail}")


def nccl_problem(trainer: NcclReading, generator: NcclReading) -> str | None:
    """None when both environments load the same NCCL, else the one-line reason."""
    for role, key, reading in (("trainer", "SCALERL_PYTHON", trainer), ("generator", "SGLANG_PYTHON", generator)):
        if reading.nccl is None:
            return (f"cannot read the NCCL version of the {role} env ({key}={reading.python}: {reading.source}); "
                    f"install {NCCL_WHEEL}=={NCCL_VERSION} there (docs/cluster_install.md)")
    if trainer.nccl != generator.nccl:
        return (f"NCCL differs between the trainer env (SCALERL_PYTHON, {trainer.describe()}) and the generator env "
                f"(SGLANG_PYTHON, {generator.describe()}): NCCL refuses mismatched versions at communicator init, "
                f"so the first weight push would fail. Install the same wheel in both: pip install --no-deps "
                f"{NCCL_WHEEL}=={NCCL_VERSION} (docs/cluster_install.md)")
    return None


def check_nccl(trainer_python: str, generator_python: str, *, probe_fn=probe, out=sys.stdout) -> int:
    trainer, generator = probe_fn(trainer_python), probe_fn(generator_python)
    print(f"NCCL trainer env: {trainer.describe()}", file=out)
    print(f"NCCL generator env: {generator.describe()}", file=out)
    problem = nccl_problem(trainer, generator)
    if problem:
        print(f"NCCL check: {problem}", file=sys.stderr)
        return EXIT_MISMATCH
    return 0


# ----------------------------------------------------------------------------- install-time resolution
def project_requirements(pyproject: Path) -> tuple[list[str], list[str]]:
    """(dependencies, the `gpu` extra) of the project."""
    import tomllib

    project = tomllib.loads(pyproject.read_text())["project"]
    return list(project["dependencies"]), list(project["optional-dependencies"]["gpu"])


def _index_url() -> str:
    return os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")


def te_torch_requirements(version: str = TE_VERSION) -> list[str]:
    """Runtime requirements of TransformerEngine's PyTorch extension, read from its sdist's PKG-INFO.

    `transformer_engine_torch` is published as an sdist only, and its build needs torch and CUDA; pip
    would build it (downloading torch into a build env) just to read its metadata. So the resolution
    takes the requirements its sdist declares, and the install builds it afterwards in the trainer env
    (`pip install --no-build-isolation transformer_engine_torch==V`, docs/cluster_install.md)."""
    name = "transformer-engine-torch"
    req = urllib.request.Request(f"{_index_url()}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        files = json.load(resp)["files"]
    fname = f"transformer_engine_torch-{version}.tar.gz"
    url = next((f["url"] for f in files if f["filename"] == fname), None)
    if url is None:
        raise SystemExit(f"check-gpu-envs: {fname} is not on the index {_index_url()}")
    with urllib.request.urlopen(url, timeout=300) as resp:
        data = resp.read()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        member = next(m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO"))
        text = tar.extractfile(member).read().decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def trainer_requirements(pyproject: Path, *, te_requires: list[str]) -> list[str]:
    """The trainer env: the project with its `gpu` extra, TransformerEngine's CUDA-13 core wheel and its
    PyTorch extension's runtime requirements in place of the source-only extension."""
    deps, gpu = project_requirements(pyproject)
    if any(r.replace(" ", "").startswith("sglang") for r in gpu):
        raise SystemExit("check-gpu-envs: the `gpu` extra must not contain sglang (it has its own env)")
    te = [r for r in gpu if r.replace(" ", "").startswith("transformer-engine")]
    rest = [r for r in gpu if r not in te]
    return [*deps, *rest, f"transformer-engine[core-cu13]=={TE_VERSION}", *te_requires]


def _pip_env() -> dict[str, str]:
    """pip's environment for the resolution: no pip config files, find-links, extra indexes or constraints
    (a machine's local wheels, e.g. a CPU torch build, would stand in for the index's); PIP_INDEX_URL and
    the certificate settings are kept."""
    drop = ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT", "PIP_NO_INDEX", "PIP_REQUIREMENT")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def pip_resolve(requirements: list[str], *, label: str, python: str = sys.executable, fast_deps: bool = False,
                workdir: Path, arch: str = "x86_64", python_version: str = "3.11") -> dict[str, str]:
    """{canonical name: version} that pip's resolver would install for linux `arch` / CPython
    `python_version` (binary wheels only); SystemExit naming the environment and pip's error on a conflict."""
    report = workdir / f"{label}.json"
    abi = "cp" + python_version.replace(".", "")
    cmd = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
           "--target", str(workdir / f"{label}-target"), "--only-binary=:all:", "--python-version", python_version,
           "--implementation", "cp", "--abi", abi, "--abi", "abi3", "--abi", "none"]
    for plat in platforms(arch):
        cmd += ["--platform", plat]
    wheels = workdir / "sdist-wheels"
    if not wheels.exists():
        r = subprocess.run([python, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), *SOURCE_ONLY],
                           capture_output=True, text=True, env=_pip_env())
        if r.returncode != 0:
            raise SystemExit(f"check-gpu-envs: cannot build {SOURCE_ONLY}: {r.stderr.strip()[-500:]}")
    cmd += ["--find-links", str(wheels)]
    if fast_deps:
        cmd.append("--use-feature=fast-deps")
    r = subprocess.run([*cmd, *requirements], capture_output=True, text=True, env=_pip_env())
    if r.returncode != 0:
        err = "\n".join([x for x in r.stderr.strip().splitlines() if not x.startswith("WARNING")][-15:])
        raise SystemExit(f"check-gpu-envs: the {label} environment ({arch}, CPython {python_version}) does not "
                         f"resolve:\n{err}")
    installs = json.loads(report.read_text())["install"]
    got = {_canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}
    local = {k: v for k, v in got.items() if "+" in v}
    if local:  # e.g. torch 2.13.0+cpu: a local build, not the index's CUDA wheel
        raise SystemExit(f"check-gpu-envs: the {label} environment resolves local builds {local}")
    return got


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def nccl_plan(trainer: dict[str, str], generator: dict[str, str]) -> tuple[list[str], list[str]]:
    """(lines to print, problems) for the NCCL wheels of two resolutions, after the documented
    override (`pip install --no-deps nvidia-nccl-cu13==NCCL_VERSION` in the trainer env)."""
    lines, problems = [], []
    wheels = {"trainer": {k: v for k, v in trainer.items() if k.startswith("nvidia-nccl-")},
              "generator": {k: v for k, v in generator.items() if k.startswith("nvidia-nccl-")}}
    for env, found in wheels.items():
        lines.append(f"{env} resolution: " + (", ".join(f"{k}=={v}" for k, v in sorted(found.items())) or "no NCCL wheel"))
        others = sorted(set(found) - {NCCL_WHEEL})
        if others:
            problems.append(f"{env} env resolves another NCCL build too ({', '.join(others)}): two libnccl in one env")
        if NCCL_WHEEL not in found:
            problems.append(f"{env} env resolves no {NCCL_WHEEL}")
    gen = wheels["generator"].get(NCCL_WHEEL)
    if gen is not None and gen != NCCL_VERSION:
        problems.append(f"the generator env resolves {NCCL_WHEEL}=={gen}, but both envs are to install "
                        f"{NCCL_VERSION} (gpu_envs.NCCL_VERSION): update the pin and docs/cluster_install.md")
    tr = wheels["trainer"].get(NCCL_WHEEL)
    if tr is not None and _version_key(tr) > _version_key(NCCL_VERSION):
        problems.append(f"the trainer env resolves {NCCL_WHEEL}=={tr}, newer than the shared {NCCL_VERSION}: "
                        "overriding downwards would run torch on an older NCCL than it was built with")
    if tr is not None and gen is not None:
        lines.append(f"after the override both envs install {NCCL_WHEEL}=={NCCL_VERSION}"
                     + (f" (trainer's torch pins {tr}; overridden upwards)" if tr != NCCL_VERSION else ""))
    return lines, problems


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:4])


def resolve_combination(reqs: list[str], *, arch: str, python_version: str, pip_python: str, fast_deps: bool,
                        workdir: Path) -> tuple[str, list[str]]:
    """(the combination's one line, its problems): both environments resolved for linux `arch` / CPython
    `python_version`; a conflict is a problem (reported with pip's error), not an exit."""
    tag = f"linux {arch} CPython {python_version}"
    envs: dict[str, dict[str, str]] = {}
    for label, requirements in (("trainer", reqs), ("generator", [SGLANG_REQUIREMENT])):
        try:
            envs[label] = pip_resolve(requirements, label=f"{label}-{arch}-{python_version}", python=pip_python,
                                      fast_deps=fast_deps, workdir=workdir, arch=arch, python_version=python_version)
        except SystemExit as exc:
            return f"{tag}: FAILED ({label} env does not resolve)", [str(exc)]
    trainer, generator = envs["trainer"], envs["generator"]
    _, problems = nccl_plan(trainer, generator)
    line = (f"{tag}: trainer {len(trainer)} packages (torch {trainer.get('torch')}, megatron-core "
            f"{trainer.get('megatron-core')}, transformers {trainer.get('transformers')}, {NCCL_WHEEL} "
            f"{trainer.get(NCCL_WHEEL)}); generator {len(generator)} packages (sglang {generator.get('sglang')}, "
            f"torch {generator.get('torch')}, {NCCL_WHEEL} {generator.get(NCCL_WHEEL)}): "
            f"{'FAILED' if problems else 'OK'}")
    return line, [f"{tag}: {p}" for p in problems]


def resolve_main(args) -> int:
    t0 = time.monotonic()
    repo = Path(args.repo)
    all_problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="check-gpu-envs-") as tmp:
        work = Path(tmp)
        te = te_torch_requirements()
        print(f"trainer env: project + gpu extra + transformer-engine[core-cu13]=={TE_VERSION}; "
              f"transformer_engine_torch {TE_VERSION} (sdist) requires {te}; generator env: {SGLANG_REQUIREMENT}; "
              f"after the override both envs install {NCCL_WHEEL}=={NCCL_VERSION}", flush=True)
        reqs = trainer_requirements(repo / "pyproject.toml", te_requires=te)
        for arch in args.arch or ARCHS:
            for python_version in args.python or PYTHON_VERSIONS:
                line, problems = resolve_combination(reqs, arch=arch, python_version=python_version,
                                                     pip_python=args.pip_python, fast_deps=args.fast_deps,
                                                     workdir=work)
                print(line, flush=True)
                all_problems += problems
    for p in all_problems:
        print(f"check-gpu-envs: {p}", file=sys.stderr)
    print(f"check-gpu-envs: {'FAILED' if all_problems else 'OK'} in {time.monotonic() - t0:.0f} s")
    return 1 if all_problems else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scalerl_mega.cluster.gpu_envs", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    n = sub.add_parser("nccl", help="refuse a launch whose two environments load different NCCL versions")
    n.add_argument("--trainer-python", required=True)
    n.add_argument("--generator-python", required=True)
    r = sub.add_parser("resolve", help="resolve both GPU environments against the package index")
    r.add_argument("--repo", default=str(Path(__file__).resolve().parents[2]))
    r.add_argument("--pip-python", default=sys.executable, help="interpreter whose pip (>= 23) resolves")
    r.add_argument("--arch", action="append", choices=ARCHS, help=f"only this architecture (default: {ARCHS})")
    r.add_argument("--python", action="append", choices=PYTHON_VERSIONS,
                   help=f"only this CPython version (default: {PYTHON_VERSIONS})")
    r.add_argument("--no-fast-deps", dest="fast_deps", action="store_false",
                   help="do not fall back to HTTP range requests where the index serves no PEP 658 metadata")
    args = ap.parse_args(argv)
    if args.cmd == "nccl":
        return check_nccl(args.trainer_python, args.generator_python)
    return resolve_main(args)


if __name__ == "__main__":
    sys.exit(main())
