#!/usr/bin/env bash
# Mutation testing, the slow lane (not in the default suite, not in .ci/run): mutmut 3 over the modules where a
# silent bug costs a wrong published number, one group at a time, each in its own staged copy.
#
#   bash scripts/mutation.sh [GROUP ...]       (default: budgets scorers; "all" for every group)
#
# Groups (modules mutated <- the tests that may kill them):
#   budgets   kvbench/{budgets,allocations,selection}.py <- test_budgets, test_methods_invariants
#   scorers   scorers/*.py                            <- test_scorers, test_scbench_scorers, test_scbench_official_scorers
#   results   kvbench/results/*.py, kvbench/rows.py   <- test_results, test_results_edges, test_results_upgrade,
#                                                        test_rows, test_store_cli
#   methods   methods/*.py, gatesight/{features,      <- test_methods_*, test_budgets, test_gatesight, test_oracle
#             estimator,method}.py: what runs when a      (not its two CLI runs), test_triattention_trig
#             method scores (GateSight's offline label / train / evaluate pipeline is left out: its output is
#             a recorded artifact)
#   ruler     tasks/ruler*.py                         <- test_ruler, test_ruler_official, test_ruler_edges,
#                                                        test_ruler_official_edges, test_ruler_tasks_edges
#   scbench   tasks/scbench*.py, kvbench/prompt.py    <- test_scbench*, test_prompt (not the 13 s CLI run of
#                                                        test_scbench_sources: every mutant would wait for it)
#
# Why a staged copy: methods/, tasks/ and scorers/ are installed as kvbench.methods, kvbench.tasks and
# kvbench.scorers (pyproject's package-dir), but mutmut names and imports mutants by file path. The copy under
# $MUTATION_DIR/<group> (default .mutation/, git-ignored) puts them under kvbench/ and gets the pyproject's
# [tool.mutmut] section with the group's only_mutate and test selection filled in; mutmut then runs there at
# nice 19 with one worker (MUTATION_JOBS to change). Its results stay there: `cd .mutation/<group> &&
# ../../.venv/bin/mutmut results` lists survivors, `mutmut show <name>` shows one. Each group's summary line
# is printed at the end and written to .mutation/<group>/score.txt. MUTANTS='kvbench.scorers.scbench.*' runs
# only the mutants matching those patterns (mutmut's names: module path, then x_<function>__mutmut_<n>).
# MUTATION_RECHECK_TIMEOUTS=1 reruns the mutants mutmut timed out (its wall-clock timeout counts as a kill, and on a
# loaded machine it fires on mutants that do not loop); run the script alone on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${VENV:-$ROOT/.venv}
OUT=${MUTATION_DIR:-$ROOT/.mutation}
JOBS=${MUTATION_JOBS:-1}
if ! "$VENV/bin/python" -c "import mutmut" 2>/dev/null; then
  echo "error: mutmut is not installed in $VENV; run: $VENV/bin/python -m pip install 'mutmut>=3,<4'" >&2
  exit 2
fi

declare -A MUTATE TESTS
MUTATE[budgets]="kvbench/budgets.py kvbench/allocations.py kvbench/selection.py"
TESTS[budgets]="tests/test_budgets.py tests/test_methods_invariants.py"
MUTATE[scorers]="kvbench/scorers/*.py"
TESTS[scorers]="tests/test_scorers.py tests/test_scbench_scorers.py tests/test_scbench_official_scorers.py"
MUTATE[results]="kvbench/results/*.py kvbench/rows.py"
TESTS[results]="tests/test_results.py tests/test_results_edges.py tests/test_results_upgrade.py tests/test_rows.py
  tests/test_store_cli.py"
MUTATE[methods]="kvbench/methods/*.py kvbench/methods/gatesight/features.py kvbench/methods/gatesight/estimator.py
  kvbench/methods/gatesight/method.py"
TESTS[methods]="tests/test_methods_invariants.py tests/test_methods_keydiff.py tests/test_methods_kvzip.py
  tests/test_methods_options.py tests/test_methods_snapkv.py tests/test_methods_triattention.py tests/test_budgets.py
  tests/test_gatesight.py tests/test_oracle.py tests/test_triattention_trig.py
  --deselect tests/test_oracle.py::test_oracle_through_the_cli_beats_random_on_the_needle
  --deselect tests/test_oracle.py::test_model_list_runs_each_model_once_into_one_out"
MUTATE[ruler]="kvbench/tasks/ruler*.py"
TESTS[ruler]="tests/test_ruler.py tests/test_ruler_official.py tests/test_ruler_edges.py tests/test_ruler_official_edges.py
  tests/test_ruler_tasks_edges.py"
MUTATE[scbench]="kvbench/tasks/scbench*.py kvbench/prompt.py"
TESTS[scbench]="tests/test_scbench.py tests/test_scbench_generate.py tests/test_scbench_official.py
  tests/test_scbench_sources.py tests/test_prompt.py tests/test_scbench_edges.py tests/test_scbench_generate_edges.py
  --deselect tests/test_scbench_sources.py::test_run_without_data_writes_generated_rows_and_says_so_in_one_line"
ALL="budgets scorers results methods ruler scbench"

