"""AHA's head-level analyses (Sec. 3.3): the gap between full-attention calls per head (Table 3), the gates over a
text (Fig. 1), and the per-task heat-maps and sorted heads (Figs. 3-4).

    python -m eval.aha_gates table3 RESULT.json [--heads 5.2,12.8 | --heads all] [--json OUT.json]
    python -m eval.aha_gates heads RESULT.json --out DIR             # Figs. 3-4, one panel / line per task
    python -m eval.aha_gates text CHECKPOINT --text a.txt [--text b.txt ...] --out fig1.png [--json OUT.json]

``RESULT.json`` is what ``eval.downstream run`` writes (per task: ``attention_stats``, the gate means per layer and
head over the counted tokens, AHA's Eq. 8) or what ``eval.perplexity`` writes (the same per corpus).

**Table 3.** The paper's gap is "the mean number of tokens processed between consecutive triggers of the global
attention path for a specific head". Over a stream of ``N`` counted tokens in which a head opens ``k`` times, the
mean spacing of its consecutive openings is ``(p_k - p_1) / (k - 1)`` (:func:`stream_gaps`), which is ``N / k``
up to the tokens before the first and after the last opening. ``table3`` prints ``N / k = 1 / mu_f`` of each
head, from the result file's per-head ``mu_f``: it needs no order of the tokens, which a task's batched requests
do not have (the paper's gaps of thousands of tokens on MBPP span many requests, so it, too, counts across them).
``text`` reports both for its texts, where the order is the text's. A head that never opens has no gap
(``never``). Heads are named as in the heat-maps: layer and head from 0. By default the table shows three
representative heads, as the paper does: those with the highest, the median and the lowest ``mu_f`` averaged
over the tasks.

**Fig. 1.** ``text`` runs the checkpoint over each text (its first ``--max-tokens`` tokens, after the rolling
windows' prefix token) with one forward, reads every layer's gates (B, T, H), and shades each token by the share
of the model's L x H heads that attend fully there (light: 0, dark blue: 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from neox_dar.report.tables import Table, to_markdown
from neox_dar.rundir import check_writable, write_text_atomic

STAT = "mu_f"


class GateError(ValueError):
    """A bad input file or checkpoint for these analyses (one line)."""


def head_tables(result: dict, stat: str = STAT) -> dict[str, list[list[float]]]:
    """Per task (a downstream result) or corpus (a perplexity result): the per-head statistic, L x H lists."""
    if "tasks" in result:
        groups = {row.get("label") or row["task"]: row.get("attention_stats") or {} for row in result["tasks"]}
    elif "corpora" in result:
        groups = {name: r.get("attention_stats") or {} for name, r in result["corpora"].items()}
    else:
        raise GateError("not a result of eval.downstream (no 'tasks') or eval.perplexity (no 'corpora')")
    out = {}
    suffix = f"/{stat}"
    for name, stats in groups.items():
        layers = sorted((int(k[len("layer"):-len(suffix)]), v) for k, v in stats.items()
                        if k.startswith("layer") and k.endswith(suffix))
        if layers:
            out[name] = [list(map(float, v)) for _, v in layers]
    if not out:
        raise GateError(f"no task or corpus reports {stat} per layer and head (an AHA checkpoint's result?)")
    return out


def tokens_per_call(mu: float) -> float | None:
    """Tokens per full-attention call of a head that opens on a share ``mu`` of its tokens (None: never opens)."""
    return 1.0 / mu if mu > 0 else None


def stream_gaps(gates: torch.Tensor) -> torch.Tensor:
    """Mean spacing between consecutive openings per head: gates (N, ...) bool, N tokens in stream order ->
    (...) float64, ``(p_k - p_1) / (k - 1)`` for the ``k`` opening positions ``p``; NaN where ``k < 2``."""
    n = gates.shape[0]
    pos = torch.arange(n, dtype=torch.float64).reshape(n, *([1] * (gates.dim() - 1)))
    k = gates.sum(0).double()
    first = torch.where(gates, pos, torch.inf).amin(0)
    last = torch.where(gates, pos, -torch.inf).amax(0)
    return torch.where(k >= 2, (last - first) / (k - 1).clamp(min=1), torch.nan)


def representative(tables: dict[str, list[list[float]]]) -> list[tuple[int, int]]:
    """(layer, head) of the heads with the highest, median and lowest statistic averaged over the tables."""
    first = next(iter(tables.values()))
    mean = {(l, h): sum(t[l][h] for t in tables.values()) / len(tables)
            for l in range(len(first)) for h in range(len(first[l]))}
    ranked = sorted(mean, key=lambda lh: (-mean[lh], lh))
    return list(dict.fromkeys([ranked[0], ranked[len(ranked) // 2], ranked[-1]]))


def table3(tables: dict[str, list[list[float]]], heads: list[tuple[int, int]], source: str) -> Table:
    """The gap ``1 / mu_f`` per head (rows) and task (columns)."""
    rows = []
    for l, h in heads:
        gaps = [tokens_per_call(t[l][h]) for t in tables.values()]
        rows.append([f"Layer {l}, Head {h}"] + ["never" if g is None else f"{g:.2f}" for g in gaps])
    notes = [f"Average full-attention gap (tokens per full-attention call, 1 / mu_f of the head) per task; {source}; "
             "layers and heads from 0."]
    return Table("Average full attention gap per head", ["Head"] + list(tables), rows, notes)


def parse_heads(text: str, tables: dict[str, list[list[float]]]) -> list[tuple[int, int]]:
    first = next(iter(tables.values()))
    if text == "all":
        return [(l, h) for l in range(len(first)) for h in range(len(first[l]))]
    heads = []
    for item in text.split(","):
        try:
            l, h = (int(x) for x in item.split("."))
        except ValueError:
            raise GateError(f"--heads takes LAYER.HEAD,... or 'all', got '{item}'") from None
        if not (0 <= l < len(first) and 0 <= h < len(first[l])):
            raise GateError(f"head {l}.{h} is not in the model's {len(first)} layers x {len(first[0])} heads")
        heads.append((l, h))
    return heads


@torch.no_grad()
def text_gates(model: torch.nn.Module, ids: list[int], prefix: int) -> torch.Tensor:
    """Every layer's AHA gates over ``ids`` after the ``prefix`` token, one forward: (T, L, H) bool, T = len(ids)."""
    from neox_dar.evaluation.scoring import AttentionStatsMean

    device = next(model.parameters()).device
    model(torch.tensor([[prefix] + list(ids)], device=device))
    current = AttentionStatsMean(model).current()
    layers = sorted((int(k[len("layer"):-len(STAT) - 1]), v) for k, v in current.items() if k.endswith(f"/{STAT}"))
    if not layers:
        raise GateError("the checkpoint's attention reports no gates (mu_f): an AHA checkpoint is needed")
    return torch.stack([v[0, 1:].bool().cpu() for _, v in layers], dim=1)


