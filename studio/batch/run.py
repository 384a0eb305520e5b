"""Running a batch: every job's MP4, one warm engine per avatar, failures recorded, not fatal.

Jobs are grouped by what opens an engine (the engine, its avatar); each group opens its
engine once and every job of it renders with ``engine.with_settings`` (the same networks and
avatar) and a renderer kept while its settings allow. A job's output is written atomically
(:func:`studio.render.pipeline.start_video`, its file finished beside the next job's
render); whatever goes wrong with one job (a missing or corrupt file, an avatar without a
face, an engine error) is recorded as its one-line error and the batch goes on.
:class:`~studio.batch.state.BatchState` is updated after every job, so a rerun skips what is
done. :func:`run_in_turn` is what a Ray actor runs as well.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from studio.batch.jobs import Job
from studio.batch.state import REPORT_FILE, BatchState
from studio.engines.base import EngineRequest, Progress
from studio.errors import Cancelled, OptionError, StudioError
from studio.export.video import is_partial_of, written_path
from studio.files import write_json

REPORT_FORMAT = "studio-batch-report/1"
# analyse the next job beside this one's render (run_in_turn): off until a GPU measurement
# shows a gain; STUDIO_BATCH_AHEAD=1 turns it on (studio bench --suite warmstart --batch-runs ahead)
AHEAD = os.environ.get("STUDIO_BATCH_AHEAD") == "1"


@dataclass(frozen=True)
class EngineOptions:
    """What opens engines besides a job's settings and avatar (the command's options)."""

    checkpoints: str | None = None
    device: str | None = None
    avatar_cache: str | None = None

    @functools.cached_property
    def identity(self) -> list[Any]:
        """What of these options a job's output depends on: the checkpoint folder and its
        network files (path, size, time), so that other weights make the jobs anew. Read
        once per options (a batch's plan and each job's record)."""
        if self.checkpoints is None:
            return []
        root = Path(self.checkpoints).expanduser()
        files = sorted(root.glob("ditto_*/**/*.*")) if root.is_dir() else []
        facts: list[Any] = [str(root.resolve())]
        for path in files:
            try:
                st = path.stat()
            except OSError:
                continue
            facts.append([str(path.relative_to(root)), st.st_size, st.st_mtime_ns])
        return facts

    def request(self, job: Job) -> EngineRequest:
        return EngineRequest(
            job.settings, self.checkpoints, job.avatar, self.device, self.avatar_cache
        )


def engine_key(job: Job, options: EngineOptions) -> tuple:
    """Jobs with the same key share one opened engine."""
    from studio.render.engines import capabilities

    avatar = job.avatar if capabilities(job.settings.backend).takes_avatar else None
    return (job.settings.backend, avatar, options.checkpoints, options.device)


class JobOptionError(OptionError):
    """An option a job's engine cannot take (the command's error): the message names the
    job; ``job`` is it, for a caller that words it otherwise (the batch queue window)."""

    def __init__(self, error: OptionError, job: Job) -> None:
        super().__init__(error.option, f"{error.message} (job {job.source})")
        self.job = job


def check_engines(jobs: Sequence[Job], options: EngineOptions) -> list[str]:
    """Each engine the jobs need, checked before any work as ``studio render`` checks its
    own, once for each avatar and values of the settings its checks read
    (:attr:`~studio.engines.base.Capabilities.checked`): the checkpoint folder (every file
    it needs) and an option that cannot work for it (``--avatar`` with the demo engine, a
    precision the device cannot run, ...) are the command's errors; a job's own files are
    its own failure, found when it runs.
    Returns the notes on options the engines ignore, each once."""
    from studio.render.engines import capabilities, engine_package, prepare_engine

    notes: list[str] = []
    seen: set[tuple] = set()
    for backend in dict.fromkeys(job.settings.backend for job in jobs):
        if options.checkpoints and capabilities(backend).needs_checkpoints:
            # every job's: a missing file there is the command's error, not each job's
            engine_package(backend).check_checkpoints(options.checkpoints)
    for job in jobs:
        # the avatar too: an engine that ignores it (the demo's) must still refuse it; and
        # the settings its checks read, which each job of a group may set its own way (a
        # precision the device cannot run is the command's error, not a failure after the
        # job's motion)
        checked = sorted(capabilities(job.settings.backend).checked)
        values = tuple(getattr(job.settings, name) for name in checked)
        key = (*engine_key(job, options), job.avatar, values)
        if key in seen:
            continue
        seen.add(key)
        try:
            prepared = prepare_engine(options.request(job))
        except OptionError as e:
            raise JobOptionError(e, job) from None
        except StudioError:
            continue  # a missing or unreadable file of this job: recorded when it runs
        notes += [n for n in prepared.notes if n not in notes]
    return notes


def one_line(error: BaseException) -> str:
    """A job's error as one line: the studio's own message, or the exception's type and
    text for anything else."""
    text = str(error) if isinstance(error, StudioError) else f"{type(error).__name__}: {error}"
    return " ".join(text.split()) or type(error).__name__


class EngineCache:
    """Opened engines by :func:`engine_key`, and each one's renderer for the last settings it
    rendered with (a renderer holds device buffers: one per engine)."""

    def __init__(self, options: EngineOptions, progress: Progress | None = None) -> None:
        self.options = options
        self.progress = progress
        self.engines: dict[tuple, Any] = {}
        self.renderers: dict[tuple, tuple[tuple, Any]] = {}
        self.failures: dict[tuple, StudioError] = {}

    def engine(self, job: Job) -> Any:
        """The warm engine of ``job``'s group under the job's settings (opened on first use;
        an opening error is the job's)."""
        from studio.render.engines import open_prepared, prepare_engine

        key = engine_key(job, self.options)
        if key in self.failures:  # the group's avatar or engine failed once: not again
            raise self.failures[key]
        if key not in self.engines:
            try:
                prepared = prepare_engine(self.options.request(job))
                self.engines[key] = open_prepared(prepared, self.progress)
            except StudioError as e:
                self.failures[key] = e
                raise
        return self.engines[key].with_settings(job.settings)

    def renderer(self, job: Job, engine: Any) -> Any:
        key = engine_key(job, self.options)
        want = engine.renderer_key(job.settings)
        kept = self.renderers.get(key)
        if kept is None or kept[0] != want:
            self.renderers[key] = kept = (want, engine.renderer(job.settings))
        return kept[1]


@dataclass
class Analysed:
    """A job analysed and ready to render (``result``), or failed on the way (``error``)."""

    job: Job
    rec: dict[str, Any]
    t0: float
    first: bool = False  # this job opened its group's engine
    opened: float = 0.0
    engine: Any = None
    result: Any = None
    error: BaseException | None = None
    turn: float | None = None  # when its render could start (its analysis may be earlier)


def analyse_job(job: Job, out_dir: Path, cache: EngineCache, quiet: bool = False) -> Analysed:
    """The first half of a job: its engine (opened on the group's first job), its audio and
    controls read, its motion made (:func:`studio.render.pipeline.analyze`). A job's own
    problem is kept in ``error``; Cancelled and KeyboardInterrupt go through. ``quiet``: the
    engine copy reports no stages (analysed beside a render, whose progress is the one shown)."""
    from studio.audio.io import load_audio
    from studio.motion.controls import ControlTracks
    from studio.render.pipeline import analyze

    done = Analysed(job, _record(job, out_dir, cache.options), time.perf_counter())
    try:
        done.first = engine_key(job, cache.options) not in cache.engines
        done.engine = cache.engine(job)
        if quiet:
            done.engine.progress = None  # a copy (with_settings): the group's engine still reports
        done.opened = time.perf_counter()
        audio = load_audio(job.audio)
        controls = None if job.controls is None else ControlTracks.load(job.controls)
        done.result = analyze(audio, job.settings, done.engine, controls)
    except (Cancelled, KeyboardInterrupt):
        raise
    except Exception as e:  # noqa: BLE001 - one job's failure is recorded, never fatal
        done.error = e
    return done


def _record(job: Job, out_dir: Path, options: EngineOptions) -> dict[str, Any]:
    return {
        "name": job.name,
        "source": job.source,
        "audio": job.audio,
        "avatar": job.avatar,
        "output": str((out_dir / job.name).absolute()),  # as "audio" is
        "fingerprint": job.fingerprint(options.identity),
    }


@dataclass
class InFlight:
    """A job rendered whole whose file its encoder is still writing (``video``), or one that
    failed on the way (``rec`` filled in already)."""

    done: Analysed
    t0: float
    built: float = 0.0
    video: Any = None  # studio.render.pipeline.EncodingVideo


def start_job(
    done: Analysed,
    cache: EngineCache,
    progress: Progress | None = None,
    cancel: Callable[[], bool] | None = None,
    ahead: int | None = None,
) -> InFlight:
    """The second half of a job up to its last frame: engines built (``ahead``: the frames
    the batch will render on them, :meth:`~studio.engines.base.Renderer.build_engines`), every
    frame rendered and handed to the job's encoder (:func:`studio.render.pipeline.
    start_video`). A job's own error is recorded in its record; Cancelled and
    KeyboardInterrupt go through."""
    from studio.render.pipeline import start_video

    job, rec = done.job, done.rec
    flight = InFlight(done, done.t0 if done.turn is None else done.turn)  # not the time ahead
    try:
        if done.error is not None:
            raise done.error
        renderer = cache.renderer(job, done.engine)
        t1 = time.perf_counter()
        renderer.build_engines(int(done.result.plan.keyframes.size), progress, ahead)
        flight.built = time.perf_counter() - t1
        flight.video = start_video(
            done.result, renderer, rec["output"], job.settings, cancel=cancel, progress=progress
        )
    except (Cancelled, KeyboardInterrupt):
        raise
    except Exception as e:  # noqa: BLE001 - one job's failure is recorded, never fatal
        _failed(flight, e)
    return flight


def finish_job(flight: InFlight, aside: bool = False) -> dict[str, Any]:
    """The job's file written (its encoder's tail; ``aside``: beside the next job's render);
    its record: status ``done`` or ``failed`` with the one-line error, frames, seconds of
    audio and of work, peak memory."""
    from studio.render.pipeline import warmup_of
    from studio.runtime.base import peak_memory_mb

    done, rec = flight.done, flight.done.rec
    if flight.video is None:
        return rec  # failed before its file
    try:
        report = flight.video.finish(aside)
    except (Cancelled, KeyboardInterrupt):
        raise
    except Exception as e:  # noqa: BLE001 - one job's failure is recorded, never fatal
        return _failed(flight, e)
    wall = time.perf_counter() - flight.t0
    peak = peak_memory_mb()
    rec.update(
        status="done",
        frames=report["frames"],
        rendered_frames=report["rendered_frames"],
        duration_s=report["duration_s"],
        wall_s=round(wall, 3),
        warmup_ms={
            "open_engine": round((done.opened - done.t0) * 1000.0, 2) if done.first else 0.0,
            "build_engines": round(flight.built * 1000.0, 2),
            **warmup_of(report),  # LMDM's graph capture, a GPU process's first clip
        },
        realtime=round(report["duration_s"] / wall, 2) if wall > 0 else None,
        timings_ms=report["timings_ms"],
        peak_host_mb=peak["host"],
        peak_gpu_mb=peak["gpu"],
    )
    return rec


def _failed(flight: InFlight, error: BaseException) -> dict[str, Any]:
    rec = flight.done.rec
    wall = round(time.perf_counter() - flight.t0, 3)
    rec.update(status="failed", error=one_line(error), wall_s=wall)
    return rec


@dataclass
class BatchProgress:
    """Lines about the batch as it goes: each job's outcome, the rate and the time left."""

    total: int
    audio_total_s: float
    say: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr))
    done: int = 0
    audio_done_s: float = 0.0  # speech of the jobs run this time, failed ones included
    rendered_s: float = 0.0  # speech of those that made a video
    started: float = field(default_factory=time.perf_counter)

    def job(self, rec: dict[str, Any], audio_s: float) -> None:
        """Job ``rec`` ended (``audio_s`` of speech): its line, with the rate of speech
        rendered so far and the time the rest should take at it (jobs skipped as done before
        count for neither; a failed one counts as gone from the rest, not as rendered)."""
        self.done += 1
        made = rec["status"] == "done"
        ran = made or rec.get("was") is None
        self.audio_done_s += audio_s if ran else 0.0
        self.rendered_s += audio_s if made else 0.0
        elapsed = time.perf_counter() - self.started
        if made:
            what = f"done, {rec['duration_s']:.1f} s of speech in {rec['wall_s']:.1f} s"
            if rec.get("again"):
                what = f"{what}, made again ({rec['again']})"
        elif rec.get("was") == "done":
            what = "skipped (done before)"
        elif rec.get("was") == "failed":
            what = f"failed before, not retried (--retry-failed): {rec.get('error', '')}"
        else:
            what = f"FAILED: {rec['error']}"
        tail = ""
        if ran and (now := pace(self.rendered_s, self.audio_total_s - self.audio_done_s, elapsed)):
            rate, eta = now
            tail = f" ({rate:.1f}x real time so far{f', ETA {eta}' if eta else ''})"
        self.say(f"[{self.done}/{self.total}] {rec['name']}: {what}{tail}")


