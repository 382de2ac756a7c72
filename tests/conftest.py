import os

import pytest

from tests.helpers import REPO


@pytest.fixture(scope="session")
def ptb_path():
    """The real PTB files: $PTB_DATA_PATH, else data/ptb (`make data` puts them there)."""
    path = os.environ.get("PTB_DATA_PATH", os.path.join(REPO, "data", "ptb"))
    missing = [f for f in ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt")
               if not os.path.isfile(os.path.join(path, f))]
    if missing:
        pytest.fail(f"real PTB files missing from {path}: set PTB_DATA_PATH or run `make data`")
    return path
