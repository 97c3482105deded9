#!/usr/bin/env bash
# Results, second round (issue 35; docs/experiments.md, "Results, second round"): the CPU runs of
# configs/sweeps/results-round2.yml (then results-round2-finetune.yml), two at a time, one thread each, resumable.
#
#   bash scripts/results_round2.sh            # data (skipped when there), plan, then two background workers that
#                                             #   take the runs in the sweep's order; a worker already running is
#                                             #   left alone, so running it again is safe (and resumes everything)
#   bash scripts/results_round2.sh --status   # where each run is (python -m neox_dar.sweep ... status)
#   bash scripts/results_round2.sh --stop     # the workers start no new run (the running ones finish); --go, or
#                                             #   launching again, undoes it
#   bash scripts/results_round2.sh --publish RUN...  # copy finished runs into results/results-round2 (the report,
#                                             #   docs/experiments.md's table, and data.json: torch, sha256 of the bytes)
#   bash scripts/results_round2.sh --publish-finetune RUN...   # the same for results/results-round2-finetune
#   bash scripts/results_round2.sh --publish-dimpo    # the DimPO study into results/results-round2-dimpo
#   bash scripts/results_round2.sh --rebuild RUN [STEPS]   # train one published run again from nothing with the
#                                             #   code that trained it (in runs/results-round2-rebuild/RUN), its
#                                             #   first STEPS steps if given, and compare its losses with the published
#   bash scripts/results_round2.sh --publish-checkpoint RUN   # RUN's final weights (the start of the fine-tuning
#                                             #   runs and the DimPO study: vanilla-seed3) into
#                                             #   results/results-round2/checkpoints/RUN, loadable as a checkpoint
#
# Each worker (logs: runs/results-round2/logs/worker-N.log) goes through the task list (--list) in order, takes the
# first task no other worker holds (a flock on runs/results-round2/claims/TASK.lock, released by the kernel however
# the worker ends) and runs it: `python -m neox_dar.sweep SWEEP run --local --only RUN` trains (continuing from the
# run's newest checkpoint) and evaluates it, and skips a run that is done. A worker starts no task after STOP_AT
# (HH:MM UTC, optional) or while runs/results-round2/STOP exists, and ends when a pass over the list started nothing.
# The list and each task are read from this file when they run, so an edit here reaches running workers.
# Environment: SHARED (default ../shared/data), WORKERS (2), OMP_NUM_THREADS (1), STOP_AT, PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
CODE=runs/round2-code                                   # a git worktree of the code the runs use (setup_code)
CODE_COMMIT=${CODE_COMMIT:-3e08c0d8f91cbc8455ba9a90c0a04b07373dbece}
SITE=runs/round2-site
SHARED=${SHARED:-../shared/data}
WORKERS=${WORKERS:-2}
WORK=runs/results-round2
DATA=runs/replicate-cpu/data
TEXT=runs/replicate-cpu/text
SWEEP=configs/sweeps/results-round2.yml
FT_SWEEP=configs/sweeps/results-round2-finetune.yml
FT_WORK=runs/results-round2-finetune
DIMPO_WORK=runs/results-round2-dimpo
# DimPO Table 1's protocol on vanilla-seed3 (bench/dimpo_small.py's small-scale schedule: 8 epochs, Table 6's learning
# rates x 10) with held-out Wikipedia bytes: the first 4 / next 2 / next 2 held-out articles, their first 512 bytes
DIMPO_ARGS="--dims 16,8,4 --seq-len 512 --train-docs 4 --valid-docs 2 --test-docs 2 --epochs 8 --lr-scale 10 --device cpu"
REUSED="vanilla-seed1 vanilla-seed2 dar uniform swa mswa aha-w16 aha-w64"   # round 1's runs, same configs
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

log() { echo "[round2 $(date -u +%H:%M:%S)] $*"; }

