"""The real download code against a real HTTP server on 127.0.0.1 serving archives built here."""
import functools
import http.server
import io
import os
import socket
import tarfile
import threading

import pytest

from data import ptb


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


@pytest.fixture
def server(tmp_path):
    """Serves tmp_path/www on 127.0.0.1; yields (www folder, base URL)."""
    www = tmp_path / "www"
    www.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(www))
    handler.log_message = lambda *a, **k: None
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


def test_present_files_are_not_downloaded_again(tmp_path):
    for name, content in FILES.items():
        (tmp_path / name).write_bytes(content)
    ptb.ensure_data(str(tmp_path), url="http://127.0.0.1:9/never-contacted")  # raises if tried
    assert {name: (tmp_path / name).read_bytes() for name in FILES} == FILES


def test_the_md5_check_names_files_that_are_not_ptbs_and_the_fix(tmp_path, capsys):
    """`python -m data.ptb` (make data, before every make target): a file with other contents
    is named in one error line with what to do, exit 2; nothing is downloaded over it."""
    for name in ptb.FILES:
        (tmp_path / name).write_text("not the corpus\n")
    assert ptb.main(["--data_path", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out.count("MISMATCH, expected") == 3
    assert err.startswith(f"error: ptb.train.txt, ptb.valid.txt, ptb.test.txt in {tmp_path} are "
                          "not PTB's own; delete them") and err.count("\n") == 1, err
    assert (tmp_path / "ptb.train.txt").read_text() == "not the corpus\n"
