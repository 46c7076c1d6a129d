"""``kvbench data fetch [ruler|scbench|all] [--data-dir DIR]``: the external data the benches read, fetched
into the data directory in the layout ``kvbench run --data-dir DIR`` reads (``docs/benches.md``):

* ``DIR/ruler/PaulGrahamEssays.json`` (``{"text": ...}``): RULER's essay haystack, gathered as RULER's own
  ``scripts/data/synthetic/json/download_paulgraham_essay.py`` gathers it: the essay URLs listed in RULER's
  ``PaulGrahamEssays_URLs.txt`` (plain-text copies in gkamradt's LLMTest_NeedleInAHaystack repository, the rest
  as paulgraham.com pages whose first ``<font>`` element holds the essay), the plain-text ones first, each group
  in file-name order, concatenated. RULER converts the pages with html2text (markdown); kvbench takes the
  element's text with the standard library, so the haystack's words are the same but not its markup.
* ``DIR/ruler/squad.json``: SQuAD v2.0 dev; ``DIR/ruler/hotpotqa.json``: HotpotQA dev (distractor). Both are
  checked against their published sha256.
* ``DIR/scbench/scbench_<task>/*.parquet``: SCBench's twelve tasks from the hub (``microsoft/SCBench``), listed
  with ``huggingface_hub`` and checked against the hub's LFS sha256.

Every file is downloaded to ``<name>.part`` (a rerun continues it with an HTTP range request, or restarts it
when the server ignores the range) and renamed into place only once complete and checked, so an interrupted
fetch never leaves a truncated file where the benches read. The sha256, size and source of every file land in
``DIR/kvbench-fetch.json``. A file already present is kept (its checksum recorded). Offline, the command stops
at the first connection with one line naming what it would fetch and from where (exit status 2).

The sources can be pointed elsewhere (a mirror, or the tests' local server): ``KVBENCH_RULER_ESSAY_URLS`` (the
URL of the essay URL list), ``KVBENCH_SQUAD_URL``, ``KVBENCH_HOTPOTQA_URL``, ``KVBENCH_HUB_ENDPOINT`` (the hub,
default ``$HF_ENDPOINT`` or https://huggingface.co). A source moved by one of them is not held to the published
sha256 (its checksum is still recorded)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from enum import Enum
from html.parser import HTMLParser
from pathlib import Path
from typing import Callable, Optional

import typer

from kvbench.atomic import check_writable, move_into_place, sha256_of, write_atomic, write_json
from kvbench.errors import KvbenchError, os_error

#: RULER's commit whose essay URL list is fetched.
RULER_COMMIT = "c3f5e3b4f87f97e048793bb510a3a6b19a46bf3a"
ESSAY_LIST_URL = (
    f"https://raw.githubusercontent.com/NVIDIA/RULER/{RULER_COMMIT}/scripts/data/synthetic/json/PaulGrahamEssays_URLs.txt"
)
SQUAD_URL = "https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v2.0.json"
HOTPOTQA_URL = "http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json"
#: Published sha256 of the two QA files (checked when fetched from their default URLs).
SQUAD_SHA256 = "80a5225e94905956a6446d296ca1093975c4d3b3260f1d6c8f68bc2ab77182d8"
HOTPOTQA_SHA256 = "e3da074df24e8369009918aa5cdbdd254dadcde4c63f7569d36afd6f2268caa8"
HUB_REPO = "microsoft/SCBench"
HUB_REVISION = "main"
#: The file of ``DIR`` recording each fetched file's sha256, size and source.
RECORD = "kvbench-fetch.json"
#: Seconds a connection may stay silent before the fetch gives up on it.
TIMEOUT_S = 60.0
#: Seconds each source is given to answer when an offline fetch names every unreachable one.
PROBE_S = 5.0
_CHUNK = 1 << 16


class Offline(KvbenchError):
    """A source could not be reached (no network, DNS failure, refused connection); ``url``: which."""

    def __init__(self, url: str, reason: object) -> None:
        self.url = url
        super().__init__(f"cannot reach {url} ({reason})")


class Unusable(KvbenchError):
    """A file the benches could not use (empty, cut short, not parseable, no item); the message says why."""


class What(str, Enum):
    ruler = "ruler"
    scbench = "scbench"
    all = "all"


@dataclass(frozen=True)
class Plan:
    """One file to fetch: ``rel`` (path under the data directory), ``url``, ``sha256`` it must have (None:
    recorded only) and ``size`` in bytes when known."""

    rel: str
    url: str
    sha256: str | None = None
    size: int | None = None


def _source(env: str, default: str) -> tuple[str, bool]:
    """(URL, whether it is the default) of a source that ``env`` may override."""
    value = os.environ.get(env, "").strip()
    return (value, False) if value else (default, True)


def hub_endpoint() -> str:
    """The hub SCBench is fetched from: ``$KVBENCH_HUB_ENDPOINT``, else ``$HF_ENDPOINT``, else the public hub."""
    return (os.environ.get("KVBENCH_HUB_ENDPOINT") or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip(
        "/"
    )


def describe(what: What) -> str:
    """What ``kvbench data fetch WHAT`` fetches, in one clause (the offline error names it)."""
    parts = []
    if what in (What.ruler, What.all):
        parts.append("ruler/PaulGrahamEssays.json (RULER's essay list), ruler/squad.json (SQuAD v2 dev) and "
                     "ruler/hotpotqa.json (HotpotQA dev distractor)")  # fmt: skip
    if what in (What.scbench, What.all):
        parts.append(f"scbench/scbench_<task>/*.parquet ({HUB_REPO} from {hub_endpoint()})")
    return " and ".join(parts)


def sources(what: What) -> list[str]:
    """The URLs ``kvbench data fetch WHAT`` starts from: the essay URL list and the QA files (ruler), the hub
    (scbench)."""
    urls = []
    if what in (What.ruler, What.all):
        urls.append(_source("KVBENCH_RULER_ESSAY_URLS", ESSAY_LIST_URL)[0])
        urls += [plan.url for plan in ruler_plans()]
    if what in (What.scbench, What.all):
        urls.append(hub_endpoint())
    return urls


def _unreachable(first: Offline, urls: list[str]) -> str:
    """Every source that cannot be reached, ``"cannot reach URL (reason); …"``: ``first`` (the failure that
    stopped the fetch), then each other of ``urls`` whose host does not answer, all probed at once (a few
    seconds at most)."""
    from concurrent.futures import ThreadPoolExecutor

    def probe(url: str) -> Offline | None:
        try:
            _reachable(url, timeout=PROBE_S)
        except Offline as e:
            return e
        return None

    others = list(dict.fromkeys(u for u in urls if u != first.url))
    with ThreadPoolExecutor(max_workers=max(1, len(others))) as pool:
        failed = [e for e in pool.map(probe, others) if e is not None]
    return "; ".join(str(e) for e in [first, *failed])


# --- downloading ---------------------------------------------------------------------------------------------


def _open(url: str, offset: int = 0):
    """An open HTTP response for ``url`` (from byte ``offset`` when > 0); :class:`Offline` when unreachable."""
    import urllib.error
    import urllib.request

    headers = {"User-Agent": "kvbench-data-fetch"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S)
    except urllib.error.HTTPError as e:
        if e.code == 416 and offset:  # the partial file is already whole (or longer): start over
            raise _Restart from None
        raise KvbenchError(f"fetching {url} failed: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise Offline(url, reason) from None


def _reachable(url: str, timeout: float = TIMEOUT_S) -> None:
    """:class:`Offline` unless a TCP connection to ``url``'s host and port opens within ``timeout`` seconds."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError as e:
        raise Offline(url, e) from None


