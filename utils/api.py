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
import io
import os
import shutil
import signal
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from utils.cli import PeerLost
from utils.distributed.launcher import SEPARATE_STORES
from utils.distributed.signals import StopRequested
from utils.errors import UserError


class OptionError(UserError, TypeError):
    """A keyword the script has no option for, or a value its option cannot take; the message names it."""


def option_names(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every keyword a script's API takes: each option's dest and each of its long flags with '_' for '-'
    (``img_size``, ``imgsz``, ``img``; the hidden reference-only flags as ``dnn`` and ``refused_dnn``)."""
    names: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        names[action.dest] = action
        for flag in action.option_strings:
            if flag.startswith("--"):
                names.setdefault(flag[2:].replace("-", "_"), action)
    return names


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
    """The command line that means ``options`` (keywords named as :func:`option_names`); OptionError for an
    unknown keyword (naming the closest one) or one option given under two names."""
    names, argv, seen = option_names(parser), [], {}
    for name, value in options.items():
        if name not in names:
            raise _unknown(name, list(names), script)
        action = names[name]
        if action.dest in seen:
            raise OptionError(f"{script}.run(): {seen[action.dest]!r} and {name!r} are the same option; give one")
        seen[action.dest] = name
        argv += _flag_values(action, name, value, script)
    return argv


def parse(parse_opt: Callable[[list[str]], argparse.Namespace], argv: list[str], script: str) -> argparse.Namespace:
    """``parse_opt(argv)``, its argparse errors (which print usage and exit) raised as one-line OptionErrors."""
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
    ``torchrun --standalone --nproc_per_node N`` does (c10d rendezvous on a free local port, spawned processes, no
    restarts); return rank 0's value, or raise the job's error (:func:`first_error`). ``worker`` must be a
    module-level function (it is pickled by name) returning :func:`outcome`'s record."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if not isinstance(nproc_per_node, int) or isinstance(nproc_per_node, bool) or nproc_per_node < 1:
        raise OptionError(f"nproc_per_node={nproc_per_node!r}: give the number of processes, 1 or more")
    log_dir = Path(tempfile.mkdtemp(prefix="yolo-launch-"))  # the launcher's error files; removed after
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc_per_node, run_id=uuid.uuid4().hex,
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, start_method="spawn",
                          logs_specs=DefaultLogsSpecs(log_dir=str(log_dir)))
    try:
        with _process_state_kept():
            outcomes = elastic_launch(config, worker)(*args)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    error = first_error(outcomes)
    if error is not None:
        raise error
    return outcomes[0].value


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
