"""Data directory, checksums and downloads (a loopback HTTP server stands in for the network)."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import socket
import threading
from pathlib import Path

import pytest

from flows.data.files import data_dir, data_file, download


def test_data_dir_resolution(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("FLOWS_DATA_DIR", raising=False)
    with pytest.raises(FileNotFoundError, match=r"pass data_dir=\.\.\. or set the FLOWS_DATA_DIR"):
        data_dir()
    monkeypatch.setenv("FLOWS_DATA_DIR", str(tmp_path))
    assert data_dir() == tmp_path
    assert data_dir(tmp_path / ".." / tmp_path.name).resolve() == tmp_path.resolve()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        data_dir(tmp_path / "missing")


def test_missing_file_names_what_was_expected(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"expected the data file 'mnist.npz' \(MNIST.*flows.data.download"):
        data_file("mnist.npz", tmp_path)


def test_tampered_file_fails_the_checksum(tmp_path: Path) -> None:
    (tmp_path / "miniboone_maf_valtest.npz").write_bytes(b"not the data")
    with pytest.raises(ValueError, match=r"checksum mismatch .* expected sha256 c41fdb2c"):
        data_file("miniboone_maf_valtest.npz", tmp_path)
    (tmp_path / "other.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="no known checksum"):
        data_file("other.bin", tmp_path)
    assert data_file("other.bin", tmp_path, verify=False).read_bytes() == b"x"


def test_real_files_verify_when_the_shared_directory_is_present() -> None:
    directory = os.environ.get("FLOWS_DATA_DIR")
    if not directory or not (Path(directory) / "miniboone_maf_valtest.npz").exists():
        pytest.skip("FLOWS_DATA_DIR with the shared data is not set (CI sets it)")
    assert data_file("miniboone_maf_valtest.npz").stat().st_size > 0


@pytest.fixture()
def server(tmp_path: Path):
    root = tmp_path / "served"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_download_from_loopback_verifies_and_moves_atomically(tmp_path: Path, server) -> None:
    root, base = server
    (root / "table.csv").write_text("a,b\n1,2\n")
    target_dir = tmp_path / "data"
    target_dir.mkdir()
    path = download("table.csv", target_dir, url=f"{base}/table.csv")
    assert path.read_text() == "a,b\n1,2\n"
    assert sorted(p.name for p in target_dir.iterdir()) == ["table.csv"]  # no temp files left
    # a known file whose bytes do not match is refused and nothing is left behind
    shutil.copy(root / "table.csv", root / "mnist.npz")
    with pytest.raises(ValueError, match=r"has sha256 .* expected 06af5dfe"):
        download("mnist.npz", target_dir, url=f"{base}/mnist.npz")
    assert not (target_dir / "mnist.npz").exists()
    assert sorted(p.name for p in target_dir.iterdir()) == ["table.csv"]


def test_download_without_network_fails_fast_with_instructions(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RuntimeError, match=r"could not download 'mnist.npz' .* copy the file to"):
        download("mnist.npz", tmp_path, url=f"http://127.0.0.1:{port}/mnist.npz", timeout=5)
    with pytest.raises(ValueError, match="no public download address"):
        download("lj13_reference_samples.npz", tmp_path)
