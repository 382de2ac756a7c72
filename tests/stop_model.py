"""Model builders that stop a process while it builds its model: after the start-up's first
collectives, before the trainer reads its checkpoints (and broadcasts them). `build` freezes
rank 1 (SIGSTOP, as a frozen node or a stuck read would); `build_terminated` sends SIGTERM to
its process (a preemption in the start-up)."""
import os
import signal

from utils.model import build_model


def build(cfg, vocab_size):
    if os.environ.get("OMPI_COMM_WORLD_RANK") == "1":
        os.kill(os.getpid(), signal.SIGSTOP)
    return build_model(cfg, vocab_size)


def build_terminated(cfg, vocab_size):
    os.kill(os.getpid(), signal.SIGTERM)
    return build_model(cfg, vocab_size)