def pace(rendered_s: float, left_s: float, elapsed_s: float) -> tuple[float, str] | None:
    """The rate (x real time: ``rendered_s`` of speech in ``elapsed_s``) and the time
    ``left_s`` more should take at it, as a clock ("" under half a second: never 'ETA 0:00');
    None before anything is rendered. The CLI's lines and the queue window both say it."""
    if elapsed_s <= 0 or rendered_s <= 0:
        return None
    rate = rendered_s / elapsed_s
    left = max(left_s, 0.0) / rate
    return rate, clock(left) if left >= 0.5 else ""


def clock(seconds: float) -> str:
    """Seconds as ``m:ss`` or ``h:mm:ss`` (an ETA)."""
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def audio_seconds(job: Job) -> float:
    """The job's speech length as its file declares it (0 where it cannot be read: it will
    fail), for the time left and the frames ahead."""
    from studio.audio.io import declared_seconds

    return declared_seconds(job.audio) or 0.0


def _sweep_partials(out: Path, names: Iterable[str]) -> None:
    """Remove the partial outputs an interrupted batch left of the outputs ``names`` (this
    batch's jobs and those its state remembers; files, or PNG folders). With the folder's lock
    held no batch writes them; the partial files of other names and types are another
    program's (a render into the folder)."""
    targets = [out / written_path(name) for name in names]
    for stale in out.glob(".*.partial-*"):
        if not any(is_partial_of(stale.name, t) for t in targets):
            continue
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


