"""Hyperparameter files (``data/hyps/*.yaml``): where they are found, what they must hold.

One loader for every caller (training, the dataset's augmentation defaults, evolution), so a file that
trains also augments, and ``--hyp hyp.finetune.yaml`` finds the bundled file by its name. Files are per family:
YOLOv5's (hyp.scratch.yaml, ...) hold box, obj, cls and anchor_t; the anchor-free families' (hyp.anchor-free.yaml)
box, cls and dfl. Which keys a run needs is its family's (utils/training/families.py ``required_hyp``); this
module checks every file for the keys all families need (REQUIRED) and, when told, the family's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from utils.errors import UserError
from utils.paths import ROOT
from utils.safe_yaml import YamlError, load_yaml, shown

HYPS_DIR = ROOT / "data" / "hyps"
SCRATCH_HYP = HYPS_DIR / "hyp.scratch.yaml"
SYNTHETIC_HYP = HYPS_DIR / "hyp.synthetic.yaml"  # tuned so the no-argument run converges in minutes
SYNTHETIC_DATA = ("synthetic.yaml", "synthetic-seg.yaml")  # the built-in sets (the same images) it is tuned for
REQUIRED = ("lr0", "lrf", "momentum", "weight_decay")  # every family's optimizer and schedule read these
TEXT_KEYS = ("optimizer",)  # the only entries that are not numbers


class HypError(UserError, ValueError):
    """A hyperparameter file that is missing, malformed or incomplete."""


def find_hyp_file(path: str | Path) -> Path:
    """``path`` as given, else the bundled file of that name in data/hyps; HypError when neither exists."""
    candidates = [Path(path).expanduser(), HYPS_DIR / Path(path).name]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        raise HypError(f"--hyp {path}: file not found (give a path, or a name in data/hyps such as hyp.scratch.yaml)")
    return found


def default_hyp_file(data: str | Path | None) -> Path:
    """YOLOv5's hyp file without --hyp: the synthetic set's tuned one for the built-in data, else the scratch one
    (a run's default is its family's: utils.training.families.Family.default_hyp_file)."""
    synthetic = data is not None and Path(str(data)).name in SYNTHETIC_DATA and SYNTHETIC_HYP.is_file()
    return SYNTHETIC_HYP if synthetic else SCRATCH_HYP


def load_hyp(source: str | Path | Mapping[str, Any] | None = None, required: Sequence[str] = REQUIRED,
             family: str = "") -> dict[str, Any]:
    """Hyperparameters from a file (or a mapping; None: the scratch file), checked: the ``required`` keys are there
    (``family`` names whose they are, for the message), every value is a number (floats), except ``optimizer``, a
    name."""
    if isinstance(source, Mapping):
        raw, where = dict(source), "hyperparameters"
    else:
        path = find_hyp_file(source or SCRATCH_HYP)
        try:
            raw = load_yaml(path) or {}
        except YamlError as e:
            raise HypError(str(e)) from None
        where = str(path)
    if not isinstance(raw, dict):
        raise HypError(f"{where}: expected a mapping of hyperparameter names to values")
    missing = [k for k in dict.fromkeys((*REQUIRED, *required)) if k not in raw]
    if missing:
        needs = f" (the {family} family needs {', '.join(required)})" if family else ""
        raise HypError(f"{where} lacks {', '.join(missing)}{needs}")
    hyp: dict[str, Any] = {}
    for key, value in raw.items():
        if key in TEXT_KEYS:
            if not isinstance(value, str) or len(value) > 40:
                raise HypError(f"{where}: {shown(key)} must be a name (such as SGD), got {shown(value)}")
            hyp[key] = value
        elif isinstance(value, bool) or not isinstance(value, int | float):
            raise HypError(f"{where}: hyperparameter {shown(key)} must be a number, got {shown(value)}")
        else:
            hyp[key] = float(value)
    return hyp


# Augmentation entries every family's data pipeline reads (with a default when its file lacks one).
AUGMENTATION = ("hsv_h", "hsv_s", "hsv_v", "degrees", "translate", "scale", "shear", "perspective", "flipud",
                "fliplr", "mosaic", "mixup", "copy_paste", "close_mosaic")


def override_hyp(hyp: Mapping[str, Any], items: Sequence[str]) -> dict[str, Any]:
    """``hyp`` with ``--hyp-set`` items (``lr0=0.002``, ``fliplr=0``) over it: each key one the run's
    hyperparameters have (or an augmentation entry), each value a number (``optimizer``: a name); HypError
    naming the item otherwise."""
    import difflib

    result = dict(hyp)
    for item in items:
        key, sep, text = str(item).partition("=")
        key = key.strip()
        if not sep or not key:
            raise HypError(f"--hyp-set {shown(item)}: give KEY=VALUE, such as lr0=0.002")
        if key not in hyp and key not in AUGMENTATION and key not in TEXT_KEYS:
            close = difflib.get_close_matches(key, [*hyp, *AUGMENTATION], n=2, cutoff=0.6)
            hint = f"did you mean {' or '.join(close)}?" if close else "see data/hyps/ for the keys"
            raise HypError(f"--hyp-set {shown(item)}: {shown(key)} is not a hyperparameter of this run; {hint}")
        if key in TEXT_KEYS:
            result[key] = text.strip()
            continue
        try:
            result[key] = float(text)
        except ValueError:
            raise HypError(f"--hyp-set {shown(item)}: {shown(key)} takes a number") from None
    return result
