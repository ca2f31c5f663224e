import os
import sys
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # forced: no test reaches for a hub
REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(autouse=True)
def _single_thread():
    """Tests are tiny; one thread keeps them deterministic and fair on a 2-core machine."""
    import torch

    torch.set_num_threads(1)
    yield


@pytest.fixture
def logged(caplog):
    """Call it for what margrpo logged at INFO since the last call (what a stage's log file shows)."""
    import logging

    caplog.set_level(logging.INFO, logger="margrpo")

    def read() -> str:
        text = caplog.text
        caplog.clear()
        return text

    return read