setup_code() {  # the code the runs train and evaluate with: a git worktree at CODE_COMMIT (others' edits in the main
  # tree never reach a running sweep, and every checkpoint records a clean commit), its runs/ the main tree's runs/
  if [ ! -f "$CODE/train.py" ]; then
    git worktree prune
    git worktree add --detach "$CODE" "$CODE_COMMIT" >/dev/null
  fi
  [ -L "$CODE/runs" ] || ln -sfn "$ROOT/runs" "$CODE/runs"
  mkdir -p "$SITE"
  # the package is installed editable from the main tree, and its finder maps neox_dar.eval, .kernels and .data_prep
  # there: this sitecustomize (on PYTHONPATH) points the finder at the worktree's folders instead
  cat > "$SITE/sitecustomize.py" <<'EOF'
import os
import sys

code = os.environ.get("NEOX_DAR_CODE")
if code:
    for name, module in list(sys.modules.items()):
        mapping = getattr(module, "MAPPING", None) if name.startswith("__editable__") else None
        if isinstance(mapping, dict) and "neox_dar" in mapping:
            root = os.path.dirname(mapping["neox_dar"])
            for key, path in mapping.items():
                mapping[key] = os.path.join(code, os.path.relpath(path, root))
EOF
}

in_code() {  # in_code CMD...: CMD from the worktree, with its own package
  (cd "$CODE" && PYTHONPATH="$ROOT/$SITE${PYTHONPATH:+:$PYTHONPATH}" NEOX_DAR_CODE="$ROOT/$CODE" "$@")
}

prepare_data() {  # as scripts/replicate.sh --cpu: the text, byte-level tokens, WikiText-103 test, 100 held-out articles
  mkdir -p "$DATA"
  [ -f "$TEXT/manifest.json" ] || "$PY" -m data_prep.wikipedia --wikipedia "$SHARED/wikipedia" \
    --wikitext "$SHARED/wikitext103" --out "$TEXT" --max-mib 4
  local name
  for name in wiki_train:wiki_train.jsonl.zst wiki_heldout:wiki_heldout.jsonl.gz; do
    [ -f "$DATA/${name%%:*}.idx" ] || "$PY" -m data_prep.tokenize "$TEXT/${name#*:}" \
      --tokenizer data/byte_tokenizer.json --out "$DATA/${name%%:*}" --no-progress
  done
  if [ ! -f "$DATA/wiki.test.tokens" ]; then
    gunzip -c "$TEXT/wiki.test.tokens.gz" > "$DATA/wiki.test.tokens.tmp" && mv "$DATA/wiki.test.tokens.tmp" "$DATA/wiki.test.tokens"
  fi
  if [ ! -f "$DATA/wiki_heldout100.jsonl.gz" ]; then
    { gunzip -c "$TEXT/wiki_heldout.jsonl.gz" | head -n 100 || true; } | gzip -n > "$DATA/wiki_heldout100.jsonl.gz.tmp"
    mv "$DATA/wiki_heldout100.jsonl.gz.tmp" "$DATA/wiki_heldout100.jsonl.gz"
  fi
}

