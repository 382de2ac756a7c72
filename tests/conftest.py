import os
import resource

import pytest

# The suite runs on the CPU cores, its GPUs hidden from it and from every process it starts: its
# multi-rank runs start more ranks than a workstation has GPUs, which the trainers refuse, and
# its expectations are the CPU path's. The GPU pinning is tested on stand-in devices
# (tests/stand_in_gpus.py); the GPU build by `make gpu-build-check` (docs/gpu.md).
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import utils  # noqa: E402  before any test imports TensorFlow: the Keras PTB_KERAS selects
# TensorFlow's variables as the scripts set them (oneDNN on, fewer notes), for the tests' own
# TensorFlow and every process they start; TensorFlow itself is imported by the tests that use it
utils.set_tensorflow_defaults()
from tests.helpers import REPO, patterned_sentences, write_corpus

# The files that take longest, first: `make test` hands whole files to its workers in the order
# collected, so these start at once and the short ones fill in around them, and the workers end
# near together. Idle on a 2-core AVX2-only EPYC (CI of 382ff25, seconds): resume 665, chaos
# 595, faults 553, elastic 203, communication 196, distributed 156, tf_distribute 143, use 135.
LONG_FILES_FIRST = ["test_resume.py", "test_chaos.py", "test_faults.py", "test_elastic.py",
                    "test_communication.py", "test_distributed.py", "test_tf_distribute.py",
                    "test_use.py"]


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONG_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: in-file order kept


def cpu_seconds():
    """User and system CPU of this process and of every child it (or they) waited for."""
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                          resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each test's CPU seconds (its trainers', mpirun ranks' and its own) as the property cpu_s
    of the JUnit XML CI keeps: unlike wall times, they hardly change with what shares the cores,
    so they say which tests cost the most (a process killed whole, not waited for, is left out)."""
    if call.when == "teardown" and hasattr(item, "cpu_at_start"):
        item.user_properties.append(("cpu_s", round(cpu_seconds() - item.cpu_at_start, 1)))
    yield


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.cpu_at_start = cpu_seconds()


@pytest.fixture(scope="session")
def ptb_path():
    """The real PTB files: $PTB_DATA_PATH, else data/ptb (`make data` puts them there)."""
    path = os.environ.get("PTB_DATA_PATH", os.path.join(REPO, "data", "ptb"))
    missing = [f for f in ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt")
               if not os.path.isfile(os.path.join(path, f))]
    if missing:
        pytest.fail(f"real PTB files missing from {path}: set PTB_DATA_PATH or run `make data`")
    return path


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """A small PTB-format corpus with structure an LSTM learns in a few epochs."""
    folder = tmp_path_factory.mktemp("corpus")
    return str(write_corpus(folder, patterned_sentences(2400, 0), patterned_sentences(200, 1),
                            patterned_sentences(200, 2)))


@pytest.fixture(scope="session")
def long_corpus(tmp_path_factory):
    """Ten times the sentences of `corpus`: 830 windows a tiny epoch. On the fastest CPU seen here
    (an AMD EPYC with AVX-512, 4 ms a tiny step) the 83 windows of `corpus` take 0.2 s, so a test
    that stops a run mid-epoch could land its signal after the epoch (in rank 0's evaluation, or
    after the run ended); ten times longer leaves the seconds such a test needs."""
    folder = tmp_path_factory.mktemp("long")
    return str(write_corpus(folder, patterned_sentences(24000, 0), patterned_sentences(200, 1),
                            patterned_sentences(200, 2)))
