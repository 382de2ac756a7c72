"""The real download code against a real HTTP server on 127.0.0.1 serving archives built here."""
import functools
import http.server
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import threading

import pytest

from data import ptb
from tests.helpers import (IS_ROOT, REPO, TINY, patterned_sentences, read_only_folder,
                           script_env, write_corpus)
from tests.test_faults import small_disk


def make_tgz(files, extra=()):
    """A gzip tar with simple-examples/data/<name> members, plus raw (TarInfo, bytes) extras."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(ptb.ARCHIVE_DIR + name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
        for info, content in extra:
            tar.addfile(info, io.BytesIO(content) if content is not None else None)
    return buf.getvalue()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # no line on stderr for each request
        pass


@pytest.fixture
def server(tmp_path):
    """Serves tmp_path/www on 127.0.0.1; yields (www folder, base URL)."""
    www = tmp_path / "www"
    www.mkdir()
    handler = functools.partial(QuietHandler, directory=str(www))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield www, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


FILES = {"ptb.train.txt": b" a b c \n b c \n", "ptb.valid.txt": b" a b \n", "ptb.test.txt": b" c a \n"}
MD5 = {name: __import__("hashlib").md5(content).hexdigest() for name, content in FILES.items()}


def test_download_success(server, tmp_path):
    www, base = server
    (www / "simple-examples.tgz").write_bytes(make_tgz(FILES, extra=[
        (tarfile.TarInfo("simple-examples/README"), b"")]))
    dest = tmp_path / "data"
    ptb.ensure_data(str(dest), url=f"{base}/simple-examples.tgz", md5=MD5)
    assert sorted(os.listdir(dest)) == sorted(FILES)
    for name, content in FILES.items():
        assert (dest / name).read_bytes() == content


def test_wrong_content_leaves_nothing(server, tmp_path):
    www, base = server
    bad = dict(FILES, **{"ptb.test.txt": b"tampered\n"})
    (www / "simple-examples.tgz").write_bytes(make_tgz(bad))
    dest = tmp_path / "data"
    with pytest.raises(ptb.DataError, match="ptb.test.txt .* has md5 .* expected"):
        ptb.ensure_data(str(dest), url=f"{base}/simple-examples.tgz", md5=MD5)
    assert os.listdir(dest) == []  # not even the train/valid files that were fine


@pytest.mark.parametrize("evil", ["../evil.txt", "/tmp/evil.txt", "simple-examples/../../evil"])
def test_member_outside_target_is_rejected(server, tmp_path, evil):
    www, base = server
    (www / "simple-examples.tgz").write_bytes(make_tgz(FILES, extra=[(tarfile.TarInfo(evil), b"")]))
    dest = tmp_path / "data"
    with pytest.raises(ptb.DataError, match="refusing archive"):
        ptb.ensure_data(str(dest), url=f"{base}/simple-examples.tgz", md5=MD5)
    assert os.listdir(dest) == []
    assert not (tmp_path / "evil.txt").exists()


def test_link_member_is_rejected(server, tmp_path):
    www, base = server
    link = tarfile.TarInfo("simple-examples/data/link")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    (www / "simple-examples.tgz").write_bytes(make_tgz(FILES, extra=[(link, None)]))
    with pytest.raises(ptb.DataError, match="refusing archive"):
        ptb.ensure_data(str(tmp_path / "data"), url=f"{base}/simple-examples.tgz", md5=MD5)


def test_http_error_and_unreachable_host_name_the_url(server, tmp_path):
    _, base = server
    url = f"{base}/missing.tgz"  # 404
    with pytest.raises(ptb.DataError, match=f"download of {url} failed after 2 tries.*by hand"):
        ptb.ensure_data(str(tmp_path / "a"), url=url, retries=2, backoff=0.01)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/simple-examples.tgz"
    with pytest.raises(ptb.DataError, match="ConnectionError.*PTB_DATA_PATH"):
        ptb.ensure_data(str(tmp_path / "b"), url=url, retries=2, backoff=0.01)
    assert os.listdir(tmp_path / "b") == []


def test_a_folder_short_of_a_file_keeps_its_own_files_and_says_what_to_add(server, tmp_path):
    """A corpus of one's own without its test file: the download would have replaced the two
    files it has with PTB's, silently. Refused in one line, nothing written; where the files
    present are PTB's own, the download completes the folder."""
    www, base = server
    (www / "simple-examples.tgz").write_bytes(make_tgz(FILES))
    url = f"{base}/simple-examples.tgz"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "ptb.train.txt").write_bytes(b" my own words \n")
    (mine / "ptb.valid.txt").write_bytes(FILES["ptb.valid.txt"])
    with pytest.raises(ptb.DataError) as e:
        ptb.ensure_data(str(mine), url=url, md5=MD5)
    assert str(e.value) == (
        f"{mine} holds ptb.train.txt, not PTB's, but not ptb.test.txt; a download of PTB would "
        "replace them, so none is made: add ptb.test.txt for a corpus of your own, or point "
        "--data_path / PTB_DATA_PATH at an empty folder for PTB")
    assert sorted(os.listdir(mine)) == ["ptb.train.txt", "ptb.valid.txt"]
    assert (mine / "ptb.train.txt").read_bytes() == b" my own words \n"
    (mine / "ptb.train.txt").write_bytes(FILES["ptb.train.txt"])  # PTB's own, one file short
    ptb.ensure_data(str(mine), url=url, md5=MD5)
    assert {f: (mine / f).read_bytes() for f in FILES} == FILES


