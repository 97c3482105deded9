"""Where the training logs go (rank 0 only): terminal, ``{save}/metrics.jsonl``, W&B, TensorBoard, and the
resolved ``{save}/config.yml``.

Terminal: on a TTY a tqdm progress bar with ETA plus one line per ``log_interval``; otherwise (batch jobs)
only the lines, each with its ETA, so logs do not fill with bar redraws.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import secrets
import sys
import time
from pathlib import Path

from ..config import Config, ConfigError
from ..rundir import (CONFIG, METRICS, WANDB_ID, WANDB_STEP, append_text, open_run_file, read_metrics,
                      truncate_metrics, write_text_atomic)
from ..variants.registry import stat_names


def _scalars(row: dict) -> dict[str, float]:
    """Flatten per-head lists (``{stat}/layer0`` -> ``{stat}/layer0/head0`` ...) for W&B and TensorBoard."""
    out = {}
    for k, v in row.items():
        if isinstance(v, list):
            out.update({f"{k}/head{i}": x for i, x in enumerate(v)})
        elif isinstance(v, (int, float)) and k != "step":
            out[k] = v
    return out


class RunLogger:
    """Rank 0's log sinks for one run; on other ranks every method does nothing."""

    def __init__(self, cfg: Config, is_main: bool, start_step: int):
        self.cfg, self.enabled = cfg, is_main
        self.save = Path(cfg.run.save)
        self.start_step = start_step
        self.t0 = time.time()
        self.bar = self.wandb = self.tb = None
        self.metrics = -1
        if not self.enabled:
            return
        self.save.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.save / CONFIG, cfg.to_yaml())
        self.wandb_sent = self._wandb_sent() if cfg.run.use_wandb else 0
        truncate_metrics(self.save, start_step)
        # each row goes straight to the file: a full disk fails that row's write (one line naming the file), not a
        # later flush; a link in place of the file is refused, never followed
        self.metrics = open_run_file(self.save / METRICS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=cfg.training.train_iters, initial=start_step, unit="step", mininterval=1.0,
                            dynamic_ncols=True, file=sys.stderr)
        if cfg.run.use_wandb:
            self._init_wandb()
        if cfg.run.tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(cfg.run.tensorboard_dir, purge_step=start_step + 1)

    def _init_wandb(self) -> None:
        import wandb

        id_file = self.save / WANDB_ID
        run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(4)
        write_text_atomic(id_file, run_id + "\n")
        try:
            self.wandb = wandb.init(project=self.cfg.run.wandb_project, group=self.cfg.run.wandb_group,
                                    name=self.cfg.run.wandb_run_name, entity=self.cfg.run.wandb_team, id=run_id,
                                    resume="allow", dir=str(self.save), config=self.cfg.flat())
        except wandb.errors.Error as e:  # no API key without a terminal to ask for one, a refused key, no server
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ConfigError(f"use_wandb=true, but W&B did not start ({reason}): run `wandb login` or set "
                              "WANDB_API_KEY; or set WANDB_MODE=offline to log here and `wandb sync` the run "
                              "later; or use_wandb=false") from None
        self.wandb.save(str(self.save / CONFIG), base_path=str(self.save), policy="now")

    def _wandb_sent(self) -> int:
        """The highest step an earlier attempt of this run sent to W&B (its rows in metrics.jsonl, read before a
        resume drops those after the checkpoint, and the step recorded by the attempt before), recorded again: W&B
        keeps a run's first values for a step and cannot take rows back, so a resumed run does not send those steps
        again."""
        path = self.save / WANDB_STEP
        text = path.read_text().strip() if path.is_file() else ""
        recorded = int(text) if text.isdigit() else 0
        sent = max([recorded, *(r.get("step", 0) for r in read_metrics(self.save))])
        write_text_atomic(path, f"{sent}\n")
        return sent

    # -- per step ------------------------------------------------------------------------------
    def advance(self, step: int) -> None:
        if self.bar is not None:
            self.bar.update(step - self.bar.n)

    def log(self, row: dict) -> None:
        """Write one metrics row (train or validation) to every sink."""
        if not self.enabled:
            return
        append_text(self.metrics, json.dumps(row) + "\n", self.save / METRICS)
        scalars = _scalars(row)
        if self.wandb is not None and row["step"] > self.wandb_sent:  # W&B holds those steps: the losses are these
            self.wandb.log(scalars, step=row["step"])
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, row["step"])
        self._print(self._line(row))

    def _eta(self, step: int) -> str:
        done = step - self.start_step
        if done <= 0:
            return "?"
        left = (time.time() - self.t0) / done * (self.cfg.training.train_iters - step)
        return str(datetime.timedelta(seconds=round(left)))

    def _line(self, row: dict) -> str:
        step = row["step"]
        head = f"step {step}/{self.cfg.training.train_iters}"
        if "valid_loss" in row:
            return f"{head} | valid_loss {row['valid_loss']:.4f} | valid_ppl {row['valid_ppl']:.2f}"
        if "loss" not in row:  # an in-training evaluation of the corpora
            return " | ".join([head] + [f"{k} {v:.3f}" for k, v in row.items() if isinstance(v, float)])
        parts = [head, f"loss {row['loss']:.4f}"]
        if row.get("aux_loss"):
            parts.append(f"aux {row['aux_loss']:.3e}")
        parts += [f"lr {row['lr']:.3e}", f"grad_norm {row['grad_norm']:.3f}", f"{row['tokens_per_sec']:,.0f} tok/s",
                  f"{row['tflops_per_device']:.3g} TFLOP/s/dev"]
        if "mfu" in row:
            parts.append(f"MFU {100 * row['mfu']:.1f}%")
        mem = row.get("mem_allocated_gb", row.get("mem_rss_gb"))
        if mem is not None:
            parts.append(f"mem {mem:.2f} GB")
        parts += [f"{stat} {row[stat]:.3f}" for stat in stat_names() if isinstance(row.get(stat), float)]
        parts.append(f"ETA {self._eta(step)}")
        return " | ".join(parts)

    def _print(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, flush=True)

    def message(self, text: str) -> None:
        if self.enabled:
            self._print(text)

    def close(self) -> None:
        if self.metrics >= 0:
            os.close(self.metrics)
            self.metrics = -1
        if self.bar is not None:
            self.bar.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def perplexity(loss: float) -> float:
    """``exp(loss)``; inf beyond float range, NaN for a NaN loss (no labelled token)."""
    return math.exp(loss) if loss < 700 else float("inf") if loss >= 700 else math.nan
