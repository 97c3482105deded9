"""SLURM job scripts for a sweep: settings, rendering the sbatch template, submitting, queue lookups.

Settings come from the sweep file's ``slurm:`` mapping, then from the command line. ``mode: array``
submits one job array (``--array=0-N%concurrency``) whose task i trains run i; ``mode: per-run``
submits one job per run. ``gpus_per_node: 0`` is CPU mode: ``nproc_per_node`` processes per node.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import shutil
import subprocess
import sys
import typing
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

from ..config import ConfigError, setting
from ..config.coerce import coerce
from ..evaluation.corpora import CORPORA, HUB_DEFAULT_DOCS
from ..notices import Notice
from ..rundir import record_job
from .errors import SweepError

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TEMPLATE = REPO / "slurm" / "sweep.sbatch"
LAUNCHER = REPO / "slurm" / "launch_node.sh"
TRAIN_SCRIPT = REPO / "train.py"
_FIELD = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")
_SLURM_TIME = re.compile(r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|(?i:unlimited|infinite)")  # sbatch --time's forms
QUEUED_STATES = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING",
                 "RESIZING", "SUSPENDED", "STAGE_OUT", "SIGNALING"}


@dataclass
class SlurmSettings:
    """What the sbatch script asks for; every field is a `slurm:` key in the sweep file."""

    nodes: int = setting(1, "Nodes per run; one srun task (one torchrun) per node.")
    gpus_per_node: int = setting(8, "#SBATCH --gpus-per-node; 0 = CPU mode.")
    nproc_per_node: Optional[int] = setting(None, "Training processes per node (default gpus_per_node; needed in CPU "
                                                  "mode).")
    cpus_per_task: int = setting(16, "CPUs for each node's task.")
    mem: Optional[str] = setting(None, "#SBATCH --mem (e.g. 0 = all of the node's memory).")
    mem_per_gpu: Optional[str] = setting(None, "#SBATCH --mem-per-gpu (e.g. 200G); not with mem.")
    exclusive: bool = setting(False, "#SBATCH --exclusive: the nodes are the job's alone.")
    time: str = setting("24:00:00", "#SBATCH --time.")
    partition: Optional[str] = setting(None, "#SBATCH --partition.")
    account: Optional[str] = setting(None, "#SBATCH --account.")
    qos: Optional[str] = setting(None, "#SBATCH --qos.")
    constraint: Optional[str] = setting(None, "#SBATCH --constraint (node features, e.g. h100).")
    mail_user: Optional[str] = setting(None, "#SBATCH --mail-user.")
    mail_type: Optional[str] = setting(None, "#SBATCH --mail-type (e.g. END,FAIL).")
    mode: Literal["array", "per-run"] = setting("array", "One job array over the runs, or one job per run.")
    concurrency: Optional[int] = setting(None, "Array mode: at most this many runs at once (--array=0-N%C).")
    signal_seconds: int = setting(120, "USR1 this many seconds before the time limit (checkpoint, requeue).")
    max_requeues: int = setting(3, "Stop requeueing a run whose training made no progress in this many requeues.")
    template: Optional[str] = setting(None, "sbatch template (default slurm/sweep.sbatch).")
    extra_sbatch: list[str] = setting([], "Raw #SBATCH options (repeatable; on the command line: "
                                     "--extra-sbatch=--exclusive).")
    setup: list[str] = setting([], "Shell lines run before training: module load, source venv (repeatable).")
    python: Optional[str] = setting(None, "Python on the compute nodes (default: the one running submit).")
    master_port_base: int = setting(12000, "The rendezvous port is this + job id % 20000: the same on every node "
                                           "of a job, another for each job, below Linux's ephemeral ports (32768+).")
    nccl_debug: Optional[str] = setting("WARN", "NCCL_DEBUG: WARN prints NCCL's errors; INFO its set-up too (which "
                                                "interface, InfiniBand or not), to debug a hang.")
    nccl_socket_ifname: Optional[str] = setting(None, "NCCL_SOCKET_IFNAME: the network interfaces NCCL may use, "
                                                      "e.g. ib0, or ^lo,docker0 (unset: NCCL chooses).")
    nccl_ib_disable: Optional[int] = setting(None, "NCCL_IB_DISABLE: 1 = no InfiniBand (sockets), 0 = use it (unset: "
                                                   "NCCL uses it when it finds it).")
    nccl_ib_hca: Optional[str] = setting(None, "NCCL_IB_HCA: the InfiniBand adapters to use, e.g. mlx5.")
    nccl_ib_timeout: Optional[int] = setting(None, "NCCL_IB_TIMEOUT: InfiniBand retry timeout, 4.096 us x 2^N (NCCL's "
                                                   "default 20; raise it on a congested fabric).")
    env: dict[str, str] = setting({}, "More environment variables for the job, NAME: value (e.g. "
                                      "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC: 1200).")

    @classmethod
    def from_dict(cls, data: dict) -> "SlurmSettings":
        """The settings of a sweep's ``slurm:`` mapping (with the command line's on top), each checked against its
        type as a config key is (a string where a list belongs wrote one script line per character): SweepError."""
        names = {f.name for f in dataclasses.fields(cls)}
        data = {k.replace("-", "_"): v for k, v in data.items()}
        unknown = set(data) - names
        if unknown:
            raise SweepError(f"unknown slurm setting(s) {', '.join(sorted(unknown))} "
                             f"(allowed: {', '.join(sorted(names))})")
        hints = typing.get_type_hints(cls)
        typed = {}
        for key, value in data.items():
            if key == "env":  # NAME: value, each value a scalar written as text (validate checks the names)
                if not isinstance(value, dict) or not all(isinstance(v, (str, int, float)) for v in value.values()):
                    raise SweepError(f"slurm env must be a mapping NAME: value, got {value!r}")
                typed[key] = {k: str(v) for k, v in value.items()}
                continue
            if key in ("mem", "mem_per_gpu", "time") and type(value) is int:
                value = str(value)  # mem: 0, a number of minutes: YAML reads them as ints
            try:
                typed[key] = coerce(hints[key], value, f"slurm {key}", "the sweep's slurm settings")
            except ConfigError as e:
                raise SweepError(str(e)) from None
        s = cls(**typed)
        s.validate()
        return s

    def validate(self) -> None:
        if self.nodes < 1:
            raise SweepError(f"slurm nodes must be >= 1, got {self.nodes}")
        if self.gpus_per_node < 0:
            raise SweepError(f"slurm gpus_per_node must be >= 0, got {self.gpus_per_node}")
        if self.gpus_per_node == 0 and not self.nproc_per_node:
            raise SweepError("CPU mode (gpus_per_node: 0) needs nproc_per_node")
        if self.nproc_per_node is not None and self.nproc_per_node < 1:
            raise SweepError(f"slurm nproc_per_node must be >= 1, got {self.nproc_per_node}")
        if self.gpus_per_node and (self.nproc_per_node or 0) > self.gpus_per_node:
            raise SweepError(f"slurm nproc_per_node {self.nproc_per_node} is more than gpus_per_node "
                             f"{self.gpus_per_node}: a process per GPU at most (the others would find no GPU)")
        if self.mode not in ("array", "per-run"):
            raise SweepError(f"slurm mode must be 'array' or 'per-run', got {self.mode!r}")
        if self.cpus_per_task < 1:
            raise SweepError(f"slurm cpus_per_task must be >= 1, got {self.cpus_per_task}")
        if self.max_requeues < 1:
            raise SweepError(f"slurm max_requeues must be >= 1, got {self.max_requeues}")
        if self.concurrency is not None and self.concurrency < 1:
            raise SweepError(f"slurm concurrency must be >= 1, got {self.concurrency}")
        if not isinstance(self.time, str) or not _SLURM_TIME.fullmatch(self.time.strip()):
            raise SweepError(f"slurm time must be one of sbatch's --time forms (minutes, minutes:seconds, "
                             f"hours:minutes:seconds, days-hours, days-hours:minutes, days-hours:minutes:seconds, "
                             f"UNLIMITED), got {self.time!r}")
        if not 0 <= self.signal_seconds <= 65535:
            raise SweepError(f"slurm signal_seconds must be in 0..65535 (sbatch --signal's range), got "
                             f"{self.signal_seconds}")
        if self.mem is not None and self.mem_per_gpu is not None:
            raise SweepError("slurm mem and mem_per_gpu exclude each other (sbatch takes one): set one")
        if not 1024 <= self.master_port_base <= 65535 - 20000:
            raise SweepError(f"slurm master_port_base must be in 1024..{65535 - 20000} (ports base .. base + 19999), "
                             f"got {self.master_port_base}")
        if self.nccl_ib_disable not in (None, 0, 1):
            raise SweepError(f"slurm nccl_ib_disable must be 0 or 1, got {self.nccl_ib_disable!r}")
        if not isinstance(self.env, dict) or not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(k)) for k in self.env):
            raise SweepError(f"slurm env must be a mapping NAME: value of environment variable names, got {self.env!r}")

    @property
    def procs_per_node(self) -> int:
        return self.nproc_per_node or self.gpus_per_node

    @property
    def world_size(self) -> int:
        """Data-parallel ranks of one run: nodes x processes per node."""
        return self.nodes * self.procs_per_node


def render(template: str, values: dict[str, object]) -> str:
    """Fill ``{{ name }}`` fields; a line whose field is None (an unset setting) is dropped, and so is an ``#SBATCH``
    line whose field is empty."""
    out = []
    for line in template.splitlines():
        names = _FIELD.findall(line)
        missing = [n for n in names if n not in values]
        if missing:
            raise SweepError(f"sbatch template field(s) {', '.join(missing)} unknown "
                             f"(known: {', '.join(sorted(values))})")
        if any(values[n] is None or (line.startswith("#SBATCH") and values[n] == "") for n in names):
            continue
        out.append(_FIELD.sub(lambda m: str(values[m.group(1)]), line))
    return "\n".join(out) + "\n"


def sbatch_quote(value: str) -> str:
    """``value`` as one argument of an ``#SBATCH`` line. sbatch reads such a line as arguments (its
    ``get_argument``): quotes group characters (spaces, ``#``), a backslash escapes the next character, even
    inside quotes, and an unquoted ``#`` starts a comment; a line ends the directive, so a value holding one is a
    SweepError."""
    if "\n" in value or "\r" in value:
        raise SweepError(f"{value!r} holds a line break, which an #SBATCH line cannot carry: choose another folder")
    if value and not re.search(r"[\s\"'\\#]", value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def eval_args(ev: dict | None) -> list[str]:
    """eval.perplexity options from the sweep's ``eval:`` mapping; [] = no evaluation.

    ``source``: ``hub`` (default: the full corpora's Hub splits) or ``local`` (the files in data/eval, or ``args``'
    ``--corpus-path``); ``corpora``: default all three; ``max_docs``: documents per corpus, an int for every corpus or
    a mapping corpus -> int or null (= all), default :data:`neox_dar.evaluation.corpora.HUB_DEFAULT_DOCS` for the
    Hub and all documents for local files; ``args``: more eval.perplexity options; ``extra``: ``{NAME: PATH}`` of
    JSON-lines corpora scored beside them (:mod:`neox_dar.sweep.evaluate`, which takes these options with
    ``--extra NAME=PATH``). Every run scores the documents of the sweep's manifest (``--sweep-manifest``: the first
    run to be evaluated writes it)."""
    if not ev:
        return []
    allowed = ("args", "corpora", "extra", "max_docs", "source")
    unknown = set(ev) - set(allowed)
    if unknown:
        raise SweepError(f"unknown eval setting(s) {', '.join(sorted(unknown))} (allowed: {', '.join(allowed)})")
    source = ev.get("source", "hub")
    if source not in ("hub", "local"):
        raise SweepError(f"eval source must be 'hub' or 'local', got {source!r}")
    corpora = ev.get("corpora") or list(CORPORA)
    if not isinstance(corpora, list) or set(corpora) - set(CORPORA):
        raise SweepError(f"eval corpora must be a list drawn from {', '.join(CORPORA)}, got {corpora!r}")
    defaults = HUB_DEFAULT_DOCS if source == "hub" else {}
    max_docs = ev.get("max_docs", {})
    if not isinstance(max_docs, dict):
        max_docs = dict.fromkeys(corpora, max_docs)
    counts = {name: max_docs.get(name, defaults.get(name)) for name in corpora}
    bad = {k: v for k, v in max_docs.items() if k not in CORPORA} or {
        k: v for k, v in counts.items() if v is not None and (type(v) is not int or v < 1)}
    if bad:
        raise SweepError(f"eval max_docs wants an int >= 1 or null per corpus of {', '.join(CORPORA)}, got {bad}")
    args = ["--source", source, "--corpora", ",".join(corpora), "--sweep-manifest"]
    args += [f"--max-docs={name}={'all' if n is None else n}" for name, n in counts.items()]
    extra_args = ev.get("args") or []
    if not isinstance(extra_args, list) or not all(isinstance(a, (str, int, float)) for a in extra_args):
        raise SweepError(f"eval args must be a list of eval.perplexity options, e.g. [--batch-size, 4], got "
                         f"{extra_args!r}")
    args += [str(a) for a in extra_args]
    return args + [f"--extra={name}={path}" for name, path in extra_corpora(ev).items()]


def extra_corpora(ev: dict | None) -> dict[str, str]:
    """The sweep's extra evaluation corpora, ``{NAME: PATH}`` (SweepError for a bad one)."""
    from .extra import parse_extra

    extra = (ev or {}).get("extra") or {}
    if not isinstance(extra, dict):
        raise SweepError(f"eval extra must be a mapping NAME: PATH of JSON-lines files, got {extra!r}")
    try:
        return parse_extra(extra)
    except ValueError as e:
        raise SweepError(f"eval {e}") from None


