"""The table, the JSON file and the plot of ``tritonshm bench``'s results."""

from __future__ import annotations

import importlib.util
import json
import sys
from typing import Any, TextIO

from ..demo import _size
from ._methods import LIMIT, PEERS

_INSTALL_HINT = {"triton-shm-client": "pip install triton-shm-client"}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def server_note(meta: dict[str, Any]) -> str:
    """The end of a table's first line: one request at a time, which server, started or given."""
    started = "started for this run" if meta["server"] == "started" else "given with --url"
    return f"one request at a time; Triton {meta['server_version']} at {meta['url']} ({started})"


def table_header(indent: str, width: int, reference: str) -> str:
    """The column heads of a size's rows: method names *width* wide, the last ratio over *reference*."""
    return (f"{indent}{'method':<{width}} {'median':>9} {'p25 - p75':>21} {'MB/s':>9} {'/best peer':>11} "
            f"{'/' + reference:>7}")


def table_row(indent: str, width: int, label: str, res: dict[str, Any], nbytes: int, vs: str) -> str:
    """One measured method's row under :func:`table_header`; *vs* is the key of its last ratio."""
    spread = f"{_ms(res['p25_s'])} - {_ms(res['p75_s'])}"
    return (f"{indent}{label:<{width}} {_ms(res['median_s']):>9} {spread:>21} {nbytes / res['median_s'] / 1e6:>9.1f} "
            f"{_ratio(res['vs_best_peer']):>11} {_ratio(res[vs]):>7}")


def format_table(results: dict[str, Any]) -> str:
    """The results as a readable table, one block per size."""
    meta = results["meta"]
    lines = [
        f"{meta['model']} ({meta['datatype']}), {server_note(meta)}",
        f"tritonshm {meta['tritonshm_version']}, {meta['cpu_count']} CPUs; repetitions interleaved: "
        f"every method once per round, in a rotating order",
        "ms per request: median and p25-p75; '/best peer' and '/limit': median time divided by "
        "that reference's (below 1 = faster)",
        f"peers: {', '.join(meta['peers'])}; limit = {meta['limit']}, sample by sample",
    ]
    header = table_header("  ", 20, "limit")
    for entry in results["results"]:
        nbytes = entry["nbytes"]
        lines += ["", f"{_size(nbytes)} ({entry['elements']} x {meta['datatype']}), {entry['reps']} repetitions, "
                      f"best peer: {entry['best_peer'] or '-'}", header]
        for name, res in entry["methods"].items():
            label = f"{name} = {meta['limit'].replace(' ', '')}" if name == LIMIT else name
            if res["status"] != "ok":
                hint = _INSTALL_HINT.get(name)
                lines.append(f"  {label:<20} {res['status']}" + (f" ({hint})" if hint else ""))
                continue
            lines.append(table_row("  ", 20, label, res, nbytes, "vs_limit"))
    return "\n".join(lines)


def write_json(results: dict[str, Any], path: str) -> None:
    """Write *results* to *path* as JSON; ``-`` is standard output."""
    text = json.dumps(results, indent=1)
    if path == "-":
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    else:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text + "\n")


def matplotlib_missing() -> str | None:
    """The one-line error for ``--plot`` without matplotlib, or None when it is there."""
    if importlib.util.find_spec("matplotlib") is None:
        return "--plot needs matplotlib, which is not installed: pip install matplotlib"
    return None


def write_plot(results: dict[str, Any], path: str) -> None:
    """Median time per request against size (p25-p75 as error bars), and each
    method's time over the best peer's, as a PNG (or whatever *path*'s suffix says)."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no display needed

    meta = results["meta"]
    entries = results["results"]
    names = list(entries[0]["methods"]) if entries else []
    fig = Figure(figsize=(12, 5), layout="constrained")
    times, ratios = fig.subplots(1, 2)
    for name in names:
        points = [(e["nbytes"], e["methods"][name]) for e in entries if e["methods"][name]["status"] == "ok"]
        if not points:
            continue
        style = {"linestyle": "--" if name == LIMIT else "-", "marker": "o", "markersize": 4,
                 "linewidth": 2.5 if name in PEERS else 1.5}
        x = [p[0] for p in points]
        med = [p[1]["median_s"] * 1e3 for p in points]
        err = [[m - p[1]["p25_s"] * 1e3 for m, p in zip(med, points)],
               [p[1]["p75_s"] * 1e3 - m for m, p in zip(med, points)]]
        times.errorbar(x, med, yerr=err, label=name, capsize=2, **style)
        if name != "memcpy":  # a part of the limit, not a way to send a request
            ratios.plot(x, [p[1]["vs_best_peer"] for p in points], label=name, **style)
    for ax in (times, ratios):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks([e["nbytes"] for e in entries], [_size(e["nbytes"]) for e in entries])
        ax.set_xlabel(f"tensor size ({meta['datatype']})")
        ax.grid(True, which="major", alpha=0.3)
    times.set_ylabel("ms per request (median, p25-p75)")
    ratios.set_ylabel("median time / best peer's")
    ratios.axhline(1.0, color="gray", linewidth=1)
    times.legend(fontsize=8)
    fig.suptitle(f"tritonshm bench: {meta['model']}, Triton {meta['server_version']}, "
                 f"{meta['cpu_count']} CPUs, tritonshm {meta['tritonshm_version']}", fontsize=10)
    fig.savefig(path, dpi=120)


def print_table(results: dict[str, Any], stream: TextIO) -> None:
    print(format_table(results), file=stream)