def plan(
    jobs: Sequence[Job],
    state: BatchState,
    retry_failed: bool,
    options: EngineOptions | None = None,
) -> tuple[list[Job], list[dict[str, Any]], dict[str, str]]:
    """(jobs to run, records of jobs skipped, why each job the state knows runs again): done
    ones are skipped; failed ones too unless ``retry_failed`` (with their earlier error);
    either only while the job and the engine ``options`` it is made with are unchanged."""
    engine = (options or EngineOptions()).identity
    todo, skipped, again = [], [], {}
    for job in jobs:
        fp = job.fingerprint(engine)
        before = state.jobs.get(job.name)
        if state.finished(job.name, fp):
            skipped.append({**state.jobs[job.name], "status": "skipped", "was": "done"})
            continue
        if state.failed(job.name, fp) and not retry_failed:
            skipped.append({**state.jobs[job.name], "status": "failed", "was": "failed"})
            continue
        todo.append(job)
        if before is None:
            continue
        if before.get("fingerprint") != fp:
            again[job.name] = "its files, settings or checkpoints changed"
        elif before.get("status") == "done":
            again[job.name] = "its video was gone"
        else:
            again[job.name] = "--retry-failed"
    return todo, skipped, again


def run_batch(
    jobs: Sequence[Job],
    out_dir: str | Path,
    options: EngineOptions | None = None,
    retry_failed: bool = False,
    progress: Progress | None = None,
    say: Callable[[str], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    runner: Callable[..., Iterable[dict[str, Any]]] | None = None,
    on_start: Callable[[Job], None] | None = None,
    on_job: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run ``jobs`` into ``out_dir`` (module docstring); the batch report, also written to
    ``out_dir/batch_report.json``. ``runner(todo, out_dir, options, progress, cancel,
    on_start)`` yields the records of the jobs to run (default: here, one after another,
    grouped by engine; the Ray path passes its own). ``on_start(job)`` is called as a job
    starts here (not on Ray), ``on_job(record)`` as each job's record is kept (skipped ones
    first); ``say`` gets the progress lines (default: stderr). A runner that cannot start
    (a StudioError before its first record: a cluster it cannot reach) leaves no report, and
    no output folder where this batch made it."""
    options = options or EngineOptions()
    out = Path(out_dir)
    made = not out.exists()
    try:
        return _run_batch(
            jobs, out, options, retry_failed, progress, say, cancel, runner, on_start, on_job
        )
    except StudioError:
        if made:
            with contextlib.suppress(OSError):
                out.rmdir()  # only where nothing was written into it
        raise


def _run_batch(
    jobs: Sequence[Job],
    out: Path,
    options: EngineOptions,
    retry_failed: bool,
    progress: Progress | None,
    say: Callable[[str], None] | None,
    cancel: Callable[[], bool] | None,
    runner: Callable[..., Iterable[dict[str, Any]]] | None,
    on_start: Callable[[Job], None] | None,
    on_job: Callable[[dict[str, Any]], None] | None,
) -> dict[str, Any]:
    started = time.perf_counter()
    with BatchState.open(out) as state:
        _sweep_partials(out, [*(job.name for job in jobs), *state.jobs])
        todo, skipped, again = plan(jobs, state, retry_failed, options)
        seconds = {job.name: audio_seconds(job) for job in todo}  # skipped jobs: no reading
        bar = BatchProgress(len(jobs), sum(seconds.values()))
        if say is not None:
            bar.say = say
        records: dict[str, dict[str, Any]] = {}
        for rec in skipped:
            records[rec["name"]] = rec
            bar.job(rec, seconds.get(rec["name"], 0.0))
            if on_job is not None:
                on_job(rec)
        run = (runner or _run_here)(todo, out, options, progress, cancel, on_start)
        started_up, stopped = True, False
        try:
            for rec in run:
                if rec["name"] in again:
                    rec = {**rec, "again": again[rec["name"]]}
                records[rec["name"]] = rec
                bar.job(rec, seconds.get(rec["name"], 0.0))  # said first: a full disk
                if on_job is not None:  # stops the state's write, not the job's line
                    on_job(rec)
                kept = {k: v for k, v in rec.items() if k not in ("was", "again")}
                state.record(rec["name"], kept)
        except StudioError:
            started_up = len(records) > len(skipped)  # else: the runner could not start
            stopped = True
            raise
        except BaseException:
            stopped = True
            raise
        finally:
            if hasattr(run, "close"):  # a job rendered but not recorded is not kept either
                run.close()
            report = batch_report(jobs, records, time.perf_counter() - started)
            if started_up:
                _write_report(out / REPORT_FILE, report, stopped)
    return report


def _write_report(path: Path, report: dict[str, Any], stopped: bool) -> None:
    """The batch's report; where the batch was stopped by an error (a full disk: the state
    could not be saved), one the report cannot be written for either does not hide it."""
    try:
        write_json(path, report)
    except StudioError:
        if not stopped:
            raise


def _run_here(
    todo: Sequence[Job],
    out: Path,
    options: EngineOptions,
    progress: Progress | None,
    cancel: Callable[[], bool] | None,
    on_start: Callable[[Job], None] | None = None,
) -> Iterable[dict[str, Any]]:
    """The jobs one after another in this process, a group's jobs together (one warm
    engine), in the order of the list within a group (:func:`run_in_turn`)."""
    order: dict[tuple, list[Job]] = {}
    for job in todo:
        order.setdefault(engine_key(job, options), []).append(job)
    grouped = [job for group in order.values() for job in group]
    cache = EngineCache(options, progress)
    yield from run_in_turn(grouped, out, cache, progress, cancel, on_start, ahead=AHEAD)


def run_in_turn(
    jobs: Sequence[Job],
    out: Path,
    cache: EngineCache,
    progress: Progress | None = None,
    cancel: Callable[[], bool] | None = None,
    on_start: Callable[[Job], None] | None = None,
    ahead: bool = False,
) -> Iterable[dict[str, Any]]:
    """Each job's record, in the jobs' order, one job rendered after another. A job's encoder
    finishes its file on a thread of its own while the next job renders, so the GPU does not
    wait for x264's last frames: a record comes when the next job's frames are rendered (or
    before, when its file was written while the next job was analysed; or at the end). On an
    error, Cancelled or KeyboardInterrupt the files already rendered are finished and their
    records given first; the batch's consumer gone, a file not yet written is discarded.

    With ``ahead``, while a job renders the next one is analysed beside it (audio features
    and motion on a thread of its own, its GPU work on a stream of its own) when its engine
    is open already, so the GPU goes from one clip's frames to the next's without waiting for
    the motion model; a job whose engine is not open yet opens it here, at its turn. What is
    process-wide is serialised: CUDA graph captures and cache releases
    (:data:`~studio.runtime.base.GPU_LOCK`), the TF32 and cuDNN flags
    (:class:`~studio.runtime.base.SharedFlags`); the analysis thread reports no stages and
    keeps one stream. Off by default (:data:`AHEAD`) until measured on a GPU."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from studio.layout import FPS

    frames_ahead = round(sum(audio_seconds(job) for job in jobs) * FPS)  # every job's, at most
    with (
        ThreadPoolExecutor(1, thread_name_prefix="studio-analysis") as pool,
        ThreadPoolExecutor(1, thread_name_prefix="studio-encode-tail") as tails,
    ):
        pending: Future[Analysed] | None = None
        unrecorded: deque[tuple[Future[dict[str, Any]], InFlight]] = deque()  # files finishing

        def records(keep: int, wait: bool = True) -> Iterator[dict[str, Any]]:
            """The records of the files finished, oldest first, until ``keep`` are left (or,
            without ``wait``, until the oldest is still being written)."""
            while len(unrecorded) > keep and (wait or unrecorded[0][0].done()):
                rec = unrecorded[0][0].result()
                unrecorded.popleft()
                yield rec

        try:
            for i, job in enumerate(jobs):
                if cancel is not None and cancel():
                    raise Cancelled()
                turn = time.perf_counter()
                if on_start is not None:
                    on_start(job)
                done = pending.result() if pending else analyse_job(job, out, cache)
                done.turn = turn
                if pending is not None:
                    done.rec["analysed_ahead"] = True  # its motion was made beside the last render
                nxt = jobs[i + 1] if i + 1 < len(jobs) else None
                key = None if nxt is None else engine_key(nxt, cache.options)
                pending = None
                if ahead and key in cache.engines:  # its engine is open: analyse it beside
                    pending = pool.submit(_analyse_aside, nxt, out, cache)
                yield from records(keep=0, wait=False)  # files written while this was analysed
                flight = start_job(done, cache, progress, cancel, frames_ahead)
                unrecorded.append((tails.submit(finish_job, flight, True), flight))
                yield from records(keep=1)  # the last job's, finished beside this render
            yield from records(keep=0)
        except (Exception, KeyboardInterrupt):  # Cancelled too: what is rendered is kept
            yield from records(keep=0)
            raise
        finally:  # the consumer gone (GeneratorExit), or a second interrupt: a file whose
            if pending is not None:  # record cannot be kept is not kept either, unless it
                pending.cancel()  # was written already (the next run writes it again)
            for _, flight in unrecorded:
                if flight.video is not None:
                    flight.video.abort()


