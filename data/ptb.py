"""Penn Treebank (word level): download, vocabulary, token ids, batch windows, shards.

Nothing here imports TensorFlow or Horovod: sharding takes `rank` and `size` as plain
arguments, so every function can be tested alone on tiny hand-made inputs.
"""
import collections
import hashlib
import os
import tarfile
import tempfile
import time

import numpy as np

URL = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"
ARCHIVE_DIR = "simple-examples/data/"
MD5 = {
    "ptb.train.txt": "f26c4b92c5fdc7b3f8c7cdcb991d8420",
    "ptb.valid.txt": "aa0affc06ff7c36e977d7cd49e3839bf",
    "ptb.test.txt": "8b80168b89c18661a38ef683c0dc3721",
}
FILES = tuple(MD5)
EOS = "<eos>"
UNK = "<unk>"


class DataError(Exception):
    """Bad or missing data; the message says what is wrong and how to fix it."""


Corpus = collections.namedtuple("Corpus", "train valid test vocab path")  # path: its folder


# --- download -------------------------------------------------------------------------------

def missing_files(data_path):
    return [f for f in FILES if not os.path.isfile(os.path.join(data_path, f))]


def ensure_data(data_path, url=None, timeout=30, retries=3, backoff=2.0, md5=MD5):
    """Make sure the three PTB files are in `data_path`, downloading them if needed.

    `url` defaults to $PTB_URL (a mirror) or the canonical address.
    """
    missing = missing_files(data_path)
    if not missing:
        return
    if os.path.exists(data_path) and not os.path.isdir(data_path):
        raise DataError(f"--data_path {data_path} is a file, not a folder; point --data_path / "
                        f"PTB_DATA_PATH at the folder of {', '.join(FILES)}")
    _refuse_replacing_files_of_ones_own(data_path, missing, md5)
    url = url or os.environ.get("PTB_URL") or URL
    how_to = (f"place {', '.join(FILES)} in {data_path} by hand (from {ARCHIVE_DIR} in the "
              f"archive), or point --data_path / PTB_DATA_PATH at a copy")
    try:
        os.makedirs(data_path, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create data folder {data_path}: {e.strerror}; {how_to}") from None
    try:  # the archive and the files go to data_path: a folder that takes neither stops here
        with tempfile.TemporaryFile(dir=data_path) as archive:
            _fetch(url, archive, timeout, retries, backoff, how_to)
            archive.seek(0)
            _extract(archive, data_path, md5, url)
    except OSError as e:  # read-only, full, a folder in a file's place
        raise DataError(f"cannot write the download in data folder {data_path} "
                        f"({e.strerror or e}); nothing was kept; free space or make the folder "
                        f"writable, or {how_to}") from None


def _refuse_replacing_files_of_ones_own(data_path, missing, md5):
    """The download writes all three files: where the folder already holds some that are not
    PTB's (a corpus of one's own, a file short), it would replace them, so it is refused."""
    own = [f for f in FILES if f not in missing and md5_of(os.path.join(data_path, f)) != md5[f]]
    if own:
        raise DataError(f"{data_path} holds {', '.join(own)}, not PTB's, but not "
                        f"{', '.join(missing)}; a download of PTB would replace them, so none "
                        f"is made: add {', '.join(missing)} for a corpus of your own, or point "
                        "--data_path / PTB_DATA_PATH at an empty folder for PTB")


def _fetch(url, out, timeout, retries, backoff, how_to):
    """Stream `url` into the open file `out`, with bounded retries."""
    import requests  # only needed when downloading
    last = None
    for attempt in range(retries):
        if attempt:
            time.sleep(backoff * attempt)
        out.seek(0)
        out.truncate()
        try:
            with requests.get(url, stream=True, timeout=timeout) as r:
                r.raise_for_status()
                for chunk in r.iter_content(chunk_size=1 << 20):
                    out.write(chunk)
            return
        except requests.RequestException as e:
            last = e
    raise DataError(f"download of {url} failed after {retries} tries ({type(last).__name__}); "
                    f"{how_to}")


def _extract(archive, data_path, md5, url):
    """Extract only the three word-level files, md5-checked, each via a temp name."""
    try:
        tar = tarfile.open(fileobj=archive, mode="r:*")
        members = tar.getmembers()
    except tarfile.TarError as e:
        raise DataError(f"{url} is not a valid tar archive ({e}); download it again") from None
    for m in members:
        if not _is_safe_member(m):
            raise DataError(f"refusing archive {url}: member {m.name!r} is a link or points outside "
                            "the target folder")
    by_name = {m.name: m for m in members}
    written = []
    try:
        for name in FILES:
            member = by_name.get(ARCHIVE_DIR + name)
            if member is None:
                raise DataError(f"{url} has no {ARCHIVE_DIR + name}; is it simple-examples.tgz?")
            content = tar.extractfile(member).read()
            got = hashlib.md5(content).hexdigest()
            if got != md5[name]:
                raise DataError(f"{name} from {url} has md5 {got}, expected {md5[name]}: corrupt "
                                "or wrong download; nothing was kept")
            written.append(_write_via_temp(data_path, name, content))
        for tmp, final in written:
            os.replace(tmp, final)
    finally:
        for tmp, _ in written:
            if os.path.exists(tmp):
                os.remove(tmp)


def _is_safe_member(m):
    name = m.name
    parts = name.replace("\\", "/").split("/")
    return ((m.isfile() or m.isdir()) and not os.path.isabs(name) and ".." not in parts)


# The process's umask, for files made through mkstemp (created 0600): a file written here gets
# the mode open() would have given it, readable by whoever may read the folder
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def _write_via_temp(folder, name, content):
    """(a temp file in `folder` holding `content`, the path it is for); a failed write (a full
    disk) leaves no temp file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_UMASK)
            f.write(content)
    except BaseException:
        os.remove(tmp)
        raise
    return tmp, os.path.join(folder, name)


def md5_of(path):
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --- vocabulary and ids ---------------------------------------------------------------------

def read_words(path):
    """Words of a file, with <eos> at each line end."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text (bad byte at offset {e.start}); "
                        "re-encode it as UTF-8") from None
    words = []
    for line in text.splitlines():
        words.extend(line.split())
        words.append(EOS)
    return words


