"""The table, the JSON file and the plot of ``tritonshm bench``'s results."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from typing import Any, TextIO

from ..demo import _size
from ._methods import LIMITS, NO_GRPC, NO_HTTP, PEERS

_INSTALL_HINT = {"triton-shm-client": "pip install triton-shm-client"}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def server_at(meta: dict[str, Any]) -> str:
    """Where the run's server was: its gRPC address and its http:// URL, those the run had."""
    where = [meta["url"]] if meta.get("url") else []
    where += [f"http://{meta['http_url']}"] if meta.get("http_url") else []
    started = "started for this run" if meta["server"] == "started" else "given with --url"
    return f"Triton {meta['server_version']} at {' and '.join(where)} ({started})"


def server_note(meta: dict[str, Any]) -> str:
    """The end of a table's first line: one request at a time, which server, started or given."""
    return f"one request at a time; {server_at(meta)}"


def table_header(indent: str, width: int, reference: str) -> str:
    """The column heads of a size's rows: method names *width* wide, the last ratio over *reference*."""
    return (f"{indent}{'method':<{width}} {'median':>9} {'p25 - p75':>21} {'MB/s':>9} {'/best peer':>11} "
            f"{'/' + reference:>7}")


def table_row(indent: str, width: int, label: str, res: dict[str, Any], nbytes: int, vs: str) -> str:
    """One measured method's row under :func:`table_header`; *vs* is the key of its last ratio."""
    spread = f"{_ms(res['p25_s'])} - {_ms(res['p75_s'])}"
    return (f"{indent}{label:<{width}} {_ms(res['median_s']):>9} {spread:>21} {nbytes / res['median_s'] / 1e6:>9.1f} "
            f"{_ratio(res['vs_best_peer']):>11} {_ratio(res[vs]):>7}")


def legend(meta: dict[str, Any], *, pointer: bool = True) -> list[str]:
    """What every column and reference row of :func:`format_table` means, the limits included
    (with *pointer*, where to read what each method does)."""
    limits = meta.get("limits", {"limit": meta["limit"]})
    against = meta.get("against_limit", {})

    def rows_of(limit: str) -> str:
        return ", ".join(name for name, of in against.items() if of == limit) or "-"

    entries = [
        ("median", "ms per request, the median of the repetitions"),
        ("p25 - p75", "ms, the middle half of the repetitions (25th to 75th percentile)"),
        ("MB/s", "the input's bytes (10^6) per second at the median; the output is as large again"),
        ("/best peer", f"median / the fastest peer's median at that size (peers: {', '.join(PEERS)}); "
                       "below 1: faster than every peer"),
        ("/limit", "tritonshm's rows only: median / the limit of the row's own protocol -- "
                   + "; ".join(f"{limit} ({'HTTP' if limit.endswith('-http') else 'gRPC'}) for {rows_of(limit)}"
                               for limit in limits)),
        ("floor", "a request whose input is already in a registered region and whose output is left there: "
                  "tritonclient's infer call alone, over gRPC (floor) and over HTTP (floor-http)"),
        ("memcpy", "one copy of the input's bytes (np.copyto)"),
        ("limit", "; ".join(f"{limit} = {parts}" for limit, parts in limits.items())
                  + ", repetition by repetition: the best a client that takes its input from the caller's "
                    "array can do, if its request costs what tritonclient's does"),
        ("below 1", "on /limit, possible: tritonshm's clients send a request made ready ahead (over HTTP on a "
                    "connection of their own, not through tritonclient.http), which costs less than tritonclient's "
                    "call -- the limit is what a request costs the way tritonclient sends it, not a bound on every "
                    "client"),
    ]
    lines = ["", "columns and reference rows" + (" (each method: tritonshm bench --list-methods):" if pointer else ":")]
    for key, text in entries:
        lines += textwrap.wrap(text, 108, initial_indent=f"  {key:<11} ", subsequent_indent=" " * 14,
                               break_on_hyphens=False)
    return lines


def format_table(results: dict[str, Any]) -> str:
    """The results as a readable table, one block per size, and a legend under it."""
    meta = results["meta"]
    limits = meta.get("limits", {"limit": meta["limit"]})
    lines = [
        f"{meta['model']} ({meta['datatype']}), {server_note(meta)}",
        f"tritonshm {meta['tritonshm_version']}, {meta['cpu_count']} CPUs; repetitions interleaved: "
        f"every method once per round, in an order drawn anew each round",
    ]
    statuses = {res["status"] for entry in results["results"] for res in entry["methods"].values()}
    if NO_GRPC in statuses:
        lines.append("the gRPC rows sit out: the run had the server's HTTP URL alone (give its gRPC host:port as "
                     "--url and the http:// URL as --http-url to run them)")
    if NO_HTTP in statuses:
        lines.append("the HTTP rows sit out: the run had no HTTP address (give the server's http:// URL as --http-url "
                     "to run them)")
    header = table_header("  ", 30, "limit")
    for entry in results["results"]:
        nbytes = entry["nbytes"]
        lines += ["", f"{_size(nbytes)} ({entry['elements']} x {meta['datatype']}), {entry['reps']} repetitions, "
                      f"best peer: {entry['best_peer'] or '-'}", header]
        for name, res in entry["methods"].items():
            label = f"{name} = {limits[name].replace(' ', '')}" if name in limits else name
            if res["status"] != "ok":
                hint = _INSTALL_HINT.get(name)
                lines.append(f"  {label:<30} {res['status']}" + (f" ({hint})" if hint else ""))
                continue
            lines.append(table_row("  ", 30, label, res, nbytes, "vs_limit"))
    return "\n".join(lines + legend(meta))


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
        style = {"linestyle": "--" if name in LIMITS else "-", "marker": "o", "markersize": 4,
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
