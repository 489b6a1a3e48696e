"""The licence is Apache-2.0 (as vLLM, SGLang and Kubernetes), in the file and the metadata."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APACHE_2_0_MD5 = "3b83ef96387f14655fc854ddc3c6bd57"
"""Of https://www.apache.org/licenses/LICENSE-2.0.txt, the full text unchanged."""


def test_the_license_file_is_the_full_apache_2_0_text() -> None:
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.md5(text).hexdigest() == APACHE_2_0_MD5


def test_the_package_metadata_says_the_same() -> None:
    # tomllib is Python 3.11+, and the package supports 3.10: the two lines as written.
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^license = "Apache-2.0"$', text, re.M)
    assert re.search(r'^license-files = \["LICENSE"\]$', text, re.M)