def cmd_text(args) -> int:
    from neox_dar.devices import check_device
    from neox_dar.evaluation.loading import load_for_eval
    from neox_dar.report.plots import token_shading
    from neox_dar.tokenizer import load_tokenizer, prefix_token_id, tokenizer_file

    if args.max_tokens < 1:
        raise GateError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    try:
        check_device(args.device)
    except ValueError as e:
        raise GateError(str(e)) from None
    loaded = load_for_eval(args.checkpoint, args.device)
    if loaded.cfg.attention.attention_type != "aha":
        raise GateError(f"{args.checkpoint} uses {loaded.cfg.attention.attention_type} attention: an AHA checkpoint "
                        "is needed")
    path = tokenizer_file(loaded.cfg, args.tokenizer, loaded.model_dir)
    tok, prefix = load_tokenizer(path=path), prefix_token_id(path)
    limit = min(args.max_tokens, loaded.cfg.seq_length - 1)
    panels, out = [], {"checkpoint": loaded.info["checkpoint"], "step": loaded.info["step"], "texts": []}
    for file in args.text:
        ids = tok.encode(Path(file).read_text(), add_special_tokens=False).ids[:limit]
        if not ids:
            raise GateError(f"{file} holds no tokens")
        gates = text_gates(loaded.model, ids, prefix)  # (T, L, H)
        share = gates.float().mean((1, 2)).tolist()
        mu = gates.double().mean(0)
        panels.append((f"{Path(file).name} ({len(ids)} tokens, mu_f {mu.mean():.3f})",
                       [tok.decode([i]) for i in ids], share))
        out["texts"].append({"file": file, "tokens": len(ids), "mu_f": float(mu.mean()),
                             "share_per_token": share, "mu_f_per_head": mu.tolist(),
                             "gap_per_head": [[None if g != g else g for g in row]
                                              for row in stream_gaps(gates).tolist()]})
    token_shading(panels, f"AHA gates over a text: {out['checkpoint']}",
                  ["Each token's shade: the share of the model's layers x heads that attend fully at it (light 0, "
                   "dark blue 1), AHA Fig. 1."], Path(args.out))
    print(f"wrote {args.out}")
    if args.json:
        write_text_atomic(args.json, json.dumps(out, indent=1))
        print(f"wrote {args.json}")
    return 0


