"""--view-img: each annotated frame shown in a window (one per source) where a display exists.

Where none does (a server, a container, an OpenCV built without a GUI), one warning line says so and the run goes
on: the results are still saved.
"""

from __future__ import annotations

import os
import re
import sys

import cv2
import numpy as np

from utils.log import LOGGER


def display_problem() -> str | None:
    """Why no window can be opened here, or None when one can."""
    gui = re.search(r"GUI:\s*(\S+)", cv2.getBuildInformation())
    if gui and gui.group(1).upper() == "NONE":
        return "this OpenCV has no GUI support (opencv-python-headless?)"
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        return "no display (DISPLAY is not set)"
    return None


class Viewer:
    """Shows frames with cv2.imshow when ``enabled`` and a display exists; otherwise warns once and does nothing."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.windows: set[str] = set()
        if enabled and (problem := display_problem()):
            self._disable(problem)

    def _disable(self, reason: str) -> None:
        LOGGER.warning(f"WARNING: --view-img: {reason}; results are saved but not shown")
        self.enabled = False

    def show(self, name: str, image: np.ndarray) -> None:
        """Draw ``image`` (BGR) in the window ``name`` (created resizable on first use) and let the GUI refresh."""
        if not self.enabled:
            return
        try:
            if name not in self.windows:
                cv2.namedWindow(name, cv2.WINDOW_NORMAL | cv2.WINDOW_KEEPRATIO)
                cv2.resizeWindow(name, image.shape[1], image.shape[0])
                self.windows.add(name)
            cv2.imshow(name, image)
            cv2.waitKey(1)
        except cv2.error as e:  # a GUI backend that cannot open a window here
            self._disable(f"cannot open a window ({str(e).strip().splitlines()[-1][:120]})")

    def close(self) -> None:
        if self.windows:
            cv2.destroyAllWindows()
            self.windows.clear()
