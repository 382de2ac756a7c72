"""Use a trained model without Horovod: test perplexity, text generation, SavedModel export.

Works on the checkpoints of either trainer and never imports Horovod, so a model trained on a
cluster runs anywhere plain TensorFlow does. The run's config is read from its metrics.jsonl
and the vocabulary is rebuilt from the training file, exactly as the trainer built it.

    python evaluate.py perplexity --run runs/config_small-np2
    python evaluate.py generate --run runs/config_small-np2 --prompt "the company said" \\
        --length 30 --temperature 0.8 --seed 1
    python evaluate.py export --run runs/config_small-np2 --export_dir exported/small
"""
import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's start-up notes out of the log

import tensorflow as tf

from data import ptb
from utils import cli, training
from utils.config import DEFAULT_DATA_PATH, ConfigError
from utils.model import build_model


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_text in (("perplexity", "test perplexity of the latest checkpoint"),
                            ("generate", "sample text that continues a prompt"),
                            ("export", "write a SavedModel of next-word probabilities")):
        s = sub.add_parser(name, help=help_text)
        s.add_argument("--run", required=True, help="the trainer's --output_dir")
        s.add_argument("--data_path", default=DEFAULT_DATA_PATH)
        if name == "generate":
            s.add_argument("--prompt", default="the")
            s.add_argument("--length", type=int, default=30)
            s.add_argument("--temperature", type=float, default=1.0)
            s.add_argument("--seed", type=int, default=0)
        if name == "export":
            s.add_argument("--export_dir", required=True)
    return p.parse_args(argv)


def run_config(run_dir):
    """The resolved config the run was trained with, from its metrics.jsonl."""
    path = os.path.join(run_dir, "metrics.jsonl")
    try:
        with open(path) as f:
            cfg = dict(json.loads(f.readline())["config"])
    except (OSError, ValueError, KeyError):
        raise ConfigError(f"--run {run_dir}: no readable metrics.jsonl; point --run at the "
                          "--output_dir of a training run") from None
    cfg.pop("name", None)
    return cfg


def load_model(run_dir, cfg, vocab_size):
    model = build_model(cfg, vocab_size)
    latest = tf.train.latest_checkpoint(os.path.join(run_dir, "checkpoints"))
    if latest is None:
        raise ConfigError(f"--run {run_dir}: no checkpoint in {run_dir}/checkpoints; let the "
                          "run finish an epoch first")
    # Only the model: the optimizer's state in the checkpoint is not needed here.
    tf.train.Checkpoint(model=model).restore(latest).expect_partial()
    return model


def perplexity(model, corpus, cfg):
    test = ptb.windows(corpus.test, cfg["eval_batch_size"], cfg["eval_num_steps"], "test")
    return training.evaluate(training.make_eval_step(model), model, *test, cfg)


def generate(model, vocab, prompt, length, temperature, seed):
    """Feed the prompt, then sample `length` words; <eos> becomes a line break."""
    if temperature <= 0:
        raise ConfigError(f"--temperature must be > 0, got {temperature}")
    words = [w if w in vocab else ptb.UNK for w in prompt.split()] or [ptb.EOS]
    if ptb.UNK in words and ptb.UNK not in vocab:
        raise ConfigError(f"prompt word(s) not in the vocabulary and no {ptb.UNK}: {prompt!r}")
    id_to_word = {i: w for w, i in vocab.items()}
    logits, state = model(tf.constant([[vocab[w] for w in words]]), model.zero_state(1))
    out = list(words)
    for i in range(length):
        next_id = int(tf.random.stateless_categorical(logits[:, -1] / temperature, 1,
                                                      seed=[seed, i])[0, 0])
        out.append(id_to_word[next_id])
        logits, state = model(tf.constant([[next_id]]), state)
    return " ".join(out).replace(f" {ptb.EOS} ", "\n").replace(ptb.EOS, "\n").strip()


class NextWordModel(tf.Module):
    """What the SavedModel holds: the weights, the vocabulary, and one function."""

    def __init__(self, model, vocab):
        super().__init__()
        self.model = model
        words = sorted(vocab, key=vocab.get)
        self.words = tf.constant(words)
        self.table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(self.words, tf.range(len(words), dtype=tf.int64)),
            default_value=vocab.get(ptb.UNK, -1))

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.string)])
    def next_word_probabilities(self, words):
        """[batch, steps] words -> [batch, vocab] probabilities of the word that follows."""
        ids = tf.cast(self.table.lookup(words), tf.int32)
        state = self.model.zero_state(tf.shape(ids)[0])
        logits, _ = self.model(ids, state)
        return {"probabilities": tf.nn.softmax(logits[:, -1]), "vocabulary": self.words}


def main(argv=None):
    args = parse_args(argv)
    cfg = run_config(args.run)
    corpus = ptb.load_corpus(args.data_path)
    model = load_model(args.run, cfg, len(corpus.vocab))
    if args.command == "perplexity":
        print(f"test ppl {perplexity(model, corpus, cfg):.2f}")
    elif args.command == "generate":
        print(generate(model, corpus.vocab, args.prompt, args.length, args.temperature, args.seed))
    else:
        module = NextWordModel(model, corpus.vocab)
        tf.saved_model.save(module, args.export_dir, signatures={
            "serving_default": module.next_word_probabilities})
        print(f"SavedModel written to {args.export_dir}")


if __name__ == "__main__":
    sys.exit(cli.run_main(main))