class _Restart(Exception):
    pass


def download(url: str, dest: Path, progress=None, task=None, sha256: str | None = None, size: int | None = None,
             check: Callable[[Path], None] | None = None) -> str:  # fmt: skip
    """Fetch ``url`` into ``dest`` by way of ``dest.part``: a ``.part`` left by an interrupted fetch is continued
    (HTTP range) or, when the server sends the whole file instead, rewritten from its start. The finished file
    is checked (its length against the server's and against ``size`` when known, its sha256 against ``sha256``
    when given, then ``check(part)``, which raises :class:`Unusable` for a file the benches could not use) and
    renamed onto ``dest`` in one step. ``progress``/``task``: a progress display and task advanced by bytes.
    Returns the sha256 (hex). A mismatch or an unusable file removes the ``.part`` and raises
    :class:`KvbenchError`; a file shorter than announced keeps its ``.part`` for the rerun to continue."""
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.is_file() else 0
    try:
        response = _open(url, have)
    except _Restart:
        part.unlink()
        have, response = 0, _open(url)
    with response:
        if have and response.status != 206:  # the server ignored the range: a clean restart
            have = 0
        length = response.headers.get("Content-Length")
        total = have + int(length) if length is not None else None
        if progress is not None:
            progress.update(task, total=total, completed=have)
        with open(part, "ab" if have else "wb") as f:
            while chunk := response.read(_CHUNK):
                f.write(chunk)
                if progress is not None:
                    progress.advance(task, len(chunk))
    got = part.stat().st_size
    for expected in (n for n in (total, size) if n is not None):  # the server's length, then the listing's
        if got < expected:
            raise KvbenchError(f"fetching {url} stopped at {got} of {expected} bytes; rerun the command to continue it")
        if got > expected:
            part.unlink()
            raise KvbenchError(f"{url} gave {got} bytes, not the {expected} announced; nothing was kept, rerun later")
    digest = sha256_of(part)
    if sha256 is not None and digest != sha256:
        part.unlink()
        raise KvbenchError(f"{url} gave sha256 {digest}, not the published {sha256}; nothing was kept, rerun later")
    try:
        if check is not None:
            check(part)
    except Unusable as exc:
        part.unlink()
        raise KvbenchError(f"{url} gave a file the benches cannot use ({exc}); nothing was kept: check the source "
                           "(or its KVBENCH_*_URL setting) and rerun") from None  # fmt: skip
    move_into_place(part, dest)
    return digest