def job_script(settings: SlurmSettings, job_name: str, run_dirs: list[Path], log_dir: Path,
               ev: dict | None, workdir: Path | None = None) -> str:
    """The sbatch script for ``run_dirs`` (an array over them when there are several)."""
    template = Path(settings.template) if settings.template else DEFAULT_TEMPLATE
    if not template.is_file():
        raise SweepError(f"sbatch template not found: {template}")
    array = len(run_dirs) > 1
    if array:
        spec = f"0-{len(run_dirs) - 1}" + (f"%{settings.concurrency}" if settings.concurrency else "")
    values = {
        "job_name": job_name,
        "nodes": settings.nodes,
        "gpus_per_node": settings.gpus_per_node or None,
        "cpus_per_task": settings.cpus_per_task,
        "mem": settings.mem,
        "mem_per_gpu": settings.mem_per_gpu,
        "exclusive": "--exclusive" if settings.exclusive else None,
        "time": settings.time,
        "partition": settings.partition,
        "account": settings.account,
        "qos": settings.qos,
        "constraint": settings.constraint,
        "mail_user": settings.mail_user,
        "mail_type": settings.mail_type,
        "array": spec if array else None,
        "output": sbatch_quote(str(log_dir / ("%x-%A_%a.out" if array else "%x-%j.out"))),
        "signal_seconds": settings.signal_seconds,
        "max_requeues": settings.max_requeues,
        "extra_sbatch": "\n".join(f"#SBATCH {opt}" for opt in settings.extra_sbatch),
        "run_dirs": " ".join(shlex.quote(str(d)) for d in run_dirs),
        "python": shlex.quote(settings.python or sys.executable),
        "nproc_per_node": settings.procs_per_node,
        "launcher": shlex.quote(str(LAUNCHER)),
        "train_script": shlex.quote(str(TRAIN_SCRIPT)),
        "eval_args": " ".join(shlex.quote(a) for a in eval_args(ev)),
        "extra_corpora": " ".join(shlex.quote(a) for a in extra_corpora(ev)),
        "workdir": shlex.quote(str(workdir or Path.cwd())),
        "setup": "\n".join(settings.setup),
        "master_port_base": settings.master_port_base,
        **{name: None if getattr(settings, name) is None else shlex.quote(str(getattr(settings, name)))
           for name in ("nccl_debug", "nccl_socket_ifname", "nccl_ib_disable", "nccl_ib_hca", "nccl_ib_timeout")},
        "env": "\n".join(f"export {k}={shlex.quote(str(v))}" for k, v in settings.env.items()),
    }
    return render(template.read_text(), values)


