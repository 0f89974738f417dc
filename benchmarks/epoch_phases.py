"""Where the CPU time of a train.py run goes, phase by phase (run by ``bench_step.py --epoch`` in a child process).

    python benchmarks/epoch_phases.py --tree . --out phases.json -- --cfg yolov5n --img 320 --epochs 1
    python benchmarks/epoch_phases.py --clock wall --tree . --out phases.json -- --cfg yolo11n --epochs 15

It imports train.py from ``--tree`` (this checkout, or another one for a before/after comparison), wraps the
functions that make up each phase with a timer of the training thread's CPU time (``time.thread_time``) and runs
``train.main``. A phase's time is exclusive: a phase inside another (the data wait inside validation) is counted
once, under "validation: data". Functions a tree does not have are skipped, so older trees can be measured too.
The JSON holds the phases, the training thread's total, the other threads' (plots drawn in the background) and
the DataLoader workers' CPU seconds. With ``--clock wall`` the phases are wall seconds of the training thread
instead (waits included: a phase's share of the run's wall time), the other figures stay CPU seconds.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import json
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODEL_PHASES = ("forward", "loss", "backward", "optimizer step")  # what bench_step's pure step does too
CONTEXT_PHASES = ("validation",)  # phases inside these are reported as "validation: <phase>"
STEP_LOOP = "step loop (progress, vote, bookkeeping)"
# phases that count only inside the step loop or validation; elsewhere (the AMP probe's forward) the outer one's
GENERIC_PHASES = (*MODEL_PHASES, "data (batches from the workers)")

# what a run does once, however many epochs it has (the rest recurs every epoch)
ONCE_PER_RUN = ("start-up imports (train.py and what it imports)", "other (start-up, options, run folder, teardown)",
                "dataset build (labels, synthetic set)", "model build", "autoanchor", "AMP decision",
                "optimizer build", "start-up checks", "loggers' start (TensorBoard)", "validation: plots",
                "other threads (plots drawn in the background)")
WORKERS = "DataLoader workers (augmentation)"
OTHER_THREADS = "other threads (plots drawn in the background)"

# (module, attribute path, phase): module-level functions are patched where train.py's modules look them up
PATCHES = (
    ("utils.training.builder", "load_data_config", "dataset build (labels, synthetic set)"),
    ("utils.training.builder", "load_train_data", "dataset build (labels, synthetic set)"),
    ("utils.training.builder", "build_model", "model build"),
    ("utils.training.builder", "check_anchors", "autoanchor"),
    ("utils.training.builder", "decide_amp", "AMP decision"),
    ("utils.training.builder", "build_updater", "optimizer build"),
    ("utils.training.builder", "ModelEMA", "EMA update"),
    ("utils.training.builder", "fingerprint", "start-up checks"),
    ("utils.training.builder", "write_run_files", "start-up checks"),
    ("utils.hooks", "Hooks.before_train", "loggers' start (TensorBoard)"),
    ("utils.hooks", "Hooks.after_epoch", "epoch hooks (results.csv, TensorBoard)"),
    ("utils.hooks", "Hooks.after_step", "step hooks (batch plots queued)"),
    ("utils.training.checkpointer", "Checkpointer.after_epoch", "checkpoint saving"),
    ("utils.training.loop", "Trainer.validate", "validation"),
    ("utils.evaluation.evaluate", "postprocess", "NMS"),
    ("utils.evaluation.evaluate", "write_outputs", "plots"),
    ("utils.evaluation.evaluate", "_plot_batch", "plots"),
    ("utils.evaluation.evaluate", "_image_stats", "matching"),
    ("utils.training.loop", "Trainer.train_epoch", STEP_LOOP),
    ("utils.training.loss", "ComputeLoss.__call__", "loss"),
    ("utils.training.optim", "ModelEMA.update", "EMA update"),
    ("utils.training.optim", "WeightUpdater.step", "optimizer step"),
    ("torch", "Tensor.backward", "backward"),
    ("torch.nn.modules.module", "Module.__call__", "forward"),
    ("torch.utils.data.dataloader", "_BaseDataLoaderIter.__next__", "data (batches from the workers)"),
    ("torch.utils.data.dataloader", "DataLoader.__iter__", "data (batches from the workers)"),
)


class PhaseClock:
    """Exclusive training-thread CPU seconds per phase: time inside a nested phase is the inner phase's."""

    def __init__(self, now: Callable[[], float] = time.thread_time) -> None:
        self.now = now  # the training thread's CPU seconds
        self.seconds: dict[str, float] = defaultdict(float)
        self.stack: list[list] = []  # [label, start of the current slice]

    def enter(self, phase: str) -> None:
        now = self.now()
        if self.stack:
            outer = self.stack[-1]
            self.seconds[outer[0]] += now - outer[1]
            inner_of = outer[0].split(": ")[-1]
            if phase in GENERIC_PHASES and inner_of not in (STEP_LOOP, *CONTEXT_PHASES):
                phase = outer[0]  # a module inside a module, the loss's modules, the AMP probe's forward
        contexts = [s[0] for s in self.stack if s[0] in CONTEXT_PHASES]
        label = phase if not contexts or phase == contexts[0] else f"{contexts[0]}: {phase.split(': ')[-1]}"
        self.stack.append([label, now])

    def leave(self) -> None:
        now = self.now()
        label, start = self.stack.pop()
        self.seconds[label] += now - start
        if self.stack:
            self.stack[-1][1] = now

    def wrap(self, fn: Any, phase: str) -> Any:
        import threading

        main = threading.main_thread()

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is not main:
                return fn(*args, **kwargs)
            self.enter(phase)
            try:
                return fn(*args, **kwargs)
            finally:
                self.leave()

        return timed


