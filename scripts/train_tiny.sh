#!/usr/bin/env bash
# Reproduce the shipped default model (kvbench/builtin/tiny-trained) and its calibration artifacts, from
# scratch, on CPU: six training stages, the export (bf16 copy + model card + full-cache RULER accuracy),
# then scripts/calibrate_tiny.sh. Deterministic; each stage resumes from its latest checkpoint if cut.
# About 100 + 85 + 10 + 25 + 50 + 30 minutes of training on 2 idle cores, then about 40 minutes of calibration.
# ARCH=qwen3_5 trains the dense twin (kvbench/builtin/tiny-trained-dense) with the same stages plus two the
# measurements called for (3b: variable chains on short rows; 7: 900 more steps at 1,024 tokens, export after
# it), starting from tiny-trained's tokenizer instead of training one.
# Across machines: a stage is skipped when its final/ or a later stage's final/ is complete, so a stage's
# final/ alone (about 19 MB, no optimizer state) carries the run to a fresh machine (docs/models.md).
# Stages 8-9 (both ARCHs) extend the model to 4,096 tokens and to SCBench's offline-generated tasks (kv, mf,
# prefix_suffix, vt; several questions per context, each a target), keeping RULER's tasks in the mix. By
# default they start from the SHIPPED weights (kvbench/builtin/<name>, bf16) and stages 1-7 are not run;
# FROM_SCRATCH=1 runs stages 1-7 first and starts stage 8 from the last of them instead. Shipped weights already
# trained past 1,024 tokens (the export of stage 9: both models since issue 31) skip stages 8-9.
# Stages 10s-10u (both ARCHs, issue 44): SCBench kv key matching (short keys, then answers that quote the asked
# pair), then every SCBench task up to the full 4,096-token context, from the shipped weights (or stage 9's
# final/); each later one gated by scripts/probe_kv.py on the one before (exit 3 when not learned); 10v (the dense
# twin only): 100 more steps at 4,096 tokens. Stages 10n-10p (both ARCHs, issue 44): SCBench mf from short lists,
# then every task at 4,096 tokens with RULER's weighted back up; 10q-10r (tiny-trained only): RULER's multi-key
# and fwe rows weighted up further. Export and calibration after the last (10r for tiny-trained, 10p for the twin).
# CANDIDATES=1 (issue 63): after the exported stage, the stages not shipped yet: 11p (copying: prefix_suffix
# without distractors and short vt chains at 384-512 tokens), 11a (SCBench prefix_suffix and vt
# from short rows, training-only row kinds scbench_ps_short / scbench_ps_hard / scbench_vt_short), 11b (every
# SCBench task at 1,536 then 4,096 tokens), 11c (4,096 tokens, RULER's multi-key rows weighted up for
# tiny-trained); then it stops (no calibration: the shipped weights are unchanged). UNTIL=STAGE stops after STAGE.
# Usage: [ARCH=qwen3_next|qwen3_5] [FROM_SCRATCH=1] [THREADS=1] [AUTOCAST=1] [CANDIDATES=1] [UNTIL=STAGE] bash scripts/train_tiny.sh [OUT]
#        (default OUT: models/<model name>)
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=${ARCH:-qwen3_next}
case "$ARCH" in
  qwen3_next) NAME=tiny-trained; FIRST=() ;;
  qwen3_5) NAME=tiny-trained-dense; FIRST=(--tokenizer kvbench/builtin/tiny-trained) ;;
  *) echo "ARCH=$ARCH: valid are qwen3_next, qwen3_5" >&2; exit 2 ;;
