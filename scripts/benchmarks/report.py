"""The printed report: the JSON's figures as plain-text tables, one per measurement.

Runs are meant to be compared table by table (before and after a change, or across machines), so
the tables keep their titles, columns and number formats; a precision the CPU only emulates is
left out of every table and named once, with the reason, under the CPU's flags.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt  # noqa: E402

from .decoding import PRECISIONS as DECODING_PRECISIONS  # noqa: E402


def print_table(title: str, header: list[str], rows: list[list]) -> None:
    """Left-aligned first column, right-aligned figures: floats under 10 with 3 significant digits,
    larger ones rounded with thousands separators."""
    cells = [header] + [[f"{c:,.3g}" if isinstance(c, float) and abs(c) < 10 else
                         f"{c:,.0f}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    print(f"\n== {title}")
    for row in cells:
        print("  ".join(cell.rjust(width) if i else cell.ljust(width) for i, (cell, width) in
                        enumerate(zip(row, widths))))


def print_report(results: dict) -> None:
    """Every table of the benchmark's ``results`` (as written to the JSON); parts not run are left out."""
    env = results["environment"]
    flags = " ".join(f"{flag}={'yes' if on else 'no'}" for flag, on in env["flags"].items())
    print(f"cpu: {env['cpu']} ({env['cores']} cores), torch {env['torch']}, {env['threads']} threads\nflags: {flags}")
    print(f"corpus: {results['corpus']}")
    for precision, reason in results.get("skipped", {}).items():
        print(f"skipped {precision}: {reason}")
    for part, report in (("training", training_report), ("decoding", decoding_report), ("engines", engines_report),
                         ("batching", batching_report), ("memory", memory_report), ("serving", serving_report)):
        if part in results:
            report(results[part])


def training_report(train: dict) -> None:
    print_table(f"training: target tokens/s, median of {len(train['fp32']['ours']['rounds'])} rounds of "
                f"{train['batches']} batches", ["precision", "ours", "nn.Transformer", "ours/baseline",
                                                "MFU ours", "MFU baseline", "matmul peak GFLOP/s"],
                [[p, train[p]["ours"]["tokens_per_s"], train[p]["baseline"]["tokens_per_s"], train[p]["ratio"],
                  f"{train[p]['ours']['mfu']:.1%}", f"{train[p]['baseline']['mfu']:.1%}", peak / 1e9]
                 for p, peak in train["matmul_peak_flops"].items()])
    for precision, profile in train["profile"].items():
        print_profile(f"{precision} training step, ms: phases, then torch.profiler self time by kind of operator",
                      profile)


def print_profile(title: str, profile: dict) -> None:
    """A profiled training step of both models (`profile_training`): its phases, then its time by kind."""
    labels = list(dict.fromkeys([*profile["ours"]["phases_ms"], *profile["ours"]["categories_ms"],
                                 *profile["baseline"]["categories_ms"]]))
    rows = [[label, *(p["phases_ms"].get(label, p["categories_ms"].get(label, 0.0)) for p in profile.values())]
            for label in labels]
    print_table(title, ["", "ours", "baseline"], rows)


