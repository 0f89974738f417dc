"""The Python API of the scripts: ``train.run(epochs=3)``, ``test.run(...)``, ``detect.run(...)``,
``export.run(...)`` take the command line's option names as keywords, and ``train.run(..., nproc_per_node=N)``
starts N processes with torch's own elastic launcher (what torchrun runs), returning rank 0's result;
``train.run(..., ray_workers=N)`` trains on N workers of Ray Train's TorchTrainer (utils/distributed/ray_train.py).

Keywords become the script's own argv (``img_size=64`` -> ``--img-size 64``) and go through the script's parser,
so a value is checked, converted and refused exactly as on the command line, with the same one-line errors.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import importlib.util
import io
import json
import logging
import os
import pickle
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from utils.cli import PeerLost
from utils.compat.ultralytics import KEYS, option_names, valid_keys
from utils.device import processes_to_start
from utils.distributed.launcher import SEPARATE_STORES, launched
from utils.distributed.signals import StopRequested
from utils.errors import UserError
from utils.paths import ROOT


class OptionError(UserError, TypeError):
    """A keyword the script has no option for, or a value its option cannot take; the message names it."""


def _unknown(name: str, known: Sequence[str], script: str) -> OptionError:
    close = difflib.get_close_matches(name, [k for k in known if not k.startswith("refused_")], n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else f"; see python {script}.py --help"
    return OptionError(f"{script}.run() got an unknown option {name!r}{hint}")


def _flag_values(action: argparse.Action, name: str, value: Any, script: str) -> list[str]:
    """The argv words of one option's value (None: the option's default, so none)."""
    flag = next((s for s in action.option_strings if s.startswith("--")), action.option_strings[0])
    if value is None:
        return []
    if action.nargs == 0:  # store_true and the like
        if not isinstance(value, bool):
            raise OptionError(f"{script}.run(): {name} takes True or False (it is the flag {flag}), not {value!r}")
        return [flag] if value else []
    if action.nargs == "?" and isinstance(value, bool):  # --resume, --cache, --evolve: bare flag or a value
        return [flag] if value else []
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if isinstance(action, argparse._AppendAction):  # --hook a --hook b
        return [word for v in values for word in (flag, str(v))]
    if action.nargs in (None, "?") and len(values) != 1:
        raise OptionError(f"{script}.run(): {name} takes one value ({flag}), not {value!r}")
    if action.nargs in (None, "?"):
        return [f"{flag}={values[0]}"]  # '=' keeps a value that starts with '-' a value
    return [flag, *map(str, values)]


def to_argv(parser: argparse.ArgumentParser, options: Mapping[str, Any], script: str) -> list[str]:
    """The command line that means ``options`` (keywords named as :func:`option_names`, or ultralytics' keys as
    utils/compat/ultralytics.py reads them: ``model="yolo11n.pt"``); OptionError for an unknown keyword (naming
    the closest one) or one option given under two names."""
    names, argv, seen = option_names(parser), [], {}
    for name, value in options.items():
        if name not in names and name in KEYS:  # ultralytics' name (model=, batch=): the parser reads the word
            if value is not None:
                text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
                argv.append(f"{name}={text}")
            continue
        if name not in names:
            raise _unknown(name, [*names, *valid_keys(parser)], script)
        action = names[name]
        if action.dest in seen:
            raise OptionError(f"{script}.run(): {seen[action.dest]!r} and {name!r} are the same option; give one")
        seen[action.dest] = name
        argv += _flag_values(action, name, value, script)
    return argv


def parse(parse_opt: Callable[[list[str]], argparse.Namespace], argv: list[str], script: str) -> argparse.Namespace:
    """``parse_opt(argv)``, its argparse errors (which print usage and exit) raised as one-line OptionErrors."""
    _not_reentered(f"{script}.run()")
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return parse_opt(argv)
    except SystemExit:
        lines = stderr.getvalue().strip().splitlines() or ["invalid options"]
        raise OptionError(lines[-1].removeprefix(f"{script}.py: error: ")) from None


@dataclass
class RankOutcome:
    """What one launched process returned: its value, or the error it would have printed on the command line."""

    value: Any = None
    error: BaseException | None = None


def outcome(work: Callable[[], Any]) -> RankOutcome:
    """Run ``work`` in a launched process and keep an error the command line prints as one line as a value, so
    the caller can raise it; anything else is a crash the launcher reports with its traceback."""
    try:
        return RankOutcome(value=work())
    except (UserError, PeerLost, StopRequested) as e:
        return RankOutcome(error=e)


def first_error(outcomes: Mapping[int, RankOutcome]) -> BaseException | None:
    """The error to raise for a launched job: the lowest rank's UserError, else the line of a lost peer, else a
    stop; None when every rank succeeded."""
    errors = [outcomes[rank].error for rank in sorted(outcomes) if outcomes[rank].error is not None]
    for kind in (UserError, PeerLost, StopRequested):
        found = [e for e in errors if isinstance(e, kind) and (kind is not PeerLost or e.line)]
        if found:
            return found[0]
    return errors[0] if errors else None


@contextlib.contextmanager
def _process_state_kept() -> Iterator[None]:
    """The launcher installs its own handlers for SIGTERM, SIGINT, SIGHUP and SIGQUIT in the calling process and
    sets an environment variable; put both back when it is done (a notebook's Ctrl-C must stay KeyboardInterrupt).
    Meanwhile the workers get a store of their own (SEPARATE_STORES), as every elastic job of ours should."""
    signals = [getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT") if hasattr(signal, name)]
    handlers = {sig: signal.getsignal(sig) for sig in signals}
    env = {name: os.environ.get(name) for name in ("TORCHELASTIC_SIGNALS_TO_HANDLE", SEPARATE_STORES)}
    os.environ[SEPARATE_STORES] = "1"
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():  # elsewhere the launcher installed none
            for sig, handler in handlers.items():
                if handler is not None:
                    signal.signal(sig, handler)
        for name, value in env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def launch(worker: Callable[..., RankOutcome], nproc_per_node: int, *args: Any) -> Any:
    """Start ``worker(*args)`` in ``nproc_per_node`` processes on this machine with torch's elastic launcher, as
    ``torchrun --standalone --nproc_per_node N`` does (c10d rendezvous on a free local port, no restarts); return
    rank 0's value, or raise the job's error (:func:`first_error`). ``worker`` must be a module-level function
    returning :func:`outcome`'s record.

    Each process is a fresh interpreter that imports ``worker``'s module and calls it (:func:`run_job`); it never
    runs the caller's ``__main__``, so a script without ``if __name__ == "__main__":``, ``python -c`` and stdin
    work. Only when an argument's class is defined in ``__main__`` (a hook written in the calling script) is that
    script imported in the processes, as multiprocessing's spawn does."""
    if not isinstance(nproc_per_node, int) or isinstance(nproc_per_node, bool) or nproc_per_node < 1:
        raise OptionError(f"nproc_per_node={nproc_per_node!r}: give the number of processes, 1 or more")
    _not_reentered("launch()")
    job = Path(tempfile.mkdtemp(prefix="yolo-launch-"))  # the job, each rank's outcome, the launcher's error files
    try:
        _write_job(job, worker, args)
        with _process_state_kept(), _launcher_quiet():
            elastic_launch(_config(nproc_per_node, job), sys.executable)("-c", _BOOT, str(job))
        outcomes = {rank: _read_outcome(job, rank) for rank in range(nproc_per_node)}
    finally:
        shutil.rmtree(job, ignore_errors=True)
    error = first_error(outcomes)
    if error is not None:
        raise error
    return outcomes[0].value


# What each launched process runs: the repository importable, then run_job(job folder).
_BOOT = f"import sys; sys.path[:0] = [{str(ROOT)!r}]; from utils.api import run_job; sys.exit(run_job(sys.argv[1]))"


class _Bootstrap(threading.local):
    importing = ""  # the calling script a launched process is importing for its hooks


_BOOTSTRAP = _Bootstrap()


def _not_reentered(call: str) -> None:
    """OptionError when a launched process, importing the calling script for its hooks, meets ``call`` at the
    script's top level (it would run again in every process, each rank a job of its own)."""
    if _BOOTSTRAP.importing:
        raise OptionError(f"a new process imported {_BOOTSTRAP.importing} for the hooks defined there, and it "
                          f"called {call} again: put the call under `if __name__ == \"__main__\":`")


def _config(nproc_per_node: int, log_dir: Path) -> Any:
    """torchrun --standalone's launch configuration for ``nproc_per_node`` local processes."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig

    return LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc_per_node, run_id=uuid.uuid4().hex,
                        rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
                        logs_specs=DefaultLogsSpecs(log_dir=str(log_dir / "logs")))


def _write_job(job: Path, worker: Callable[..., Any], args: tuple) -> None:
    """job.json (where the worker lives, the caller's sys.path, the calling script when an argument's class is
    defined in it) and args.pkl (the arguments, pickled: read back only by the processes started here)."""
    module = sys.modules[worker.__module__]
    main = [type(a).__name__ for arg in args for a in (arg if isinstance(arg, (list, tuple)) else [arg])
            if type(a).__module__ == "__main__"] + ([worker.__qualname__] if worker.__module__ == "__main__" else [])
    main_file = getattr(sys.modules["__main__"], "__file__", None)
    if main and not main_file:
        raise OptionError(f"{main[0]} is defined in __main__ of an interactive session, python -c or stdin, which "
                          "new processes cannot import: define it in a module of its own and import it")
    spec = {"module": worker.__module__, "file": getattr(module, "__file__", None), "function": worker.__qualname__,
            "sys_path": [p for p in sys.path if isinstance(p, str)], "main_file": main_file if main else None}
    (job / "job.json").write_text(json.dumps(spec))
    with open(job / "args.pkl", "wb") as f:
        pickle.dump(args, f)


def _read_outcome(job: Path, rank: int) -> RankOutcome:
    path = job / f"outcome-{rank}.pkl"
    with open(path, "rb") as f:  # written by a process started here, into this call's private folder
        return pickle.load(f)


def run_job(job_dir: str) -> int:
    """One launched process (_BOOT): import the worker's module, call it with the job's arguments, and write its
    outcome for the caller; a crash's traceback goes to the launcher's error file (torch elastic's ``record``), so
    the caller's ChildFailedError shows it."""
    from torch.distributed.elastic.multiprocessing.errors import record

    return record(_run_job)(Path(job_dir))


def _run_job(job: Path) -> int:
    spec = json.loads((job / "job.json").read_text())
    sys.path[:] = spec["sys_path"] + [p for p in sys.path if p not in spec["sys_path"]]
    try:
        if spec["main_file"]:
            _import_main(spec["main_file"])
        module = _import_worker_module(spec["module"], spec["file"])
        with open(job / "args.pkl", "rb") as f:  # written by the caller into its private folder
            args = pickle.load(f)
        result = getattr(module, spec["function"])(*args)
    except UserError as e:  # e.g. the calling script, imported for its hooks, launched again
        result = RankOutcome(error=e)
    rank = int(os.environ.get("RANK", 0))
    partial = job / f"outcome-{rank}.pkl.tmp"
    with open(partial, "wb") as f:
        pickle.dump(result, f)
    partial.replace(job / f"outcome-{rank}.pkl")
    return 0


def _import_main(path: str) -> None:
    """The calling script as ``__mp_main__`` (its ``if __name__ == "__main__":`` block not run), for the classes
    defined in it."""
    from multiprocessing.spawn import import_main_path

    _BOOTSTRAP.importing = path
    try:
        import_main_path(path)
    finally:
        _BOOTSTRAP.importing = ""


def _import_worker_module(name: str, file: str | None) -> Any:
    """The worker's module under the name it has in the caller (a script such as train.py by its file)."""
    if name in sys.modules:
        return sys.modules[name]
    if "." in name or not file:
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pickled values name their classes by this module
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------- the command line
def processes(opt: argparse.Namespace) -> int:
    """How many processes a script's options ask this machine for (utils.device.processes_to_start): more than 1
    only outside a launcher, with several GPUs in --device or --nproc-per-node above 1."""
    import torch

    return processes_to_start(opt.device, getattr(opt, "nproc_per_node", None),
                              launched(getattr(opt, "local_rank", -1)),
                              torch.cuda.device_count() if torch.cuda.is_available() else 0)


def torchrun_line(script: str, argv: Sequence[str], nproc_per_node: int) -> str:
    """The torchrun command that does what ``python script argv`` does with our own launcher."""
    words, skip = [], False
    for word in argv:
        if skip:
            skip = False
            continue
        if word.split("=")[0] in ("--nproc-per-node", "--nproc_per_node"):
            skip = "=" not in word
            continue
        words.append(word)
    return shlex.join(["torchrun", "--standalone", "--nproc_per_node", str(nproc_per_node), script, *words])


def command_line(script_file: str, parse_opt: Callable[[list[str]], argparse.Namespace],
                 main: Callable[[Any], Any]) -> int:
    """A script's ``__main__``: parse sys.argv; when the options ask for several processes here (``--device
    0,1``, ``--nproc-per-node 2``) start them with torch's elastic launcher, each running this script as torchrun
    would, after printing that torchrun command once; else run ``main`` in this process (utils.cli.run_script).
    Returns the exit code."""
    from utils.cli import EXIT_USER_ERROR, run_script

    script, argv = Path(script_file).name, sys.argv[1:]
    opt = parse_opt(argv)
    try:
        count = processes(opt)
    except UserError as e:
        print(f"{Path(script).stem}: error: {e}", file=sys.stderr, flush=True)
        return EXIT_USER_ERROR
    if count == 1:
        return run_script(main, opt, Path(script).stem)
    print(f"Starting {count} processes with torch's elastic launcher, as this command would:\n  "
          f"{torchrun_line(script, argv, count)}", flush=True)
    return launch_command(Path(script_file).resolve(), argv, count)


def launch_command(script: Path, argv: Sequence[str], nproc_per_node: int) -> int:
    """``python script argv`` in ``nproc_per_node`` processes (torchrun's environment, output to this terminal);
    the exit code of the first process that failed, 0 when all succeeded. The processes print their own errors
    (one line for a user error), and nothing is printed after them: their line stays the last one."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    logs = Path(tempfile.mkdtemp(prefix="yolo-launch-"))
    try:
        with _process_state_kept(), _launcher_quiet():
            elastic_launch(_config(nproc_per_node, logs), sys.executable)(str(script), *argv)
        return 0
    except ChildFailedError as e:  # the first process that ended by itself (others may be the launcher's kills)
        failures = sorted(e.failures.items(), key=lambda item: (item[1].exitcode < 0, item[1].timestamp, item[0]))
        code = failures[0][1].exitcode
        return code if code > 0 else 128 - code
    except SignalException as e:  # Ctrl-C or a scheduler's signal to this process: the ranks got it and saved
        return 128 + int(e.sigval)
    finally:
        shutil.rmtree(logs, ignore_errors=True)


@contextlib.contextmanager
def _launcher_quiet() -> Iterator[None]:
    """Inside, torch's launcher logs nothing (its banner, its shutdown notes, its failure table): the processes
    report their own errors, and a failure reaches the caller as an exception or an exit code. Its loggers are
    disabled for the while and put back as they were."""
    import torch.distributed.elastic.agent.server.local_elastic_agent  # noqa: F401 (creates the loggers to quiet)
    import torch.distributed.launcher.api  # noqa: F401

    prefixes = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")
    loggers = [logging.getLogger(name) for name in list(logging.Logger.manager.loggerDict)
               if name.startswith(prefixes)]
    before = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        for logger, disabled in zip(loggers, before):
            logger.disabled = disabled


def elastic_launch(config: Any, entrypoint: Any) -> Any:
    """torch's elastic launcher (what torchrun runs), imported when used."""
    from torch.distributed.launcher.api import elastic_launch as launcher

    return launcher(config, entrypoint)


def ray_launch(loop: Callable[[dict], None], options: Mapping[str, Any], hooks: Sequence[Any], device: str,
               backend: str, timeout_s: float, ray_workers: int, ray_address: str = "", ray_storage: str = "",
               ray_max_failures: int = 0) -> Any:
    """Start ``loop(config)`` (train.ray_train_loop) on ``ray_workers`` workers of Ray Train's TorchTrainer, ``config``
    being the script's ``options`` and the ``hooks``, on the Ray cluster at ``ray_address`` ('' = a local one started
    and stopped here), with one GPU per worker unless ``device`` is 'cpu' ('' = where the cluster has GPUs),
    checkpoints in ``ray_storage`` and ``ray_max_failures`` restarts of the worker group; return rank 0's value, or
    raise its one-line error (utils/distributed/ray_train.py)."""
    from utils.distributed.ray_train import RayError, RayJob, fit, outcome_of

    device = str(device).strip().lower()
    if device not in ("", "cpu", "cuda") and not all(part.strip().isdigit() for part in device.split(",")):
        raise RayError(f"--device {device!r} with ray_workers: give 'cpu', '' or CUDA GPUs ('0'); Ray assigns each "
                       "worker its GPU")
    job = RayJob(workers=ray_workers, address=ray_address, use_gpu=None if device == "" else device != "cpu",
                 storage=ray_storage, max_failures=ray_max_failures, backend=backend, timeout_s=timeout_s)
    return outcome_of(fit(loop, {**options, "hooks": list(hooks)}, job))