esac
OUT=${1:-models/$NAME}
kvbench() { .venv/bin/kvbench "$@"; }
# THREADS=1 on a busy machine; AUTOCAST=1: bf16 autocast, faster only on a CPU with AVX-512-BF16 / AMX (docs/models.md)
train() {
  local fast=()
  [ "${AUTOCAST:-0}" = 1 ] && fast=(--autocast)
  kvbench train-tiny --arch "$ARCH" ${THREADS:+--threads "$THREADS"} "${fast[@]}" "$@"
}
STAGES=(stage1 stage2 stage3 stage4 stage5 stage6 stage8 stage9)
[ "$ARCH" = qwen3_5 ] && STAGES=(stage1 stage2 stage3 stage3b stage4 stage5 stage6 stage7 stage8 stage9)
STAGES+=(stage10s stage10t stage10u)
[ "$ARCH" = qwen3_5 ] && STAGES+=(stage10v)
STAGES+=(stage10n stage10o stage10p)
[ "$ARCH" = qwen3_next ] && STAGES+=(stage10q stage10r)
[ "${CANDIDATES:-0}" = 1 ] && STAGES+=(stage11p stage11a stage11b stage11c)
finished() { [ -f "$OUT/$1/final/training_args.json" ]; }
# finished_after NAME: prints the first stage after NAME (in STAGES order) whose final/ is complete; false if none
finished_after() {
  local later=0 s
  for s in "${STAGES[@]}"; do
    if [ "$later" = 1 ] && finished "$s"; then echo "$s"; return 0; fi
    if [ "$s" = "$1" ]; then later=1; fi
  done
  return 1
}
# stage NAME ARGS...: train stage NAME into $OUT/NAME, unless a later stage has finished (its final/ is then
# all the run needs from NAME); a finished NAME itself is returned by train-tiny without training.
stage() {
  local name=$1 done
  shift
  if done=$(finished_after "$name"); then
    echo "$name: skipped ($done has finished)" >&2
  else
    train --out "$OUT/$name" "$@"
  fi
  if [ "${UNTIL:-}" = "$name" ]; then echo "UNTIL=$name: stopping after it" >&2; exit 0; fi
}
# gate DONE NEXT PAIRS [KEY_CHARS] [MODE] [TOP1]: stage NEXT starts only once stage DONE has learned key matching
# at PAIRS pairs (scripts/probe_kv.py on SCBench kv rows of the evaluation seed, keys cut to KEY_CHARS, MODE
# --echo or --say, top-1 at least TOP1, default $GATE_TOP1 or 0.8; it exits 3 naming what it measured);
# no probe when NEXT or a later stage has already finished.
PROBE=${PROBE:-.venv/bin/python scripts/probe_kv.py}
gate() {
  if finished "$2" || finished_after "$2" >/dev/null; then return 0; fi
  local json="$OUT/$1/probe-$3${5:+${5#--}}.json"
  $PROBE "$OUT/$1/final" --pairs "$3" --rows 4 ${4:+--key-chars "$4"} ${5:+"$5"} --require-top1 "${6:-${GATE_TOP1:-0.8}}" \
    ${THREADS:+--threads "$THREADS"} --json "$json" || { echo "$2 not started: $1 has not learned key matching at" \
    "$3 pairs ($json); train $1 longer (more --steps) first" >&2; exit 3; }
}
if [ "${FROM_SCRATCH:-0}" = 1 ]; then
  # Stage 1: tokenizer, then 3,850 steps from scratch, curriculum 128 -> 256 -> 512 -> 1,024 (the defaults).
  stage stage1 --eval-limit 0 "${FIRST[@]}"
  # Stage 2: 800 steps at 1,024 tokens from stage 1's weights, weighted to multi-key retrieval, vt and fwe.
  stage stage2 --init "$OUT/stage1/final" --seed 1 --steps 800 --lr 1e-3 \
    --curriculum 1024@0 \
    --mix niah_single_1=0.08,niah_multikey_2=0.25,niah_multikey_3=0.2,vt=0.1,fwe=0.07,recall=0.2,chains=0.05,repeat=0.05 \
    --eval-limit 0
  # Stage 3: key matching. 600 steps at 256 tokens of "echo" rows (questions in the needle's own wording, which
  # a copying head answers) and "lookup" rows (RULER's wording, needles drawn with replacement).
  stage stage3 --init "$OUT/stage2/final" --seed 11 --steps 600 --lr 2e-3 \
    --curriculum 256@0 --save-every 100 --mix echo=0.5,lookup=0.5 --eval-limit 0
  BEFORE4="$OUT/stage3/final"
  if [ "$ARCH" = qwen3_5 ]; then
    # Stage 3b, the dense twin only: variable tracking on short rows, as stage 3 did for key matching. Measured:
    # after stage 2 the MoE model's supervised loss on chains / vt rows had fallen to 1.3 / 1.2, the dense
    # twin's was still 3.6 / 3.5 (where both started stage 2), so the twin had not learned to follow a chain.
    # 400 steps at 256 tokens of chains rows, with echo and lookup rows to keep stage 3's key matching.
    stage stage3b --init "$OUT/stage3/final" --seed 15 --steps 400 --lr 2e-3 \
      --curriculum 256@0 --save-every 100 --mix chains=0.6,echo=0.2,lookup=0.2 --eval-limit 0
    BEFORE4="$OUT/stage3b/final"
  fi
  # Stage 4: back to every task, 512 then 1,024 tokens, keeping lookup and echo rows in the mix.
  stage stage4 --init "$BEFORE4" --seed 12 --steps 300 --lr 1.5e-3 \
    --curriculum 512@0,1024@0.4 --save-every 50 \
    --mix echo=0.1,lookup=0.25,niah_multikey_2=0.15,niah_multikey_3=0.05,vt=0.15,chains=0.1,fwe=0.12,niah_single_1=0.05,repeat=0.03 \
    --eval-limit 0
  # Stages 5-6: more 1,024-token steps weighted to multi-key retrieval, vt and fwe (their losses were still
  # falling after stage 4); export after stage 6.
  MIX56=echo=0.05,lookup=0.2,niah_multikey_2=0.2,niah_multikey_3=0.1,vt=0.18,chains=0.07,fwe=0.15,niah_single_1=0.03,repeat=0.02
  stage stage5 --init "$OUT/stage4/final" --seed 13 --steps 450 --lr 1e-3 \
    --curriculum 1024@0 --save-every 50 --mix "$MIX56" --eval-limit 0
  EXPORT=(--eval-limit 15 --export "kvbench/builtin/$NAME" --card-note "scripts/${NAME//-/_}_card_note.md")
  LAST6=("${EXPORT[@]}")
  [ "$ARCH" = qwen3_5 ] && LAST6=(--eval-limit 0)
  stage stage6 --init "$OUT/stage5/final" --seed 14 --steps 300 --lr 7e-4 \
    --curriculum 1024@0 --save-every 50 --mix "$MIX56" "${LAST6[@]}"
  if [ "$ARCH" = qwen3_5 ]; then
    # Stage 7, the dense twin only. Measured after stage 6 (the export's 15 items per task): niah_single_1 100,
    # niah_multikey_2 33.3, niah_multikey_3 13.3, vt 8.0, fwe 11.1 (mean 33.1; MoE: 50.7 on 50 official items).
    # Its supervised losses were still falling through stages 5-6 (niah_multikey_2 0.30 -> 0.22, vt 1.17 -> 0.94,
    # fwe 2.18 -> 1.60; means of 150 steps) at about 3x the MoE model's on multi-key rows (0.22 vs 0.07), so:
    # 900 more steps at 1,024 tokens, the learning rate back at stage 5's, multi-key and lookup rows weighted up.
    # Measured after it: 100, 93.3, 33.3, 20.0, 20.0 (mean 53.3); on 50 official items 55.6 (model card).
    stage stage7 --init "$OUT/stage6/final" --seed 16 --steps 900 --lr 1e-3 \
      --curriculum 1024@0 --save-every 50 \
      --mix echo=0.05,lookup=0.25,niah_multikey_2=0.25,niah_multikey_3=0.12,vt=0.15,chains=0.03,fwe=0.12,niah_single_1=0.02,repeat=0.01 \
      "${EXPORT[@]}"
  fi
  INIT8="$OUT/stage6/final"
  [ "$ARCH" = qwen3_5 ] && INIT8="$OUT/stage7/final"
