"""Shared fixtures: small specs written to tmp_path."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def hetero_spec() -> dict:
    """AMP's heterogeneous cluster (3x4 V100 + 1x4 T4) with GPT-2 medium."""
    return yaml.safe_load((ROOT / "configs" / "amp-hetero-gpt2.yaml").read_text())


@pytest.fixture
def write_spec(tmp_path):
    def write(data: dict | str, name: str = "spec.yaml") -> Path:
        p = tmp_path / name
        p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
        return p
    return write
