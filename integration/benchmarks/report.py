"""Combined table and plot of the latest benchmark results (run after the bench_*.py scripts).

    uv run python integration/benchmarks/report.py
    uv run python integration/benchmarks/report.py --results /tmp --png /tmp/benchmarks.png

Reads ``ray.json`` (bench_ray.py), ``protocol.json`` (bench_protocol.py) and ``startup.json``
(bench_startup.py) from ``--results`` (any may be missing), prints one table of every figure
with its ratio against the baseline of the same run and the goal (``--markdown`` prints it as a
Markdown table), and draws ``benchmarks.png`` there (``--png`` to write it elsewhere) from the
first two.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

plt.rcParams["axes.titlesize"] = 10

RESULTS = Path(__file__).resolve().parent / "results"

# (measurement, sc figure, baseline figure, ratio, goal, met: True / False / None)
Row = tuple[str, str, str, str, str, bool | None]


def _load(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def protocol_rows(p: dict[str, Any]) -> list[Row]:
    r, s = p["ratios"], p["seconds"]
    gib = p["batch_bytes"] / 2**30
    base = f"torch.save round trip {s['torch_save_roundtrip']:.3f} s"
    rows: list[Row] = [
        (
            f"pickle 5 + buffer_callback, {gib:.2g} GiB",
            f"{s['pickle5_buffer_callback']:.4f} s",
            base,
            f"{r['pickle5_buffer_callback_speedup']:.0f}x the speed",
            ">= 10x",
            r["pickle5_buffer_callback_speedup"] >= 10,
        ),
        (
            "  its peak extra memory / batch",
            f"{r['pickle5_buffer_callback_peak_memory_over_batch']:.3f}",
            f"torch.save: {r['torch_save_peak_memory_over_batch']:.2f}",
            "",
            "< 0.2",
            r["pickle5_buffer_callback_peak_memory_over_batch"] < 0.2,
        ),
        (
            "plain pickle.dumps (protocol 4)",
            f"{s['pickle_default_protocol']:.3f} s",
            base,
            f"{r['pickle_default_protocol_speedup']:.2f}x the speed",
            ">= 2x",
            r["pickle_default_protocol_speedup"] >= 2,
        ),
        (
            "pickle 5 in-band (no callback)",
            f"{s['pickle5_in_band']:.3f} s",
            base,
            f"{r['pickle5_in_band_speedup']:.2f}x the speed",
            "(>= 2x)",
            None,
        ),
        (
            "chunk(8)",
            f"{s['chunk8'] * 1e3:.3f} ms",
            "",
            "",
            "well under 1 ms",
            s["chunk8"] < 1e-3,
        ),
        (
            "concat of 8 chunks",
            f"{s['concat8']:.3f} s",
            f"torch.cat {s['torch_cat8']:.3f} s",
            f"{r['concat_over_torch_cat']:.2f}x the time",
            "<= 1.5x",
            r["concat_over_torch_cat"] <= 1.5,
        ),
    ]
    ops = p.get("ops")
    if ops:
        mib = ops["ops_bytes"] / 2**20
        rows += [
            ("select 2 of 4 columns", f"{ops['select2_s'] * 1e6:.1f} us", "", "", "", None),
            ("2 selects + union", f"{ops['select2_union_s'] * 1e6:.1f} us", "", "", "", None),
            (
                f"dp[permutation of half the rows], {mib:.0f} MiB",
                f"{ops['index_s']:.4f} s",
                f"index_select {ops['torch_index_select_s']:.4f} s",
                f"{ops['index_over_torch']:.2f}x the time",
                "",
                None,
            ),
            (
                f"repeat(2), {mib:.0f} MiB",
                f"{ops['repeat2_s']:.4f} s",
                f"repeat_interleave {ops['torch_repeat_interleave2_s']:.4f} s",
                f"{ops['repeat2_over_torch']:.2f}x the time",
                "",
                None,
            ),
        ]
    return rows


def _time_ratio_row(what: str, ours: str, baseline: str, ratio: float, workers: int) -> Row:
    """A row of sc-ray's time against a baseline's; the claim (at most 1.3x the time) is
    checked at 8 workers only."""
    claimed = workers == 8
    return (
        what,
        ours,
        baseline,
        f"{ratio:.2f}x the time",
        "<= 1.3x" if claimed else "",
        ratio <= 1.3 if claimed else None,
    )


def ray_rows(ray: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for n in ray.get("noop_sweep", [ray["noop"]] if "noop" in ray else []):
        workers = int(n.get("workers", 8))
        rows.append(
            _time_ratio_row(
                f"no-op ONE_TO_ALL, {workers} worker{'s' if workers > 1 else ''}",
                f"{n['sc_ray_s'] * 1e3:.2f} ms",
                f"raw Ray {n['raw_ray_s'] * 1e3:.2f} ms",
                n["ratio"],
                workers,
            )
        )
    for d in ray.get("dp_proto_sweep", [ray["dp_proto"]] if "dp_proto" in ray else []):
        big = d["mib"] >= 512
        rows.append(
            (
                f"DP_COMPUTE_PROTO {d['mib']:.0f} MiB, 4 workers",
                f"{d['sc_ray_gib_s']:.3f} GiB/s",
                f"raw Ray numpy {d['raw_numpy_gib_s']:.3f} GiB/s",
                f"{d['ratio_vs_raw_numpy']:.2f}x the throughput",
                ">= 0.7x" if big else "",
                d["ratio_vs_raw_numpy"] >= 0.7 if big else None,
            )
        )
        rows.append(
            (
                "  the same, against torch.save",
                "",
                f"torch.save {d['torch_save_gib_s']:.3f} GiB/s",
                f"{d['ratio_vs_torch_save']:.1f}x the throughput",
                ">= 5x" if big else "",
                d["ratio_vs_torch_save"] >= 5 if big else None,
            )
        )
    if "chain" in ray:
        c = ray["chain"]
        rows.append(
            (
                f"2 chained non-blocking calls, {c['mib']:.0f} MiB",
                f"{c['bytes_fetched_by_driver']:.0f} B fetched",
                f"put {c['bytes_put_by_driver'] / 2**20:.0f} MiB",
                "",
                "fetched < 1 MiB",
                c["bytes_fetched_by_driver"] < 2**20,
            )
        )
    if "startup" in ray:
        s = ray["startup"]
        workers = int(s.get("workers", 8))
        rows.append(
            _time_ratio_row(
                f"start-up, {workers} workers importing torch",
                f"{s['sc_ray_s']:.1f} s",
                f"bare actors {s['bare_actors_s']:.1f} s",
                s["ratio"],
                workers,
            )
        )
    return rows


_STARTUP_LABELS = {
    "torch": "bare actors importing torch (baseline)",
    "tensordict": "bare actors importing torch, tensordict",
    "bare_proto": "bare actors importing sc_protocol, DataProto echo",
    "sc_proto": "sc-ray group, first DP_COMPUTE_PROTO call",
    "sc_proto_eager": "  the same, tensordict imported plainly",
}


def startup_rows(s: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for imp in s.get("imports", []):
        rows.append(
            (
                f"python -c 'import {imp['imports']}' (CPU)",
                f"{imp['cpu_s']['median']:.2f} s",
                "",
                f"{imp['cpu_over_torch']:.2f}x torch's CPU",
                "",
                None,
            )
        )
    for row in s.get("workers", []):
        n = int(row["workers"])
        base = row["variants"]["torch"]["s"]["median"]
        for variant, e in row["variants"].items():
            goal = variant == "sc_proto"
            ratio = e["ratio"]["median"]
            rows.append(
                (
                    f"start-up, {n} workers: {_STARTUP_LABELS.get(variant, variant)}",
                    f"{e['s']['median']:.1f} s ({e['s']['min']:.1f}-{e['s']['max']:.1f})",
                    f"torch {base:.1f} s",
                    f"{ratio:.2f}x ({e['ratio']['min']:.2f}-{e['ratio']['max']:.2f})",
                    "<= 1.3x" if goal else "",
                    ratio <= 1.3 if goal else None,
                )
            )
    return rows


def _met(flag: bool | None) -> str:
    return "" if flag is None else ("met" if flag else "NOT MET")


def print_table(title: str, rows: list[Row], markdown: bool) -> None:
    header: tuple[str, ...] = ("measurement", "sc", "baseline (same run)", "ratio", "goal", "")
    if markdown:
        print(f"\n**{title}**\n")
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join([*row[:5], _met(row[5])]) + " |")
        return
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(5)]
    print(f"\n{title}")
    lines: list[tuple[str, ...]] = [header, *((*r[:5], _met(r[5])) for r in rows)]
    for line in lines:
        cells = [c.ljust(w) for c, w in zip(line[:5], widths, strict=True)]
        print("  ".join([*cells, line[5]]).rstrip())


def plot(ray: dict[str, Any] | None, proto: dict[str, Any] | None, png: Path) -> None:
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    (ax_noop, ax_dp), (ax_proto, ax_start) = axes
    if ray and ray.get("noop_sweep"):
        sweep = ray["noop_sweep"]
        n = [int(x["workers"]) for x in sweep]
        ax_noop.plot(n, [x["sc_ray_s"] * 1e3 for x in sweep], "o-", label="sc-ray ONE_TO_ALL")
        ax_noop.plot(n, [x["raw_ray_s"] * 1e3 for x in sweep], "s--", label="raw Ray actors")
        for x in sweep:
            ax_noop.annotate(
                f"{x['ratio']:.2f}x",
                (x["workers"], x["sc_ray_s"] * 1e3),
                textcoords="offset points",
                xytext=(0, 8),
                ha="center",
                fontsize=8,
            )
        ax_noop.set_xticks(n)
        ax_noop.set_ylim(0, max(x["sc_ray_s"] for x in sweep) * 1e3 * 1.15)
        ax_noop.legend(fontsize=8)
    ax_noop.set(
        title="No-op call latency (median; goal <= 1.3x at 8)", xlabel="workers", ylabel="ms"
    )
    if ray and ray.get("dp_proto_sweep"):
        sweep = ray["dp_proto_sweep"]
        mib = [x["mib"] for x in sweep]
        ax_dp.plot(mib, [x["sc_ray_gib_s"] for x in sweep], "o-", label="sc-ray DataProto")
        ax_dp.plot(mib, [x["raw_numpy_gib_s"] for x in sweep], "s--", label="raw Ray numpy")
        ax_dp.plot(mib, [x["torch_save_gib_s"] for x in sweep], "^:", label="torch.save via Ray")
        for x in sweep:
            ax_dp.annotate(
                f"{x['ratio_vs_raw_numpy']:.2f}x / {x['ratio_vs_torch_save']:.1f}x",
                (x["mib"], x["sc_ray_gib_s"]),
                textcoords="offset points",
                xytext=(0, 8),
                ha="center",
                fontsize=8,
            )
        ax_dp.set_xscale("log", base=2)
        ax_dp.set_xticks(mib, [f"{m:.0f}" for m in mib])
        top = max(max(x["sc_ray_gib_s"], x["raw_numpy_gib_s"]) for x in sweep)
        ax_dp.set_ylim(0, top * 1.15)
        ax_dp.legend(fontsize=8)
    ax_dp.set(
        title="DP_COMPUTE_PROTO round trip, 4 workers\n(labels: ratio vs numpy / vs torch.save)",
        xlabel="MiB",
        ylabel="GiB/s",
    )
    if proto:
        r = proto["ratios"]
        names = ["pickle 5\n+ callback", "pickle 5\nin-band", "pickle.dumps\n(protocol 4)"]
        values = [
            r["pickle5_buffer_callback_speedup"],
            r["pickle5_in_band_speedup"],
            r["pickle_default_protocol_speedup"],
        ]
        bars = ax_proto.bar(names, values, color=["tab:green", "tab:orange", "tab:red"])
        ax_proto.bar_label(bars, [f"{v:.1f}x" for v in values], fontsize=8)
        ax_proto.axhline(1, color="grey", lw=0.8)
        ax_proto.axhline(10, color="tab:green", ls="--", lw=0.8, label="goal 10x (callback)")
        ax_proto.axhline(2, color="tab:red", ls="--", lw=0.8, label="goal 2x (in-band)")
        ax_proto.set_yscale("log")
        ax_proto.legend(fontsize=8)
        gib = proto["batch_bytes"] / 2**30
        ax_proto.set_title(f"DataProto dumps + loads of {gib:.2g} GiB: speed-up over torch.save")
    else:
        ax_proto.set_title("DataProto pickling (no results)")
    if ray and "startup" in ray:
        s = ray["startup"]
        bars = ax_start.bar(
            ["sc-ray group", "bare actors"],
            [s["sc_ray_s"], s["bare_actors_s"]],
            color=["tab:blue", "tab:grey"],
        )
        ax_start.bar_label(bars, [f"{s['sc_ray_s']:.1f} s", f"{s['bare_actors_s']:.1f} s"])
        text = f"ratio {s['ratio']:.2f}x (goal <= 1.3x)"
        if "chain" in ray:
            c = ray["chain"]
            text += (
                f"\nchain of 2 non-blocking calls over {c['mib']:.0f} MiB:\n"
                f"driver fetched {c['bytes_fetched_by_driver']:.0f} B (goal < 1 MiB)"
            )
        ax_start.text(0.5, 0.97, text, transform=ax_start.transAxes, ha="center", va="top")
        ax_start.set_ylim(0, max(s["sc_ray_s"], s["bare_actors_s"]) * 1.45)
        ax_start.set_title(f"Start-up of {int(s.get('workers', 8))} workers importing torch")
        ax_start.set_ylabel("s")
    else:
        ax_start.set_title("Start-up (no results)")
    first = ray or proto or {}
    machine = first.get("machine", {})
    load = machine.get("loadavg_at_end") or machine.get("loadavg_at_start")
    fig.suptitle(
        f"sc benchmarks, {first.get('date', '')[:16].replace('T', ' ')} UTC: "
        f"{machine.get('cpus', '?')} CPU cores, {machine.get('memory_gib', '?')} GiB, "
        f"{machine.get('gpus') or 'no'} GPU"
        + (f", load average {load[0]:.1f}" if load else "")
        + " (ratios against the baseline of the same run)",
        fontsize=10,
    )
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of the JSON files")
    parser.add_argument("--png", type=Path, default=None, help="default: <results>/benchmarks.png")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    args = parser.parse_args(argv)
    ray = _load(args.results / "ray.json")
    proto = _load(args.results / "protocol.json")
    startup = _load(args.results / "startup.json")
    if ray is None and proto is None and startup is None:
        parser.error(f"no ray.json, protocol.json or startup.json in {args.results}")
    for name, data, rows in (
        ("sc-protocol", proto, protocol_rows),
        ("sc-ray", ray, ray_rows),
        ("worker start-up", startup, startup_rows),
    ):
        if data is not None:
            quick = " (--quick smoke run: figures mean nothing)" if data.get("quick") else ""
            load = data["machine"].get("loadavg_at_end") or data["machine"].get("loadavg_at_start")
            load_text = f", load average {load[0]:.1f}" if load else ""
            title = (
                f"{name}: {data.get('date', 'undated')}, {data['machine'].get('cpus')} CPU cores"
                f"{load_text}{quick}"
            )
            print_table(title, rows(data), args.markdown)
    if ray is not None or proto is not None:
        png = args.png or args.results / "benchmarks.png"
        plot(ray, proto, png)
        print(f"\nwrote {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
