"""The first trace of lm_ptb_distributed.py's train step, timed in each rank (wall and CPU s),
then the run goes on as usual. --autograph_in_horovod puts back what Horovod 0.28.1 does
without patch 09: its allreduce subgraphs traced with AutoGraph. From the repo:
  mpirun --allow-run-as-root --oversubscribe -bind-to none -np 2 .venv/bin/python \\
      scripts/probes/first_trace.py [--autograph_in_horovod] --config tests/config_tiny.py \\
      --data_path $PTB_DATA_PATH --output_dir /tmp/ft --set num_epochs=1 \\
      --set steps_per_epoch=20 --set eval_steps=2"""
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
import lm_ptb_distributed  # noqa: E402


def timed_first_trace(make_train_step):
    def make(*args, **kwargs):
        step = make_train_step(*args, **kwargs)
        traced = []

        def train_step(*a):
            if not traced:
                wall, cpu = time.monotonic(), time.process_time()
                step.get_concrete_function(*a)
                traced.append(1)
                print(f"rank {os.environ.get('OMPI_COMM_WORLD_RANK')}: first trace "
                      f"{time.monotonic() - wall:.2f} s wall, {time.process_time() - cpu:.2f} s "
                      "CPU", flush=True)
            return step(*a)
        return train_step
    return make


def main():
    argv = sys.argv[1:]
    if "--autograph_in_horovod" in argv:
        argv.remove("--autograph_in_horovod")
        import tensorflow as tf
        import horovod.tensorflow as hvd_tf
        hvd_tf._make_subgraph = tf.function  # AutoGraph on, as before patch 09
    # the name the trainer calls (it imports make_train_step from utils.train_steps)
    lm_ptb_distributed.make_train_step = timed_first_trace(lm_ptb_distributed.make_train_step)
    return lm_ptb_distributed.main(argv)


if __name__ == "__main__":
    sys.exit(main())