def build_vocab(words):
    """word -> id, most frequent first, ties broken alphabetically."""
    counts = collections.Counter(words)
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return {w: i for i, (w, _) in enumerate(ordered)}


def to_ids(words, vocab, path="data"):
    unk = vocab.get(UNK)
    # one list, then one array: filling the array word by word took 1.6 times as long (0.25
    # against 0.15 CPU s for PTB's train split, in every process that loads it; AMD EPYC Zen 3)
    ids = [vocab.get(w, unk) for w in words]
    if unk is None and None in ids:
        w = words[ids.index(None)]
        raise DataError(f"{path}: word {w!r} is not in the training vocabulary and there is "
                        f"no {UNK} token; map rare words to {UNK}")
    return np.array(ids, dtype=np.int32)


def load_corpus(data_path):
    """Token ids of train/valid/test and the vocabulary built from train."""
    paths = [os.path.join(data_path, f) for f in FILES]
    train_words = read_words(paths[0])
    if not train_words:
        raise DataError(f"{paths[0]} is empty; replace it with the real PTB training file")
    vocab = build_vocab(train_words)
    splits = [to_ids(train_words, vocab, paths[0])]
    for p in paths[1:]:
        words = read_words(p)
        if not words:
            raise DataError(f"{p} is empty; replace it with the real PTB file")
        splits.append(to_ids(words, vocab, p))
    return Corpus(*splits, vocab, os.path.abspath(data_path))


def write_whole(path, text):
    """The file with this text, or as it was: never half written."""
    tmp, final = _write_via_temp(os.path.dirname(path), os.path.basename(path), text.encode())
    try:
        os.replace(tmp, final)
    except BaseException:
        os.remove(tmp)
        raise


def write_vocab(path, vocab):
    """One word a line, in id order."""
    write_whole(path, "".join(w + "\n" for w in sorted(vocab, key=vocab.get)))


def read_vocab(path):
    """A run's vocab.txt (write_vocab) as word -> id."""
    try:
        with open(path, encoding="utf-8") as f:
            return {w: i for i, w in enumerate(f.read().splitlines())}
    except OSError as e:
        why = e.strerror or str(e)
    except UnicodeDecodeError as e:
        why = f"not UTF-8 text, bad byte at offset {e.start}"
    raise DataError(f"cannot read the run's vocabulary {path} ({why}); make it readable, or move "
                    "it away to have it rebuilt from the corpus the run was trained on "
                    "(--data_path)")


