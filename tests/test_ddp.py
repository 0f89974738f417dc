"""train.py under torch.distributed on CPU (gloo): torchrun runs, one DDP step against one process, two
"nodes", a failing rank, decisions broadcast from rank 0, and the start-up agreement check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.helpers import ROOT, free_port, in_our_code, job_env
from tests.test_readme import readme_torchrun

pytestmark = [pytest.mark.ddp, pytest.mark.slow]
FAIL_RANK1 = "tests.plugins.faults:FailAt(rank=1, epoch=0, batch=1)"


def train_flags(tiny_cfg_file: Path, tiny_dataset: Path, project: Path, *extra: str) -> list[str]:
    return ["train.py", "--cfg", str(tiny_cfg_file), "--data", str(tiny_dataset), "--img", "64", "--batch-size", "8",
            "--epochs", "2", "--device", "cpu", "--workers", "0", "--noautoanchor", "--project", str(project),
            "--ddp-timeout", "120", *extra]


def launch(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *args], cwd=ROOT, env=job_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # bytes: keep tqdm's \r in a line


def collect(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, list[tuple[float, str]], float]:
    """(exit code, timestamped output lines (stdout and stderr), exit time); kills the job on timeout."""
    lines: list[tuple[float, str]] = []

    def pump(stream):
        for line in stream:
            lines.append((time.monotonic(), line.decode(errors="replace").rstrip("\n")))

    pumps = [threading.Thread(target=pump, args=(s,), daemon=True) for s in (proc.stdout, proc.stderr)]
    for t in pumps:
        t.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
        pytest.fail(f"job did not end within {timeout} s:\n" + "\n".join(text for _, text in lines[-40:]))
    ended = time.monotonic()
    for t in pumps:
        t.join(timeout=10)
    return rc, lines, ended


def text_of(lines: list[tuple[float, str]]) -> str:
    return "\n".join(text for _, text in lines)


def epoch_lines(lines: list[tuple[float, str]], epoch: int, epochs: int) -> list[str]:
    """Finished epoch progress lines (a tqdm line's last carriage-return segment) for ``epoch``."""
    tag = f"{epoch}/{epochs - 1}"
    return [t for _, t in lines if t.split("\r")[-1].split() and t.split("\r")[-1].split()[0] == tag]


def with_option(words: list[str], option: str, value: str) -> list[str]:
    """``words`` with the value after ``option`` replaced."""
    i = words.index(option)
    return [*words[:i + 1], value, *words[i + 2:]]


def test_two_process_run_prints_once_and_exits_promptly(tiny_cfg_file, tiny_dataset, tmp_path):
    """The README's one-machine command, with 2 processes for the 2-core CPU, a free port, and the tiny data, model
    and CPU device given after its own flags (the later value of a flag wins)."""
    launcher, script = readme_torchrun("DDP on one machine")
    args = [*with_option(launcher, "--nproc_per_node", "2"), "--master_addr", "127.0.0.1", "--master_port",
            str(free_port()), *script, *train_flags(tiny_cfg_file, tiny_dataset, tmp_path)[1:]]
    rc, lines, _ = collect(launch(args))
    output = text_of(lines)
    assert rc == 0, output[-3000:]
    assert len(epoch_lines(lines, 0, 2)) == 1 and len(epoch_lines(lines, 1, 2)) == 1, output[-3000:]
    assert output.count("Starting training for 2 epochs") == 1 and output.count("2 epochs completed in") == 1
    assert "batch 4 per rank, 2 ranks" in output
    # no hang after the last epoch: every rank tore down its group and the job exited 0 within collect()'s timeout
    # (a rank left waiting in a collective would end with the --ddp-timeout error instead, rc != 0)
    run_dir = tmp_path / "exp"
    assert (run_dir / "weights" / "last.pt").is_file() and len((run_dir / "results.csv").read_text().splitlines()) == 3


def test_batch_not_divisible_by_world_size_is_a_one_line_error(tiny_cfg_file, tiny_dataset, tmp_path):
    args = ["--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
            *train_flags(tiny_cfg_file, tiny_dataset, tmp_path), "--batch-size", "3"]
    rc, lines, _ = collect(launch(args), timeout=120)
    errors = [t for _, t in lines if t.startswith("train: error:")]
    assert rc != 0 and errors, text_of(lines)
    assert "--batch-size 3 must be a positive multiple of the world size 2" in errors[0]
    assert not any(in_our_code(t) for _, t in lines), "a traceback from our code"  # torchrun's own
    # ChildFailedError report follows; the workers themselves printed only the one line


def test_two_nodes_on_localhost_with_c10d_rendezvous(tiny_cfg_file, tiny_dataset, tmp_path):
    """The README's several-machines command as two 1-process "machines" on loopback (its endpoint HOST:29400 a
    free port of 127.0.0.1), the tiny data, model and CPU device given after its own flags."""
    launcher, script = readme_torchrun("DDP on several machines")
    common = with_option(with_option(with_option(launcher, "--nproc_per_node", "1"), "--rdzv-endpoint",
                                     f"127.0.0.1:{free_port()}"), "--rdzv-id", f"two-nodes-{os.getpid()}")
    flags = [*script, *train_flags(tiny_cfg_file, tiny_dataset, tmp_path, "--epochs", "1", "--noplots")[1:]]
    nodes = [launch([*common, *flags]) for _ in range(2)]
    results = [collect(node) for node in nodes]
    for rc, lines, _ in results:
        assert rc == 0, text_of(lines)[-3000:]
    combined = "\n".join(text_of(lines) for _, lines, _ in results)
    assert combined.count("1 epochs completed in") == 1 and "batch 4 per rank, 2 ranks" in combined


def test_a_failing_rank_ends_the_job_and_is_named(tiny_cfg_file, tiny_dataset, tmp_path):
    args = ["--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
            *train_flags(tiny_cfg_file, tiny_dataset, tmp_path), "--hook", FAIL_RANK1]
    rc, lines, _ = collect(launch(args), timeout=180)
    output = text_of(lines)
    assert rc != 0
    fault = [t for t, text in lines if "rank 1: test fault injected at epoch 0 batch 1" in text]
    assert fault, output[-3000:]
    assert "epochs completed" not in output
    # the live rank says once which rank left it (it noticed the loss, it did not wait for the collective timeout),
    # instead of a traceback of its own failed collective
    lost = [text for _, text in lines if "lost its peers during a collective" in text]
    assert len(lost) == 1 and "(rank 1 last seen in train, epoch 0, batch 1)" in lost[0], output[-3000:]
    assert "timed out" not in lost[0].lower() and "timeout" not in lost[0].lower(), lost[0]
    assert output.count("Traceback") == 2, output[-3000:]  # rank 1's own error, and torchrun's report of it


# --- in-process 2-rank group (torch.multiprocessing, gloo) -----------------------------------------------------


def _rank_worker(rank: int, port: int, out_dir: str, cfg: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import utils.distributed.comm as dist

    dist.init_distributed("cpu", "gloo", 300, 300)
    try:
        results = {"ddp_step": _ddp_step(rank, cfg, Path(out_dir)), **_broadcast_decisions(rank)}
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        dist.cleanup(clean_exit=True)


def _frozen_bn(model: torch.nn.Module) -> torch.nn.Module:
    """Training mode with BatchNorm on its running statistics: DDP and one process then compute the same."""
    model.train()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.eval()
    return model


def _step(cfg_file: str, batch: tuple, save_dir: Path) -> torch.Tensor:
    """The builder's trainer (DDP-wrapped when the group has 2 ranks) through one train_epoch over one batch;
    the flattened parameters after it."""
    from utils.training.builder import TrainData, build_trainer
    from utils.training.config import RunConfig

    hyp = {"lr0": 0.01, "lrf": 1.0, "momentum": 0.9, "weight_decay": 5e-4, "warmup_epochs": 0.0, "box": 0.05,
           "cls": 0.5, "obj": 1.0, "anchor_t": 4.0}
    # total batch 64, the nominal one: the optimizer steps after the batch (its images stand for the rank's share)
    config = RunConfig(cfg=cfg_file, epochs=1, batch_size=64, img_size=64, optimizer="SGD", amp="off", noplots=True,
                       save_dir=str(save_dir))
    trainer = build_trainer(config, hyp, torch.device("cpu"), data=TrainData([batch], None, None, ["a", "b", "c"]))
    _frozen_bn(trainer.model_without_ddp)
    trainer.model.train = lambda mode=True: trainer.model  # keep the frozen BN through train_epoch's .train()
    trainer.train_epoch(0)
    assert trainer.updater.steps == 1
    return torch.cat([p.detach().flatten() for p in trainer.model_without_ddp.parameters()])


class _single_process:
    """Inside: utils.distributed.comm answers as one process would (world size 1, gathers of this rank's object
    alone), though the group is up."""

    def __enter__(self) -> None:
        import utils.distributed.comm as dist

        self.saved = dist.get_world_size, dist.all_gather_object
        dist.get_world_size = lambda: 1
        dist.all_gather_object = lambda obj, *args, **kwargs: [obj]

    def __exit__(self, *exc: object) -> None:
        import utils.distributed.comm as dist

        dist.get_world_size, dist.all_gather_object = self.saved


def _ddp_step(rank: int, cfg: str, out_dir: Path) -> str:
    imgs = torch.randint(0, 256, (4, 3, 64, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    boxes = torch.tensor([[0, 1, 0.5, 0.5, 0.4, 0.5], [0, 2, 0.25, 0.3, 0.2, 0.2], [1, 0, 0.6, 0.4, 0.5, 0.3]])
    params = _step(cfg, (imgs[2 * rank:2 * rank + 2], boxes, ("a", "b"), None), out_dir / "ddp")
    torch.save(params, out_dir / f"params{rank}.pt")
    # one process on both ranks' images in one batch; every rank computes it, so no rank waits on another's solo work
    union = torch.cat((boxes, boxes + torch.tensor([2.0, 0, 0, 0, 0, 0])))
    with _single_process():
        single = _step(cfg, (imgs, union, ("a", "b", "c", "d"), None), out_dir / f"single{rank}")
    torch.save(single, out_dir / f"params_single{rank}.pt")
    return "done"


def _broadcast_decisions(rank: int) -> dict:
    from types import SimpleNamespace

    import utils.distributed.comm as dist
    from utils.training.amp import decide_amp
    from utils.training.early_stop import EarlyStopping
    from utils.training.loop import Trainer

    run = SimpleNamespace(config=SimpleNamespace(multi_scale=True, seed=rank, img_size=64), grid=32,
                          train_loader=[None] * 20)
    sizes = Trainer.step_sizes(run, epoch=3)  # each rank has its own seed; rank 0's draw wins
    stopper = EarlyStopping(patience=1)
    stopper(0, 0.5)
    stop = dist.main_decides(lambda: stopper(1 if rank == 0 else 0, 0.1))  # only rank 0 would stop
    try:
        dist.check_agreement({"params": 100 + rank, "config": "same"})
        agreement = "passed"
    except dist.DistError as e:
        agreement = str(e)
    return {"sizes": sizes, "stop": stop, "amp": decide_amp(None, torch.device("cpu"), "off"),
            "agreement": agreement}


def test_ddp_step_equals_one_process_on_the_union_and_rank0_decisions_are_shared(tiny_cfg, tiny_cfg_file, tmp_path):
    mp.start_processes(_rank_worker, args=(free_port(), str(tmp_path), str(tiny_cfg_file)), nprocs=2,
                       start_method="spawn")
    p0 = torch.load(tmp_path / "params0.pt", weights_only=True)
    p1 = torch.load(tmp_path / "params1.pt", weights_only=True)
    single = torch.load(tmp_path / "params_single0.pt", weights_only=True)
    assert torch.equal(single, torch.load(tmp_path / "params_single1.pt", weights_only=True))
    assert torch.equal(p0, p1)  # DDP keeps the replicas identical
    initial = torch.cat([p.detach().flatten() for p in _initial_params(tiny_cfg)])
    assert (p0 - initial).abs().max() > 1e-4  # the step moved the weights
    assert torch.allclose(p0, single, atol=1e-5, rtol=0), (p0 - single).abs().max()
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["sizes"] == r1["sizes"] and len(set(r0["sizes"])) > 1 and all(s % 32 == 0 for s in r0["sizes"])
    assert r0["stop"] is True and r1["stop"] is True
    assert r0["amp"] is False and r1["amp"] is False
    for r in (r0, r1):
        assert "rank 1 differs from rank 0 in params: 101 vs 100" in r["agreement"]


def _initial_params(cfg: dict) -> list[torch.Tensor]:
    from models.yolo import Model

    torch.manual_seed(0)
    return list(Model(cfg).parameters())