reuse_round1() {  # round 1's trained and evaluated runs (same configs: only save and wandb_group differ) join round 2;
  # on a machine whose runs/ lost round 2's finished runs, their published files come back the same way (but
  # vanilla-seed3, whose checkpoint the fine-tuning and DimPO start from: it is trained again, deterministically)
  local run src dst
  for src in results/replicate-cpu/runs/* results/results-round2/runs/*; do
    run=${src##*/}
    [ -f "$src/status.json" ] && [ -f "$WORK/$run/config.yml" ] || continue
    case "$src" in results/replicate-cpu/*) case " $REUSED " in *" $run "*) ;; *) continue ;; esac ;; esac
    [ "$run" = vanilla-seed3 ] && continue
    dst=$WORK/$run
    [ -f "$dst/status.json" ] && continue
    mkdir -p "$dst/eval"
    cp "$src/status.json" "$src/metrics.jsonl" "$dst/"
    cp "$src/eval/"*.json "$dst/eval/"
    log "reused $run from $src"
  done
}

plan_finetune() {  # the fine-tuning sweep starts from vanilla-seed3's checkpoint: planned once vanilla-seed3 is trained
  if [ -f "$FT_SWEEP" ] && grep -q '"state": "done"' "$WORK/vanilla-seed3/status.json" 2>/dev/null; then
    in_code "$PY" -m neox_dar.sweep "$ROOT/$FT_SWEEP" plan --out "$ROOT/$FT_WORK" >/dev/null
  fi
}

plan() {
  setup_code
  in_code "$PY" -m neox_dar.sweep "$ROOT/$SWEEP" plan --out "$ROOT/$WORK" >/dev/null
  reuse_round1
  plan_finetune
}

runs_of() {  # the run names of a sweep file, in order
  "$PY" -c 'import sys
from neox_dar.sweep import load_sweep
print(" ".join(r.name for r in load_sweep(sys.argv[1]).runs))' "$1"
}

list_tasks() {  # every task, in priority order (as SWEEP_FILE:RUN): the sweep's 1x runs (vanilla-seed3 first: the
  # fine-tuning and DimPO start from it), the fine-tuning runs and the DimPO study (short), then the longer budgets
  local run late=""
  for run in $(runs_of "$SWEEP"); do
    case " $REUSED " in *" $run "*) continue ;; esac
    case "$run" in *-2x|*-4x) late+=" $run"; continue ;; esac
    echo "$SWEEP:$run"
  done
  if [ -f "$FT_SWEEP" ]; then
    for run in $(runs_of "$FT_SWEEP"); do echo "$FT_SWEEP:$run"; done
  fi
  echo "dimpo:vanilla-seed3"
  for run in $late; do echo "$SWEEP:$run"; done
}

dimpo_task() {  # DimPO fit and table on vanilla-seed3's checkpoint (the fit resumes when run again)
  grep -q '"state": "done"' "$WORK/vanilla-seed3/status.json" 2>/dev/null || { log "dimpo: vanilla-seed3 not trained yet"; return 4; }
  mkdir -p "$DIMPO_WORK"
  # shellcheck disable=SC2086
  in_code "$PY" -m neox_dar.dimpo fit "$WORK/vanilla-seed3" --train "$DATA/wiki_heldout" --out "$DIMPO_WORK" $DIMPO_ARGS \
    > >(tee -a "$DIMPO_WORK/fit.log") 2>&1
  in_code "$PY" -m neox_dar.dimpo table "$DIMPO_WORK" > "$DIMPO_WORK/table.md.tmp"
  mv "$DIMPO_WORK/table.md.tmp" "$DIMPO_WORK/table.md"
}

run_task() {  # run_task TASK: train and evaluate one sweep run (skipped when done), or the DimPO study
  local task=$1 sweep run out
  [ "$task" = dimpo:vanilla-seed3 ] && { dimpo_task; return; }
  sweep=${task%%:*} run=${task#*:}
  out=$WORK
  [ "$sweep" = "$FT_SWEEP" ] && out=$FT_WORK
  if [ "$sweep" = "$FT_SWEEP" ] && [ ! -f "$FT_WORK/$run/config.yml" ]; then
    plan_finetune
    [ -f "$FT_WORK/$run/config.yml" ] || { log "$run: not planned yet (needs vanilla-seed3 trained)"; return 4; }
  fi
  in_code "$PY" -m neox_dar.sweep "$ROOT/$sweep" run --local --out "$ROOT/$out" --only "$run"
}

stopped() {
  [ -e "$WORK/STOP" ] && return 0
  [ -n "${STOP_AT:-}" ] && [ "$(date -u +%H%M)" -ge "${STOP_AT/:/}" ] && return 0
  return 1
}

worker() {  # worker N: passes over the task list until one starts nothing
  local n=$1 task name started failed=" " rc
  mkdir -p "$WORK/claims"
  log "worker $n: pid $$, OMP_NUM_THREADS=$OMP_NUM_THREADS${STOP_AT:+, no new task after $STOP_AT UTC}"
  while true; do
    started=0
    for task in $(bash "$0" --list); do
      if stopped; then log "worker $n: stopped (STOP file or STOP_AT): no new task"; return 0; fi
      name=${task##*/}
      name=${name//:/__}
      case "$failed" in *" $task "*) continue ;; esac
      exec {fd}>"$WORK/claims/$name.lock"
      if ! flock -n "$fd"; then exec {fd}>&-; continue; fi
      if bash "$0" --done "$task"; then exec {fd}>&-; continue; fi
      log "worker $n: $task"
      started=1
      rc=0
      bash "$0" --task "$task" || rc=$?
      exec {fd}>&-
      if ((rc == 4)); then started=0; continue; fi
      if ((rc != 0)); then
        log "worker $n: $task exited with $rc"
        ((rc == 3)) && return 3   # stopped by a signal: the worker stops too
        failed+="$task "
      fi
      break   # after each task, a fresh list from the top (the highest-priority task first)
    done
    ((started)) || { log "worker $n: nothing left to start"; return 0; }
  done
}