else
  INIT8="kvbench/builtin/$NAME"  # the shipped weights (the export of stage 6 / 7 before issue 31)
  shipped_len=$(grep -o '"context_length": *[0-9]*' "$INIT8/kvbench_builtin.json" | grep -o '[0-9]*$' || echo 0)
  # already the export of stage 9 (both models since issue 31): stages 8-9 on it would train them twice, so
  # the run starts at stage 10 from the shipped weights
  if [ "${shipped_len:-0}" -gt 1024 ]; then SKIP89=1; fi
fi
INIT10="kvbench/builtin/$NAME"
if [ "${SKIP89:-0}" != 1 ]; then
  # Stages 8-9: to 4,096 tokens, with SCBench's generated tasks (each row: a context and its five answered
  # questions) beside RULER's tasks and the lookup / chains rows. Stage 8 at 2,048 tokens, stage 9 at 4,096
  # (export after it: the model's default --length becomes 4,096, the longest row it was trained on).
  MIX89=scbench_kv=0.16,scbench_mf=0.07,scbench_prefix_suffix=0.1,scbench_vt=0.08,niah_single_1=0.05,niah_multikey_2=0.12,niah_multikey_3=0.08,vt=0.1,fwe=0.08,lookup=0.1,chains=0.04,repeat=0.02
  stage stage8 --init "$INIT8" --seed 20 --steps 200 --lr 1e-3 \
    --curriculum 2048@0 --save-every 25 --mix "$MIX89" --eval-limit 0
  # Stage 9 takes 4 rows a step (8 rows of 4,096 tokens would be about 4x a 2,048-token step's time and memory:
  # stage 8 measured 9.6 GB resident with 8 x 2,048).
  stage stage9 --init "$OUT/stage8/final" --seed 21 --steps 250 --batch-size 4 --lr 7e-4 \
    --curriculum 4096@0 --save-every 25 --mix "$MIX89" \
    --eval-limit 15 --export "kvbench/builtin/$NAME" --card-note "scripts/${NAME//-/_}_card_note.md"
  INIT10="$OUT/stage9/final"
