"""What the commands share: where workers run, how a bad option ends a command, one run per
output, and how a run is watched (Prometheus metrics on a port, an event log with a
``report.html``)."""

from __future__ import annotations

import contextlib
import errno
import math
import os
import signal
import sys
import threading
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

if typing.TYPE_CHECKING:  # typer carries its own click: the package may not be installed
    import click


class BackendChoice(StrEnum):
    local = "local"
    ray = "ray"


BACKEND = Annotated[BackendChoice, typer.Option(case_sensitive=False, help="Where workers run.")]
ADDRESS = Annotated[str | None, typer.Option(help="Ray cluster address (--backend ray).")]
CPUS = Annotated[float | None, typer.Option(min=0.5, help="CPUs to use.", show_default="all")]
GPUS = Annotated[
    int | None,
    typer.Option(min=0, max=1024, help="GPUs to use (0: CPU only).", show_default="all"),
]
MEMORY_GB = Annotated[
    float | None,
    typer.Option(
        "--memory-gb",
        min=0.1,
        help="Host memory the run may take, workers and queued data together (local "
        "backend): no worker is started beyond it, but every stage keeps one.",
        show_default="what is available",
    ),
]


@dataclass(frozen=True)
class Machine:
    """What a run may use: ``--cpus``, ``--gpus`` and ``--memory-gb`` (``None``: all)."""

    cpus: float | None = None
    gpus: int | None = None
    memory_gb: float | None = None

    def check_ray(self, address: str | None) -> None:
        """``ValueError`` for a limit that cannot apply on Ray: ``--memory-gb`` anywhere,
        ``--cpus`` where the run joins a cluster (``address``, or ``RAY_ADDRESS``); and
        ``ConnectionError`` where nothing answers at the cluster's address."""
        if self.memory_gb is not None:
            raise ValueError(
                "--memory-gb is for the local backend: on Ray each node's memory resource "
                "is its limit (ray start --memory)"
            )
        target = ray_target(address)
        if target is not None and self.cpus is not None:
            raise ValueError(
                f"--cpus declares a private cluster's CPUs: joining the Ray cluster at "
                f"{target} uses its nodes' own (ray start --num-cpus)"
            )
        if target is not None:
            from conveyor.backends.ray import check_answers

            check_answers(target)

    def use_gpus(self, on_ray: bool, address: str | None) -> bool | None:
        """Whether the models run on GPUs: ``--gpus`` where given; on Ray (checked first,
        ``check_ray``) a joined cluster is asked, its driver's own GPUs telling nothing;
        ``None``: this machine's (detected by the config)."""
        if on_ray:
            self.check_ray(address)
        if self.gpus is not None:
            return self.gpus > 0
        target = ray_target(address) if on_ray else None
        return cluster_has_gpus(target) if target is not None else None

    def ray_limits(self, address: str | None) -> dict[str, Any]:
        """``num_cpus``/``num_gpus`` for a private Ray cluster; none when joining one (where
        ``--gpus`` only says whether to use the cluster's GPUs)."""
        if ray_target(address) is not None:
            return {}
        return {"num_cpus": self.cpus, "num_gpus": self.gpus}

    def backend(self, choice: BackendChoice, address: str | None) -> Any:
        """The backend ``--backend`` names, with these limits (``ValueError``: a bad one)."""
        if choice is BackendChoice.ray:
            from conveyor.backends import RayBackend

            self.check_ray(address)
            return RayBackend(address, **self.ray_limits(address))
        from conveyor.backends import LocalBackend

        return LocalBackend(num_cpus=self.cpus, num_gpus=self.gpus, memory_gb=self.memory_gb)


def ray_target(address: str | None) -> str | None:
    """The Ray cluster a run joins: ``--address``, else ``RAY_ADDRESS``; ``None`` for a
    private one started on this machine."""
    return address or os.environ.get("RAY_ADDRESS") or None


def cluster_has_gpus(address: str) -> bool:
    """Whether the Ray cluster at ``address`` has GPUs, asked of the cluster itself (its
    driver often has none); the connection stays for the run (``RayConnection``)."""
    import ray

    from conveyor.backends.ray import RayConnection

    RayConnection(address).connect()
    return float(ray.cluster_resources().get("GPU", 0.0)) > 0


