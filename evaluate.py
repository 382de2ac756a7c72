"""Use a trained model without Horovod: test perplexity, text generation, SavedModel export.

Works on the checkpoints of either trainer and never imports Horovod, so a model trained on a
cluster runs anywhere plain TensorFlow does. It takes the run's newest checkpoint, an epoch's or
one saved inside an epoch, and names it; the config (the precision too) is the one that
checkpoint was trained with, and the vocabulary the run's vocab.txt, so generate and export need
only the run. Perplexity
reads the split from --data_path, else from the folder the run trained on (its data_path.txt),
else $PTB_DATA_PATH; it scores the whole test set unless --eval_steps says otherwise, whatever
the training run used; --split valid and --batch_size / --num_steps score the valid set or
another window layout.

    python evaluate.py perplexity --run runs/config_small-np2
    python evaluate.py generate --run runs/config_small-np2 --prompt "the company said" \\
        --length 30 --temperature 0.8 --seed 1
    python evaluate.py export --run runs/config_small-np2 --export_dir exported/small
"""
import argparse
import contextlib
import io
import json
import os
import sys

import utils  # first: tf.keras becomes the Keras that PTB_KERAS names
# TensorFlow as the scripts here start it, before the imports below load it: oneDNN on (x86),
# its start-up notes and Keras' matplotlib left out; a Python without it stops in one line
utils.import_tensorflow()
from data import ptb
from utils import cli, hardware, loop, train_steps
from utils.checkpoints import (DATA_PATH_FILE, EPOCHS_KEY, IN_EPOCH_STEP_KEY, RUN_CONFIG_KEY,
                               UNREADABLE, VOCAB_FILE, newest_first, refuse_other_keras,
                               warn_damaged)
from utils.config import DEFAULT_DATA_PATH, ConfigError
from utils.errors import OutputError, first_line, os_reason
from utils.logs import check_writable, parse_line
from utils.model import build
import tensorflow as tf  # started above by utils.import_tensorflow(), as the trainers start it


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_text in (("perplexity", "test perplexity of the latest checkpoint"),
                            ("generate", "sample text that continues a prompt"),
                            ("export", "write a SavedModel of next-word probabilities")):
        s = sub.add_parser(name, help=help_text)
        s.add_argument("--run", required=True, help="the trainer's --output_dir")
        s.add_argument("--data_path", default=None, help=(
            "the PTB folder (default: the run's, then $PTB_DATA_PATH)" if name == "perplexity"
            else "the PTB folder, for a run without vocab.txt only"))
        if name == "perplexity":
            s.add_argument("--split", choices=("test", "valid"), default="test")
            s.add_argument("--eval_steps", type=int, default=None,
                           help="score only this many windows (default: the whole set)")
            s.add_argument("--batch_size", type=int, default=None,
                           help="streams read side by side (default: the run's eval_batch_size)")
            s.add_argument("--num_steps", type=int, default=None,
                           help="window length (default: the run's eval_num_steps)")
        if name == "generate":
            s.add_argument("--prompt", default="the")
            s.add_argument("--length", type=int, default=30)
            s.add_argument("--temperature", type=float, default=1.0)
            s.add_argument("--seed", type=int, default=0)
        if name == "export":
            s.add_argument("--export_dir", required=True)
        s.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default=None,
                       help="the matmuls' precision (default: the run's; its fp32 weights load "
                            "into either)")
    args = p.parse_args(argv)
    cli.refuse_empty_paths(args, ("run", "data_path", "export_dir"),
                           required=("run", "export_dir"))
    for flag, least in (("eval_steps", 1), ("batch_size", 1), ("num_steps", 1), ("length", 0)):
        value = getattr(args, flag, None)
        if value is not None and value < least:
            raise ConfigError(f"--{flag} must be {least} or more, got {value}")
    return args


class Checkpoint:
    """A checkpoint of the run (of an epoch's end, or inside an epoch), where it stands and the
    config it was trained with. Raises one of checkpoints.UNREADABLE where its files cannot be
    read."""

    def __init__(self, run_dir, path):
        self.path = path
        reader = tf.train.load_checkpoint(self.path)
        refuse_other_keras(reader, self.path)
        try:
            self.epochs_done = int(reader.get_tensor(EPOCHS_KEY))
        except ValueError:  # a file that is no checkpoint of this code
            raise ConfigError(f"--run {run_dir}: {self.path} holds no epochs_done; point --run "
                              "at the --output_dir of a training run") from None
        self.step = int(reader.get_tensor(IN_EPOCH_STEP_KEY)) \
            if reader.has_tensor(IN_EPOCH_STEP_KEY) else 0
        saved = reader.get_tensor(RUN_CONFIG_KEY) if reader.has_tensor(RUN_CONFIG_KEY) else None
        # checkpoints from before they held their config: the run's newest logged one
        self.cfg = json.loads(saved) if saved is not None else logged_config(run_dir)

    def where(self):
        name = os.path.relpath(self.path, os.path.dirname(os.path.dirname(self.path))) \
            if self.step else os.path.basename(self.path)
        return (f"{name}, epoch {self.epochs_done + 1} step {self.step}" if self.step else
                f"{name}, the end of epoch {self.epochs_done}")