fi
# Stages 10s-10u (issue 44): SCBench kv key matching. After stage 9 both models copy *a* UUID of the context but
# not the one whose key is asked (kv 2 of 100). Rows are SCBench kv contexts in the evaluation's format with few
# pairs (scbench_kv8*: 4-8 pairs, at most pairs - 1 distinct keys asked, so no answer by elimination); each stage
# starts only once the probe finds the previous one has learned what it was for (gate). Half of every mix keeps
# RULER's tasks, the lookup / echo / chains rows and the other SCBench tasks.
KEEP10=lookup=0.08,echo=0.05,niah_single_1=0.05,niah_multikey_2=0.08,niah_multikey_3=0.04,vt=0.04,fwe=0.04,chains=0.03,scbench_mf=0.03,scbench_prefix_suffix=0.03,scbench_vt=0.03
# 10s: keys cut to their first 4-8 hex characters (scbench_kv8_short, with echo rows): about 700 steps of full
# UUID keys (an earlier 10a alone, then with echo rows) left the probe at chance (docs/models.md); a key of one to a few
# tokens separates "copy a value" from "match a multi-token key". 400 steps taught the copy, not the match: fed
# the asked pair's "KEY": " the model writes the right value (probe --echo, 8 pairs, 6-character keys: top-1 0.75,
# chance 0.12; the shipped weights 0.00) but answering the bare question stays at chance (0.15). Gated on the
# copy: --echo at top-1 0.5, four times chance.
stage stage10s --init "$INIT10" --seed 34 --steps 400 --lr 1e-3 \
  --curriculum 768@0 --save-every 20 --mix "scbench_kv8_short=0.3,scbench_kv8_short_echo=0.2,$KEEP10" --eval-limit 0
