"""Hyperparameter evolution (``train.py --evolve N``): short runs whose hyperparameters are mutated from the
fittest so far, a genetic search over the gains, learning rates and augmentation strengths. The bounds are
YOLOv5's, with the model family's own where its gains differ (utils/training/families.py ``evolve_bounds``) and its
task's for the gains only its loss reads (utils/tasks/registry.py ``Task.evolve_bounds``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch
import yaml

from utils.distributed import comm as dist
from utils.log import LOGGER
from utils.paths import check_run_name, new_run_folder
from utils.tasks.registry import get_task
from utils.training.builder import model_kind
from utils.training.config import RunConfig
from utils.training.families import get_family
from utils.training.fitness import fitness
from utils.weights.checkpoint import to_plain

# Hyperparameter evolution: key -> (mutation gain, lower bound, upper bound); gain 0 keeps the value fixed.
EVOLVE_BOUNDS = {
    "lr0": (1, 1e-5, 1e-1), "lrf": (1, 0.01, 1.0), "momentum": (0.3, 0.6, 0.98), "weight_decay": (1, 0.0, 0.001),
    "warmup_epochs": (1, 0.0, 5.0), "warmup_momentum": (1, 0.0, 0.95), "warmup_bias_lr": (1, 0.0, 0.2),
    "box": (1, 0.02, 0.2), "cls": (1, 0.2, 4.0), "cls_pw": (1, 0.5, 2.0), "obj": (1, 0.2, 4.0),
    "obj_pw": (1, 0.5, 2.0), "iou_t": (0, 0.1, 0.7), "anchor_t": (1, 2.0, 8.0), "fl_gamma": (0, 0.0, 2.0),
    "hsv_h": (1, 0.0, 0.1), "hsv_s": (1, 0.0, 0.9), "hsv_v": (1, 0.0, 0.9), "degrees": (1, 0.0, 45.0),
    "translate": (1, 0.0, 0.9), "scale": (1, 0.0, 0.9), "shear": (1, 0.0, 10.0), "perspective": (0, 0.0, 0.001),
    "flipud": (1, 0.0, 1.0), "fliplr": (0, 0.0, 1.0), "mosaic": (1, 0.0, 1.0), "mixup": (1, 0.0, 1.0)}


def mutate(base: dict, history: list[tuple[float, dict]], rng: np.random.Generator,
           probability: float = 0.8, sigma: float = 0.2,
           bounds: Mapping[str, tuple[float, float, float]] = EVOLVE_BOUNDS) -> dict:
    """A new hyp: a parent picked among the 5 fittest (fitness-weighted), each gene scaled by ~N(1, sigma) and kept
    within ``bounds`` (key -> (mutation gain, low, high))."""
    if not history:
        return dict(base)
    top = sorted(history, key=lambda h: h[0], reverse=True)[:5]
    weights = np.array([f for f, _ in top]) - min(f for f, _ in top) + 1e-6
    parent = top[rng.choice(len(top), p=weights / weights.sum())][1]
    keys = [k for k in bounds if k in parent]
    gains = np.array([bounds[k][0] for k in keys], dtype=float)
    factors = np.ones(len(keys))
    while len(keys) and np.all(factors == 1):  # mutate until something changes
        mask = rng.random(len(keys)) < probability
        factors = (gains * mask * rng.standard_normal(len(keys)) * rng.random() * sigma + 1).clip(0.3, 3.0)
    child = dict(parent)
    for key, factor in zip(keys, factors):
        low, high = bounds[key][1:]
        child[key] = round(float(np.clip(parent[key] * factor, low, high)), 5)
    return child


def evolve(base_hyp: dict, config: RunConfig, device: torch.device,
           train: Callable[[dict, RunConfig, torch.device], tuple[dict[str, float], dict]]) -> dict:
    """--evolve N: N short ``train`` runs (final-epoch validation only, final checkpoint only), each with hyps
    mutated from the fittest so far; writes evolve.csv and hyp_evolve.yaml (the best). All ranks must call it.

    ``train`` returns the metrics and the hyperparameters the run trained with, which are what the history keeps:
    with --optimizer auto the first run's rule sets lr0, momentum and warmup_bias_lr and names its optimizer in the
    hyp (``optimizer``), so later generations mutate those values and train with them (the rule defers to a hyp's
    own optimizer entry), and evolve.csv records what each run used."""
    config = config.replace(noval=True, nosave=True)
    family, task = model_kind(config)
    bounds = {**EVOLVE_BOUNDS, **get_family(family).evolve_bounds, **get_task(task).evolve_bounds}
    check_run_name(config.name)
    evolve_dir = dist.main_decides(lambda: new_run_folder(config.project, f"{config.name}-evolve", config.exist_ok))
    rng, history = np.random.default_rng(config.seed), []
    for generation in range(config.evolve):
        hyp = dist.main_decides(lambda: mutate(base_hyp, history, rng, bounds=bounds))
        metrics, used = train(hyp, config.replace(save_dir=str(evolve_dir / f"gen{generation}")), device)
        history.append((fitness(metrics), used))
        if dist.is_main_process():
            _write_evolution(evolve_dir, history, metrics)
    LOGGER.info(f"Hyperparameter evolution finished: {len(history)} runs; best hyps in {evolve_dir}/hyp_evolve.yaml")
    return max(history, key=lambda h: h[0])[1]


def _write_evolution(evolve_dir: Path, history: list[tuple[float, dict]], metrics: dict[str, float]) -> None:
    """Append the latest generation to evolve.csv and rewrite hyp_evolve.yaml with the fittest hyps."""
    fit, hyp = history[-1]
    csv_path = evolve_dir / "evolve.csv"
    keys = [k for k, v in hyp.items() if isinstance(v, (int, float))]
    header = "" if csv_path.exists() else ",".join(["fitness", *metrics, *keys]) + "\n"
    with open(csv_path, "a") as f:
        f.write(header + ",".join(f"{v:.5g}" for v in [fit, *metrics.values(), *(float(hyp[k]) for k in keys)]) + "\n")
    best_fit, best = max(history, key=lambda h: h[0])
    text = f"# Hyperparameter evolution: best fitness {best_fit:.5g} of {len(history)} runs\n"
    (evolve_dir / "hyp_evolve.yaml").write_text(text + yaml.safe_dump(to_plain(best), sort_keys=False))
