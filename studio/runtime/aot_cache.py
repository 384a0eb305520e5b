"""Compiled torch engines that persist on disk: AOTInductor packages, keyed and verified.

``torch.compile`` rebuilds its graphs in every new process (Dynamo traces again, Inductor
looks its kernels up), so a fresh `studio render --compile` pays tens of seconds before its
first frame. An AOTInductor package is the compiled network itself: exported once
(``torch.export``), compiled to a shared library (``aoti_compile_and_package``), then loaded
by a later process in well under a second, as a TensorRT engine is.

Each package ``<cache>/aot/<network>-<precision>-b<batch>-<key digest>.pt2`` has a JSON
beside it with its :class:`AotKey` (the SHA-256 of the network's weights and that of its code,
:mod:`studio.runtime.network_digest`; precision and policy, batch, device and compute
capability, torch and CUDA versions) and the package's own SHA-256.
:func:`load` checks both before loading: a stale or corrupted package is not loaded and the
reason is said; :func:`build` writes a new one atomically under the package's file lock, so
two processes build it once.

Two things seen on an H100 (torch 2.11) shape the recipe. An operator without an AOTInductor
C shim runs through the package's proxy executor, and such a package crashed the process that
loaded it (a segmentation fault, nothing to catch); so a build that needs the proxy executor
is refused (:class:`NotPackageable`), and every new package is loaded and run once in a
separate process before it is kept. The warp network's 3-D grid sampling, the one such
operator the render networks had, is exported as gathers instead
(:mod:`studio.runtime.grid_gather`). And a
package's runner cannot be captured into a CUDA graph ("operation not permitted when stream
is capturing"), so its engine runs it as it is (its kernels are launched from C++).

Where no package loads (:func:`packages_usable`: a probe package fails in a new process, as
on torch 2.11 with CUDA 13 on every GPU lent here, or ``$STUDIO_COMPILED_FORMAT`` is
``artifact``), the engine keeps Inductor's standalone artifacts instead
(:mod:`studio.runtime.aot_artifacts`), checked and built by the same helpers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from studio.files import write_atomic
from studio.paths import build_lock
from studio.runtime.engine_cache import file_sha256
from studio.runtime.grid_gather import GatheredGridSample
from studio.runtime.network_digest import code_sha256, weights_sha256

AOT_FORMAT = 4  # bump when the build recipe changes what a package contains (4: output-checked)
PROXY_EXECUTOR_SIGN = "missing a c-shim implementation"  # torch._inductor.ir's warning
VERIFY_TIMEOUT_S = 600
FORMAT_ENV = "STUDIO_COMPILED_FORMAT"  # "artifact": Inductor's artifacts, never packages
NO_PACKAGES = "this torch cannot load compiled packages here"
_log = logging.getLogger(__name__)


# why a compiled runner does not compute its network's outputs (None: it does); given by the
# engine, which knows the precision's tolerance
Check = Callable[[Callable[..., Any]], str | None]
R = TypeVar("R")  # what a compiled file loads as (a package's runner, a bound artifact)


def _device_facts(device: torch.device) -> tuple[str, str, str | None]:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        return torch.cuda.get_device_name(index), f"{major}.{minor}", torch.version.cuda
    import platform

    return platform.machine() or "cpu", "cpu", None


@dataclass(frozen=True)
class AotKey:
    """What a package was compiled for and from; equal keys mean it can be loaded."""

    network: str
    weights_sha256: str
    precision: str
    policy: str  # the precision adapter's mode, and any layout choice
    batch: int
    device_name: str
    capability: str
    torch_version: str
    cuda_version: str | None
    code_sha256: str = ""  # the network's source (studio.runtime.network_digest)
    format: int = AOT_FORMAT

    @classmethod
    def of(
        cls,
        network: str,
        module: nn.Module,
        precision: str,
        policy: str,
        batch: int,
        device: torch.device,
    ) -> AotKey:
        name, cap, cuda = _device_facts(torch.device(device))
        return cls(
            network,
            weights_sha256(module),
            precision,
            policy,
            int(batch),
            name,
            cap,
            torch.__version__,
            cuda,
            code_sha256(module),
        )

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()


def package_file(cache_dir: str | os.PathLike[str], key: AotKey) -> Path:
    """Where ``key``'s package lives."""
    return Path(cache_dir) / f"{key.network}-{key.precision}-b{key.batch}-{key.digest()[:16]}.pt2"