gate stage10s stage10t 8 6 --echo 0.5
# 10t: the answer is the asked pair quoted, "KEY": "VALUE, every token supervised (*_say rows): copying the key
# from the question, then what follows it in the context, which 10s taught. The kv scorer counts the quote (the
# value is a substring of it). Gated on the quoted answer (probe --say) at 8 pairs with 6-character keys.
stage stage10t --init "$OUT/stage10s/final" --seed 35 --steps 400 --lr 1e-3 \
  --curriculum 768@0 --save-every 20 --eval-limit 0 \
  --mix "scbench_kv8_short_say=0.3,scbench_kv8_say=0.1,scbench_kv8_short_echo=0.1,$KEEP10"
# 10t learned it, and beyond what it was trained on: --say top-1 1.00 at 8, 16, 32 and 51 pairs (the full
# 4,096-token context) with full UUID keys, and full-cache SCBench kv 45 at 4,096 (20 contexts x 5 questions;
# the shipped weights: 2), so the pair-count steps planned here (8 / 16 / 32 pairs at 1,024-3,072 tokens) are
# not needed (docs/models.md). What 10t lost: SCBench vt 3.4 -> 0 and prefix_suffix 9 -> 4 (its rows were 768
# tokens, mostly kv). 10u: kv quoted-pair rows up to the full context (kv16 / kv32 / kv64_say), SCBench's three
# other tasks at three times their 10t weight, RULER's tasks kept; 1,536-token rows, the last fifth at 4,096.
gate stage10t stage10u 51 "" --say
KEEP10U=niah_single_1=0.04,niah_multikey_2=0.07,niah_multikey_3=0.04,vt=0.05,fwe=0.04,lookup=0.05,echo=0.02,chains=0.03
EXPORT=(--eval-limit 15 --export "kvbench/builtin/$NAME" --card-note "scripts/${NAME//-/_}_card_note.md")
# CANDIDATES=1: the exported stage (10r / 10p) is not exported and evaluated again on the way to the stages after it
[ "${CANDIDATES:-0}" = 1 ] && EXPORT=(--eval-limit 0)
stage stage10u --init "$OUT/stage10t/final" --seed 36 --steps 300 --batch-size 4 --lr 7e-4 \
  --curriculum 1536@0,4096@0.8 --save-every 10 --eval-limit 0 \
  --mix "scbench_kv16_say=0.1,scbench_kv32_say=0.15,scbench_kv64_say=0.1,scbench_mf=0.1,scbench_prefix_suffix=0.09,scbench_vt=0.12,$KEEP10U"
AFTER10U="$OUT/stage10u/final"
if [ "$ARCH" = qwen3_5 ]; then
  # 10v: 10u left the twin at SCBench kv 54 (tiny-trained: 71), 60 steps of its 300 having been at 4,096 tokens;
  # 100 more steps x 4 rows all at 4,096, kv rows of the full context's pairs 30 %, lr 5e-4. Measured run: started
  # from 10u's bf16 export (its float32 final/ was lost with its machine), not from 10u's final/ as here.
  stage stage10v --init "$OUT/stage10u/final" --seed 37 --steps 100 --batch-size 4 --lr 5e-4 \
    --curriculum 4096@0 --save-every 10 --eval-limit 0 \
    --mix "scbench_kv64_say=0.3,scbench_kv32_say=0.06,scbench_mf=0.1,scbench_prefix_suffix=0.1,scbench_vt=0.1,$KEEP10U"
  AFTER10U="$OUT/stage10v/final"
