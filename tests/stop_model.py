"""A model builder that freezes rank 1 (SIGSTOP, as a frozen node or a stuck read would) while it
builds its model: after the start-up's first collectives, before the checkpoint's broadcast."""
import os
import signal

from utils.model import build_model


def build(cfg, vocab_size):
    if os.environ.get("OMPI_COMM_WORLD_RANK") == "1":
        os.kill(os.getpid(), signal.SIGSTOP)
    return build_model(cfg, vocab_size)
