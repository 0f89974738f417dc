"""--view-img: a window where a display exists, one warning line where none does."""

from __future__ import annotations

import cv2
import numpy as np

from utils.plots import viewer


def test_no_display_is_detected(monkeypatch) -> None:
    monkeypatch.setattr(viewer.sys, "platform", "linux")
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    assert viewer.display_problem() in ("no display (DISPLAY is not set)",
                                        "this OpenCV has no GUI support (opencv-python-headless?)")
    monkeypatch.setattr(cv2, "getBuildInformation", lambda: "  GUI:                           NONE\n")
    monkeypatch.setenv("DISPLAY", ":0")
    assert viewer.display_problem() == "this OpenCV has no GUI support (opencv-python-headless?)"


def test_a_window_that_cannot_open_disables_the_viewer_with_one_warning(monkeypatch, caplog) -> None:
    monkeypatch.setattr(viewer, "display_problem", lambda: None)

    def refuse(*args: object) -> None:
        raise cv2.error("OpenCV(5.0) error: (-2:Unspecified error) The function is not implemented")

    monkeypatch.setattr(cv2, "namedWindow", refuse)
    shown = viewer.Viewer(True)
    for _ in range(3):
        shown.show("frame", np.zeros((4, 4, 3), np.uint8))
    assert not shown.enabled
    warnings = [r.getMessage() for r in caplog.records if "--view-img" in r.getMessage()]
    assert len(warnings) == 1 and "cannot open a window (" in warnings[0]
