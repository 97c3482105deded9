#!/usr/bin/env bash
# Collect what the GPU machine lacks for scripts/gpu_check.sh, on a machine with PyPI access:
#   .whl/               wheels for CPython 3.12 / manylinux x86_64 (the GPU machine: Python 3.12, torch 2.11,
#                       Triton 3.6, transformers, no network), every one --no-deps and pinned; torch, Triton and
#                       everything else the machine has are NOT collected
#   runs/gpu_sample/    the shipped C4 sample, tokenized (the training smoke's data)
# then check that the set is complete and that what travels to the machine stays under its 64 MiB limit.
#
#   bash scripts/gpu_wheels.sh           # build both (PyPI needed), then --check
#   bash scripts/gpu_wheels.sh --check   # only check: every pinned wheel there once, installable on cp312
#                                        #   manylinux x86_64, dependencies closed, size under the limit
#   bash scripts/gpu_wheels.sh --list    # print the pinned wheels
# Then hand `.whl` and `runs/gpu_sample` to the GPU command (the device tool's `carry`) and run
# `bash scripts/gpu_check.sh` there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=${GPU_WHEELS:-.whl}
SAMPLE=${GPU_SAMPLE:-runs/gpu_sample}
LIMIT_MIB=64

# Wheels published for cp312 manylinux x86_64 (or pure Python), pinned: the closure of DeepSpeed, megatron-core,
# lm-eval, wandb and fla-core (linear attention's CUDA kernels) minus what the GPU machine has (GPU_HAS below),
# resolved on 2026-11-23 with
# `pip install --dry-run --report` for --python-version 3.12 against that machine's package list.
BINARY="
fla-core==0.6.0
megatron-core==0.16.1
lm-eval==0.4.13
wandb==0.31.0
hjson==3.1.0
pydantic==2.14.3
pydantic-core==2.50.4
annotated-types==0.8.0
typing-inspection==0.4.5
datasets==5.2.0
evaluate==0.4.6
dill==0.4.1
multiprocess==0.70.19
more-itertools==11.2.1
pytablewriter==1.2.1
dataproperty==1.1.1
mbstrdecoder==1.1.5
pathvalidate==3.3.1
tabledata==1.3.5
tcolorpy==0.1.7
typepy==1.3.5
chardet==6.0.0.post1
pytz==2026.6
rouge-score==0.0.4
nltk==3.10.4
cwevals==0.0.1b1
opentelemetry-api==1.45.2
opentelemetry-sdk==1.45.2
opentelemetry-proto==1.45.2
opentelemetry-exporter-otlp-proto-http==1.45.2
opentelemetry-exporter-otlp-proto-common==1.45.2
opentelemetry-exporter-http-transport==0.66b2
opentelemetry-exporter-otlp-common==0.66b2
opentelemetry-semantic-conventions==0.66b2
googleapis-common-protos==1.76.0
platformdirs==4.14.7
distro==1.9.0
sniffio==1.3.1
defusedxml==0.7.1
"
# Source-only on PyPI: built here as pure-Python wheels. DeepSpeed's C++/CUDA ops stay unbuilt (DS_BUILD_OPS=0)
# and compile just in time if a job asks for one (train.py asks for none: torch's AdamW, no DeepSpeed optimizer).
SOURCE_ONLY="
deepspeed==0.19.8
sqlitedict==2.1.0
word2number==1.1
"
ROOTS="deepspeed megatron-core lm-eval wandb fla-core"
PLATFORM="--python-version 3.12 --implementation cp --only-binary=:all:
  --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64"