def _analyse_aside(job: Job, out: Path, cache: EngineCache) -> Analysed:
    """:func:`analyse_job` on the analysis thread, its GPU work on a stream of its own."""
    from studio.runtime.base import own_stream

    with own_stream():
        return analyse_job(job, out, cache, quiet=True)


def batch_report(
    jobs: Sequence[Job], records: dict[str, dict[str, Any]], wall_s: float
) -> dict[str, Any]:
    """The report: per job (in the list's order) its record or ``pending``, and totals."""
    rows = [records.get(j.name, {"name": j.name, "status": "pending"}) for j in jobs]
    made = [r for r in rows if r["status"] == "done"]
    audio = sum(r.get("duration_s", 0.0) for r in made)
    counts = {
        s: sum(r["status"] == s for r in rows) for s in ("done", "skipped", "failed", "pending")
    }
    return {
        "format": REPORT_FORMAT,
        "jobs": rows,
        "summary": {
            **counts,
            "total": len(rows),
            "audio_s": round(audio, 3),
            "frames": sum(r.get("frames", 0) for r in made),
            "wall_s": round(wall_s, 3),
            "realtime": round(audio / wall_s, 2) if wall_s > 0 and audio else None,
            "fps": round(sum(r.get("frames", 0) for r in made) / wall_s, 1) if wall_s > 0 else None,
            "peak_host_mb": _most(r.get("peak_host_mb") for r in made),
            "peak_gpu_mb": _most(r.get("peak_gpu_mb") for r in made),  # None: CUDA unused
            "actors": _per_actor(made),
        },
    }