def _meta(package: Path) -> Path:
    return package.with_name(package.name + ".json")


def stale_reasons(recorded: dict[str, Any], wanted: AotKey) -> list[str]:
    """Why a package recorded with ``recorded`` (its key's dict) cannot serve ``wanted``."""
    want = asdict(wanted)
    return [f"{k} {recorded.get(k)!r} -> {v!r}" for k, v in want.items() if recorded.get(k) != v]


def checked_meta(path: Path, key: AotKey, absent: str) -> tuple[dict[str, Any] | None, str]:
    """The metadata kept beside a compiled file made for ``key`` (None, why not: ``absent``,
    unreadable, stale, or the file corrupt)."""
    if not path.is_file():
        return None, absent
    try:
        meta = json.loads(_meta(path).read_text())
        recorded, sha = dict(meta["key"]), str(meta["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return None, f"{path.name}: its metadata is missing or unreadable"
    reasons = stale_reasons(recorded, key)
    if reasons:
        return None, f"{path.name} is stale ({'; '.join(reasons)})"
    if file_sha256(path) != sha:
        return None, f"{path.name} is corrupt (its SHA-256 is not the one recorded)"
    return meta, ""


def load(cache_dir: str | os.PathLike[str], key: AotKey) -> tuple[Callable | None, str]:
    """(the loaded package, "loaded"), or (None, why not: absent, stale, corrupt)."""
    package = package_file(cache_dir, key)
    meta, why = checked_meta(package, key, "no compiled package yet")
    if meta is None:
        return None, why
    try:
        runner = torch._inductor.aoti_load_package(str(package))
    except Exception as e:  # noqa: BLE001 - a package that does not load is rebuilt
        return None, f"{package.name} does not load ({type(e).__name__}: {e})"
    return runner, "loaded"


class NotPackageable(RuntimeError):
    """The network needs AOTInductor's proxy executor (an operator without a C shim)."""


class TransientFailure(RuntimeError):
    """A build that failed for now (out of memory, out of time): tried again next time."""


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _compile_package(exported: Any, path: Path, network: str) -> None:
    """AOTInductor-compile ``exported`` into ``path``; NotPackageable where an operator
    would run through the proxy executor."""
    collect = _Collect()
    logger = logging.getLogger("torch._inductor.ir")
    logger.addHandler(collect)
    try:
        torch._inductor.aoti_compile_and_package(exported, package_path=str(path))
    finally:
        logger.removeHandler(collect)
    proxied = sorted({line.split()[0] for line in collect.lines if PROXY_EXECUTOR_SIGN in line})
    if proxied:
        raise NotPackageable(
            f"{network}: {', '.join(proxied)} would run through AOTInductor's proxy executor "
            "(such packages crashed the process loading them, torch 2.11 on CUDA)"
        )


_VERIFY = """
import faulthandler, sys, torch
faulthandler.enable()
runner = torch._inductor.aoti_load_package(sys.argv[1])
runner(*torch.load(sys.argv[2]))
if torch.cuda.is_available():
    torch.cuda.synchronize()
"""


def _last_words(stderr: str) -> str:
    """A failed child's last line; for a crash, the fatal error and the innermost frame
    faulthandler printed (most recent call first)."""
    lines = [line.strip() for line in stderr.strip().splitlines()] or ["no message"]
    fatal = next((i for i, line in enumerate(lines) if line.startswith("Fatal Python")), None)
    if fatal is None:
        return lines[-1][:300]
    frame = next((line for line in lines[fatal:] if line.startswith("File ")), "")
    return f"{lines[fatal]} at {frame}"[:300]


def verify_elsewhere(
    path: Path, payload: object, network: str, script: str = _VERIFY, what: str = "package"
) -> None:
    """Load and run a compiled file once in a new process (``script`` with the file and
    ``payload`` saved by torch: by default a package and its example inputs): one that
    crashes it is not kept."""
    import subprocess
    import sys

    inputs = path.with_name(path.name + ".inputs.pt")
    try:
        torch.save(payload, inputs)
        try:
            r = subprocess.run(
                [sys.executable, "-c", script, str(path), str(inputs)],
                capture_output=True,
                text=True,
                timeout=VERIFY_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise TransientFailure(f"{network}: its {what} did not load and run in time") from None
    finally:
        inputs.unlink(missing_ok=True)
    if r.returncode != 0:
        last = _last_words(r.stderr)
        failure = TransientFailure if "out of memory" in r.stderr.lower() else RuntimeError
        raise failure(
            f"{network}: its {what} fails when a new process loads and runs it "
            f"(exit {r.returncode}: {last})"
        )


def _package_verified(
    module: nn.Module, example: tuple[torch.Tensor, ...], path: Path, network: str
) -> None:
    """Export ``module`` on ``example`` (3-D grid sampling as gathers), compile it into
    ``path`` and load and run it in a new process: raises where any step fails."""
    with torch.no_grad(), GatheredGridSample():
        exported = torch.export.export(module, example)
        _compile_package(exported, path, network)
    verify_elsewhere(path, tuple(t.detach() for t in example), network)


def refuse_wrong(runner: Callable[..., Any], check: Check | None, network: str, what: str) -> None:
    """RuntimeError where ``check`` finds that a new compiled ``runner`` computes something
    else than its network: checked once, when built, so a kept file is loaded as it is."""
    problem = None if check is None else check(runner)
    if problem:
        raise RuntimeError(f"{network}: its {what} {problem}")


def build(
    cache_dir: str | os.PathLike[str],
    key: AotKey,
    module: nn.Module,
    example: tuple[torch.Tensor, ...],
    check: Check | None = None,
) -> tuple[Callable, bool]:
    """Export ``module`` on ``example`` and compile it into ``key``'s package (atomically,
    under the package's build lock); the loaded package, and whether this call built it
    (else another process finished it meanwhile, which is kept).
    NotPackageable where it needs the proxy executor; RuntimeError where a new process cannot
    load and run it, or where ``check`` refuses its outputs (none is kept)."""

    def make(partial: Path) -> tuple[dict[str, Any], Callable]:
        _package_verified(module, example, partial, key.network)
        runner = torch._inductor.aoti_load_package(str(partial))  # safe: it ran elsewhere
        refuse_wrong(runner, check, key.network, "compiled package")
        return {}, runner

    return build_file(package_file(cache_dir, key), key, lambda: load(cache_dir, key)[0], make)


def build_file(
    path: Path,
    key: AotKey,
    present: Callable[[], R | None],
    make: Callable[[Path], tuple[dict[str, Any], R]],
) -> tuple[R, bool]:
    """Write a compiled file for ``key`` at ``path`` once, under its build lock: the file's
    loaded runner, and whether this call wrote it. ``present()`` is the runner of a file
    another process finished meanwhile (kept), or None; else ``make(partial)`` writes it to
    a hidden file and returns what else its metadata keeps and the runner it loaded (and
    checked) from it, so it is loaded once; the file is then put in place atomically with
    its metadata (the key and the file's SHA-256)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(path, f"the compiled {key.network} (batch {key.batch})"):
        there = present()
        if there is not None:
            return there, False
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial{path.suffix}")
        try:
            extra, runner = make(partial)
            sha = file_sha256(partial)
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
        meta = {"key": asdict(key), "sha256": sha, **extra}
        write_atomic(_meta(path), json.dumps(meta, indent=1))
    return runner, True


def _device_of(example: tuple[torch.Tensor, ...]) -> torch.device:
    return next((t.device for t in example if isinstance(t, torch.Tensor)), torch.device("cpu"))


def failed_file(path: Path) -> Path:
    """Where a compiled file's failure to build is remembered."""
    return path.with_name(path.name + ".failed.json")


class _Probe(nn.Module):
    """The smallest package worth building: does this torch load packages at all?"""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def _probe_facts(device: torch.device | str) -> dict[str, Any]:
    name, cap, cuda = _device_facts(torch.device(device))
    return {
        "device_name": name,
        "capability": cap,
        "torch": torch.__version__,
        "cuda": cuda,
        "format": AOT_FORMAT,
    }


def probe_file(cache_dir: str | os.PathLike[str], device: torch.device | str) -> Path:
    """Where :func:`packages_load_here` keeps its answer for ``device``'s kind and this torch."""
    return _probe_path(cache_dir, _probe_facts(device))


def _probe_path(cache_dir: str | os.PathLike[str], facts: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir) / f"probe-{digest}.json"


def packages_load_here(cache_dir: str | os.PathLike[str], device: torch.device) -> tuple[bool, str]:
    """Whether a new process can load and run a package built here: found once per device
    kind and torch (a tiny package built and verified, the answer kept in
    ``<cache>/probe-<digest>.json``), before minutes go into the render networks' packages.
    On the H100 and H200 machines with torch 2.11+cu130 every CUDA package, a single linear
    layer's too, crashed the process loading it."""
    facts = _probe_facts(device)
    answer = _probe_path(cache_dir, facts)
    answer.parent.mkdir(parents=True, exist_ok=True)
    with build_lock(answer, "the compiled-package probe"):
        try:
            kept = json.loads(answer.read_text())
            return bool(kept["ok"]), str(kept["why"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        with torch.random.fork_rng(devices=[]):  # the caller's random numbers stay its own
            probe = _Probe().to(device).eval()
            example = (torch.randn(4, 8).to(device),)
        partial = answer.with_name(f".{answer.stem}.{os.getpid()}.pt2")
        try:
            _package_verified(probe, example, partial, "a one-layer probe")
            ok, why = True, "a probe package loads in a new process"
        except Exception as e:  # noqa: BLE001 - any failure means: no packages here
            ok, why = False, f"{type(e).__name__}: {e}"
        finally:
            partial.unlink(missing_ok=True)
        write_atomic(answer, json.dumps({**facts, "ok": ok, "why": why[:2000]}, indent=1))
    return ok, why


def load_or_build(
    cache_dir: str | os.PathLike[str],
    key: AotKey,
    module: nn.Module,
    example: tuple[torch.Tensor, ...],
    build_missing: bool = True,
    check: Check | None = None,
) -> tuple[Callable | None, str]:
    """The package of ``key``: loaded; else (``build_missing``) built (its outputs checked
    by ``check``), saying why, and loaded; else (None, why not). A network that failed to
    export or compile for this key, or whose package computed something else, is remembered
    (``<package>.failed.json``), so later processes do not try again."""
    runner, why = load(cache_dir, key)
    if runner is not None or not build_missing:
        return runner, why

    def usable() -> str | None:
        loads, probed = packages_usable(cache_dir, key, _device_of(example))
        return None if loads else f"{NO_PACKAGES} ({probed})"

    return build_then_load(
        package_file(cache_dir, key),
        key,
        why,
        "no compiled package yet",
        lambda: build(cache_dir, key, module, example, check),
        usable,
    )


def packages_usable(
    cache_dir: str | os.PathLike[str], key: AotKey, device: torch.device
) -> tuple[bool, str]:
    """Whether to keep ``key``'s compiled engine as a package here: not where
    ``$STUDIO_COMPILED_FORMAT`` is ``artifact``; on a GPU, where a probe package loads
    (:func:`packages_load_here`)."""
    if os.environ.get(FORMAT_ENV) == "artifact":
        return False, f"{FORMAT_ENV}=artifact"
    if key.capability == "cpu":
        return True, "packages load on the CPU"
    return packages_load_here(cache_dir, device)


def build_then_load(
    path: Path,
    key: AotKey,
    why: str,
    absent: str,
    build_it: Callable[[], tuple[R, bool]],
    usable: Callable[[], str | None] = lambda: None,
) -> tuple[R | None, str]:
    """A compiled file that did not load (``why``) built, as ``build_it`` loaded it: (runner,
    "built"; or "loaded" where another process built it meanwhile), or (None, why not: it
    failed before, or ``usable()`` says why not here). A failed build is remembered beside
    it (``<file>.failed.json``), so later processes do not try again; one out of memory or
    time (:class:`TransientFailure`) is not."""
    failed = failed_file(path)
    if failed.is_file():
        return None, f"it failed to compile ahead of time before ({failed.name})"
    refused = usable()
    if refused:
        return None, refused
    if why != absent:
        _log.warning("%s: compiling it again", why)
    try:
        runner, made = build_it()
    except Exception as e:
        if not isinstance(e, TransientFailure | torch.cuda.OutOfMemoryError):
            reason = f"{type(e).__name__}: {e}"
            failure = json.dumps({"key": asdict(key), "error": reason[:2000]}, indent=1)
            write_atomic(failed, failure)
        raise
    return runner, "built" if made else "loaded"
