"""``kvbench data fetch`` against a local HTTP server only (127.0.0.1, a thread of this process): RULER's essay
list and essays, the two QA files, and a hub serving the shipped SCBench fixture in the hub's layout (the tree
API ``huggingface_hub`` lists, and ``resolve/`` URLs). Checked: the layout ``kvbench run`` reads, the recorded
checksums, an interrupted download continued by a range request, a server that ignores the range, a checksum
mismatch that keeps nothing, the one-line offline error (exit 2), and the fetch command named by ``kvbench
run``'s missing-data line."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvbench.tasks import data_fetch
from tests.test_cli import MODEL, kvbench

FIXTURES = Path(__file__).parent / "fixtures"
HUB = "/api/datasets/microsoft/SCBench/tree/main"
RESOLVE = "/datasets/microsoft/SCBench/resolve/main/"
ESSAYS = {  # served path -> body; two plain-text essays (gkamradt's copies) and two paulgraham.com pages
    "/essays/b.txt": "Second plain essay.\n",
    "/essays/a.txt": "First plain essay.\n",
    "/pg/zeta.html": "<html><body><table><tr><td><font size=2 face=verdana>Zeta starts here.<br><br>"
    "It has <b>two</b> paragraphs &amp; an entity.</font></td></tr></table>"
    "<font>a second font, not the essay</font></body></html>",
    "/pg/alpha.html": "<html><font>Alpha <i>essay</i>.<p>Second paragraph.</p></font></html>",
}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Server:
    """Serves ``files`` (path -> bytes); honours ``Range`` unless the path is in ``ignore_range``; the first
    request of a path in ``cut`` sends the full length header but only half the body, then closes."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files, self.cut, self.ignore_range, self.requests = files, set(), set(), []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                path = self.path.split("?")[0]
                server.requests.append((path, self.headers.get("Range")))
                body = server.files.get(path)
                if body is None:
                    self.send_error(404)
                    return
                start = 0
                m = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
                if m and path not in server.ignore_range:
                    start = int(m[1])
                    if start >= len(body):
                        self.send_error(416)
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                if path in server.cut:
                    server.cut.discard(path)
                    self.wfile.write(body[start : start + (len(body) - start) // 2])
                    self.close_connection = True
                    return
                self.wfile.write(body[start:])

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _hub_files(base: str) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """(served files, {scbench/<path>: bytes}) of the SCBench fixture as a hub: its tree listing and files."""
    tree, served, expected = [], {}, {}
    for path in sorted((FIXTURES / "scbench").rglob("*.parquet")):
        rel = path.relative_to(FIXTURES / "scbench").as_posix()
        data = path.read_bytes()
        tree.append({"type": "file", "path": rel, "size": len(data), "oid": hashlib.sha1(data).hexdigest(),
                     "lfs": {"oid": _sha(data), "size": len(data), "pointerSize": 134}})  # fmt: skip
        served[RESOLVE + rel] = data
        expected[f"scbench/{rel}"] = data
    tree.append({"type": "file", "path": "README.md", "size": 3, "oid": "0" * 40})  # not a task's file
    served[HUB] = json.dumps(tree).encode()
    return served, expected


@pytest.fixture
def sources(monkeypatch):
    """A local server with every source, and the environment pointing kvbench at it."""
    qa = {"/qa/squad.json": (FIXTURES / "ruler" / "squad.json").read_bytes(),
          "/qa/hotpot.json": (FIXTURES / "ruler" / "hotpotqa.json").read_bytes()}  # fmt: skip
    files = {**{k: v.encode() for k, v in ESSAYS.items()}, **qa}
    with Server(files) as server:
        hub, expected = _hub_files(server.url)
        files.update(hub)
        files["/list.txt"] = "".join(f"{server.url}{p}\n" for p in ESSAYS).encode()
        monkeypatch.setenv("KVBENCH_RULER_ESSAY_URLS", f"{server.url}/list.txt")
        monkeypatch.setenv("KVBENCH_SQUAD_URL", f"{server.url}/qa/squad.json")
        monkeypatch.setenv("KVBENCH_HOTPOTQA_URL", f"{server.url}/qa/hotpot.json")
        monkeypatch.setenv("KVBENCH_HUB_ENDPOINT", server.url)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("KVBENCH_DATA_DIR", raising=False)
        expected["ruler/squad.json"] = qa["/qa/squad.json"]
        expected["ruler/hotpotqa.json"] = qa["/qa/hotpot.json"]
        yield server, expected


def test_fetch_all_fills_the_layout_run_reads(sources, tmp_path, capsys):
    server, expected = sources
    root = tmp_path / "data"
    assert kvbench("data", "fetch", "all", "--data-dir", str(root)) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    for rel, data in expected.items():
        assert (root / rel).read_bytes() == data, rel
    essays = json.loads((root / "ruler" / "PaulGrahamEssays.json").read_text())["text"]
    # RULER's order: the plain-text copies, then the pages, each by file name; a page's first <font> only
    assert essays == ("First plain essay.\nSecond plain essay.\nAlpha essay.\n\nSecond paragraph.\n\n"
                      "Zeta starts here.\n\nIt has two paragraphs & an entity.\n\n")  # fmt: skip
    record = json.loads((root / data_fetch.RECORD).read_text())["files"]
    assert set(record) == set(expected) | {"ruler/PaulGrahamEssays.json"}
    for rel, entry in record.items():
        data = (root / rel).read_bytes()
        assert entry["sha256"] == _sha(data) and entry["bytes"] == len(data), rel
    assert not list(root.rglob("*.part")) and not (root / "ruler" / ".essays").exists()
    # the benches find it: RULER's data files, and every SCBench task of the fixture
    from kvbench.tasks import ruler_tasks
    from kvbench.tasks.scbench import find_task_files

    os.environ["KVBENCH_DATA_DIR"] = str(root)  # the fixture's monkeypatch restores it
    assert all(ruler_tasks.data_path(t).is_file() for t in ruler_tasks.DATA_FILES)
    tasks = {p.parent.name.removeprefix("scbench_") for p in (FIXTURES / "scbench").rglob("*.parquet")}
    assert all(find_task_files(root / "scbench", t) for t in tasks)
    # not a terminal: progress as whole lines, no redraws
    assert "\r" not in err and re.search(r"^ruler/squad\.json: \d+/\d+ done", err, re.M), err
    # a second run keeps everything and fetches nothing
    before = len(server.requests)
    assert kvbench("data", "fetch", "ruler", "--data-dir", str(root)) == 0
    assert len(server.requests) == before and "already there, kept" in capsys.readouterr().err


def test_an_interrupted_download_continues_where_it_stopped(sources, tmp_path, capsys):
    server, expected = sources
    root = tmp_path / "data"
    server.cut.add("/qa/hotpot.json")
    assert kvbench("data", "fetch", "ruler", "--data-dir", str(root)) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the lines of what did arrive
    assert last.startswith("error: fetching ") and last.endswith("rerun the command to continue it")
    part = root / "ruler" / "hotpotqa.json.part"
    have = part.stat().st_size
    assert 0 < have < len(expected["ruler/hotpotqa.json"]) and not (root / "ruler" / "hotpotqa.json").exists()
    assert kvbench("data", "fetch", "ruler", "--data-dir", str(root)) == 0, capsys.readouterr().err
    assert ("/qa/hotpot.json", f"bytes={have}-") in server.requests  # continued, not restarted
    assert (root / "ruler" / "hotpotqa.json").read_bytes() == expected["ruler/hotpotqa.json"]
    assert not part.exists()


def test_a_server_ignoring_the_range_restarts_the_file_cleanly(sources, tmp_path, capsys):
    server, expected = sources
    root = tmp_path / "data"
    (root / "ruler").mkdir(parents=True)
    (root / "ruler" / "squad.json.part").write_bytes(b"stale bytes from another attempt")
    server.ignore_range.add("/qa/squad.json")
    assert kvbench("data", "fetch", "ruler", "--data-dir", str(root)) == 0, capsys.readouterr().err
    assert (root / "ruler" / "squad.json").read_bytes() == expected["ruler/squad.json"]


def test_a_checksum_mismatch_keeps_nothing(sources, tmp_path, capsys):
    server, _ = sources
    tree = json.loads(server.files[HUB])
    tree[0]["lfs"]["oid"] = "0" * 64
    server.files[HUB] = json.dumps(tree).encode()
    root = tmp_path / "data"
    assert kvbench("data", "fetch", "scbench", "--data-dir", str(root)) == 2
    err = capsys.readouterr().err
    assert "not the published" in err and "0" * 64 in err
    rel = tree[0]["path"]
    assert not (root / "scbench" / rel).exists() and not (root / "scbench" / f"{rel}.part").exists()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("what", ["ruler", "scbench"])
def test_offline_is_one_line_naming_what_it_would_fetch(what, tmp_path, monkeypatch, capsys):
    dead = f"http://127.0.0.1:{_closed_port()}"
    for env in ("KVBENCH_RULER_ESSAY_URLS", "KVBENCH_SQUAD_URL", "KVBENCH_HOTPOTQA_URL"):
        monkeypatch.setenv(env, f"{dead}/x")
    monkeypatch.setenv("KVBENCH_HUB_ENDPOINT", dead)
    root = tmp_path / "data"
    assert kvbench("data", "fetch", what, "--data-dir", str(root)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs the network" in err, err
    named = ["ruler/PaulGrahamEssays.json", "ruler/squad.json", "ruler/hotpotqa.json"] if what == "ruler" else [
        "scbench/scbench_<task>/*.parquet", "microsoft/SCBench"]
    assert all(n in err for n in named), err
    assert not root.exists()  # nothing written


def test_fetch_needs_a_data_directory(monkeypatch, capsys):
    monkeypatch.delenv("KVBENCH_DATA_DIR", raising=False)
    assert kvbench("data", "fetch", "ruler") == 2
    assert "give --data-dir DIR" in capsys.readouterr().err


def test_run_names_the_fetch_command_for_missing_data(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    args = ["run", *MODEL, "--bench", "ruler", "--task", "qa_1", "--limit", "1", "--length", "2048"]
    assert kvbench(*args, "--data-dir", str(empty), "--out", str(tmp_path / "out")) == 2
    assert "kvbench data fetch ruler --data-dir DIR" in capsys.readouterr().err
    from kvbench.tasks.scbench import _FIX

    assert "kvbench data fetch scbench --data-dir DIR" in _FIX


def test_an_essay_that_cannot_be_fetched_is_skipped_as_ruler_does(sources, tmp_path, capsys):
    server, _ = sources
    del server.files["/essays/b.txt"]  # a 404 among the essays
    root = tmp_path / "data"
    assert kvbench("data", "fetch", "ruler", "--data-dir", str(root)) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "3 essays (1 could not be fetched" in err and "HTTP 404" in err
    text = json.loads((root / "ruler" / "PaulGrahamEssays.json").read_text())["text"]
    assert text.startswith("First plain essay.\nAlpha essay.") and "Second plain essay" not in text
