r"""The benchmark's peer: the same model and training step in PyTorch, for `make bench` only.

Runs in its own virtual environment (.venv-peer, requirements-peer.txt); nothing in the
trainers or tests imports it. Same sizes, initialisation range, dropout placement (embedding
output and every LSTM layer's output), loss (cross-entropy summed over time, averaged over the
batch), SGD with global-norm clipping, real PTB windows with the state carried across them.

    .venv-peer/bin/python scripts/peer_pytorch.py --config config_small --output_dir D \
        --set steps_per_epoch=100 --log_every 10
writes D/metrics.jsonl with the progress events our trainers write, so that the benchmark
reads both alike. `--layer H` instead prints one LSTM layer's fwd+bwd time (batch 20) as JSON.
With `--set precision='bf16'` the forward runs under torch.autocast("cpu", dtype=torch.bfloat16),
PyTorch's own mixed precision: the bf16 peer of precision="bf16".
"""
import json
import os
import statistics
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from data import ptb  # noqa: E402  (numpy only)
from utils import cli, config  # noqa: E402  (no TensorFlow)


class PTBModel(torch.nn.Module):
    def __init__(self, vocab, cfg):
        super().__init__()
        h, drop = cfg["hidden_size"], 1.0 - cfg["keep_prob"]
        self.embedding = torch.nn.Embedding(vocab, h)
        # nn.LSTM's own dropout acts between its layers; the first and last are added here.
        self.lstm = torch.nn.LSTM(h, h, cfg["num_layers"], dropout=drop if drop else 0.0)
        self.softmax = torch.nn.Linear(h, vocab)
        self.dropout = torch.nn.Dropout(drop)
        for p in self.parameters():
            torch.nn.init.uniform_(p, -cfg["init_scale"], cfg["init_scale"])

    def forward(self, x, state):
        """x [steps, batch] ids (time-major, nn.LSTM's layout) -> logits, state."""
        out, state = self.lstm(self.dropout(self.embedding(x)), state)
        return self.softmax(self.dropout(out)), state


def train(args, cfg):
    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    torch.manual_seed(args.seed)
    corpus = ptb.load_corpus(args.data_path)
    xs, ys = ptb.windows(corpus.train, cfg["batch_size"], cfg["num_steps"], "train")
    steps = ptb_steps = min(len(xs), cfg["steps_per_epoch"] or len(xs))
    model = PTBModel(len(corpus.vocab), cfg)
    opt = torch.optim.SGD(model.parameters(), lr=cfg["learning_rate"])
    zeros = torch.zeros(cfg["num_layers"], cfg["batch_size"], cfg["hidden_size"])
    state = (zeros, zeros)
    log_every = args.log_every or max(1, steps // 10)
    # precision "bf16": PyTorch's own mixed precision, autocast (its LSTM and Linear in bf16)
    bf16 = cfg["precision"] == "bf16"
    os.makedirs(args.output_dir, exist_ok=True)
    metrics = open(os.path.join(args.output_dir, "metrics.jsonl"), "w")
    event = {"config": dict(cfg, name=args.config), "world_size": 1}
    start = time.perf_counter()
    for step in range(ptb_steps):
        x = torch.from_numpy(xs[step].T.astype("int64"))
        y = torch.from_numpy(ys[step].T.astype("int64"))
        state = tuple(s.detach() for s in state)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits, state = model(x, state)
        state = tuple(s.float() for s in state)
        loss = torch.nn.functional.cross_entropy(  # in fp32, as ours
            logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum") / x.shape[1]
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["max_grad_norm"])
        opt.step()
        if (step + 1) % log_every == 0 or step + 1 == steps:
            words = (step + 1) * cfg["batch_size"] * cfg["num_steps"]
            metrics.write(json.dumps(dict(event, event="progress", epoch=1, step=step + 1,
                                          loss=loss.item() / cfg["num_steps"], time=time.time(),
                                          wps=words / (time.perf_counter() - start))) + "\n")
            metrics.flush()
    metrics.write(json.dumps(dict(event, event="epoch", epoch=1, step=steps, time=time.time(),
                                  peak_rss_mb=peak_rss_mb())) + "\n")
    metrics.close()


def peak_rss_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))


def time_layer(units, steps, reps, threads):
    """Median ms of one nn.LSTM layer's forward + backward, batch 20, state carried in."""
    torch.set_num_threads(threads or len(os.sched_getaffinity(0)))
    lstm = torch.nn.LSTM(units, units)
    x = torch.randn(steps, 20, units, requires_grad=True)
    state = (torch.randn(1, 20, units), torch.randn(1, 20, units))
    weights = torch.randn(steps, 20, units)
    times = []
    for _ in range(reps + 2):  # the first two warm up
        t0 = time.perf_counter()
        out, _ = lstm(x, state)
        (out * weights).sum().backward()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times[2:])


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--layer" in argv:  # --layer UNITS STEPS REPS
        i = argv.index("--layer")
        units, steps, reps = map(int, argv[i + 1:i + 4])
        print(json.dumps({"torch": torch.__version__, "ms": time_layer(units, steps, reps, 0)}))
        return
    args = cli.parse_args(argv, __doc__)
    train(args, config.load_config(args.config, args.set))


if __name__ == "__main__":
    main()