def _read(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise GateError(f"no such file: {path}") from None
    except ValueError as e:
        raise GateError(f"{path} is not JSON ({e})") from None


def cmd_table3(args) -> int:
    tables = head_tables(_read(args.result))
    heads = representative(tables) if args.heads is None else parse_heads(args.heads, tables)
    t = table3(tables, heads, args.result)
    print(to_markdown(t))
    if args.json:
        write_text_atomic(args.json, json.dumps({"result": args.result, "tasks": list(tables), "gap": {
            f"{l}.{h}": {task: tokens_per_call(t[l][h]) for task, t in tables.items()} for l, h in heads}}, indent=1))
    return 0


def cmd_heads(args) -> int:
    from neox_dar.report.plots import head_heatmaps, sorted_heads

    tables = head_tables(_read(args.result))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    panels = list(tables.items())
    for path in (head_heatmaps(panels, f"AHA mu_f per layer and head, per task: {args.result}",
                               out / "aha_mu_f_heatmap_tasks.png"),
                 sorted_heads(panels, "mu_f", f"AHA heads sorted by mu_f, per task: {args.result}",
                              out / "aha_mu_f_heads_tasks.png")):
        print(f"wrote {path}")
    return 0


def check_outputs(args) -> None:
    """ValueError (one line) for an output the command could not write, before any work: ``--json`` a file,
    ``heads``' ``--out`` a folder, ``text``'s ``--out`` an image file."""
    from neox_dar.report.plots import check_figure_path

    if getattr(args, "json", None):
        check_writable(args.json, "--json")
    if args.command == "heads":
        check_writable(args.out, "--out", folder=True)
    elif args.command == "text":
        check_figure_path(args.out)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m eval.aha_gates", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    t3 = sub.add_parser("table3", help="Table 3: the gap between full-attention calls per head and task")
    t3.add_argument("result", help="a result file of eval.downstream run or eval.perplexity")
    t3.add_argument("--heads", help="LAYER.HEAD,... or 'all' (default: the highest, median and lowest mu_f)")
    t3.add_argument("--json", help="also write the gaps here")
    heads = sub.add_parser("heads", help="Figs. 3-4 per task: mu_f heat-maps and sorted heads")
    heads.add_argument("result")
    heads.add_argument("--out", required=True, help="folder for the two PNG files")
    text = sub.add_parser("text", help="Fig. 1: the gates over texts, each token shaded by its heads' share")
    text.add_argument("checkpoint", help="an AHA run, step directory or Hugging Face folder")
    text.add_argument("--text", action="append", required=True, help="a UTF-8 text file (repeat for more panels)")
    text.add_argument("--out", required=True, help="the PNG file")
    text.add_argument("--json", help="also write the tokens' shares and each head's mu_f and gap here")
    text.add_argument("--max-tokens", type=int, default=400, help="tokens of each text (default 400)")
    text.add_argument("--tokenizer", help="tokenizer.json (default: the checkpoint's)")
    text.add_argument("--device", default="cpu")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_outputs(args)
        return {"table3": cmd_table3, "heads": cmd_heads, "text": cmd_text}[args.command](args)
    except (GateError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