# The GPU machine's Python packages (as the device lender's machine notes listed them, read 2026-11-17), with the
# versions a session saw there where known; a name alone is checked by name (gpu_check.sh runs `pip check` there).
GPU_HAS="
torch==2.11.0 triton==3.6.0 numpy==2.5.2 transformers==5.17.0 tokenizers==0.23.2 safetensors==0.8.0
accelerate==1.15.0 huggingface-hub==1.33.0 sentencepiece==0.2.2 tiktoken==0.14.0 onnx==1.23.1 jax==0.11.2
absl-py aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi charset-normalizer click
cloudpickle colorama contourpy cycler einops filelock fonttools frozenlist fsspec grpcio h11 hf-xet httpcore httpx
idna jinja2 joblib kiwisolver markdown markdown-it-py markupsafe matplotlib mdurl ml-dtypes mpmath msgpack
multidict networkx ninja nvidia-ml-py packaging pandas peft pillow pip pluggy portalocker prometheus-client
propcache protobuf psutil pyarrow py-cpuinfo pygments pyparsing python-dateutil pyyaml regex requests rich
sacrebleu scikit-learn scipy setuptools shellingham simplejson six sortedcontainers sympy tabulate tensorboard
tensorboard-data-server threadpoolctl toolz tqdm typer typing-extensions typing-inspect urllib3 werkzeug wheel
wrapt xxhash yarl zipp lxml
"

die() { echo "gpu_wheels.sh: error: $*" >&2; exit 2; }

list() { printf '%s\n' $BINARY $SOURCE_ONLY; }

build() {
  mkdir -p "$WHEELS"
  echo "== downloading $(echo $BINARY | wc -w) wheels for cp312 manylinux x86_64 into $WHEELS/"
  # shellcheck disable=SC2086
  "$PY" -m pip download -q --no-deps $PLATFORM -d "$WHEELS" $BINARY \
    || die "pip download failed (PyPI reachable? a pinned version withdrawn?)"
  echo "== building pure-Python wheels of the source-only packages"
  for req in $SOURCE_ONLY; do
    name=${req%%==*}
    ls "$WHEELS"/"${name//-/_}"-"${req##*==}"-*.whl >/dev/null 2>&1 && continue
    # --no-build-isolation: DeepSpeed's setup.py imports torch (the CPU build here); no op is compiled
    DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WHEELS" "$req" \
      || die "could not build a wheel of $req"
  done
  echo "== tokenizing the shipped C4 sample into $SAMPLE/"
  "$PY" -m data_prep.tokenize data/sample/c4_sample.jsonl --tokenizer data/20B_tokenizer.json \
    --out "$SAMPLE/c4_sample" --no-progress
}

check() {
  [ -d "$WHEELS" ] || die "$WHEELS/ does not exist: run bash scripts/gpu_wheels.sh first"
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  echo "== dependencies closed over $WHEELS/ and the GPU machine's packages"
  WHEELS=$WHEELS ROOTS=$ROOTS GPU_HAS=$GPU_HAS PINNED="$(list)" "$PY" - <<'EOF' || exit 2
import os, sys, zipfile
from email.parser import Parser
from pathlib import Path
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "os_name": "posix", "implementation_name": "cpython",
       "platform_python_implementation": "CPython"}
wheels = {}
for path in sorted(Path(os.environ["WHEELS"]).glob("*.whl")):
    name, version, _, _ = parse_wheel_filename(path.name)
    if name in wheels:
        sys.exit(f"gpu_wheels.sh: error: two wheels of {name} in {path.parent}/ ({wheels[name][0]}, {version}): "
                 "pip would refuse the install; delete one")
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        requires = Parser().parsestr(z.read(meta).decode()).get_all("Requires-Dist") or []
    wheels[name] = (version, [Requirement(r) for r in requires])
gpu = {}
for item in os.environ["GPU_HAS"].split():
    name, _, version = item.partition("==")
    gpu[canonicalize_name(name)] = Version(version) if version else None
pinned = {canonicalize_name(p.split("==")[0]): Version(p.split("==")[1]) for p in os.environ["PINNED"].split()}
problems = [f"{n} is on the GPU machine already: remove it from the pinned lists" for n in pinned if n in gpu]
problems += [f"pinned {n}=={v} is missing (found {wheels[n][0] if n in wheels else 'none'})"
             for n, v in pinned.items() if n not in wheels or wheels[n][0] != v]