class CheckedCommand(TyperCommand):
    """A command whose values are checked before it runs, whatever the option: a number
    that is not finite (``--cpus inf`` crashed in the placement, ``--clip-len inf`` in the
    splitter, where Typer's ranges let infinity through) and an empty INPUT, OUTPUT or
    path (``""`` meant the current folder: ``conveyor text "" out`` read every JSONL under
    it, ``conveyor text in ""`` wrote its output there) end it with exit 2 and one line."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # a path option given "" arrives as Path("."), which a "." the user typed also is
        ctx.meta[_EMPTY_GIVEN] = any(not arg.strip() for arg in args)
        # before the range checks, which said "should be <= 1" of a NaN
        for option, value in _float_options(self.params, args):
            with contextlib.suppress(ValueError):
                if not math.isfinite(float(value)):
                    raise fail(f"{option} must be a finite number, got {value}")
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        with _stop_on_signals():
            try:
                return self._invoke_checked(ctx)
            except OSError as exc:
                # a full disk or a failing device the command did not name itself (its
                # standard output on one: `> /dev/full`) is one line, as coreutils say it
                if exc.errno not in DEVICE_ERRORS:
                    raise
                with contextlib.suppress(OSError):
                    sys.stderr.write(f"conveyor: {exc}\n")
                raise typer.Exit(code=1) from None
            except KeyboardInterrupt:  # a command that does not say it itself
                if not _received:
                    raise  # Ctrl-C: Typer's exit 130
                typer.echo("interrupted", err=True)
                raise typer.Exit(code=stopped_code()) from None

    def _invoke_checked(self, ctx: click.Context) -> Any:
        try:
            os.getcwd()
        except FileNotFoundError:  # relative paths failed with tracebacks, torch to load
            raise fail(
                "the current folder no longer exists (it was removed after the shell entered "
                "it): cd to one that does"
            ) from None
        for param in self.params:
            value = ctx.params.get(param.name or "")
            if isinstance(value, Path) and str(value).startswith("~"):
                # a quoted "~/x" (or one from a script): expanded as INPUT and OUTPUT are
                # (os.path's: an unknown ~user stays as typed, where Path's raised)
                value = ctx.params[param.name or ""] = Path(os.path.expanduser(value))
            problem = _bad_value(value, bool(ctx.meta.get(_EMPTY_GIVEN)))
            if problem is None:
                continue
            if param.opts[0].startswith("-"):
                raise fail(f"{param.opts[0]} {problem}")
            name = param.metavar or (param.name or "").upper()
            raise fail(
                f"{name}: an argument {problem}" if isinstance(value, list) else f"{name} {problem}"
            )
        return super().invoke(ctx)


_EMPTY_GIVEN = "conveyor.empty_argument"
#: errors of the machine, not of the program: said in one line when no command caught them
DEVICE_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP (``timeout``, ``docker stop``, a scheduler, a closed terminal),
    stopping a command as Ctrl-C does: they killed the driver with no summary, no report
    and no word, and a private Ray cluster printed its crash dumps."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)


def stopped_code() -> int:
    """The exit status of a stopped command: 128 + the stop signal received (130
    for Ctrl-C), whatever carried it out (Ray's waits raise a plain ``KeyboardInterrupt``
    in place of the handler's ``Stopped``)."""
    return 128 + int(_received[-1] if _received else signal.SIGINT)


#: the stop signals received while a command runs (``_stop_on_signals``)
_received: list[int] = []


#: the signals a command stops on as on Ctrl-C
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[None]:
    """Within the block, ``STOP_SIGNALS`` raise ``Stopped`` in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: Any) -> None:
        _received.append(signum)
        raise Stopped(signum)

    _received.clear()
    saved = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _takes_float(param: Any) -> bool:
    descriptor = getattr(param, "type_descriptor", None)
    annotation = getattr(descriptor, "annotation", None)
    return annotation is float or float in typing.get_args(annotation)


def _float_options(params: Sequence[click.Parameter], args: list[str]) -> Iterator[tuple[str, str]]:
    """Each value given to an option that takes a number with a fraction, with its option
    as typed (``--opt value`` or ``--opt=value``)."""
    takes = {opt for param in params if _takes_float(param) for opt in param.opts}
    for index, arg in enumerate(args):
        if arg == "--":
            return
        option, equals, value = arg.partition("=")
        if option not in takes:
            continue
        if equals:
            yield option, value
        elif index + 1 < len(args):
            yield option, args[index + 1]


def _bad_value(value: Any, empty_given: bool) -> str | None:
    values = value if isinstance(value, (list, tuple)) else [value]
    for one in values:
        if isinstance(one, float) and not math.isfinite(one):
            return f"must be a finite number, got {one}"
        if isinstance(one, str) and not one.strip():
            return "is empty"
        if empty_given and isinstance(one, Path) and one == Path("."):
            return "is empty"
    return None


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``error: message`` on stderr; raise the returned exit (2: a bad input or option)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=code)


def refuse_unused(ctx: typer.Context, rules: Sequence[tuple[bool, Sequence[str], str]]) -> None:
    """Exit 2 where an option given on the command line would have no effect: each rule is
    (whether its options are idle, their parameter names, what they need). A value left at
    its default is never refused, so only what the user typed is checked; silently ignored,
    ``--splitter fixed --shot-threshold 0.5`` read as if the threshold had been used."""
    flags = _flags(ctx)
    for idle, names, needs in rules:
        given = [flags[n] for n in names if idle and _typed(ctx, n)]
        if given:
            verb = "has" if len(given) == 1 else "have"
            raise fail(f"{', '.join(given)} {verb} no effect without {needs}")


def as_flags(ctx: typer.Context, message: str) -> str:
    """``message`` (a config's, naming its fields) with each field an option of ``ctx``'s
    command stands for written as that option: ``min_clip_s (5.0) is longer than
    max_clip_s (1.0)`` reads ``--min-clip (5.0) is longer than --max-clip (1.0)``. Only
    names with an underscore, and the first word of each problem (``threshold must be
    ...``; problems are joined by ``"; "``), are read as fields, so plain words stay words."""
    import re

    flags = _flags(ctx)

    def flag(match: re.Match[str]) -> str:
        name = match.group(0)
        return flags.get(name) or flags.get(name.removesuffix("_s")) or name

    def subject(match: re.Match[str]) -> str:
        return match.group(1) + (flags.get(match.group(2)) or match.group(2))

    message = re.sub(r"(^|; )([a-z]+)\b", subject, message)
    return re.sub(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b", flag, message)


def _by_flags(ctx: typer.Context, exc: Exception) -> str:
    """``exc``'s message by ``ctx``'s flags; the options a ``ConfigMismatch`` names as typed:
    ``--motion -> --no-motion``, ``--clip-len: 2.0 -> 3.0`` (were ``motion: True -> False``,
    ``clip_len_s: 2.0 -> 3.0``)."""
    said = getattr(exc, "said", None)
    if not callable(said):
        return as_flags(ctx, str(exc))
    params = {p.name: p for p in ctx.command.params if p.opts[0].startswith("--")}

    def change(name: str, before: Any, now: Any) -> str:
        param = params.get(name) or params.get(name.removesuffix("_s"))
        if param is None:
            return f"{name}: {before!r} -> {now!r}"
        if isinstance(before, bool) and isinstance(now, bool) and param.secondary_opts:
            on, off = param.opts[0], param.secondary_opts[0]
            return f"{on if before else off} -> {on if now else off}"
        return f"{param.opts[0]}: {_typed_value(before)} -> {_typed_value(now)}"

    return str(said(change))


def _typed_value(value: Any) -> str:
    """A recorded option's value as it would be typed (``none`` for one not given)."""
    if value is None or value == []:
        return "none"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _flags(ctx: typer.Context) -> dict[str, str]:
    """Each option of ``ctx``'s command by its parameter name: ``min_clip`` -> ``--min-clip``
    (arguments, which have no flag, left out)."""
    return {p.name: p.opts[0] for p in ctx.command.params if p.opts[0].startswith("--")}


def _typed(ctx: typer.Context, name: str) -> bool:
    """Whether option ``name`` was given on the command line (or in the environment)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


@contextlib.contextmanager
def hold_output(
    output: str,
    clear: Callable[[str], object] | None = None,
    check: Callable[[], object] | None = None,
    ctx: typer.Context | None = None,
) -> Iterator[None]:
    """Hold OUTPUT's lock (``conveyor.output_lock``) from before the command writes anything
    there, its event log included, until it ends; another run holding it ends this command
    with exit 1 and a line naming that run. Under the lock, ``clear(output)``
    (``--overwrite``) then ``check()`` (can it be resumed?): a ValueError, OSError or
    ImportError of theirs ends the command with exit 2, said by ``ctx``'s flags."""
    from conveyor.errors import OutputInUse
    from conveyor.output_lock import output_lock

    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(output_lock(output))
        except OutputInUse as exc:
            raise fail(str(exc), 1) from None
        except OSError as exc:  # the folder cannot be made (no permission, a file in the way)
            raise fail(str(exc)) from None
        try:
            if clear is not None:
                clear(output)
            if check is not None:
                check()
        except (ValueError, OSError, ImportError) as exc:  # a ConfigMismatch among them
            # the options that differ, by the flags of ``ctx``'s command (not field names)
            raise fail(_by_flags(ctx, exc) if ctx is not None else str(exc)) from None
        yield


LIVE = Annotated[
    bool,
    typer.Option(
        "--live/--no-live",
        help="Live per-stage view (without it, or off a terminal: a line of totals every 30 s).",
    ),
]
METRICS_PORT = Annotated[
    int | None,
    typer.Option(
        min=0,
        max=65535,
        help="Serve Prometheus metrics on 127.0.0.1:PORT/metrics while the run goes "
        "(0: any free port; the URL is printed).",
        show_default="off",
    ),
]
REPORT = Annotated[
    bool,
    typer.Option(
        "--report/--no-report",
        help="Keep an event log (events.jsonl) and write report.html in the output folder.",
    ),
]


def run_monitors(
    run_dir: Path | None,
    metrics_port: int | None,
    report: bool,
    settings: dict[str, Any],
    echo: Any = typer.echo,
) -> list[Any]:
    """The monitors the options ask for; the metrics URL is printed as soon as it serves.

    A port that cannot be bound is a bad option (exit 2 with the reason)."""
    monitors: list[Any] = []
    if metrics_port is not None:
        from conveyor.monitor import PrometheusMonitor

        try:
            metrics = PrometheusMonitor(port=metrics_port)
        except (OSError, ImportError) as exc:  # ImportError: no prometheus-client
            typer.echo(f"error: --metrics-port {metrics_port}: {exc}", err=True)
            raise typer.Exit(code=2) from None
        echo(f"metrics: {metrics.url}")
        monitors.append(metrics)
    if report and run_dir is not None:
        from conveyor.monitor import EventLog

        monitors.append(EventLog(run_dir, report=True, settings=_plain(settings)))
    return monitors


def close_monitors(monitors: list[Any]) -> None:
    for monitor in monitors:
        close = getattr(monitor, "close", None)
        if close is not None:
            close()


def add_input_failures(monitors: list[Any], failures: list[Any]) -> None:
    """Give the event log the failures a pipeline found in its data (it rewrites the
    report with them)."""
    for monitor in monitors:
        add = getattr(monitor, "add_failures", None)
        if add is not None:
            add(failures)


def report_path(monitors: list[Any]) -> Path | None:
    """Where the event log wrote its report, if one did."""
    for monitor in monitors:
        path = getattr(monitor, "report_path", None)
        if path is not None:
            return Path(path)
    return None


def _plain(settings: dict[str, Any]) -> dict[str, Any]:
    """Options as JSON-friendly values (enums by value, paths as text)."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if hasattr(value, "value") and not isinstance(value, (int, float, str, bool)):
            value = value.value
        elif isinstance(value, Path):
            value = str(value)
        out[key] = value
    return out