def run_checkpoints(run_dir):
    """The run's checkpoints, newest first as a resume takes them (checkpoints.newest_first)."""
    folder = os.path.join(run_dir, "checkpoints")
    paths = newest_first(folder)
    if not paths:
        raise ConfigError(f"--run {run_dir}: no checkpoint in {folder}; point --run at the "
                          "--output_dir of a run that has saved one")
    return paths


def newest_model(run_dir, paths, precision, vocab_size):
    """(checkpoint, cfg, model) of the newest of `paths` that loads; a damaged newer one is named
    in a warning line, as a resume names it. cfg: the checkpoint's config in `precision` (None:
    the run's own)."""
    folder = os.path.join(run_dir, "checkpoints")
    damaged = []
    for path in paths:
        try:
            checkpoint = Checkpoint(run_dir, path)
            cfg = dict(checkpoint.cfg, precision=precision or checkpoint.cfg.get("precision",
                                                                                 "fp32"))
            model = load_model(run_dir, checkpoint, cfg, vocab_size)
        except ConfigError:  # refused (another Keras's, say): the damaged ones named first
            warn_damaged(damaged, f"reading {path} instead")
            raise
        except UNREADABLE as e:  # damaged: the one before it, as a resume does
            damaged.append((path, first_line(e)))
            continue
        warn_damaged(damaged, f"scoring {checkpoint.where()}")
        return checkpoint, cfg, model
    raise ConfigError(f"--run {run_dir}: no checkpoint in {folder} loads (damaged: "
                      f"{', '.join(os.path.basename(p) for p, _ in damaged)}); restore the files "
                      "from a backup")


def logged_config(run_dir):
    """The newest config in the run's metrics.jsonl."""
    path = os.path.join(run_dir, "metrics.jsonl")
    try:
        with open(path) as f:
            logged = [e["config"] for e in map(parse_line, f) if e and "config" in e]
    except OSError:
        logged = []
    if not logged:
        raise ConfigError(f"--run {run_dir}: its checkpoint holds no config and it has no "
                          "readable metrics.jsonl; point --run at the --output_dir of a "
                          "training run")
    return {k: v for k, v in logged[-1].items() if k != "name"}


def corpus_path(run_dir, given):
    """The PTB folder to read: --data_path, else the one the run trained on, else the default
    ($PTB_DATA_PATH or data/ptb); the first that holds the three files."""
    if given:
        missing = ptb.missing_files(given)
        if missing:  # --data_path is only read here: nothing is downloaded into it
            what = ("a file, not a folder" if os.path.isfile(given) else
                    "no folder" if not os.path.exists(given) else
                    f"a folder without {', '.join(missing)}")
            raise ConfigError(f"--data_path {given} is {what}; pass the folder of "
                              f"{', '.join(ptb.FILES)} the run trained on")
        return given
    recorded = os.path.join(run_dir, DATA_PATH_FILE)
    candidates = [(DEFAULT_DATA_PATH, "PTB_DATA_PATH" if os.environ.get("PTB_DATA_PATH")
                   else "the default")]
    if os.path.exists(recorded):
        candidates.insert(0, (read_recorded_path(recorded), f"the run's {DATA_PATH_FILE}"))
    for path, _ in candidates:
        if not ptb.missing_files(path):
            return path
    tried = ", ".join(f"{path} ({origin})" for path, origin in candidates)
    raise ConfigError(f"no PTB files in {tried}; pass --data_path, the folder of "
                      f"{', '.join(ptb.FILES)}")


def read_recorded_path(path):
    """The corpus folder a run's DATA_PATH_FILE names; one line if it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError as e:
        why = e.strerror or str(e)
    except UnicodeDecodeError as e:
        why = f"not UTF-8 text, bad byte at offset {e.start}"
    raise ptb.DataError(f"cannot read {path}, the run's record of its data folder ({why}); make "
                        "it readable, or pass --data_path, the folder of "
                        f"{', '.join(ptb.FILES)}")


def run_vocab(run_dir, corpus=None, data_path=None):
    """The words of the model's ids: the run's vocab.txt, which must equal the vocabulary of
    the corpus if one is given (else its ids mean other words); runs from before vocab.txt:
    the corpus's, read from data_path if none is given."""
    path = os.path.join(run_dir, VOCAB_FILE)
    if not os.path.exists(path):
        return (corpus or ptb.load_corpus(corpus_path(run_dir, data_path))).vocab
    vocab = ptb.read_vocab(path)
    if corpus is not None and vocab != corpus.vocab:
        raise ConfigError(f"--data_path gives another vocabulary than the run's {path} "
                          f"({len(corpus.vocab)} words against {len(vocab)}); point --data_path "
                          "at the data the run was trained on")
    return vocab


def load_model(run_dir, checkpoint, cfg, vocab_size):
    model = build(cfg, vocab_size)
    # Only the model is needed (expect_partial: the optimizer's values go unused), but every
    # weight of it must come from the checkpoint, or the numbers are those of a random model.
    status = tf.train.Checkpoint(model=model).restore(checkpoint.path).expect_partial()
    try:
        status.assert_existing_objects_matched()
    except AssertionError as e:
        raise ConfigError(f"--run {run_dir}: checkpoint {checkpoint.path} lacks weights of this "
                          f"model ({first_line(e)}); evaluate with the code and config it was "
                          "trained with") from None
    return model


