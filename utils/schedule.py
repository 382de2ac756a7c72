"""The paper's schedule, in plain Python (no TensorFlow): the learning rate of each epoch, and the
steps of an epoch."""


def learning_rate(cfg, epoch, workers=1):
    """Constant for max_epoch epochs, then decayed each epoch (epoch from 0). With scale_lr,
    times the number of workers."""
    scale = workers if cfg["scale_lr"] else 1
    return scale * cfg["learning_rate"] * cfg["lr_decay"] ** max(epoch + 1 - cfg["max_epoch"], 0)


def epoch_steps(cfg, num_windows):
    """The training steps of an epoch of num_windows windows: all of them, or steps_per_epoch."""
    cap = cfg["steps_per_epoch"]
    return num_windows if cap is None else min(num_windows, cap)