fi
# 10n-10p: SCBench mf. After 10u / 10v both models answer mf with one number per question kind whatever the list
# holds (scripts/mf_by_kind.py: mf 6-7); an earlier 10m of plain mf rows at 1,024 tokens left its loss at guessing
# level. 10n: mf rows of short lists (384-768 tokens) 60 %, quoted-pair kv rows and RULER kept (mf 37 on both, kv
# fell). 10o: every SCBench task at 1,536 then 4,096 tokens (10 contexts: kv 68 / 50, mf 38 / 38). 10p: 120 steps
# all at 4,096 tokens, RULER's tasks 38-42 %, lr 5e-4; the twin: SCBench kv 69, mf 37 (20 contexts; 10v: 69, 6),
# RULER's five-task mean at 4,096 41.9 (10v: 42.9); its export. Measured runs: 10n started from the bf16 exports of
# 10u / 10v, not from their final/ as here.
stage stage10n --init "$AFTER10U" --seed 39 --steps 600 --lr 1e-3 \
  --curriculum 384@0,512@0.5,768@0.8 --save-every 25 --eval-limit 0 \
  --mix scbench_mf=0.6,scbench_kv8_short_say=0.08,scbench_kv8_say=0.04,lookup=0.08,echo=0.04,chains=0.06,niah_single_1=0.03,niah_multikey_2=0.04,vt=0.03
stage stage10o --init "$OUT/stage10n/final" --seed 40 --steps 160 --batch-size 4 --lr 7e-4 \
  --curriculum 1536@0,4096@0.65 --save-every 10 --eval-limit 0 \
  --mix "scbench_kv16_say=0.06,scbench_kv32_say=0.1,scbench_kv64_say=0.12,scbench_mf=0.18,scbench_prefix_suffix=0.08,scbench_vt=0.12,$KEEP10U"
# the twin exports after 10p; tiny-trained after 10r
if [ "$ARCH" = qwen3_5 ]; then
  MIX10P=niah_single_1=0.04,niah_multikey_2=0.13,niah_multikey_3=0.09,vt=0.06,fwe=0.06,scbench_kv64_say=0.2,scbench_kv32_say=0.05,scbench_mf=0.12,scbench_prefix_suffix=0.04,scbench_vt=0.06
  EXPORT10P=("${EXPORT[@]}")
else
  MIX10P=niah_single_1=0.04,niah_multikey_2=0.14,niah_multikey_3=0.1,vt=0.07,fwe=0.07,scbench_kv64_say=0.12,scbench_kv32_say=0.05,scbench_mf=0.14,scbench_prefix_suffix=0.05,scbench_vt=0.07
  EXPORT10P=(--eval-limit 0)
fi
stage stage10p --init "$OUT/stage10o/final" --seed 41 --steps 120 --batch-size 4 --lr 5e-4 \
  --curriculum 4096@0 --save-every 10 --mix "$MIX10P,lookup=0.08,echo=0.03,chains=0.04" "${EXPORT10P[@]}"
if [ "$ARCH" = qwen3_next ]; then
  # 10q, 10r (tiny-trained only): after 10p its RULER niah_multikey_2 and fwe still trailed the shipped 10u's (20
  # items each: 35 and 10 against 50 and 26.7); 60 steps at 4,096 twice, lr 3e-4, them weighted up to 20 / 15 %,
  # then 25 / 20 %. After 10r (20 items): RULER's five-task mean 43.9 (10u: 46.7), SCBench kv 86, mf 42 (10
  # contexts; 10u: 68, 7); its export.
  stage stage10q --init "$OUT/stage10p/final" --seed 44 --steps 60 --batch-size 4 --lr 3e-4 \
    --curriculum 4096@0 --save-every 10 --eval-limit 0 \
    --mix "niah_single_1=0.03,niah_multikey_2=0.2,niah_multikey_3=0.1,vt=0.05,fwe=0.15,scbench_kv64_say=0.1,scbench_mf=0.12,scbench_prefix_suffix=0.04,scbench_vt=0.05,lookup=0.08,echo=0.03,chains=0.05"
  stage stage10r --init "$OUT/stage10q/final" --seed 45 --steps 60 --batch-size 4 --lr 3e-4 \
    --curriculum 4096@0 --save-every 10 \
    --mix "niah_single_1=0.02,niah_multikey_2=0.25,niah_multikey_3=0.08,vt=0.05,fwe=0.2,scbench_kv64_say=0.1,scbench_mf=0.1,scbench_prefix_suffix=0.03,scbench_vt=0.04,lookup=0.08,echo=0.02,chains=0.03" \
    "${EXPORT[@]}"
