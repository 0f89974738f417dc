"""The licence: Apache-2.0 for this project's code (LICENSE, pyproject.toml), and the official weight files' own
licences said where users meet them (README, docs/models.md); neither ultralytics nor YOLOv5 is a requirement."""

from __future__ import annotations

import hashlib
import re

from tests.helpers import ROOT

# SHA-256 of the Apache License 2.0 text as apache.org publishes it (LICENSE-2.0.txt, 202 lines).
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def test_the_licence_file_is_the_apache_2_0_text() -> None:
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_0_SHA256
    assert b"Apache License\n                           Version 2.0, January 2004" in text


def test_pyproject_names_the_licence_and_its_file() -> None:
    project = (ROOT / "pyproject.toml").read_text().split("[project]", 1)[1].split("\n[", 1)[0]
    assert re.search(r'^license = "Apache-2.0"', project, re.M) and re.search(r'^license-files = \["LICENSE"\]',
                                                                              project, re.M)


def test_the_weight_files_licences_are_said_and_their_code_is_not_required() -> None:
    for page in (ROOT / "README.md", ROOT / "docs" / "models.md"):
        text = " ".join(page.read_text().split())
        assert "Apache License 2.0" in text and "AGPL-3.0" in text and "derived from" in text, page
    for requirements in ROOT.glob("requirements*.txt"):
        names = [re.split(r"[<>=!~; \[]", line)[0].lower() for line in requirements.read_text().splitlines()]
        assert "ultralytics" not in names and "yolov5" not in names, requirements
