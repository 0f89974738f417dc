"""The words users bring from ultralytics, in one table: ``key=value`` arguments (``model=yolo11n.pt imgsz=640
batch=16 device=0,1``) and ``--model``, rewritten into the script's own flags before its parser reads them.

``KEYS`` is the only place that says what one of their keys means here. A key may also be one of the script's
own options with ``_`` for ``-`` (``batch_size=16``, ``img=64``), as the Python API's keywords are. A word that
is neither gets one line naming the nearest valid keys. YOLOv5's flag spellings (``--batch``, ``--img``,
``--conf``) are explicit aliases of the parsers themselves (utils/cli.py), never abbreviations.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from utils.errors import UserError

VALUE, LIST, SWITCH, UNSET, OPTIONAL, CHOICE, HYP, MODEL, DEVICE = (
    "value", "list", "switch", "unset", "optional", "choice", "hyp", "model", "device")
HYP_FLAG = "--hyp-set"  # train.py's flag for one hyperparameter (KEY=VALUE), over the hyp file's value
TRUE, FALSE = ("true", "yes", "1"), ("false", "no", "0", "none")


class SpellingError(UserError, ValueError):
    """A ``key=value`` word the script cannot take; the message names the nearest valid keys."""


@dataclass(frozen=True)
class Key:
    """What one ultralytics key means here: ``flag`` takes the value as ``kind`` says.

    VALUE one value; LIST values separated by commas (``imgsz=640,480``); SWITCH ``True`` gives the flag, ``False``
    nothing; UNSET ``False`` gives the flag (``save=False`` is ``--nosave``); OPTIONAL ``True`` gives the bare flag,
    another value the flag and the value (``resume``, ``cache``); CHOICE the value through ``choices``; HYP
    ``--hyp-set key=value``; MODEL ``--weights``, or ``--cfg`` for a .yaml; DEVICE ``0,1`` from ``[0, 1]`` too."""

    flag: str
    kind: str = VALUE
    choices: tuple[tuple[str, str], ...] = ()


_HYPERPARAMETERS = ("lr0", "lrf", "momentum", "weight_decay", "warmup_epochs", "warmup_momentum", "warmup_bias_lr",
                    "box", "cls", "dfl", "close_mosaic", "hsv_h", "hsv_s", "hsv_v", "degrees", "translate", "scale",
                    "shear", "perspective", "flipud", "fliplr", "mosaic", "mixup", "copy_paste")

# ultralytics key -> what it means here (their default.yaml's names; the modes' keys together).
KEYS: dict[str, Key] = {
    "model": Key("--weights", MODEL),
    "data": Key("--data"),
    "epochs": Key("--epochs"),
    "imgsz": Key("--img-size", LIST),
    "batch": Key("--batch-size"),
    "device": Key("--device", DEVICE),
    "workers": Key("--workers"),
    "project": Key("--project"),
    "name": Key("--name"),
    "exist_ok": Key("--exist-ok", SWITCH),
    "resume": Key("--resume", OPTIONAL),
    "patience": Key("--patience"),
    "optimizer": Key("--optimizer"),
    "cos_lr": Key("--cos-lr", SWITCH),
    "cache": Key("--cache", OPTIONAL),
    "rect": Key("--rect", SWITCH),
    "single_cls": Key("--single-cls", SWITCH),
    "fraction": Key("--fraction"),
    "freeze": Key("--freeze", LIST),
    "seed": Key("--seed"),
    "multi_scale": Key("--multi-scale", SWITCH),
    "save_period": Key("--save-period"),
    "val": Key("--noval", UNSET),
    "plots": Key("--noplots", UNSET),
    "amp": Key("--amp", CHOICE, (("true", "auto"), ("false", "off"))),
    "label_smoothing": Key("--label-smoothing"),
    "conf": Key("--conf-thres"),
    "iou": Key("--iou-thres"),
    "max_det": Key("--max-det"),
    "source": Key("--source"),
    "save_txt": Key("--save-txt", SWITCH),
    "save_conf": Key("--save-conf", SWITCH),
    "save_crop": Key("--save-crop", SWITCH),
    "save": Key("--nosave", UNSET),
    "show": Key("--view-img", SWITCH),
    "show_labels": Key("--hide-labels", UNSET),
    "show_conf": Key("--hide-conf", UNSET),
    "line_width": Key("--line-thickness"),
    "classes": Key("--classes", LIST),
    "agnostic_nms": Key("--agnostic-nms", SWITCH),
    "augment": Key("--augment", SWITCH),
    "visualize": Key("--visualize", SWITCH),
    "retina_masks": Key("--retina-masks", SWITCH),
    "vid_stride": Key("--vid-stride"),
    "tracker": Key("--track"),
    "split": Key("--task"),
    "save_json": Key("--save-json", SWITCH),
    "verbose": Key("--verbose", SWITCH),
    "half": Key("--half", SWITCH),
    "format": Key("--include", LIST),
    "int8": Key("--int8", SWITCH),
    "dynamic": Key("--dynamic", SWITCH),
    "simplify": Key("--simplify", SWITCH),
    "opset": Key("--opset"),
    **{name: Key(HYP_FLAG, HYP) for name in _HYPERPARAMETERS},
}
_WORD = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]*)=(.*)$", re.S)


def option_names(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every name of a parser's options as a keyword: each option's dest and each long flag with '_' for '-'
    (``img_size``, ``imgsz``, ``img``; hidden reference-only flags too)."""
    names: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        names[action.dest] = action
        for flag in action.option_strings:
            if flag.startswith("--"):
                names.setdefault(flag[2:].replace("-", "_"), action)
    return names