def plot_profiles(profiles: dict[str, dict], output: Path) -> Path:
    """Each profiled step (``profiles``: a label such as "bf16 ours" -> `profile_training`'s result) as one bar of
    its milliseconds by kind of operator or kernel, the kinds in the same colours on every bar: where the time
    goes, and what a change (compiled, graphs) took away, at a glance."""
    kinds = list(dict.fromkeys(kind for profile in profiles.values() for kind in profile["categories_ms"]))
    colours = {kind: plt.get_cmap("tab20")(index % 20) for index, kind in enumerate(kinds)}
    figure, axis = plt.subplots(figsize=(11, 0.4 * len(profiles) + 1.2))
    for row, profile in enumerate(reversed(profiles.values())):
        left = 0.0
        for kind in kinds:
            width = profile["categories_ms"].get(kind, 0.0)
            axis.barh(row, width, left=left, color=colours[kind], label=kind if row == 0 else None)
            left += width
    axis.set_yticks(range(len(profiles)), list(reversed(profiles)))
    axis.set_xlabel("ms a training step (torch.profiler)")
    axis.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small", frameon=False)
    figure.savefig(output, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return output


def decoding_report(decoding: dict) -> None:
    rows = [[precision, run["search"], run["workers"], run["cache"]["sentences_per_s"], run["cache"]["tokens_per_s"],
             run["cache"]["seconds"], run["no_cache_subset"]["sentences_per_s"], run["cache_speedup"],
             f"{run['bleu']:.2f}"]
            for precision in DECODING_PRECISIONS if precision in decoding for run in decoding[precision]]
    print_table(f"decoding {decoding['sentences']} sentences, batch {decoding['batch_size']}, {decoding['threads']} "
                f"threads shared by the workers (no cache: first {decoding['no_cache_sentences']})",
                ["precision", "search", "workers", "sent/s", "tok/s", "seconds", "no-cache sent/s", "cache speed-up",
                 "BLEU"], rows)
    print_table("Translator.translate of the same sentences, beam 5, in its token-budget batches: seconds",
                ["precision", *(f"workers={workers}" for workers in decoding["translate_beam5_seconds"]["fp32"])],
                [[precision, *seconds.values()] for precision, seconds in decoding["translate_beam5_seconds"].items()])


def batching_report(batching: dict) -> None:
    print_table(f"padding ({batching['batch_tokens']}-token batches, {batching['mean_batch_sentences']} sentences "
                f"on average)", ["batches", "src", "tgt"],
                [[name, f"{batching[name]['src']:.1%}", f"{batching[name]['tgt']:.1%}"]
                 for name in ("token_budget", "random_fixed_size")])
    print_table("building a training batch in GPU shapes, ms (median of an epoch's first 50)", ["rows taken by", "ms"],
                [[name, ms] for name, ms in batching["batch_building_ms"].items()])


def memory_report(memory: dict) -> None:
    print_table("peak resident memory, MB (fresh process)", ["phase", "after imports", "peak"],
                [[phase, m["rss_after_imports_mb"], m["peak_rss_mb"]] for phase, m in memory.items()])


def engines_report(engines: dict) -> None:
    if "skipped" in engines:
        print(f"\n== engines: skipped, {engines['skipped']}")
        return
    print_table(f"ours against CTranslate2: {engines['sentences']} sentences, beam {engines['beam_size']}, "
                f"{engines['threads']} threads shared by the workers; ratio = ours / CTranslate2 seconds",
                ["engine", "precision", "workers", "seconds", "sent/s", "BLEU", "ratio"],
                [[run["engine"], run["precision"], run["workers"], run["seconds"], run["sentences_per_s"],
                  f"{run['bleu']:.2f}", engines["ratio"][str(run["workers"])].get(run["precision"], "")
                  if run["engine"] == "ours" else ""] for run in engines["runs"]])
    print_table("CTranslate2 at its own batch settings", ["precision", "workers", "batch_type", "max_batch_size",
                                                          "seconds", "sent/s"],
                [list(run.values()) for run in engines["ctranslate2_batches"]])
    print_table("the best of each engine: ours / CTranslate2 at its fastest batches",
                ["precision", "workers", "ours", "ctranslate2", "its batches", "ratio"],
                [list(best.values()) for best in engines["best"]])


def serving_report(serving: dict) -> None:
    print_table(f"serving: {serving['clients']} clients, {serving['requests']} requests of 1-4 sentences "
                f"({serving['sentences']} sentences), beam {serving['decode']['beam_size']}, server on "
                f"{serving['server_threads']} threads", ["mode", "requests/s", "sentences/s", "p50 ms", "p95 ms",
                                                         "p99 ms", "requests/call", "answered", "not sent", "lost",
                                                         "mismatched"],
                [[mode, m["requests_per_s"], m["sentences_per_s"], *m["latency_ms"].values(),
                  m["mean_requests_per_call"], m["answered"], m["not_sent"], m["lost"],
                  f"{m['mismatched']} of {m['compared']}" if "compared" in m else "(reference)"]
                 for mode, m in serving["modes"].items()])