def perplexity(model, ids, batch_size, num_steps, eval_steps=None):
    """Perplexity of a token stream read as batch_size streams in num_steps windows (the state
    carried across windows), over eval_steps windows (None: all); and the tokens scored."""
    x, y = ptb.windows(ids, batch_size, num_steps)
    steps = len(x) if eval_steps is None else min(len(x), eval_steps)
    ppl = loop.evaluate(train_steps.make_eval_step(model), model, x, y,
                            {"eval_steps": eval_steps})
    return ppl, steps * batch_size * num_steps


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


def unknown_words_note(vocab, prompt):
    """A note naming the prompt's words the vocabulary lacks (fed as <unk>), with the lower-case
    forms it has (PTB is lower-case); None if every word is known, or if the vocabulary has no
    <unk> (generate then refuses the prompt with its own error)."""
    unknown = [w for w in dict.fromkeys(prompt.split()) if w not in vocab]
    if not unknown or ptb.UNK not in vocab:
        return None
    note = (f"note: not in the run's vocabulary, fed as {ptb.UNK}: "
            + ", ".join(repr(w) for w in unknown))
    lower = [w.lower() for w in unknown if w.lower() in vocab]
    if lower:
        note += "; in lower case it has " + ", ".join(repr(w) for w in lower)
    return note


def export(model, vocab, export_dir):
    """A SavedModel written by Keras' own ExportArchive: the weights, the vocabulary (a lookup
    table, tracked by hand: only Keras' own lookup layers are found by themselves) and one
    endpoint, serving_default: [batch, steps] words -> [batch, vocab] probabilities of the word
    that follows, and the vocabulary."""
    vocabulary = sorted(vocab, key=vocab.get)  # the words in id order
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(vocabulary, tf.range(len(vocab), dtype=tf.int64)),
        default_value=vocab.get(ptb.UNK, -1))

    def next_word_probabilities(words):
        ids = tf.cast(table.lookup(words), tf.int32)
        logits, _ = model(ids, model.zero_state(tf.shape(ids)[0]))
        return {"probabilities": tf.nn.softmax(logits[:, -1]),
                "vocabulary": tf.constant(vocabulary)}

    archive = tf.keras.export.ExportArchive()
    archive.track(model)
    archive.track(table)
    archive.add_endpoint("serving_default", next_word_probabilities,
                         input_signature=[tf.TensorSpec([None, None], tf.string)])
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # Keras 3 lists the endpoints it wrote
            archive.write_out(export_dir)
    except (OSError, tf.errors.OpError) as e:  # a full disk, say: main checked the folder
        raise OutputError(f"cannot write the SavedModel in --export_dir {export_dir} "
                          f"({os_reason(e)}); free space, or choose another --export_dir") \
            from None


def main(argv=None):
    args = parse_args(argv)
    if args.command == "export":  # before the model loads: nothing is written
        check_writable(args.export_dir, "--export_dir")
    paths = run_checkpoints(args.run)
    if args.command == "perplexity":
        corpus = ptb.load_corpus(corpus_path(args.run, args.data_path))
        vocab = run_vocab(args.run, corpus)
    else:
        vocab = run_vocab(args.run, data_path=args.data_path)
    checkpoint, cfg, model = newest_model(args.run, paths, args.precision, len(vocab))
    # the run's precision (runs logged before the key existed trained in fp32), or --precision
    trained_in = checkpoint.cfg.get("precision", "fp32")
    precision = f"precision {cfg['precision']} " + (
        f"(--precision; the run trained in {trained_in})" if args.precision else "(the run's)")
    note = hardware.precision_note(cfg)
    if note:
        print(note, file=sys.stderr, flush=True)
    if args.command == "perplexity":
        batch = cfg["eval_batch_size"] if args.batch_size is None else args.batch_size
        steps = cfg["eval_num_steps"] if args.num_steps is None else args.num_steps
        ppl, tokens = perplexity(model, getattr(corpus, args.split), batch, steps, args.eval_steps)
        whole = f" (the whole {args.split} set)" if args.eval_steps is None else ""
        print(f"{args.split} ppl {ppl:.2f} | {tokens} tokens scored in windows of {batch} x "
              f"{steps}{whole} | checkpoint {checkpoint.where()} | {precision}")
    elif args.command == "generate":
        print(f"checkpoint {checkpoint.where()} | {precision}", file=sys.stderr, flush=True)
        note = unknown_words_note(vocab, args.prompt)
        if note:
            print(note, file=sys.stderr, flush=True)
        print(generate(model, vocab, args.prompt, args.length, args.temperature, args.seed))
    else:
        export(model, vocab, args.export_dir)
        print(f"SavedModel written to {args.export_dir} from checkpoint {checkpoint.where()} | "
              f"{precision}")

if __name__ == "__main__":
    sys.exit(cli.run_main(main))