def check_file(rel: str, path: Path) -> None:
    """Raise :class:`Unusable` unless the file ``path`` (fetched as ``rel``) is one the benches can read: not
    empty; a RULER file parsed by the very check its bench reads it through
    (:func:`kvbench.tasks.ruler_tasks.read_data_file`: valid JSON, at least one question or a non-empty
    essay text); a parquet file whose footer reads and that holds at least one row."""
    if path.stat().st_size == 0:
        raise Unusable("the file is empty")
    if rel.startswith("ruler/"):
        from kvbench.tasks.ruler_tasks import DATA_FILES, DataFileError, read_data_file

        task = next(t for t, r in DATA_FILES.items() if r == rel)
        try:
            read_data_file(task, path)
        except DataFileError as exc:
            raise Unusable(exc.reason) from None
    elif rel.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            rows = pq.ParquetFile(path).metadata.num_rows
        except (pa.ArrowException, OSError) as exc:
            raise Unusable(f"not a readable parquet file: {exc}") from None
        if rows < 1:
            raise Unusable("the parquet file holds no row")


# --- RULER ---------------------------------------------------------------------------------------------------


class _FontText(HTMLParser):
    """The text of a page's first ``<font>`` element (where paulgraham.com pages hold the essay), line breaks
    where ``<br>`` and paragraph tags are."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.depth, self.done, self.parts = 0, False, []

    def handle_starttag(self, tag: str, attrs) -> None:
        if self.done:
            return
        if tag == "font":
            self.depth += 1
        elif self.depth and tag == "br":
            self.parts.append("\n")
        elif self.depth and tag == "p":
            self.parts.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "font" and self.depth and not self.done:
            self.depth -= 1
            self.done = self.depth == 0

    def handle_data(self, data: str) -> None:
        if self.depth and not self.done:
            self.parts.append(data)


def essay_text(page: str) -> str:
    """An essay's text from its paulgraham.com page (the first ``<font>`` element), blank-line separated
    paragraphs, a final newline."""
    parser = _FontText()
    parser.feed(page)
    lines = [" ".join(line.split()) for line in "".join(parser.parts).split("\n")]
    text = "\n".join(lines).strip()
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text + "\n\n"


def _read(url: str) -> bytes:
    with _open(url) as response:
        return response.read()


def fetch_essays(root: Path, progress, say) -> tuple[int, int]:
    """``root/ruler/PaulGrahamEssays.json`` from RULER's essay URL list; each essay is kept under
    ``root/ruler/.essays/`` as it arrives (a rerun fetches only the missing ones) and the folder is removed
    once the haystack is written. Returns (essays used, essays that failed)."""
    list_url, _ = _source("KVBENCH_RULER_ESSAY_URLS", ESSAY_LIST_URL)
    urls = [u.strip() for u in _read(list_url).decode("utf-8").splitlines() if u.strip()]
    work = root / "ruler" / ".essays"
    task = progress.add_task("ruler/PaulGrahamEssays.json (essays)", total=len(urls))
    failed = 0
    for url in urls:
        html = ".html" in url
        name = url.rstrip("/").split("/")[-1].replace(".html", ".txt")
        path = work / ("html" if html else "repo") / name
        if not path.is_file():
            try:
                raw = _read(url).decode("utf-8", errors="replace")
            except Offline:
                raise
            except KvbenchError as e:  # RULER's script skips an essay it cannot fetch; so does this
                say(f"skipped: {e}")
                failed += 1
                progress.advance(task)
                continue
            write_atomic(path, essay_text(raw) if html else raw)
        progress.advance(task)
    files = sorted((work / "repo").glob("*.txt")) + sorted((work / "html").glob("*.txt"))
    if not files:
        raise KvbenchError(f"no essay of {list_url} could be fetched; rerun the command later")
    text = "".join(p.read_text(encoding="utf-8") for p in files)
    if not text.strip():
        raise KvbenchError(f"the essays listed by {list_url} hold no text; nothing was written, check the source")
    write_json(root / "ruler" / "PaulGrahamEssays.json", {"text": text})
    for p in files:
        p.unlink()
    for d in (work / "repo", work / "html", work):
        if d.is_dir() and not any(d.iterdir()):
            d.rmdir()
    return len(files), failed


def ruler_plans() -> list[Plan]:
    """The two QA files (the essays are gathered by :func:`fetch_essays`)."""
    plans = []
    qa = (("ruler/squad.json", "KVBENCH_SQUAD_URL", SQUAD_URL, SQUAD_SHA256),
          ("ruler/hotpotqa.json", "KVBENCH_HOTPOTQA_URL", HOTPOTQA_URL, HOTPOTQA_SHA256))  # fmt: skip
    for rel, env, url, sha in qa:
        source, default = _source(env, url)
        plans.append(Plan(rel, source, sha if default else None))
    return plans


# --- SCBench -------------------------------------------------------------------------------------------------


def scbench_plans() -> list[Plan]:
    """Every ``scbench_<task>/*.parquet`` of the hub's SCBench repository (one listing call), with the hub's
    LFS sha256 and size."""
    from huggingface_hub import HfApi, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError

    from kvbench.tasks.scbench import TASKS

    endpoint = hub_endpoint()
    wanted = {f"scbench_{t}" for t in TASKS}
    _reachable(endpoint)  # huggingface_hub would retry an unreachable host for half a minute, warning each time
    try:
        tree = list(HfApi(endpoint=endpoint).list_repo_tree(HUB_REPO, recursive=True, repo_type="dataset",
                                                             revision=HUB_REVISION))  # fmt: skip
    except HfHubHTTPError as e:
        raise KvbenchError(f"listing {HUB_REPO} on {endpoint} failed: {e}".splitlines()[0]) from None
    except Exception as e:  # httpx / OS connection errors, HF_HUB_OFFLINE=1
        raise Offline(endpoint, f"{type(e).__name__}: {e}".splitlines()[0]) from None
    plans = []
    for entry in tree:
        path = getattr(entry, "path", "")
        if path.endswith(".parquet") and path.split("/")[0] in wanted and hasattr(entry, "size"):
            lfs = getattr(entry, "lfs", None)
            url = hf_hub_url(HUB_REPO, path, repo_type="dataset", revision=HUB_REVISION, endpoint=endpoint)
            plans.append(Plan(f"scbench/{path}", url, lfs.sha256 if lfs else None, entry.size))
    if not plans:
        raise KvbenchError(f"{HUB_REPO} on {endpoint} lists no scbench_<task>/*.parquet file")
    return sorted(plans, key=lambda p: p.rel)


# --- the command ---------------------------------------------------------------------------------------------


def _record(root: Path) -> dict:
    path = root / RECORD
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, json.JSONDecodeError):
        return {}


def _save_record(root: Path, record: dict) -> None:
    write_atomic(root / RECORD, json.dumps(record, indent=1, sort_keys=True) + "\n")


def fetch(what: What, root: Path, console) -> dict:
    """Fetch ``what`` into ``root``; return the record of every file (``rel -> {sha256, bytes, source}``)."""
    from rich.progress import BarColumn, DownloadColumn, TextColumn, TimeRemainingColumn, TransferSpeedColumn

    from kvbench.logs import make_progress

    record = _record(root)  # the directory is made with the first file fetched
    files = record.setdefault("files", {})

    def note(rel: str, source: str) -> None:
        path = root / rel
        files[rel] = {"sha256": sha256_of(path), "bytes": path.stat().st_size, "source": source,
                      "fetched": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
        _save_record(root, record)

    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())  # fmt: skip

    def present(rel: str) -> bool:
        """Whether ``rel`` is there already: checked (:func:`check_file`, and its size against the record's),
        recorded when it was not, and kept; one that fails a check is refused, never recorded."""
        path = root / rel
        if not path.is_file():
            return False
        recorded = files.get(rel, {}).get("bytes")
        try:
            if recorded is not None and recorded != path.stat().st_size:
                raise Unusable(f"{path.stat().st_size} bytes, not the {recorded} recorded when it was fetched")
            check_file(rel, path)
        except Unusable as exc:
            rerun = f"kvbench data fetch {what.value} --data-dir {root}"
            raise KvbenchError(f"{path} is there but the benches cannot use it ({exc}); remove it and rerun "
                               f"`{rerun}` to fetch it again") from None  # fmt: skip
        if rel not in files:
            note(rel, "present before the fetch")
        say(f"{path}: already there, kept")
        return True

    try:
        with make_progress(console, columns, throttle_s=10.0) as progress:
            plans: list[Plan] = []
            if what in (What.ruler, What.all):
                essays = root / "ruler" / "PaulGrahamEssays.json"
                if not present("ruler/PaulGrahamEssays.json"):
                    used, failed = fetch_essays(root, progress, say)
                    say(f"{essays}: {used} essays" + (f" ({failed} could not be fetched, as RULER skips them)"
                                                      if failed else ""))  # fmt: skip
                    note("ruler/PaulGrahamEssays.json", _source("KVBENCH_RULER_ESSAY_URLS", ESSAY_LIST_URL)[0])
                plans += ruler_plans()
            if what in (What.scbench, What.all):
                plans += scbench_plans()
            for plan in plans:
                if present(plan.rel):
                    continue
                task = progress.add_task(plan.rel, total=plan.size)
                download(plan.url, root / plan.rel, progress, task, plan.sha256, plan.size,
                         check=lambda path, rel=plan.rel: check_file(rel, path))  # fmt: skip
                note(plan.rel, plan.url)
    except Offline as e:
        unreachable = _unreachable(e, sources(what))
        raise KvbenchError(
            f"kvbench data fetch {what.value} needs the network: {unreachable}. It fetches {describe(what)} into "
            f"{root}; run it where those hosts are reachable, or copy the files there by hand (docs/benches.md)"
        ) from None
    except OSError as e:  # the data directory (or a file in it) cannot be written
        raise os_error(e, f"make {root} writable, or give another --data-dir") from None
    return files


data_app = typer.Typer(help="The benches' external data (RULER's essays and QA sets, SCBench from the hub).",
                       no_args_is_help=True)  # fmt: skip


@data_app.command("fetch")
def fetch_command(
    what: What = typer.Argument(What.all, help="What to fetch: ruler, scbench or all."),
    data_dir: Optional[Path] = typer.Option(
        None, "--data-dir", help="Data directory to fill (the one `kvbench run --data-dir` reads); default "
        "$KVBENCH_DATA_DIR."
    ),
) -> None:
    """Fetch the benches' external data into the data directory (online; resumable; checksums recorded)."""
    from kvbench.logs import make_console

    base = data_dir if data_dir is not None else (os.environ.get("KVBENCH_DATA_DIR") or None)
    if base is None:
        raise KvbenchError("kvbench data fetch: give --data-dir DIR (or set KVBENCH_DATA_DIR) for the data to go to")
    root = Path(base).expanduser()
    check_writable(root, "--data-dir")  # before any connection
    console = make_console(stderr=True)
    files = fetch(what, root, console)
    console.print(f"done: {len(files)} files recorded in {root / RECORD}; run with --data-dir {root}",
                  markup=False, highlight=False, soft_wrap=True)  # fmt: skip