fi
if [ "${CANDIDATES:-0}" = 1 ]; then
  # Issue 63: SCBench prefix_suffix and vt, as 10n did mf: their generated rows need 690 (prefix_suffix: 5 targets,
  # 25 strings) and 935 tokens (vt: 5 chains) at the least, so 11a trains the training-only smaller rows (1-5
  # questions, prefix_suffix with 0-2 or 2 distractors per target) at 384-768 tokens, kv and mf kept (short lists and
  # few pairs, as 10n). Answers are the generator's: one string, never a list of candidates (the official scorer
  # counts a substring). 11b: the generated rows at 1,536 then 4,096 tokens. 11c: 4,096 only, RULER's tasks weighted
  # back up, tiny-trained's multi-key rows most (its niah_multikey_2 / 3 fell 54 / 40 -> 38 / 32 over 10n-10r).
  AFTER10="$OUT/stage10r/final"
  [ "$ARCH" = qwen3_5 ] && AFTER10="$OUT/stage10p/final"
  # 11p (session of 2026-12-07, second): the first 11a run showed no learning of prefix_suffix or vt by step 350
  # (both at noise), so copying comes first, as kv's quoted-pair rows came before kv at full length: 1,000 steps of
  # short rows (384-512 tokens; vt_short needs 384), mostly prefix_suffix with 0-2 distractors and short vt chains.
  stage stage11p --init "$AFTER10" --seed 53 --steps 1000 --lr 1e-3 \
    --curriculum 384@0,512@0.6 --save-every 25 --eval-limit 0 \
    --mix scbench_ps_short=0.45,scbench_vt_short=0.2,scbench_kv8_short_say=0.08,scbench_mf=0.08,lookup=0.07,chains=0.06,niah_single_1=0.03,vt=0.03
  stage stage11a --init "$OUT/stage11p/final" --seed 50 --steps 600 --lr 1e-3 \
    --curriculum 384@0,512@0.5,768@0.8 --save-every 25 --eval-limit 0 \
    --mix scbench_ps_short=0.22,scbench_ps_hard=0.13,scbench_vt_short=0.25,scbench_mf=0.1,scbench_kv8_say=0.06,scbench_kv8_short_say=0.04,lookup=0.05,chains=0.05,niah_multikey_2=0.04,niah_single_1=0.02,vt=0.04
  stage stage11b --init "$OUT/stage11a/final" --seed 51 --steps 160 --batch-size 4 --lr 7e-4 \
    --curriculum 1536@0,4096@0.65 --save-every 10 --eval-limit 0 \
    --mix "scbench_prefix_suffix=0.14,scbench_ps_hard=0.08,scbench_vt=0.12,scbench_vt_short=0.06,scbench_kv32_say=0.06,scbench_kv64_say=0.1,scbench_mf=0.1,$KEEP10U"
  if [ "$ARCH" = qwen3_5 ]; then
    MIX11C=niah_multikey_2=0.12,niah_multikey_3=0.09,niah_single_1=0.03,vt=0.06,fwe=0.08,scbench_kv64_say=0.18,scbench_kv32_say=0.04,scbench_mf=0.12,scbench_prefix_suffix=0.1,scbench_vt=0.08,lookup=0.06,chains=0.04
  else
    MIX11C=niah_multikey_2=0.18,niah_multikey_3=0.14,niah_single_1=0.02,vt=0.05,fwe=0.1,scbench_kv64_say=0.1,scbench_mf=0.1,scbench_prefix_suffix=0.1,scbench_vt=0.08,lookup=0.08,echo=0.02,chains=0.03
  fi
  stage stage11c --init "$OUT/stage11b/final" --seed 52 --steps 100 --batch-size 4 --lr 5e-4 \
    --curriculum 4096@0 --save-every 10 --eval-limit 0 --mix "$MIX11C"
  echo "CANDIDATES=1: stages 11a-11c done; none is exported (the shipped weights and calibration are unchanged)" >&2
  exit 0
fi
bash scripts/calibrate_tiny.sh "$NAME"