def sbatch(script: Path) -> str:
    """Submit ``script``; returns the job id."""
    exe = shutil.which("sbatch")
    if exe is None:
        raise SweepError("sbatch not found: submit needs SLURM's client commands on PATH")
    proc = subprocess.run([exe, "--parsable", str(script)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SweepError(f"sbatch {script} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout.strip().split(";")[0]


def queued_jobs(ids: list[str]) -> dict[str, str]:
    """``{job id: state}`` for those of ``ids`` that SLURM still holds in a live state (pending, running, ...)."""
    if not ids or shutil.which("squeue") is None:
        return {}
    live = {}
    for job in ids:  # one query per id: squeue rejects the whole list when one id has been purged
        proc = subprocess.run(["squeue", "-h", "-r", "-j", job, "-o", "%i %T"], capture_output=True, text=True)
        if proc.returncode != 0 and "invalid job id" not in proc.stderr.lower():  # purged: gone; else no answer
            raise SweepError(f"squeue -j {job} failed (exit {proc.returncode}): "
                             f"{proc.stderr.strip() or proc.stdout.strip()}; cannot tell whether the job is live")
        for line in proc.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] in QUEUED_STATES:
                live[job] = parts[1]
    return live


def cancel_jobs(jobs: dict[str, str]) -> tuple[list[str], list[str]]:
    """Stop live jobs (id -> SLURM state): one that waits is cancelled; a running one gets TERM in its batch script
    only (``scancel --batch --signal=TERM``), which hands it to the trainers: they checkpoint and exit, and the job
    ends without requeueing (an evaluation in progress is stopped). Returns (cancelled, asked to stop)."""
    from .rundir import WAITING

    exe = shutil.which("scancel")
    if exe is None and jobs:
        raise SweepError("scancel not found: cancel needs SLURM's client commands on PATH")
    cancelled, stopped = [], []
    for job, state in jobs.items():
        waiting = state in WAITING
        cmd = [exe, job] if waiting else [exe, "--batch", "--signal=TERM", job]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SweepError(f"{' '.join(cmd)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
        (cancelled if waiting else stopped).append(job)
    return cancelled, stopped


def submit_runs(settings: SlurmSettings, sweep_name: str, run_dirs: list[Path], root: Path, ev: dict | None,
                dry_run: bool = False, workdir: Path | None = None) -> list[tuple[Path, str]]:
    """Write the job script(s) under ``root/slurm`` and submit; returns (script, job id or 'dry-run')."""
    log_dir = root / "slurm" / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    if settings.concurrency is not None and settings.mode != "array":
        warnings.warn(f"slurm concurrency {settings.concurrency} is not applied with mode per-run (one job per run, "
                      "which only SLURM's own limits bound): it limits the tasks of a job array", Notice, stacklevel=2)
    batches = [run_dirs] if settings.mode == "array" else [[d] for d in run_dirs]
    submitted = []
    for batch in batches:
        name = sweep_name if len(batch) > 1 else f"{sweep_name}.{batch[0].name}"
        script = root / "slurm" / f"{name}.sbatch"
        script.write_text(job_script(settings, name, batch, log_dir, ev, workdir))
        if dry_run:
            submitted.append((script, "dry-run"))
            continue
        job = sbatch(script)
        for i, d in enumerate(batch):
            record_job(d, f"{job}_{i}" if len(batch) > 1 else job)
        submitted.append((script, job))
    return submitted
