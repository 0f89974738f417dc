"""--hook refuses, before calling it, anything that is not a HookBase subclass or a function annotated to return one."""

from __future__ import annotations

from pathlib import Path

import pytest

from utils.hooks import HookBase, HookError, load_hook

CALLS: list[str] = []


class Counter(HookBase):
    pass


def annotated(tag: str = "") -> Counter:
    CALLS.append(f"annotated{tag}")
    return Counter()


def unannotated(tag: str = ""):  # noqa: ANN201
    CALLS.append(f"unannotated{tag}")
    return Counter()


def returns_a_string(tag: str = "") -> str:
    CALLS.append(f"string{tag}")
    return tag


def test_only_hook_factories_are_called(tmp_path: Path) -> None:
    CALLS.clear()
    assert isinstance(load_hook("tests.utils.test_hook_factories:Counter"), Counter)
    assert isinstance(load_hook("tests.utils.test_hook_factories:annotated(tag='x')"), Counter)
    marker = tmp_path / "ran"
    for spec in ("tests.utils.test_hook_factories:unannotated", "tests.utils.test_hook_factories:returns_a_string",
                 f"os:system(command='touch {marker}')", f"pathlib:Path(x={str(marker)!r})", "builtins:print"):
        with pytest.raises(HookError, match="neither a HookBase subclass nor a function annotated") as info:
            load_hook(spec)
        assert "\n" not in str(info.value) and "it was not called" in str(info.value)
    assert CALLS == ["annotatedx"] and not marker.exists()