def digest(corpus):
    """A short fingerprint of the vocabulary and the three id streams: two copies of the data
    that would train differently have different digests."""
    h = hashlib.sha256("\n".join(corpus.vocab).encode())
    for ids in (corpus.train, corpus.valid, corpus.test):
        h.update(np.asarray(ids, dtype=np.int32).tobytes())
    return h.hexdigest()[:16]


# --- batches and shards ---------------------------------------------------------------------

def windows(ids, batch_size, num_steps, name="data"):
    """Cut a token stream into the classic [steps, batch, num_steps] inputs and targets.

    The stream is laid out as `batch_size` parallel rows of length L = len // batch_size;
    window k of row b holds tokens [k*num_steps, (k+1)*num_steps) of that row, and the
    targets are the same tokens shifted by one. Consecutive windows of a row continue
    each other, which is what lets the LSTM state carry from one step to the next.
    """
    ids = np.asarray(ids, dtype=np.int32)
    row_len = len(ids) // batch_size
    n = (row_len - 1) // num_steps if row_len else 0
    if n < 1:
        raise DataError(f"{name} has {len(ids)} tokens: too short for one window of "
                        f"batch_size={batch_size} x num_steps={num_steps} (needs at least "
                        f"{batch_size * (num_steps + 1)}); lower them with --set or use more data")
    rows = ids[:row_len * batch_size].reshape(batch_size, row_len)
    cut = n * num_steps
    x = rows[:, :cut].reshape(batch_size, n, num_steps).transpose(1, 0, 2)
    y = rows[:, 1:cut + 1].reshape(batch_size, n, num_steps).transpose(1, 0, 2)
    return np.ascontiguousarray(x), np.ascontiguousarray(y)


def check_shardable(batch_size, size, passes=1):
    """batch_size rows must split evenly among `size` workers and then into `passes` slices."""
    if size > batch_size:
        raise DataError(f"{size} workers but batch_size={batch_size}: more workers than batch rows; "
                        f"use at most {batch_size} workers or raise batch_size")
    if batch_size % size:
        raise DataError(f"batch_size={batch_size} is not divisible by {size} workers; use a worker "
                        f"count that divides it or --set batch_size=<multiple of {size}>")
    if (batch_size // size) % passes:
        raise DataError(f"{batch_size // size} rows per worker (batch_size={batch_size}, {size} "
                        f"workers) do not split into backward_passes_per_step={passes} slices; "
                        "choose a divisor of the rows per worker")


def shard(batch, rank, size):
    """Rows [rank*B/N, (rank+1)*B/N) of a [steps, B, ...] array: the same steps on every rank."""
    batch_size = batch.shape[1]
    check_shardable(batch_size, size)
    per_rank = batch_size // size
    return batch[:, rank * per_rank:(rank + 1) * per_rank]


def main(argv=None):
    """`python -m data.ptb --data_path DIR`: download if missing, then check the md5s. PTB is
    told by its files: three with PTB's md5s pass; some but not all are a damaged copy, refused;
    none is a corpus of one's own (README), which is not PTB's to check: said in one line."""
    import argparse
    import sys
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--data_path", required=True)
    args = p.parse_args(argv)
    try:
        ensure_data(args.data_path)
        got = {name: md5_of(os.path.join(args.data_path, name)) for name in FILES}
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: cannot read {e.filename} ({e.strerror}); make it readable",
              file=sys.stderr)
        return 2
    wrong = [name for name in FILES if got[name] != MD5[name]]
    if len(wrong) == len(FILES):
        print(f"data: none of {', '.join(FILES)} in {args.data_path} is PTB's own (md5), so they "
              "are taken as a corpus of your own and the md5 check is skipped")
        return 0
    for name in FILES:
        print(f"{name}: md5 {got[name]} "
              f"{'MISMATCH, expected ' + MD5[name] if name in wrong else 'ok'}")
    if wrong:
        print(f"error: {', '.join(wrong)} in {args.data_path}: not PTB's own (md5), while the "
              "rest is: a damaged copy of PTB; delete them and run this again to download the "
              "originals, or point --data_path / PTB_DATA_PATH at a good copy", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