def test_present_files_are_not_downloaded_again(tmp_path):
    for name, content in FILES.items():
        (tmp_path / name).write_bytes(content)
    ptb.ensure_data(str(tmp_path), url="http://127.0.0.1:9/never-contacted")  # raises if tried
    assert {name: (tmp_path / name).read_bytes() for name in FILES} == FILES


def test_the_md5_check_names_files_that_are_not_ptbs_and_the_fix(ptb_path, tmp_path, capsys):
    """`python -m data.ptb` (make data, before every make target): in a copy of PTB, a file with
    other contents is named in one error line with what to do, exit 2; nothing is downloaded
    over it."""
    for name in ptb.FILES:
        shutil.copy(os.path.join(ptb_path, name), tmp_path / name)
    (tmp_path / "ptb.valid.txt").write_text("not the corpus\n")
    assert ptb.main(["--data_path", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out.count("MISMATCH, expected") == 1 and out.count(" ok\n") == 2, out
    assert err.startswith(f"error: ptb.valid.txt in {tmp_path}: not PTB's own (md5), while the "
                          "rest is: a damaged copy of PTB; delete them") and \
        err.count("\n") == 1, err
    assert (tmp_path / "ptb.valid.txt").read_text() == "not the corpus\n"


def test_a_corpus_of_ones_own_is_not_md5_checked_and_says_so(tmp_path, capsys):
    """None of the three files is PTB's: another corpus (README), taken as it is, in one line."""
    for name in ptb.FILES:
        (tmp_path / name).write_text("a corpus of my own\n")
    assert ptb.main(["--data_path", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert (out, err) == (f"data: none of ptb.train.txt, ptb.valid.txt, ptb.test.txt in "
                          f"{tmp_path} is PTB's own (md5), so they are taken as a corpus of your "
                          "own and the md5 check is skipped\n", "")


def test_a_read_only_data_folder_without_the_files_is_one_line(tmp_path, monkeypatch, capsys):
    """The archive would go to the folder first: it stops there, before any download."""
    monkeypatch.setenv("PTB_URL", "http://127.0.0.1:9/never-contacted")  # discard port
    with read_only_folder(tmp_path / "data") as data:
        assert ptb.main(["--data_path", str(data)]) == 2
        assert os.listdir(data) == []
    reason = "Read-only file system" if IS_ROOT else "Permission denied"
    out, err = capsys.readouterr()
    assert out == "" and err == (
        f"error: cannot write the download in data folder {data} ({reason}); nothing was kept; "
        "free space or make the folder writable, or place ptb.train.txt, ptb.valid.txt, "
        f"ptb.test.txt in {data} by hand (from simple-examples/data/ in the archive), or point "
        "--data_path / PTB_DATA_PATH at a copy\n")


def test_a_full_disk_while_extracting_is_one_line_and_keeps_nothing(ptb_path, server, tmp_path,
                                                                     monkeypatch, capsys):
    """A 3 MiB disk takes the archive of the real files (1.7 MB) but not ptb.train.txt (5.1 MB)."""
    www, base = server
    (www / "simple-examples.tgz").write_bytes(make_tgz(
        {name: open(os.path.join(ptb_path, name), "rb").read() for name in ptb.FILES}))
    monkeypatch.setenv("PTB_URL", f"{base}/simple-examples.tgz")
    with small_disk(tmp_path / "disk", "3m") as disk:
        assert ptb.main(["--data_path", str(disk)]) == 2
        assert os.listdir(disk) == []  # nor a part of the file it was writing
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(
        f"error: cannot write the download in data folder {disk} (No space left on device); "
        "nothing was kept; free space") and err.count("\n") == 1, err


def test_another_corpus_trains_through_make_train(tmp_path):
    """README's other corpus, `PTB_DATA_PATH=/my/corpus make train`: make data says it skips
    the md5 check, and the trainer trains on that corpus's words."""
    train = patterned_sentences(600, 0)
    corpus = write_corpus(tmp_path / "corpus", train, patterned_sentences(100, 1),
                          patterned_sentences(100, 2))
    runs = tmp_path / "runs"
    r = subprocess.run(["make", "train", f"CONFIG={TINY}", f"RUNS={runs}", "NP=1",
                        "ARGS=--set num_epochs=1 --set steps_per_epoch=5 --set eval_steps=2"],
                       cwd=REPO, env=dict(script_env(), PTB_DATA_PATH=str(corpus)), text=True,
                       capture_output=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"data: none of ptb.train.txt, ptb.valid.txt, ptb.test.txt in {corpus} is PTB's " \
           "own (md5), so they are taken as a corpus of your own and the md5 check is " \
           "skipped\n" in r.stdout, r.stdout
    run = runs / "config_tiny-np1"
    assert {w for line in train for w in line.split()} | {ptb.EOS} == \
        set((run / "vocab.txt").read_text().split())
    assert "test" in [json.loads(line)["event"] for line in open(run / "metrics.jsonl")]


def test_files_written_through_a_temp_file_get_the_mode_of_any_new_file(tmp_path):
    """mkstemp makes files of mode 0600: a run's vocab.txt (and the PTB files, data_path.txt)
    must be as readable as a file open() makes there, for whoever shares the folder."""
    ptb.write_vocab(str(tmp_path / "vocab.txt"), {"a": 0})
    (tmp_path / "plain.txt").write_text("a\n")
    assert oct(os.stat(tmp_path / "vocab.txt").st_mode) == \
        oct(os.stat(tmp_path / "plain.txt").st_mode)


def test_a_file_as_data_path_is_named_a_file_and_nothing_is_fetched(tmp_path):
    """It was "cannot create data folder ...: File exists; place ... in it by hand", which
    cannot be done; nothing is fetched (the address would refuse a connection)."""
    a_file = tmp_path / "ptb.tgz"
    a_file.write_bytes(b"not a folder")
    with pytest.raises(ptb.DataError) as refused:
        ptb.ensure_data(str(a_file), url="http://127.0.0.1:9/never-contacted")
    assert str(refused.value) == (
        f"--data_path {a_file} is a file, not a folder; point --data_path / PTB_DATA_PATH at the "
        "folder of ptb.train.txt, ptb.valid.txt, ptb.test.txt")
    assert a_file.read_bytes() == b"not a folder"