groups=("$@")
[ ${#groups[@]} -gt 0 ] || groups=(budgets scorers)
[ "${groups[*]}" != all ] || read -r -a groups <<<"$ALL"
for group in "${groups[@]}"; do
  if [ -z "${MUTATE[$group]+x}" ]; then
    echo "error: unknown group '$group'; valid: $ALL (or all)" >&2
    exit 2
  fi
done

stage() {  # stage GROUP DIR: the copy mutmut runs in (kept between runs: mutmut resumes what it has done)
  local group=$1 dir=$2
  mkdir -p "$dir"
  rm -rf "$dir/kvbench" "$dir/tests" "$dir/scripts"
  cp -r kvbench tests scripts "$dir/"
  for sub in methods tasks scorers; do cp -r "$sub" "$dir/kvbench/$sub"; done
  find "$dir" -name __pycache__ -prune -exec rm -rf {} +
  # the shared data (RULER's essays) beside the checkout, beside the copy too: mutmut runs the tests in
  # $dir/mutants, whose conftest looks for ../shared/data; without it the essay tasks' checks skip there
  if [ -d "$ROOT/../shared" ]; then ln -sfn "$(cd "$ROOT/../shared" && pwd)" "$dir/shared"; fi
  "$VENV/bin/python" - "$dir/pyproject.toml" "${MUTATE[$group]}" "${TESTS[$group]}" <<'EOF'
import json, re, sys
from pathlib import Path

out, patterns, tests = Path(sys.argv[1]), sys.argv[2].split(), sys.argv[3].split()
# each glob expanded here, file by file: mutmut matches only_mutate with fnmatch, whose * also crosses "/"
# (kvbench/methods/*.py would take in methods/gatesight/*.py too)
mutate = []
for pattern in patterns:
    found = sorted(str(f.relative_to(out.parent)) for f in out.parent.glob(pattern))
    assert found, f"{pattern} matches no file in {out.parent}"
    mutate += found
text = Path("pyproject.toml").read_text(encoding="utf-8")
section = re.search(r"^\[tool\.mutmut\]\n(?:(?!^\[).*\n?)*", text, re.M)
assert section, "pyproject.toml has no [tool.mutmut] section"
body = re.sub(r"^(only_mutate|pytest_add_cli_args_test_selection) = .*\n", "", section.group(0), flags=re.M)
body += f"only_mutate = {json.dumps(mutate)}\npytest_add_cli_args_test_selection = {json.dumps(tests)}\n"
out.write_text(text[: section.start()] + body + text[section.end() :], encoding="utf-8")
EOF
}

mutmut() { (cd "$dir" && OMP_NUM_THREADS=1 nice -n 19 "$VENV/bin/mutmut" "$@"); }

summaries=()
for group in "${groups[@]}"; do
  dir="$OUT/$group"
  echo "== $group: ${MUTATE[$group]} (staged in $dir)"
  stage "$group" "$dir"
  # tests (or the group's test selection) changed since the verdicts here were made, or nobody recorded which tests
  # made them (a run cut before its end): recollect which tests cover what, and recheck the mutants that were not
  # killed (mutmut keeps verdicts between runs; an interrupted run resumes)
  tests_sha=$( (echo "${TESTS[$group]}"; find tests -type f -name '*.py' -print0 | sort -z | xargs -0 cat) | sha256sum | cut -c1-16)
  recheck='survived|no tests'
  if [ -d "$dir/mutants" ] && [ "$(cat "$dir/tests.sha" 2>/dev/null)" != "$tests_sha" ]; then
    rm -f "$dir/mutants/mutmut-stats.json"
  else
    recheck=''
  fi
  # MUTATION_RECHECK_TIMEOUTS=1: mutmut counts its wall-clock timeout as a kill, and on a loaded machine it fires on
  # mutants that do not loop; rerun those (alone on the machine) so that only real endless loops stay "timeout"
  [ "${MUTATION_RECHECK_TIMEOUTS:-0}" = 0 ] || recheck="${recheck:+$recheck|}timeout"
  # shellcheck disable=SC2086  # MUTANTS: mutant name patterns (e.g. 'kvbench.scorers.scbench.*'), word-split
  mutmut run --max-children "$JOBS" ${MUTANTS:-} | tail -n 3
  if [ -n "$recheck" ]; then
    mapfile -t again < <(mutmut results --all true | awk -F': ' -v want="^($recheck)$" '$2 ~ want {gsub(/^ +/, "", $1); print $1}')
    [ ${#again[@]} -eq 0 ] || mutmut run --max-children "$JOBS" "${again[@]}" | tail -n 3
  fi
  echo "$tests_sha" >"$dir/tests.sha"
  mutmut results --all true >"$dir/results.txt"
  line=$("$VENV/bin/python" - "$dir/results.txt" "$group" <<'EOF'
import collections, sys
status = collections.Counter(line.rsplit(": ", 1)[1].strip() for line in open(sys.argv[1]) if ": " in line)
done = sum(status.values()) - status["not checked"]
killed = status["killed"] + status["timeout"] + status["caught by type check"]
score = f"{100 * killed / done:.1f}%" if done else "n/a"
print(f"{sys.argv[2]}: {killed} of {done} mutants killed ({score}); " + ", ".join(f"{k} {v}" for k, v in sorted(status.items())))
EOF
)
  echo "$line" | tee "$dir/score.txt"
  summaries+=("$line")
done
printf '%s\n' "${summaries[@]}"