def install(clock: PhaseClock) -> list[str]:
    """Patch every function of PATCHES that exists; returns those that do not (older trees)."""
    missing = []
    for module_name, attr_path, phase in PATCHES:
        try:
            owner = importlib.import_module(module_name)
            *parents, name = attr_path.split(".")
            for part in parents:
                owner = getattr(owner, part)
            fn = getattr(owner, name)
        except (ImportError, AttributeError):
            missing.append(f"{module_name}.{attr_path}")
            continue
        if isinstance(fn, type):  # a class: time its construction (ModelEMA's deepcopy)
            fn.__init__ = clock.wrap(fn.__init__, phase)
        else:
            setattr(owner, name, clock.wrap(fn, phase))
    return missing


CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}  # --clock: what a phase's seconds are


def run(tree: Path, train_args: list[str], clock_name: str = "cpu") -> dict:
    """Import train.py from ``tree`` (timed as start-up imports), patch, train; the seconds by phase on
    ``clock_name``'s clock (CLOCKS)."""
    start_thread, start_process = time.thread_time(), time.process_time()
    os.chdir(tree)
    sys.path.insert(0, str(tree))
    clock = PhaseClock(CLOCKS[clock_name])
    clock.enter("start-up imports (train.py and what it imports)")
    train = importlib.import_module("train")
    clock.leave()
    missing = install(clock)
    clock.enter("other (start-up, options, run folder, teardown)")
    train.main(train.parse_opt(train_args))
    gc.collect()  # the DataLoaders' iterators: their workers are joined, so RUSAGE_CHILDREN counts them
    clock.leave()
    thread_total = time.thread_time() - start_thread
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"phases": dict(clock.seconds), "clock": clock_name, "training_thread_s": thread_total,
            "other_threads_s": max(time.process_time() - start_process - thread_total, 0.0),
            "workers_s": children.ru_utime + children.ru_stime, "missing": missing}


def all_phases(result: dict) -> dict[str, float]:
    """A run's CPU seconds by phase, the other threads and the DataLoader workers among them."""
    return {**result["phases"], OTHER_THREADS: result["other_threads_s"], WORKERS: result["workers_s"]}


def shares(result: dict) -> dict[str, float]:
    """Totals of one run: CPU seconds in all, of the model, and the share that is not the model, for the whole
    run and for an epoch that recurs (without what a run does once)."""
    phases = all_phases(result)
    total = sum(phases.values())
    model = sum(phases.get(p, 0.0) for p in MODEL_PHASES)
    recurring = total - sum(phases.get(p, 0.0) for p in ONCE_PER_RUN)
    return {"total_s": total, "model_s": model, "not_model": 1 - model / total,
            "recurring_s": recurring, "recurring_not_model": 1 - model / recurring}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1], help="checkout to run")
    p.add_argument("--out", type=Path, required=True, help="JSON file for the phases")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                   help="phases in the training thread's CPU seconds or in wall seconds")
    p.add_argument("train_args", nargs=argparse.REMAINDER, help="train.py's arguments after --")
    opt = p.parse_args()
    args = opt.train_args[1:] if opt.train_args[:1] == ["--"] else opt.train_args
    result = run(opt.tree.resolve(), args, opt.clock)
    opt.out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
