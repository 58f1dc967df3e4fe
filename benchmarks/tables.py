"""The results page's tables, rendered from the committed results' JSON.

``benchmarks/README.md`` holds each generated table between ``<!-- table: NAME -->`` and
``<!-- /table -->``; :data:`TABLES` says what renders NAME and from which files. A figure on the
page is then the one its JSON holds: ``tests/bench/test_tables.py`` fails when they differ.

    python benchmarks/tables.py            # print every table
    python benchmarks/tables.py --write    # rewrite the page's tables from their JSON
    python benchmarks/tables.py --check    # exit 1, naming each table that differs
    python benchmarks/tables.py --plots    # redraw docs/bench-*.png from their JSON (matplotlib)

Dates are the runs' own (``started_at``, UTC). Nothing here measures anything.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "benchmarks" / "README.md"
BLOCK = re.compile(r"(<!-- table: ([\w-]+) -->\n)(.*?)(<!-- /table -->)", re.DOTALL)
DP2 = "benchmarks/results/kv-events-dp2"
SIM = "benchmarks/results/kv-events-sim"
H200 = "benchmarks/results/h200-2026-11-26"
H200_NOW = "benchmarks/results/h200-2026-11-28"


def load(path: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((REPO / path).read_text(encoding="utf-8"))
    return result


def date(report: dict[str, Any]) -> str:
    return (
        datetime.datetime.fromtimestamp(report["started_at"], datetime.timezone.utc)
        .date()
        .isoformat()
    )


def num(x: float) -> str:
    """Three figures or so: 59,384 / 423 / 13.1."""
    return f"{x:,.0f}" if x >= 1000 else f"{x:.0f}" if x >= 100 else f"{x:.1f}"


def times(r: float) -> str:
    return f"{r:.2f}x" if r < 2 else f"{r:.1f}x" if r < 10 else f"{r:.0f}x"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def ms(x: float) -> str:
    return f"{1000 * x:.0f}"


def span(r: Sequence[int]) -> str:
    return str(r[0]) if r[0] == r[1] else f"{r[0]}-{r[1]}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], files: Sequence[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join([*lines, "", "Data: " + ", ".join(f"`{f}`" for f in files) + "."])


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in report["systems"]}


def multiturn() -> str:
    """radixserve against itself without the cache and against transformers, per shape."""
    files = {"(a)": "docs/bench-multiturn-a.json", "(b)": "docs/bench-multiturn-b.json"}
    header = ["shape", "date", "radixserve", "no cache", "HF recompute", "HF KV carried"]
    header += ["hit / optimal", "cache ratio / ideal"]
    rows = []
    for label, path in files.items():
        r = load(path)
        sh, s = r["shape"], by_name(r)
        rs = s["radixserve"]
        shape = (
            f"{label} {sh['num_conversations']} conv x {sh['num_turns']} turns, user "
            f"{span(sh['user_len'])}, answers {span(sh['answer_len'])}, {sh['parallel']} clients"
        )
        others = [s[n] for n in ("radixserve-no-cache", "hf-recompute", "hf-kv-carried")]
        ideal = r["ratios"]["ideal"]
        rows.append(
            [shape, date(r), f"{rs['wall_s']:.1f} s"]
            + [_vs(rs, o) for o in others]
            + [f"{pct(rs['hit_rate'])} / {pct(rs['optimal_hit_rate'])}"]
            + [f"{ideal['cache_ratio']:.2f}x / {ideal['ideal_cache_ratio']:.2f}x"]
        )
    return table(header, rows, list(files.values()))


def _vs(base: dict[str, Any], other: dict[str, Any]) -> str:
    """``other``'s wall time and ``base``'s throughput over it."""
    return f"{other['wall_s']:.1f} s ({base['requests_per_s'] / other['requests_per_s']:.2f}x)"


ZEN3, ZEN4 = "AMD EPYC Zen 3 (AVX2)", "AMD EPYC Zen 4 (AVX-512, BF16, VNNI)"
AVX2 = "AMD EPYC, AVX2 only (family 25 model 17)"  # Zen 4 silicon shown without AVX-512
LLAMA_RUNS = [  # (what is compared, shape, machine, JSON): the latest run of each (the AVX2 rows:
    # the median of the latest day's runs); 2 vCPUs each
    ("Qwen2.5-0.5B, bf16 vs BF16 GGUF", "(a)", ZEN3, "docs/bench-llama-cpp-a-bf16-s8.json"),
    ("Qwen2.5-0.5B, int8 vs Q8_0 GGUF", "(a)", ZEN3, "docs/bench-llama-cpp-a-int8-s8.json"),
    ("Qwen3-1.7B, bf16 vs BF16 GGUF", "(a)", ZEN3, "docs/bench-llama-cpp-a-qwen3-1.7b-bf16.json"),
    ("Qwen2.5-0.5B, bf16 vs BF16 GGUF", "(b)", ZEN3, "docs/bench-llama-cpp-b.json"),
    (
        "Qwen3-1.7B, bf16 vs BF16 GGUF",
        "(a)",
        ZEN4,
        "docs/bench-llama-cpp-a-qwen3-1.7b-bf16-zen4-1129.json",
    ),
    (
        "Qwen3-1.7B, int8 vs Q8_0 GGUF",
        "(a)",
        ZEN4,
        "docs/bench-llama-cpp-a-qwen3-1.7b-int8-zen4-1129.json",
    ),
    (
        "Qwen3-1.7B, bf16 vs BF16 GGUF",
        "(a)",
        AVX2,
        "docs/bench-llama-cpp-a-qwen3-1.7b-bf16-avx2.json",
    ),
    (
        "Qwen3-1.7B, int8 vs Q8_0 GGUF",
        "(a)",
        AVX2,
        "docs/bench-llama-cpp-a-qwen3-1.7b-int8-avx2.json",
    ),
    (
        "Llama-3.2-3B, bf16 vs BF16 GGUF",
        "(a)",
        ZEN4,
        "docs/bench-llama-cpp-a-llama3.2-3b-bf16-zen4.json",
    ),
    (
        "Llama-3.2-3B, int8 vs Q8_0 GGUF",
        "(a)",
        ZEN4,
        "docs/bench-llama-cpp-a-llama3.2-3b-int8-zen4.json",
    ),
]


def llama_cpp() -> str:
    """radixserve against llama-server on the same weights, one trace each, one after the other."""
    header = ["weights", "shape", "machine", "date", "radixserve", "llama-server", "throughput"]
    header += ["TTFT p50 ms", "TTFT p99 ms", "hit rate (optimal)"]
    rows = []
    for label, shape, machine, path in LLAMA_RUNS:
        r = load(path)
        rs = next(s for s in r["systems"] if s["kind"] == "radixserve")
        ll = next(s for s in r["systems"] if s["kind"] == "compare")
        rows.append(
            [label, shape, machine, date(r), f"{rs['wall_s']:.1f} s", f"{ll['wall_s']:.1f} s"]
            + [times(rs["requests_per_s"] / ll["requests_per_s"])]
            + [f"{ms(rs['ttft_s']['p50'])} vs {ms(ll['ttft_s']['p50'])}"]
            + [f"{ms(rs['ttft_s']['p99'])} vs {ms(ll['ttft_s']['p99'])}"]
            + [f"{pct(rs['hit_rate'])} vs {pct(ll['hit_rate'])} ({pct(rs['optimal_hit_rate'])})"]
        )
    return table(header, rows, [path for *_, path in LLAMA_RUNS])


def kv_tier() -> str:
    """Shape (b) on a pool of a third of its tokens, with and without a file tier."""
    path = "docs/bench-multiturn-b-tier.json"
    r = load(path)
    header = ["system", "pool", "tier", "wall s", "req/s", "hit", "optimal", "from the tier"]
    header += ["prompt tokens computed", "TTFT p50 s"]
    rows = []
    for s in r["systems"]:
        tier = s["kind"] == "kv-tier"
        rows.append(
            [s["name"], f"{s['pool_tokens']:,}"]
            + [f"{r['options']['kv_tier']}, {s['kv_tier_capacity_tokens']:,}" if tier else "-"]
            + [f"{s['wall_s']:.1f}", f"{s['requests_per_s']:.3f}", pct(s["hit_rate"])]
            + [pct(s["optimal_hit_rate"]), pct(s["tier_hit_rate"]) if tier else "-"]
            + [f"{s['prefill_tokens']:,}", f"{s['ttft_s']['p50']:.1f}"]
        )
    return table(header, rows, [path])


def _split(s: dict[str, Any]) -> str:
    return " / ".join(pct(x) for x in s["load_split"])


def dp_routers() -> str:
    """Two workers behind sglang-router, one row per router policy (the tiny model)."""
    path = "docs/bench-dp2-tiny.json"
    header = ["router policy", "hit", "optimal", "req/s", "TTFT p99 ms", "requests per worker"]
    rows = [
        [s["router_policy"], pct(s["hit_rate"]), pct(s["optimal_hit_rate"])]
        + [f"{s['requests_per_s']:.1f}", ms(s["ttft_s"]["p99"]), _split(s)]
        for s in load(path)["systems"]
    ]
    return table(header, rows, [path])


def dp_system_prompt() -> str:
    """A system prompt every conversation shares, routed by cache_aware, with its balancing
    thresholds as they come and lowered."""
    files = ["docs/bench-dp2-system-default.json", "docs/bench-dp2-system-balanced.json"]
    header = ["router flags", "hit", "optimal", "req/s", "requests per worker"]
    rows = []
    for path in files:
        r = load(path)
        flags = " ".join(f"`--router-arg={a}`" for a in r["options"]["router_args"])
        for s in r["systems"]:
            rows.append([flags or "defaults", pct(s["hit_rate"]), pct(s["optimal_hit_rate"])])
            rows[-1] += [f"{s['requests_per_s']:.1f}", _split(s)]
    return table(header, rows, files)


ROUTERS = {"round_robin": "round_robin", "cache_aware": "cache_aware (tree)"}
ROUTERS["cache_aware:grpc"] = "cache_aware on events"
DP2_RUNS = {
    "multi-turn, default pool": "mt-default.json",
    "multi-turn, pool 2,500 per worker": "mt-pool2500.json",
    "the same, smg's warm-up off": "mt-pool2500-nowarmup.json",
    "shared-prefix, 4 groups x 8": "sp-default.json",
}


def kv_events_dp2() -> str:
    """smg 1.13 over HTTP (its approximate tree) and in gRPC mode (the workers' KV events)."""
    header = ["trace", "router", "hit (optimal)", "req/s", "TTFT p99 ms"]
    rows = []
    for label, name in DP2_RUNS.items():
        for s in load(f"{DP2}/{name}")["systems"]:
            rows.append(
                [label, ROUTERS[s["router_policy"]]]
                + [f"{pct(s['hit_rate'])} ({pct(s['optimal_hit_rate'])})"]
                + [f"{s['requests_per_s']:.2f}", ms(s["ttft_s"]["p99"])]
            )
            label = ""
    return table(header, rows, [f"{DP2}/{name}" for name in DP2_RUNS.values()])


SIM_RUNS = {
    "multi-turn, 3,000 (evicting)": "multiturn-kv3000.json",
    "multi-turn, 16,000 (no eviction)": "multiturn-kv16000.json",
    "shared-prefix, 8,000": "shared-prefix-kv8000.json",
}


def kv_events_sim() -> str:
    """The simulator's replicas behind each router, on the h100 cost model (deterministic)."""
    header = ["trace, pool per replica", "dp", "router", "hit (optimal)", "req/s", "TTFT p99 ms"]
    rows = []
    for label, name in SIM_RUNS.items():
        for run in load(f"{SIM}/{name}")["runs"]:
            rows.append(
                [label, run["point"]["dp_size"], run["point"]["router"]]
                + [f"{pct(run['hit_rate'])} ({pct(run['optimal_hit_rate'])})"]
                + [f"{run['requests_per_s']:.0f}", ms(run["ttft_s"]["p99"])]
            )
            label = ""
    return table(header, rows, [f"{SIM}/{name}" for name in SIM_RUNS.values()])


def h200_multiturn() -> str:
    """Shape (a) on one H200, the cache on and off."""
    path = f"{H200}/multiturn.json"
    header = ["system", "wall s", "req/s", "TTFT p50 ms", "TTFT p99 ms", "hit rate (optimal)"]
    names = {"radixserve": "radixserve", "radixserve-no-cache": "radixserve, cache off"}
    rows = [
        [names[s["name"]], f"{s['wall_s']:.2f}", f"{s['requests_per_s']:.1f}"]
        + [ms(s["ttft_s"]["p50"]), ms(s["ttft_s"]["p99"])]
        + [f"{pct(s['hit_rate'])} ({pct(s['optimal_hit_rate'])})"]
        for s in load(path)["systems"]
    ]
    return table(header, rows, [path])


def h200_throughput() -> str:
    """Tokens/s with decode CUDA graphs and without, beside transformers, on one H200; the
    latest run, with the first run's graphs beside it."""
    files = {
        "Qwen2.5-0.5B": "throughput-qwen25-0.5b.json",
        "Llama-3-8B": "throughput-llama3-8b.json",
    }
    header = ["shape", "row", "graphs", "eager", "graphs / eager", "HF bf16", "graphs / HF"]
    header += ["graphs: share of the bound", "graphs 2026-11-26 (share)", "now / then"]
    rows = []
    for shape, name in files.items():
        then = {r["row"]: r for r in load(f"{H200}/{name}")["rows"]}
        for row in load(f"{H200_NOW}/{name}")["rows"]:
            t = row["tokens_per_s"]
            graphs, eager, hf = t["rs bfloat16"], t["rs bfloat16+eager"], t["HF bfloat16"]
            old = then[row["row"]]
            before = old["tokens_per_s"]["rs bfloat16"]
            rows.append(
                [shape, row["row"], num(graphs), num(eager), times(graphs / eager), num(hf)]
                + [times(graphs / hf), _share(row)]
                + [num(before) + (f" ({share})" if (share := _share(old)) else "")]
                + [times(graphs / before)]
            )
    paths = [f"{d}/{name}" for d in (H200_NOW, H200) for name in files.values()]
    return table(header, rows, paths)


def _share(row: dict[str, Any]) -> str:
    bound = row.get("bound_fraction", {}).get("rs bfloat16")
    return "" if bound is None else f"{100 * bound:.0f}%"


def h200_split() -> str:
    """The prefill split (ragged new tokens + the paged prefix, merged) against one paged
    pass, whole forwards on one H200."""
    files = {"Qwen2.5-0.5B": "split-qwen25-0.5b.json", "Llama-3-8B": "split-llama3-8b.json"}
    header = ["shape", "extend", "split tok/s", "one paged pass tok/s", "split / paged"]
    header += ["max logit diff"]
    rows = [
        [shape, r["row"], num(r["tokens_per_s"]["ragged"]), num(r["tokens_per_s"]["paged"])]
        + [times(r["ratio"]), f"{r['max_logit_diff']:.3g}"]
        for shape, name in files.items()
        for r in load(f"{H200_NOW}/{name}")["rows"]
    ]
    return table(header, rows, [f"{H200_NOW}/{name}" for name in files.values()])


def h200_overlap() -> str:
    """The scheduler's real loop over the model on one H200: ms per decode step with overlap
    off, launched from the worker thread, and on the stream."""
    files = {"Qwen2.5-0.5B": "overlap-qwen25-0.5b.json", "Llama-3-8B": "overlap-llama3-8b.json"}
    header = ["shape", "batch", "off ms", "thread ms", "stream ms", "best / off"]
    rows = []
    for shape, name in files.items():
        by: dict[int, dict[str, float]] = {}
        for r in load(f"{H200_NOW}/{name}")["rows"]:
            by.setdefault(r["batch"], {})[r["overlap"]] = r["step_ms"]
        for batch, m in sorted(by.items()):
            best = min(m["thread"], m["stream"])
            rows.append(
                [shape, str(batch)]
                + [f"{m[k]:.2f}" for k in ("off", "thread", "stream")]
                + [times(m["off"] / best)]
            )
    return table(header, rows, [f"{H200_NOW}/{name}" for name in files.values()])


def h200_spec() -> str:
    """NGRAM against plain decoding on one H200 (spec_decode.py's printed table)."""
    path = f"{H200_NOW}/spec.txt"
    header = ["workload", "batch", "plain tok/s", "NGRAM tok/s", "speedup", "accept length"]
    rows = []
    names = {"a": "a: code edit", "c": "c: sent again", "d": "d: prose"}
    for line in (REPO / path).read_text(encoding="utf-8").splitlines()[2:]:
        w, bs, plain, spec, speedup, accept = line.split()
        rows.append([names[w], bs, num(float(plain)), num(float(spec)), speedup, accept])
    return table(header, rows, [path])


ZEN4 = "benchmarks/results/zen4-2026-11-28"
ZEN4_NOW = "benchmarks/results/zen4-2026-11-29"


def zen4_step() -> str:
    """One step at a time on Zen 4: prefill and decode beside transformers and llama-server."""
    return step_table(f"{ZEN4}/step-qwen25-0.5b-int8-rows.json", "bfloat16")


def avx2_step() -> str:
    """The same on the AVX2 host, beside transformers in float32 (its faster dtype there)."""
    return step_table("benchmarks/results/avx2-2026-11-29/step-qwen25-0.5b.json", "float32")


def step_table(path: str, hf_dtype: str) -> str:
    """radixserve's bf16 and int8 rows of one ``model_throughput.py`` run beside transformers in
    ``hf_dtype`` and llama-server's BF16 and Q8_0, and the ratios between them."""
    hf_name = {"bfloat16": "HF bf16", "float32": "HF fp32"}[hf_dtype]
    header = ["row", "rs bf16", "rs int8", hf_name, "llama BF16", "llama Q8_0", "int8 / bf16"]
    header += ["rs bf16 / llama BF16", "rs int8 / llama Q8_0", f"rs int8 / {hf_name}"]
    rows = []
    for row in load(path)["rows"]:
        t = row["tokens_per_s"]
        bf, i8, hf = t["rs bfloat16"], t["rs bfloat16+int8"], t[f"HF {hf_dtype}"]
        lb, lq = t["llama bf16"], t["llama q8_0"]
        rows.append(
            [row["row"]]
            + [num(v) for v in (bf, i8, hf, lb, lq)]
            + [times(i8 / bf), times(bf / lb), times(i8 / lq), times(i8 / hf)]
        )
    return table(header, rows, [path])


def zen4_forced_avx512_vnni() -> str:
    """Zen 4 forced to the avx512_vnni variant (standing in for an AVX-512 Xeon with VNNI but no
    BF16): bf16 and int8, and the int8 of the avx512 variant beside it (VPMADDUBSW + VPMADDWD in
    the skinny GEMM; its taller products on torch's path, as on a CPU without VNNI)."""
    path = f"{ZEN4_NOW}/step-qwen25-0.5b-forced-avx512-vnni.json"
    header = ["row", "rs bf16", "rs int8", "int8 / bf16", "rs int8, avx512", "avx512_vnni / avx512"]
    rows = []
    for row in load(path)["rows"]:
        t = row["tokens_per_s"]
        bf, i8 = t["rs bfloat16+avx512_vnni"], t["rs bfloat16+int8+avx512_vnni"]
        before = t["rs bfloat16+int8+avx512"]
        rows.append([row["row"], num(bf), num(i8), times(i8 / bf), num(before), times(i8 / before)])
    return table(header, rows, [path])


def zen4_skinny_vnni() -> str:
    """The skinny GEMM's int8 rows with VPDPBUSD (avx512_vnni) against VPMADDUBSW + VPMADDWD
    (avx512) on the Qwen3-1.7B shape, each variant forced, interleaved in one run."""
    path = f"{ZEN4_NOW}/step-qwen3-1.7b-skinny-vnni.json"
    rows = []
    for row in load(path)["rows"]:
        if not row["row"].startswith("decode"):
            continue  # its prefill row is the VNNI GEMM against torch's path: the table above
        t = row["tokens_per_s"]
        before, after = t["rs bfloat16+int8+avx512"], t["rs bfloat16+int8+avx512_vnni"]
        bound = row["bound_fraction"]
        rows.append(
            [row["row"], num(before), num(after), times(after / before)]
            + [
                f"{bound['rs bfloat16+int8+avx512']:.0%} / {bound['rs bfloat16+int8+avx512_vnni']:.0%}"
            ]
        )
    header = ["row", "int8, avx512", "int8, avx512_vnni", "avx512_vnni / avx512", "of the bound"]
    return table(header, rows, [path])


def zen4_packed() -> str:
    """The best tile of weights packed by blocks of 16 rows against the best row-major tile of
    the same rounds (``gemv_tiles.py --packed --prefill 512``), two runs per shape; the prefill
    row is the best packed tile against torch's GEMM."""
    shapes = {"Llama-3.2-3B shape": "llama3.2-3b", "Qwen3-1.7B shape": "qwen3-1.7b"}
    paths = {
        label: [f"{ZEN4_NOW}/gemv-tiles-packed-{name}{run}.json" for run in ("", "-2")]
        for label, name in shapes.items()
    }

    def best(rows: list[dict[str, Any]], packed: bool, key: str) -> float:
        return max(r[key]["all"] for r in rows if r["tile"].startswith("P") == packed)

    def decode_cell(path: str, m: int) -> str:
        rows = [r for r in load(path)["rows"] if r["m"] == m and "/" not in r["tile"]]
        return times(best(rows, True, "gb_s") / best(rows, False, "gb_s"))

    def prefill_cell(path: str) -> str:
        rows = load(path)["prefill_rows"]
        torch = next(r["gflop_s"]["all"] for r in rows if r["tile"] == "torch")
        packed = [r for r in rows if r["tile"] != "torch"]
        return times(best(packed, True, "gflop_s") / torch)

    ms = sorted({r["m"] for r in load(paths["Llama-3.2-3B shape"][0])["rows"]})
    rows = [
        [str(m)] + [" / ".join(decode_cell(p, m) for p in ps) for ps in paths.values()] for m in ms
    ]
    rows.append(
        ["prefill 512, against torch's GEMM"]
        + [" / ".join(prefill_cell(p) for p in ps) for ps in paths.values()]
    )
    return table(["M", *shapes], rows, [p for ps in paths.values() for p in ps])


def zen4_forced_avx2() -> str:
    """Zen 4 forced to the avx2 variant (standing in for an AVX2 CPU)."""
    return int8_against_bf16(f"{ZEN4}/step-forced-avx2-int8-rows.json")


def int8_against_bf16(path: str) -> str:
    """radixserve's bf16 and int8 rows of one ``model_throughput.py`` run, and their ratio."""
    rows = []
    for row in load(path)["rows"]:
        t = row["tokens_per_s"]
        bf, i8 = t["rs bfloat16"], t["rs bfloat16+int8"]
        rows.append([row["row"], num(bf), num(i8), times(i8 / bf)])
    return table(["row", "rs bf16", "rs int8", "int8 / bf16"], rows, [path])


def zen4_multiturn() -> str:
    """Shape (a) on the Qwen3-1.7B shape: the tree before the VNNI GEMM (40425c2), with it
    (e30e3a4), with the decode attention and bf16 tiles (8d06975), with the L2 prefetch and the
    VNNI GEMM's padding-lane offsets (ed67124), with the 8-lane int8 tiles (c62bc00), with the
    decode attention's K prefetch and Qwen3's q/k norms in the kernels (4806df0); the last four
    each in one run with llama-server, whose own times are a column."""
    trees = ["40425c2", "e30e3a4", "8d06975", "ed67124", "c62bc00", "4806df0"]
    beside = " / ".join(trees[2:])
    header = ["weights", *trees, "4806df0 / 40425c2", f"llama-server beside {beside}"]
    header += [f"to llama at {beside}", "TTFT p99 40425c2 / 4806df0 / llama"]
    rows, files = [], []
    for dtype, gguf in (("bf16", "BF16"), ("int8", "Q8_0")):
        paths = [f"{ZEN4}/multiturn-qwen3-1.7b-{dtype}-{tree}.json" for tree in trees[1:-1]]
        paths = [f"{ZEN4}/multiturn-qwen3-1.7b-{dtype}-before.json", *paths]
        paths.append(f"docs/bench-llama-cpp-a-qwen3-1.7b-{dtype}-zen4.json")
        files += paths
        runs = [load(path)["systems"] for path in paths]
        sides = [next(s for s in run if s["kind"] == "radixserve") for run in runs]
        llamas = [next(s for s in run if s["kind"] == "compare") for run in runs[2:]]
        before, now, llama = sides[0], sides[-1], llamas[-1]
        p99 = " / ".join(ms(s["ttft_s"]["p99"]) for s in (before, now, llama))
        to_llama = [
            times(s["requests_per_s"] / ll["requests_per_s"])
            for s, ll in zip(sides[2:], llamas, strict=True)
        ]
        rows.append(
            [f"{dtype} (llama: {gguf})"]
            + [f"{s['wall_s']:.1f} s" for s in sides]
            + [times(now["requests_per_s"] / before["requests_per_s"])]
            + [" / ".join(f"{ll['wall_s']:.1f} s" for ll in llamas)]
            + [" / ".join(to_llama), p99]
        )
    return table(header, rows, files)


SPEC_RUNS = [  # spec_decode.py --json: the Qwen3-1.7B shape at batch 1, 8 and 32
    f"benchmarks/results/spec-qwen3-1.7b-b{bs}-2026-11-27.json" for bs in (1, 8, 32)
]
WORKLOADS = {
    "a": "(a) code edit",
    "b": "(b) chat quoting its notes",
    "c": "(c) sent again",
    "d": "(d) prose",
}
SHAPES = {"qwen3-1.7b": "Qwen3-1.7B", "qwen2.5-0.5b": "Qwen2.5-0.5B"}


def accept_len(accept: float, drafted: object) -> str:
    """A speculative run's accept length, or "no drafts" where it verified none."""
    return f"{accept:.2f}" if drafted else "no drafts"


def spec_decode() -> str:
    """``spec_decode.py``'s rows: NGRAM against plain decoding, per workload and batch."""
    header = ["shape", "date", "workload", "batch", "plain tok/s", "NGRAM tok/s", "speedup"]
    header += ["accept length"]
    rows = []
    for path in SPEC_RUNS:
        r = load(path)
        for row in r["rows"]:
            accept = accept_len(row["accept"], row["accept"])
            rows.append(
                [
                    SHAPES.get(r["shape"], r["shape"]),
                    date(r),
                    WORKLOADS[row["workload"]],
                    str(row["bs"]),
                ]
                + [num(row["plain_tok_s"]), num(row["spec_tok_s"])]
                + [times(row["spec_tok_s"] / row["plain_tok_s"]), accept]
            )
    return table(header, rows, SPEC_RUNS)


SPEC_LLAMA = "benchmarks/results/spec-llamacpp-2026-11-27.json"
SPEC_LLAMA_NGRAM = "benchmarks/results/spec-llamacpp-ngram-2026-11-27.json"
DRAFTER_NAMES = {"model": "model drafter"}


def _spec_cell(spec: dict[str, Any] | None, plain: float) -> list[str]:
    """A llama.cpp speculative run's tokens/s (its accept length) and its speedup; empty where
    it did not run (radixserve drafted nothing to take the acceptance from)."""
    if spec is None:
        return ["", ""]
    accept = accept_len(spec["accept"], spec["verify_steps"])
    return [f"{spec['tok_s']:.1f} ({accept})", f"{spec['tok_s'] / plain:.2f}x"]


def _spec_llama_table(path: str) -> str:
    """``spec_llamacpp.py``'s rows: radixserve's NGRAM and llama-server's drafters at its
    accept length, then llama.cpp's own drafts of a request sent again, where the run has any."""
    r = load(path)
    drafters = list(r["rows"][0]["llama_spec"])
    header = ["workload", "bs", "radixserve plain", "radixserve NGRAM", "speedup"]
    header += ["accept length", "llama.cpp plain"]
    for d in drafters:
        header += [f"llama.cpp spec, {DRAFTER_NAMES.get(d, d)}", "speedup"]
    rows = []
    for row in r["rows"]:
        accept = accept_len(row["rs_accept"], row["rs_accept"])
        rows.append(
            [WORKLOADS[row["workload"]], str(row["bs"]), f"{row['rs_plain']:.1f}"]
            + [f"{row['rs_ngram']:.1f}", f"{row['rs_speedup']:.2f}x", accept]
            + [f"{row['llama_plain']:.1f}"]
            + [c for d in drafters for c in _spec_cell(row["llama_spec"][d], row["llama_plain"])]
        )
    lines = table(header, rows, [path]).split("\n")
    real = r.get("llama_real")
    if real is None:  # the first run's key: ngram-mod's real runs alone
        real = [dict(x, drafter="ngram-mod") for x in r["llama_ngram_mod_real"]]
    if real:
        header = ["workload", "bs", "llama.cpp's own drafts", "plain", "speculative"]
        header += ["speedup", "accept length", "verify steps"]
        rows = [
            [WORKLOADS[x["workload"]], str(x["bs"]), x["drafter"], f"{x['plain']:.1f}"]
            + [f"{x['tok_s']:.1f}", f"{x['tok_s'] / x['plain']:.2f}x"]
            + [accept_len(x["accept"], x["verify_steps"])]
            + [f"{x['verify_steps']:.0f}"]
            for x in real
        ]
        lines[-1:-1] = table(header, rows, []).split("\n")[:-1]
    return "\n".join(lines)


def spec_llamacpp() -> str:
    """The first run beside llama-server: the model and ngram-mod drafters, workloads a-d."""
    return _spec_llama_table(SPEC_LLAMA)


def spec_llamacpp_ngram() -> str:
    """The run with llama.cpp's three n-gram drafters and the model drafter."""
    return _spec_llama_table(SPEC_LLAMA_NGRAM)


def agent_trace() -> str:
    """An agent's hit rate through each route, beside the optimum."""
    path = "benchmarks/results/zen4-2026-11-29/agent-trace.json"
    routes = load(path)["routes"]
    rows = [
        [f"`{name}`", f"{r['prompt_tokens']:,}", f"{r['hit_rate']:.3f}", f"{r['optimal']:.3f}"]
        for name, r in routes.items()
    ]
    return table(["route", "prompt tokens", "hit rate", "optimal"], rows, [path])


def agent_trace_dp() -> str:
    """The same agents over two data-parallel workers behind smg, under each router policy."""
    paths = {
        policy: f"benchmarks/results/zen4-2026-11-29/agent-trace-dp-{policy}.json"
        for policy in ("round_robin", "cache_aware")
    }
    runs = {policy: load(path)["routes"] for policy, path in paths.items()}
    rows = []
    for name in runs["round_robin"]:
        r, c = runs["round_robin"][name], runs["cache_aware"][name]
        rows.append(
            [
                f"`{name}`",
                f"{r['hit_rate']:.3f}",
                f"{r['optimal']:.3f}",
                f"{c['hit_rate']:.3f}",
                f"{c['optimal']:.3f}",
            ]
        )
    head = ["route", "round_robin: hit rate", "optimal", "cache_aware: hit rate", "optimal"]
    return table(head, rows, list(paths.values()))


TABLES: dict[str, Callable[[], str]] = {
    "multiturn": multiturn,
    "llama-cpp": llama_cpp,
    "kv-tier": kv_tier,
    "dp-routers": dp_routers,
    "dp-system-prompt": dp_system_prompt,
    "kv-events-sim": kv_events_sim,
    "kv-events-dp2": kv_events_dp2,
    "h200-throughput": h200_throughput,
    "h200-split": h200_split,
    "h200-overlap": h200_overlap,
    "h200-spec": h200_spec,
    "zen4-step": zen4_step,
    "avx2-step": avx2_step,
    "zen4-multiturn": zen4_multiturn,
    "zen4-forced-avx512-vnni": zen4_forced_avx512_vnni,
    "zen4-skinny-vnni": zen4_skinny_vnni,
    "zen4-packed": zen4_packed,
    "zen4-forced-avx2": zen4_forced_avx2,
    "h200-multiturn": h200_multiturn,
    "spec-decode": spec_decode,
    "spec-llamacpp": spec_llamacpp,
    "spec-llamacpp-ngram": spec_llamacpp_ngram,
    "agent-trace": agent_trace,
    "agent-trace-dp": agent_trace_dp,
}


def blocks(page: str) -> dict[str, str]:
    """Each generated block's body on ``page``, by name."""
    return {m.group(2): m.group(3) for m in BLOCK.finditer(page)}


def body(name: str) -> str:
    if name not in TABLES:
        raise ValueError(f"no table named {name!r}; known: {', '.join(TABLES)}")
    return "\n" + TABLES[name]() + "\n\n"


def render_page(page: str) -> str:
    """``page`` with every block's body rendered again from its JSON."""
    return BLOCK.sub(lambda m: m.group(1) + body(m.group(2)) + m.group(4), page)


def stale_blocks(page: str) -> list[str]:
    """The blocks whose body is not what their JSON gives (an unknown name is stale too)."""
    return [n for n, text in blocks(page).items() if n not in TABLES or text != body(n)]


def redraw_plots() -> list[Path]:
    """Each committed ``docs/bench-*.png`` drawn again from its JSON beside it."""
    from radixserve.bench.plot import write_plot

    pngs = sorted((REPO / "docs").glob("bench-*.png"))
    for png in pngs:
        write_plot(json.loads(png.with_suffix(".json").read_text()), png)
    return pngs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the page's tables")
    mode.add_argument("--check", action="store_true", help="exit 1 if a table differs")
    mode.add_argument("--plots", action="store_true", help="redraw docs/bench-*.png")
    args = parser.parse_args(argv)
    page = PAGE.read_text(encoding="utf-8")
    if args.write:
        PAGE.write_text(render_page(page), encoding="utf-8")
        print(f"wrote {len(blocks(page))} tables into {PAGE.relative_to(REPO)}")
    elif args.check:
        if stale := stale_blocks(page):
            print("differs from its JSON: " + ", ".join(stale), file=sys.stderr)
            return 1
        print(f"all {len(blocks(page))} tables equal their JSON")
    elif args.plots:
        for png in redraw_plots():
            print(f"wrote {png.relative_to(REPO)}")
    else:
        for name, render in TABLES.items():
            print(f"<!-- table: {name} -->\n\n{render()}\n\n<!-- /table -->\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