def flags_of(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


def nearest(word: str, candidates: Iterable[str], count: int = 3) -> list[str]:
    """The candidates closest to ``word`` (difflib's ratio, at least 0.6), best first: those within 0.1 of the
    best one's, at most ``count``."""
    scored = sorted(((difflib.SequenceMatcher(None, word, c).ratio(), c) for c in set(candidates)),
                    key=lambda pair: (-pair[0], pair[1]))
    best = scored[0][0] if scored else 0.0
    return [c for ratio, c in scored if ratio >= max(0.6, best - 0.1)][:count]


def valid_keys(parser: argparse.ArgumentParser) -> list[str]:
    """The keys a script takes: the ultralytics keys whose flag it has, and its own option names."""
    flags = flags_of(parser)
    own = [name for name, action in option_names(parser).items()
           if not name.startswith("refused_") and action.help != argparse.SUPPRESS]
    return [key for key, rule in KEYS.items() if rule.flag in flags] + own


def _truth(word: str, value: str) -> bool:
    if value.lower() in TRUE:
        return True
    if value.lower() in FALSE:
        return False
    raise SpellingError(f"{word}: give True or False")


def _values(value: str) -> list[str]:
    """``640,480``, ``[640, 480]`` or ``640 480`` -> ['640', '480']."""
    return [v for v in re.split(r"[,\s]+", value.strip().strip("[]()")) if v]


def _rule_words(word: str, key: str, rule: Key, value: str) -> list[str]:
    """The argv words of one ultralytics key."""
    if rule.kind == MODEL:
        return ["--cfg" if value.lower().endswith((".yaml", ".yml")) else "--weights", value]
    if rule.kind in (SWITCH, UNSET):
        return [rule.flag] if _truth(word, value) == (rule.kind == SWITCH) else []
    if rule.kind == OPTIONAL:
        if value.lower() in TRUE or value.lower() in FALSE:
            return [rule.flag] if _truth(word, value) else []
        return [rule.flag, value]
    if rule.kind == CHOICE:
        return [rule.flag, dict(rule.choices).get(value.lower(), value)]
    if rule.kind == HYP:
        return [rule.flag, f"{key}={value}"]
    if rule.kind == LIST:
        return [rule.flag, *_values(value)]
    if rule.kind == DEVICE:
        return [f"{rule.flag}={','.join(_values(value))}"]
    return [f"{rule.flag}={value}"]  # '=' keeps a value that starts with '-' a value


def _own_words(word: str, action: argparse.Action, value: str) -> list[str]:
    """The argv words of one of the script's own options given as ``name=value``."""
    flag = next(s for s in action.option_strings if s.startswith("--"))
    if action.nargs == 0:
        return [flag] if _truth(word, value) else []
    if action.nargs == "?" and (value.lower() in TRUE or value.lower() in FALSE):
        return [flag] if _truth(word, value) else []
    if action.nargs in (None, "?"):
        return [f"{flag}={value}"]
    return [flag, *_values(value)]


def _unknown(word: str, key: str, parser: argparse.ArgumentParser) -> SpellingError:
    close = nearest(key, valid_keys(parser))
    hint = f"; did you mean {', '.join(k + '=' for k in close)}?" if close else \
        f"; see {parser.prog} --help or docs/from-ultralytics.md"
    return SpellingError(f"{word}: unknown key {key!r}{hint}")


def _translate_word(word: str, key: str, value: str, parser: argparse.ArgumentParser) -> list[str]:
    own = option_names(parser)
    if key in KEYS:
        rule = KEYS[key]
        words = _rule_words(word, key, rule, value)
        missing = [w for w in words if w.startswith("--") and w.split("=")[0] not in flags_of(parser)]
        if missing:
            close = nearest(key, valid_keys(parser))
            hint = f"did you mean {', '.join(k + '=' for k in close)}?" if close else f"see {parser.prog} --help"
            raise SpellingError(f"{word}: {parser.prog} has no {missing[0].split('=')[0]}, which {key}= means "
                                f"(another script's option); {hint}")
        return words
    if key in own and not key.startswith("refused_"):
        return _own_words(word, own[key], value)
    raise _unknown(word, key, parser)


def _values_taken(parser: argparse.ArgumentParser, word: str) -> int | None:
    """How many of the next words are the value of flag ``word`` whatever they look like: 1 for a one-value flag,
    None (all up to the next flag) for one whose values are themselves KEY=VALUE (--hyp-set), else 0."""
    for action in parser._actions:
        if word in action.option_strings:
            if action.nargs is None:
                return 1
            return None if "=" in str(action.metavar or "") else 0
    return 0


def translate(argv: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """``argv`` with every ``key=value`` word (and ``--model X``) rewritten as the parser's flags; a word that is
    the value of a one-value flag (``--name a=b``) or comes after ``--`` stays as it is. SpellingError (one line,
    naming the nearest keys) for a key this script does not take. ``model=last.pt resume=True`` is
    ``--resume last.pt``: ultralytics resumes the run of that checkpoint."""
    out: list[str] = []
    words = [w if isinstance(w, str) else str(w) for w in argv]
    keys: dict[str, str] = {}  # the ultralytics keys given, for the resume rule
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            out += words[i:]
            break
        if word == "--model" or word.startswith("--model="):
            value = word.partition("=")[2] if "=" in word else (words[i + 1] if i + 1 < len(words) else "")
            i += 1 if "=" in word else 2
            keys["model"] = value
            out += _translate_word(f"--model {value}", "model", value, parser)
            continue
        match = _WORD.match(word) if not word.startswith("-") else None
        if match is None:
            out.append(word)
            taken = _values_taken(parser, word)
            end = len(words) if taken is None else min(i + 1 + taken, len(words))
            while i + 1 < end and (taken or not words[i + 1].startswith("-")):
                out.append(words[i + 1])
                i += 1
            i += 1
            continue
        key = match[1].replace("-", "_")
        keys[key] = match[2]
        out += _translate_word(word, key, match[2], parser)
        i += 1
    model, resume = keys.get("model", ""), keys.get("resume", "").lower()
    if resume in TRUE and model.endswith(".pt") and "--resume" in flags_of(parser):
        weights = out.index("--weights")
        out[weights:weights + 2] = []
        out[out.index("--resume") + 1:out.index("--resume") + 1] = [model]
    return out


def key_table() -> str:
    """KEYS as the markdown table docs/from-ultralytics.md shows (the hyperparameters on one row)."""
    meaning = {
        VALUE: "`{flag} VALUE`", LIST: "`{flag} A B` (`{key}=A,B`)", SWITCH: "`{flag}` when True",
        UNSET: "`{flag}` when False", OPTIONAL: "`{flag}` when True, else `{flag} VALUE`",
        MODEL: "`--weights` for a `.pt` (with `resume=True`: `--resume` it), `--cfg` for a `.yaml`",
        DEVICE: "`{flag} 0,1` (`[0, 1]` too): one process per GPU",
    }
    rows = ["| key | here |", "|---|---|"]
    for key, rule in KEYS.items():
        if rule.kind == HYP:
            continue
        if rule.kind == CHOICE:
            text = ", ".join(f"`{rule.flag} {ours}` when {theirs.title()}" for theirs, ours in rule.choices)
        else:
            text = meaning[rule.kind].format(flag=rule.flag, key=key)
        rows.append(f"| `{key}` | {text} |")
    hyps = [key for key, rule in KEYS.items() if rule.kind == HYP]
    rows.append(f"| {', '.join(f'`{k}`' for k in hyps)} | `{HYP_FLAG} KEY=VALUE` (train.py) |")
    return "\n".join(rows)
