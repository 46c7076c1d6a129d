"""Results store: one JSON row per finished question, plus ``manifest.json`` and ``missing.json``.

Files of a results directory ``<out>``:

* ``results.jsonl`` (an unsharded run) or ``results.shard-{i}-of-{N}.jsonl`` (``--shard i/N``, N > 1):
  one row per line. Each results file has ONE writer (:class:`ResultsStore`), enforced by an exclusive
  ``fcntl.flock`` on ``<results file>.lock`` (which holds the writer's pid and command); a second writer
  gets a :class:`ResultsError` naming that pid. A results file that is a symbolic link or has several hard
  links is refused (a second name would get a lock of its own). Rows are appended with a single ``os.write`` + ``fsync``
  each, so a crash can at worst leave one partial last line; only the writer, holding the lock, sets such
  a line aside (``<file>.partial-<pid>-<ns>``) and truncates the file back to its last complete row, at its
  first append: a writer that ends before its first row leaves the directory as it was.
* ``manifest.json`` / ``missing.json``: rewritten by writers only, under the directory's ``meta.lock``,
  through a unique temporary file in the same directory and ``os.replace``.

Readers (:func:`read_results`) merge every ``results*.jsonl`` of the directories they are given and never
write, move or truncate anything: an incomplete last line (a writer may be appending it) is skipped and
noted. A row's identity is its :data:`ROW_KEY` fields (:class:`kvbench.rows.RowKey` declares them and how a
line lacking one reads); rows written before ``length``, ``seed``, ``context_sha256``, ``model_fingerprint`` and
``artifact_sha256`` joined the key ("legacy" rows) are never reused: a writer refuses a file holding them, a
reader leaves them out and says so.

The package's modules, one idea each: what a line and its identity are (:mod:`kvbench.results.keys`), reading
and atomically replacing the directory's files (:mod:`kvbench.results.io`), a writer's whole-file scan and crash
repair (:mod:`kvbench.results.scan`), the writer's lock (:mod:`kvbench.results.lock`), the store
(:mod:`kvbench.results.store`: :class:`ResultsStore`), the reader (:mod:`kvbench.results.read`:
:func:`read_results`, :func:`iter_results`), the upgrade of an older kvbench's rows (:mod:`kvbench.results.upgrade`)
and ``kvbench results`` (:mod:`kvbench.results.cli`). Import a name from the module that defines it.
"""