def _per_actor(made: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each process that rendered jobs (a Ray actor, ``host:pid``; ``here``: the batch's
    own) with its job count and peak host and GPU memory (what sizes a cluster's actors)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in made:
        by.setdefault(r.get("actor", "here"), []).append(r)
    return [
        {
            "actor": actor,
            "jobs": len(rs),
            "peak_host_mb": _most(r.get("peak_host_mb") for r in rs),
            "peak_gpu_mb": _most(r.get("peak_gpu_mb") for r in rs),
        }
        for actor, rs in by.items()
    ]


def _most(values: Iterable[float | None]) -> float | None:
    """The largest of the values given (None where none is)."""
    known = [v for v in values if v is not None]
    return max(known) if known else None


def summary_table(report: dict[str, Any]) -> str:
    """The report as a table for people: a row per job, then the totals (and each Ray
    actor's jobs and peak memory)."""
    rows = [("job", "status", "speech", "wall", "x real time", "error")]
    for r in report["jobs"]:
        ran = r["status"] == "done"  # a skipped row's figures are an earlier run's
        rows.append(
            (
                r["name"],
                r["status"],
                f"{r['duration_s']:.1f} s" if "duration_s" in r else "",
                f"{r['wall_s']:.1f} s" if "wall_s" in r and ran else "",
                f"{r['realtime']:.1f}" if r.get("realtime") and ran else "",
                r.get("error", ""),
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(5)]
    lines = [
        (
            "  ".join(str(c).ljust(w) for c, w in zip(row[:5], widths, strict=True)) + "  " + row[5]
        ).rstrip()
        for row in rows
    ]
    s = report["summary"]
    rate = f", {s['realtime']:.1f}x real time" if s["realtime"] else ""
    lines.append(
        f"{s['done']} done, {s['skipped']} skipped (done before), {s['failed']} failed"
        + (f", {s['pending']} not run" if s["pending"] else "")
        + f" of {s['total']}; {s['audio_s']:.1f} s of speech in {s['wall_s']:.1f} s{rate}"
        + f" ({s['frames']} frames at {s['fps']} fps)" * bool(s["frames"])
    )
    for a in s.get("actors", []):
        if a["actor"] != "here" and a.get("peak_host_mb"):  # a Ray actor: what it held
            gpu = f", {a['peak_gpu_mb']:,.0f} MB GPU" if a.get("peak_gpu_mb") else ""
            jobs = f"{a['jobs']} job{'s' * (a['jobs'] != 1)}"
            lines.append(f"actor {a['actor']}: {jobs}, peak {a['peak_host_mb']:,.0f} MB host{gpu}")
    stale = sum(r.get("was") == "failed" for r in report["jobs"])
    if stale:
        lines.append(f"{stale} failed before and not retried: --retry-failed runs them again")
    return "\n".join(lines)
