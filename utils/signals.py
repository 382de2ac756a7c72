"""Clean stops: SIGINT and SIGTERM become an exception raised at a safe point of the main thread,
never inside a checkpoint's write or TensorFlow's own Python code."""
import contextlib
import signal


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived; raised in the main thread at a safe point. Not an Exception,
    as KeyboardInterrupt is not: code that catches any error and goes on (Keras 3 building a
    layer by tracing its call(), which warns and goes on) let a run stopped there train on."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_defer = {"active": False, "pending": None}
_received = {"signum": None}  # the stop signal that arrived, if any


def received():
    """The stop signal that arrived (its number), None if none did."""
    return _received["signum"]


def _on_signal(signum, frame):
    _received["signum"] = signum
    if _defer["active"]:
        _defer["pending"] = signum
    else:
        raise Interrupted(signum)


def install():
    """SIGINT and SIGTERM raise Interrupted from now on; none has arrived yet."""
    _received["signum"] = None
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _on_signal)


@contextlib.contextmanager
def signals_deferred():
    """Hold SIGINT/SIGTERM until the block ends: a checkpoint is never half written by us, and a
    training step is never cut inside TensorFlow's Python code, which would turn the stop into
    an error of its own (and a traceback)."""
    _defer["active"] = True
    try:
        yield
    finally:
        _defer["active"] = False
        pending, _defer["pending"] = _defer["pending"], None
        if pending is not None:
            raise Interrupted(pending)