problems += [f"{n} in {os.environ['WHEELS']}/ is not pinned" for n in wheels if n not in pinned]
by_name_only = set()
todo = [(canonicalize_name(r), frozenset()) for r in os.environ["ROOTS"].split()]
seen = set()
while todo:
    name, extras = todo.pop()
    if (name, extras) in seen or name not in wheels:
        continue
    seen.add((name, extras))
    for req in wheels[name][1]:
        if req.marker and not any(req.marker.evaluate({**env, "extra": e}) for e in (extras or {""})):
            continue
        dep = canonicalize_name(req.name)
        if dep in wheels:
            if not req.specifier.contains(wheels[dep][0], prereleases=True):
                problems.append(f"{name} needs {req}, {os.environ['WHEELS']}/ has {dep} {wheels[dep][0]}")
            todo.append((dep, frozenset(req.extras)))
        elif dep in gpu:
            if gpu[dep] is None:
                by_name_only.add(dep)
            elif not req.specifier.contains(gpu[dep], prereleases=True):
                problems.append(f"{name} needs {req}, the GPU machine has {dep} {gpu[dep]}")
        else:
            problems.append(f"{name} needs {req}: neither in {os.environ['WHEELS']}/ nor on the GPU machine")
if problems:
    sys.exit("gpu_wheels.sh: error: the wheel set is not closed:\n  " + "\n  ".join(problems))
print(f"   {len(wheels)} wheels, closed; on the GPU machine by name only (version unchecked here, `pip check` "
      f"there): {', '.join(sorted(by_name_only)) or 'none'}")
EOF
  echo "== pip resolves the set for CPython 3.12 manylinux x86_64 with the GPU machine's torch 2.11 and Triton 3.6"
  # The GPU machine's packages as metadata-only stand-in wheels: its versions where known (GPU_HAS), else this
  # machine's (a guess; `pip check` there has the last word).
  GPU_HAS=$GPU_HAS "$PY" - "$tmp/gpu" <<'EOF' || exit 2
import importlib.metadata, os, sys, zipfile
from pathlib import Path

out = Path(sys.argv[1])
out.mkdir()
for item in os.environ["GPU_HAS"].split():
    name, _, version = item.partition("==")
    try:
        version = version or importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        continue  # pip names it below if the set needs it
    dist = f"{name.replace('-', '_')}-{version}"
    with zipfile.ZipFile(out / f"{dist}-py3-none-any.whl", "w") as z:
        z.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}.dist-info/RECORD", "")
EOF
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --dry-run --no-index --find-links "$WHEELS" --find-links "$tmp/gpu" $PLATFORM \
    --target "$tmp/site" $(list) torch==2.11.0 triton==3.6.0 \
    || die "the wheel set in $WHEELS/ does not resolve for Python 3.12 with the GPU machine's packages (pip's message above)"
  echo "   resolved: $(list | wc -l) pinned wheels over torch 2.11.0, triton 3.6.0 and the GPU machine's packages"
  echo "== what travels to the GPU machine (limit $LIMIT_MIB MiB)"
  [ -f "$SAMPLE/c4_sample.bin" ] || die "$SAMPLE/c4_sample.bin missing: run bash scripts/gpu_wheels.sh"
  local tree wheels sample total
  # (a file deleted but not yet committed is listed and not there: stat skips it)
  tree=$( (git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null || true) \
         | awk '{s += $1} END {print s + 0}')
  wheels=$(du -sb "$WHEELS" | cut -f1)
  sample=$(du -sb "$SAMPLE" | cut -f1)
  total=$((tree + wheels + sample))
  awk -v t="$tree" -v w="$wheels" -v s="$sample" -v wd="$WHEELS" -v sd="$SAMPLE" 'BEGIN {
    m = 1048576; printf "   working tree %.1f MiB + %s/ %.1f MiB + %s/ %.1f MiB = %.1f MiB\n", t/m, wd, w/m, sd, s/m, (t+w+s)/m }'
  [ "$total" -lt $((LIMIT_MIB * 1048576)) ] \
    || die "$((total / 1048576)) MiB or more would travel, over the $LIMIT_MIB MiB limit"
  echo "ok: carry $WHEELS and $SAMPLE, then run: bash scripts/gpu_check.sh"
}

case "${1:-}" in
  "") build; check ;;
  --check) check ;;
  --list) list ;;
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" ;;
  *) die "unknown argument '$1' (use --check, --list or no argument)" ;;
esac