is_done() {  # is_done TASK: exit 0 when the run is trained and evaluated (DimPO: its table written)
  local task=$1 sweep run out
  [ "$task" = dimpo:vanilla-seed3 ] && { [ -f "$DIMPO_WORK/table.md" ]; return; }
  sweep=${task%%:*} run=${task#*:}
  out=$WORK
  [ "$sweep" = "$FT_SWEEP" ] && out=$FT_WORK
  [ -f "$out/$run/config.yml" ] || return 1
  "$PY" - "$out/$run" "$sweep" <<'EOF'
import sys
from neox_dar.sweep import load_sweep
from neox_dar.sweep.rundir import run_state
from neox_dar.sweep.slurm import extra_corpora
ev = load_sweep(sys.argv[2]).eval
sys.exit(0 if run_state(sys.argv[1], True, extra=list(extra_corpora(ev))).state == "done" else 1)
EOF
}

launch() {
  mkdir -p "$WORK/logs"
  [ ! -e "$WORK/STOP" ] || { rm -f "$WORK/STOP"; log "removed $WORK/STOP (left by --stop): the workers take new runs again"; }
  log "data: $DATA"
  prepare_data
  log "plan: $SWEEP -> $WORK"
  plan
  local n
  for ((n = 1; n <= WORKERS; n++)); do
    exec {lk}>"$WORK/logs/worker-$n.pid.lock"
    if ! flock -n "$lk"; then log "worker $n is running already: left alone"; exec {lk}>&-; continue; fi
    exec {lk}>&-
    # the worker holds its own lock file for its life (flock on fd 9 of the setsid'd shell)
    setsid nohup bash -c 'exec 9>"$1"; flock -n 9 || exit 0; echo $$ > "$1.pid"; exec bash "$2" --worker "$3"' \
      _ "$WORK/logs/worker-$n.pid.lock" "$0" "$n" >> "$WORK/logs/worker-$n.log" 2>&1 < /dev/null &
    log "worker $n started (log: $WORK/logs/worker-$n.log)"
    sleep 20   # staggered: the second worker takes the second run
  done
}

publish() {  # publish WORK OUT RUN...: finished runs into OUT (results/...): run files, provenance, report, the docs'
  # table between <!-- NAME:start/end --> (NAME = OUT's folder name), and OUT/data.json (torch, sha256 of the bytes)
  local work=$1 out=$2
  shift 2
  mkdir -p "$out/runs"
  # the sweep as last planned (runs added to it since are in it); its header names the sweep file by its path in the
  # repository, not on this machine (plan ran in the code's worktree, given the file's absolute path). Its report
  # gets the "Rel. vs swa" column here (report.compare), not in the sweep file: the workers' code (CODE_COMMIT)
  # reads that file at every run and predates the setting, which it would refuse
  "$PY" - "$work/sweep.yml" "$out/runs/sweep.yml" "$ROOT/" <<'EOF'
import sys
from pathlib import Path
import yaml
src, dst, root = sys.argv[1:]
header, body = Path(src).read_text().split("\n", 1)
sweep = yaml.safe_load(body)
if sweep["name"] == "results-round2":  # the fine-tuning sweep has no SWA run
    sweep["report"]["compare"] = {"swa": {"variant": "swa", "seed": "seed1"}}  # SWA (w = 64) of the same budget
Path(dst).write_text(header.replace(root, "") + "\n" + yaml.safe_dump(sweep, sort_keys=False))
EOF
  if [ ! -f "$out/provenance.json" ]; then   # a new folder: only the runs named are published (not the pending ones)
    "$PY" - "$out" "$PUBLISH_COMMAND" <<'EOF'
import json, sys
from pathlib import Path
from neox_dar.report.publish import cpu_name
Path(sys.argv[1], "provenance.json").write_text(json.dumps(
    {"device": cpu_name(), "training_command": sys.argv[2], "runs": {}}, indent=1) + "\n")
EOF
  fi
  "$PY" -m neox_dar.report.publish "$work" "$out" --only "$@" --command "$PUBLISH_COMMAND" --docs docs/experiments.md
  "$PY" - "$out" $REUSED <<'EOF'
import hashlib, json, re, sys
from pathlib import Path
import torch
out, reused = Path(sys.argv[1]), sys.argv[2:]
# the reused runs have no checkpoint here: their training record is round 1's (results/replicate-cpu)
meta = json.loads((out / "provenance.json").read_text())
first = json.loads(Path("results/replicate-cpu/provenance.json").read_text())["runs"]
for run in reused:
    if run in meta["runs"] and not meta["runs"][run].get("trained_with"):
        meta["runs"][run].update({k: first[run][k] for k in ("step", "trained_with", "saved_at")},
                                 reused_from=f"results/replicate-cpu/runs/{run}")
# repository-relative paths: publish records the command that ran it by the script's absolute path
(out / "provenance.json").write_text(json.dumps(meta, indent=1).replace(str(Path.cwd()) + "/", "") + "\n")
# repository-relative paths: the copied configs (save) and evaluations (checkpoint) name the run directories by
# absolute path on the machine that trained them (this checkout's, or a worktree's for round 1's reused runs):
# whatever the folder, its runs/... part is kept
for path in sorted(out.glob("runs/*/config.yml")) + sorted(out.glob("runs/*/eval/*.json")):
    path.write_text(re.sub(r'(: |")/[^\s"]*?/runs/', r"\1runs/", path.read_text()))
def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
data = "runs/replicate-cpu/data"
files = {f"{data}/{n}": sha(f"{data}/{n}") for n in ("wiki_train.bin", "wiki_train.idx", "wiki_heldout.bin",
         "wiki_heldout.idx", "wiki.test.tokens", "wiki_heldout100.jsonl.gz")}
files["data/byte_tokenizer.json"] = sha("data/byte_tokenizer.json")
(out / "data.json").write_text(json.dumps({
    "torch": torch.__version__,
    "note": "sha256 of the training, validation and evaluation bytes the runs read (scripts/results_round2.sh "
            "prepares them from ../shared/data as scripts/replicate.sh --cpu does) and of the tokenizer; torch: the "
            "version in the environment that trained and published these runs; paths in the copied run files are relative to "
            "the repository's root (the runs trained under it, in runs/)",
    "sha256": files}, indent=1) + "\n")
EOF
  "$PY" scripts/results_round2_figures.py results/results-round2
}

publish_dimpo() {  # the DimPO study (f) into results/results-round2-dimpo: results.json, the fit's log and its
  # projections (172 KB) with repository-relative paths, and table.md (and docs/experiments.md's table between
  # <!-- results-round2-dimpo:start/end -->) made again from the copied results
  local out=results/results-round2-dimpo
  [ -f "$DIMPO_WORK/table.md" ] || { echo "results_round2.sh: $DIMPO_WORK/table.md missing: the study has not finished" >&2; return 2; }
  mkdir -p "$out/projections"
  "$PY" - "$DIMPO_WORK" "$out" "$ROOT/" <<'EOF'
import re
import sys
from pathlib import Path
from safetensors import safe_open
from safetensors.torch import save_file
src, out, root = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
def relative(text):  # the code ran from its worktree (runs/round2-code) as python .../neox_dar/dimpo/__main__.py
    text = re.sub(r"python \S*/neox_dar/dimpo/__main__\.py", "python -m neox_dar.dimpo", text)
    return text.replace(root + "runs/round2-code/", "").replace(root, "")
for name in ("results.json", "fit.log"):
    (out / name).write_text(relative((src / name).read_text()))
for path in sorted((src / "projections").glob("*.safetensors")):
    with safe_open(str(path), "pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    save_file(tensors, str(out / "projections" / path.name), {k: relative(v) for k, v in meta.items()})
EOF
  "$PY" -m neox_dar.dimpo table "$out" > "$out/table.md"
  "$PY" - "$out" <<'EOF'
import sys
from pathlib import Path
from neox_dar.dimpo.tables import table1
from neox_dar.report.publish import replace_block
from neox_dar.report.tables import to_markdown
replace_block(Path("docs/experiments.md"), "results-round2-dimpo", to_markdown(table1(sys.argv[1])))
EOF
  log "published $out and its table in docs/experiments.md"
}

publish_checkpoint() {  # RUN's newest checkpoint as a weights-only folder (neox_dar.saved_model.save_weights:
  # model.safetensors, model.yml, tokenizer.json, manifest with the checkpoint's step) in
  # results/results-round2/checkpoints/RUN, its tensors checked equal to the checkpoint's
  local run=$1 out=results/results-round2/checkpoints/$1
  [ -d "$WORK/$run/checkpoints" ] || { echo "results_round2.sh: $WORK/$run has no checkpoint" >&2; return 2; }
  rm -rf "$out" && mkdir -p "$out"
  "$PY" - "$WORK/$run" "$out" <<'EOF'
import shutil
import sys
from pathlib import Path
from neox_dar.rundir import checkpoint_step, held_checkpoint
from neox_dar.saved_model import load_model, save_weights
run, out = sys.argv[1], Path(sys.argv[2])
with held_checkpoint(run) as step_dir:
    shutil.copy(step_dir / "tokenizer.json", out / "tokenizer.json")
    model, cfg = load_model(step_dir)
    step = checkpoint_step(step_dir)
save_weights(model, cfg, out, step=step)
print(f"{step_dir} -> {out}")
ours, theirs = load_model(out)[0].weights(), model.weights()
assert ours.keys() == theirs.keys() and all(ours[k].equal(theirs[k]) for k in ours), "the weights differ"
EOF
  log "published $out"
}

rebuild() {  # rebuild RUN [STEPS]: train RUN again with the code that trained the round's runs (CODE_COMMIT), from
  # the data prepared here, in runs/results-round2-rebuild/RUN (continued if there), stopping after STEPS steps if
  # given; then compare its logged training losses with the published run's at every step both logged (a fine-tuning
  # run: in runs/results-round2-finetune-rebuild/RUN, from the rebuilt vanilla-seed3)
  local run=$1 steps=${2:-} sweep=$SWEEP published=results/results-round2/runs/$1 rc=0 out=runs/results-round2-rebuild
  local base=runs/results-round2-rebuild
  [ -z "$steps" ] || [[ "$steps" =~ ^[1-9][0-9]*$ ]] || {
    echo "results_round2.sh: --rebuild STEPS must be a positive integer, got '$steps'" >&2; return 2; }
  if [ -f "$FT_SWEEP" ] && [[ " $(runs_of "$FT_SWEEP") " == *" $run "* ]]; then
    sweep=$FT_SWEEP published=results/results-round2-finetune/runs/$run out=runs/results-round2-finetune-rebuild
  elif [[ " $(runs_of "$SWEEP") " != *" $run "* ]]; then
    echo "results_round2.sh: --rebuild: no run '$run' in $SWEEP or $FT_SWEEP" >&2; return 2
  fi
  [ -f "$published/metrics.jsonl" ] || { echo "results_round2.sh: --rebuild: $run is not published ($published)" >&2; return 2; }
  local overrides=()
  if [ "$sweep" = "$FT_SWEEP" ]; then  # fine-tuned from the rebuilt vanilla-seed3, not from the round's runs/
    grep -q '"state": "done"' "$base/vanilla-seed3/status.json" 2>/dev/null || {
      echo "results_round2.sh: --rebuild $run starts from vanilla-seed3: run --rebuild vanilla-seed3 first" >&2; return 2; }
    overrides=("load=$ROOT/$base/vanilla-seed3")
  fi
  log "data: $DATA"
  prepare_data
  setup_code
  # planned once; a later call continues the run as it was planned (train.py records its exit_interval there)
  [ -f "$out/$run/config.yml" ] ||
    in_code "$PY" -m neox_dar.sweep "$ROOT/$sweep" plan --out "$ROOT/$out" "${overrides[@]}" --only "$run" >/dev/null
  log "rebuild $run with the code at $CODE_COMMIT in $out/$run${steps:+, stopping at step $steps}"
  in_code "$PY" train.py "$ROOT/$out/$run/config.yml" ${steps:+exit_interval=$steps} || rc=$?
  ((rc == 0 || rc == 3)) || { log "rebuild $run: train.py exited with $rc"; return "$rc"; }
  "$PY" - "$out/$run/metrics.jsonl" "$published/metrics.jsonl" <<'EOF'
import json, sys
def losses(path):
    rows = (json.loads(line) for line in open(path) if line.strip())
    return {r["step"]: r["loss"] for r in rows if "loss" in r}
ours, theirs = losses(sys.argv[1]), losses(sys.argv[2])
steps = sorted(ours.keys() & theirs.keys())
if not steps:
    sys.exit(f"results_round2.sh: --rebuild: no logged step in common between {sys.argv[1]} and {sys.argv[2]}")
worst = max(steps, key=lambda s: abs(ours[s] - theirs[s]) / abs(theirs[s]))
gap = abs(ours[worst] - theirs[worst]) / abs(theirs[worst])
print(f"rebuild: {len(steps)} logged steps ({steps[0]}..{steps[-1]}) against {sys.argv[2]}: the largest relative "
      f"difference in the training loss is {gap:.1e}, at step {worst} ({ours[worst]:.6f} against {theirs[worst]:.6f})")
if gap > 1e-5:
    sys.exit("rebuild: the losses differ beyond 1e-5: not the published run's training")
print("rebuild: the same losses as the published run at every logged step (within 1e-5)")
EOF
}

PUBLISH_COMMAND="bash scripts/results_round2.sh (from the repository root; data from ../shared/data, as scripts/replicate.sh --cpu): python -m neox_dar.sweep configs/sweeps/results-round2.yml plan --out runs/results-round2, then two workers, OMP_NUM_THREADS=1 each, each run: python -m neox_dar.sweep configs/sweeps/results-round2.yml run --local --out runs/results-round2 --only RUN (train.py RUN/config.yml, then python -m neox_dar.sweep.evaluate RUN with the sweep's eval: arguments); round 1's runs (reused_from) copied from results/replicate-cpu/runs"

main() {
  case "${1:-}" in
    "") launch ;;
    --list) list_tasks ;;
    --task) run_task "$2" ;;
    --done) is_done "$2" ;;
    --worker) worker "$2" ;;
    --status) "$PY" -m neox_dar.sweep "$SWEEP" status --out "$WORK"
              [ -d "$FT_WORK" ] && "$PY" -m neox_dar.sweep "$FT_SWEEP" status --out "$FT_WORK"; true ;;
    --stop) mkdir -p "$WORK"; touch "$WORK/STOP"; log "no new runs will start (rm $WORK/STOP or --go to undo)" ;;
    --go) rm -f "$WORK/STOP"; log "workers may start new runs (run the script to start them)" ;;
    --publish) shift; publish "$WORK" results/results-round2 "$@" ;;
    --publish-finetune) shift; publish "$FT_WORK" results/results-round2-finetune "$@" ;;
    --publish-dimpo) publish_dimpo ;;
    --publish-checkpoint) [ $# -eq 2 ] || { echo "results_round2.sh: --publish-checkpoint needs one RUN" >&2; return 2; }
                          publish_checkpoint "$2" ;;
    --rebuild) { [ $# -ge 2 ] && [ $# -le 3 ]; } || { echo "results_round2.sh: --rebuild needs RUN and optionally STEPS" >&2; return 2; }
               rebuild "$2" "${3:-}" ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" ;;
    *) echo "results_round2.sh: unknown argument '$1' (see --help)" >&2; return 2 ;;
  esac
}

main "$@"; exit $?
