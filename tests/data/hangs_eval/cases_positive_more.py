"""More positive cases (see cases_positive.py)."""

from __future__ import annotations

from typing import Any

POSITIVE_MORE: dict[str, dict[str, Any]] = {}
