"""Render bench/results/<scale>/results.json into docs/benchmarks.md + PNG plots (tools venv)."""
from __future__ import annotations

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402,F401

WORKLOADS = ("tabular", "images", "ndarray", "tokens")
UNITS = {"tabular": "rows", "images": "images", "ndarray": "arrays", "tokens": "sequences"}


def f(x, nd=0, pct=False, suffix=""):
    if x is None:
        return "–"
    if pct:
        return f"{100 * x:.0f}%"
    if abs(x) >= 1000 and nd == 0:
        return f"{x:,.0f}{suffix}"
    return f"{x:.{nd}f}{suffix}"


def ratio(a, b):
    return a / b if a and b else None


def get(d, *ks):
    for k in ks:
        if d is None:
            return None
        d = d.get(k) if isinstance(d, dict) else None
    return d


def status_text(r, limit=None):
    if r.get("status") == "unsupported":
        t = str(r.get("reason"))
        t = t if t.startswith("not supported") else f"not supported: {t}"
    else:
        t = f"failed: {r.get('reason')}"
    t = t.replace("|", "/").replace("\n", " ")
    return t if not limit or len(t) <= limit else t[: limit - 1] + "…"


def nfiles(man):
    if man.get("files"):
        return len(man["files"])
    sp = man.get("spec") or {}
    if sp.get("rows") and sp.get("rows_per_file"):
        return -(-sp["rows"] // sp["rows_per_file"])
    return "?"


def g3(x):
    return "–" if x is None else f"{x:.3g}"


# What each system hands the trainer on the tokens workload.
LM_LAYOUT = {
    "pqloader": "(refused: ragged rows need lists= or pack=)",
    "pqloader-native": "PadOrTruncate(1024): [B, 1024]",
    "pqloader-native-cache": "PadOrTruncate(1024): [B, 1024]",
    "pqloader-ragged": "values + offsets",
    "pqloader-pad": "Pad(multiple_of=8): [B, longest ↑8]",
    "pqloader-pack": "packed blocks [32, 1024]",
    "petastorm-batch": "padded to 1024",
    "petastorm-batch-cache": "padded to 1024",
    "petastorm-row": "padded to the longest",
    "torch-nw0": "padded to the longest",
    "torch-nw2": "padded to the longest",
    "hf-datasets": "padded to the longest (vectorised from Arrow)",
    "hf-datasets-collate": "padded to the longest (pad_sequence collator)",
    "grain-pad": "padded to the longest (batch_fn)",
    "grain-pack": "packed blocks [32, 1024] (ConcatThenSplit)",
    "ray-data": "padded to the longest",
}


def lm_section(P, doc, by, c):
    """The tokens workload in tokens/s, and the goals of issue 16 as ratios of this run."""
    ceil_tok = c.get("epoch_ceiling_tokens_per_s")
    ceil_seq = c.get("epoch_ceiling_samples_per_s")
    P("#### Language-model layouts, in tokens/s")
    P("")
    P("Tokens = values of the rows delivered (padding not counted). Packed rows count as samples the "
      "documents their tokens amount to (tokens ÷ the mean length), so their samples/s above compares with "
      "the others'. Ceiling: the values + offsets decode (`read_table` on all cores) × the mean length "
      f"= {f(ceil_tok)} tokens/s.")
    P("")
    P("| system | layout | tokens/s (shuffled) | % ceiling | epoch 2 tokens/s | e2 % ceiling | unshuffled tokens/s |")
    P("|---|---|---:|---:|---:|---:|---:|")
    for s in doc["systems"]:
        r = by.get((s["id"], "tokens"))
        if not r or r.get("status") != "ok":
            continue
        t1, t2 = get(r, "epoch1", "tokens_per_s"), get(r, "epoch2", "tokens_per_s")
        P(f"| {s['label']} | {LM_LAYOUT.get(s['id'], '')} | {f(t1)} | {f(ratio(t1, ceil_tok), pct=True)} | "
          f"{f(t2)} | {f(ratio(t2, ceil_tok), pct=True)} | {f(get(r, 'unshuffled', 'tokens_per_s'))} |")
    P("")

    def rate(sid, key, epoch):
        r = by.get((sid, "tokens"))
        return get(r, epoch, key) if r and r.get("status") == "ok" else None

    goals = [
        ("ragged ÷ values + offsets ceiling (seq/s)", "pqloader-ragged", "samples_per_s", None, ceil_seq, 0.8),
        ("Pad(multiple_of=8) ÷ HF datasets + pad_sequence collator (seq/s)", "pqloader-pad", "samples_per_s",
         "hf-datasets-collate", None, 2.0),
        ("Pad(multiple_of=8) ÷ HF datasets, vectorised slices (seq/s; for reference)", "pqloader-pad",
         "samples_per_s", "hf-datasets", None, None),
        ("packed ÷ values + offsets ceiling (tokens/s)", "pqloader-pack", "tokens_per_s", None, ceil_tok, 0.6),
        ("packed ÷ Grain ConcatThenSplit (tokens/s; for reference)", "pqloader-pack", "tokens_per_s",
         "grain-pack", None, None),
    ]
    P("Goals of issue 16 as ratios measured in this run (epoch 1 includes the loader's construction and, for "
      "packing, the pass that reads every document's length; epoch 2 is the next shuffled epoch of the same "
      "loader):")
    P("")
    P("| ratio | epoch 1 | epoch 2 | goal |")
    P("|---|---:|---:|---:|")
    for name, sid, key, peer, ceiling, goal in goals:
        vals = []
        for epoch in ("epoch1", "epoch2"):
            den = ceiling if peer is None else rate(peer, key, epoch)
            vals.append(ratio(rate(sid, key, epoch), den))
        met = "" if goal is None or vals[0] is None else (" ✓" if vals[0] >= goal else " ✗")
        P(f"| {name} | {f(vals[0], 2)} | {f(vals[1], 2)} | {'≥ ' + f(goal, 1) + met if goal else '–'} |")
    P("")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    with open(a.results) as fh:
        doc = json.load(fh)
    scale = doc["scale"]
    out_dir = os.path.dirname(os.path.abspath(a.out))
    img_dir = os.path.join(out_dir, "benchmarks")
    os.makedirs(img_dir, exist_ok=True)
    rows = doc["rows"]
    ceil = doc.get("ceilings") or {}
    cw = ceil.get("workloads", {})
    workloads = [w for w in WORKLOADS if any(r["workload"] == w for r in rows)]
    by = {(r["system"], r["workload"]): r for r in rows}

    def ref_id(w):
        """The pqloader row ratios refer to: its native (C++ transforms) path where that ran, else plain."""
        r = by.get(("pqloader-native", w))
        return "pqloader-native" if r and r.get("status") == "ok" else "pqloader"

    def is_pq(sid):
        return sid.startswith("pqloader")
    L = []
    P = L.append

    P("# pqloader benchmarks")
    P("")
    P(f"Generated by `{doc['command']}` (scale **{scale}**, dataset seed {doc['seed']}), "
      f"{doc.get('started', '?')} → {doc.get('finished', 'unfinished')}, "
      f"total {f((doc.get('total_wall_s') or 0) / 60, 1)} min. Raw results: `bench/results/{scale}/results.json`, "
      f"per-measurement logs: `bench/results/{scale}/logs/`.")
    P("")
    P("Every (system, workload) measurement runs in its own subprocess with that system's virtualenv, on the "
      "same Parquet files and the same cores. Throughput runs read the whole dataset once per epoch, **shuffled** "
      "(as training reads it; each system's own shuffle: pqloader's row-group order + rows within a window, "
      "Petastorm's row-group order, Ray's file order (`shuffle='files'`, unseeded), the torch DataLoader's and "
      "Grain's row-group/file order, HF datasets' order of contiguous batch-size slices (a full row permutation "
      "only in the pad_sequence-collator row): only pqloader moves rows between batches); "
      "epoch 2 is a second shuffled pass with whatever the system caches; *unshuffled* is one epoch in file "
      "order, and *cold* (tabular) a shuffled epoch after the files were dropped from the page cache "
      "(posix_fadvise DONTNEED), with what a system reads instead of them (HF datasets' Arrow cache, a "
      "local-disk cache), by a new reader (pqloader's Loader, HF's table mapped anew). Time to first batch "
      "(TTFB) starts before the loader is constructed (it includes `ray.init`, the HF Arrow conversion, "
      "worker start-up). The page cache is warmed before every measurement, so no run but *cold* reads from disk.")
    P("")
    P("**Ratios.** `× pqloader` = samples/s of the row ÷ samples/s of the pqloader reference row on the same "
      "workload (pqloader-native, i.e. pqloader's own C++ decode transforms, where it ran; plain pqloader otherwise); "
      "`% ceiling` = samples/s ÷ the measured ceiling for that workload (see *Ceilings*). "
      "Epoch 2 is compared with the *cached* ceiling (memory bandwidth ÷ decoded bytes per sample).")
    P("")
    P("**Goal ratios.** The ratios the issues set as goals (shuffled against unshuffled and against a "
      "2-thread row-group decode, cache hits against a copy, tokens, images), each against a ceiling timed "
      "in the same run, are in `docs/benchmarks_quick.md` (`make bench-quick BENCH_QUICK_ARGS=--write-doc`); "
      "filters and mixtures in `docs/benchmarks_filter_mix.md`.")
    P("")

    bg = sorted(r["foreign_cpu_frac"] for r in rows if r.get("foreign_cpu_frac") is not None)
    if bg and bg[len(bg) // 2] > 0.10:
        P(f"> **Warning: noisy run.** Other processes used a median {100 * bg[len(bg) // 2]:.0f}% "
          f"(max {100 * bg[-1]:.0f}%) of the machine's CPU during the measurements (column *bg CPU*), and "
          f"{100 * (ceil.get('foreign_cpu_frac') or 0):.0f}% during the ceilings. Absolute numbers and ratios "
          "between rows measured under different load are not reliable; rerun on an idle machine.")
        P("")

    # ------------------------------------------------------------------ plots
    plots = []
    palette = plt.get_cmap("tab10").colors
    color = {s["id"]: palette[i % len(palette)] for i, s in enumerate(doc["systems"])}
    if workloads:
        fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4.6), squeeze=False)
        for ax, w in zip(axes[0], workloads):
            labels, e1, e2 = [], [], []
            for s in doc["systems"]:
                r = by.get((s["id"], w))
                if not r:
                    continue
                labels.append(s["id"])
                e1.append(get(r, "epoch1", "samples_per_s") or 0 if r.get("status") == "ok" else 0)
                e2.append(get(r, "epoch2", "samples_per_s") or 0 if r.get("status") == "ok" else 0)
            y = range(len(labels))
            ax.barh([i + 0.2 for i in y], e1, height=0.4, label="epoch 1", color="#4878d0")
            ax.barh([i - 0.2 for i in y], e2, height=0.4, label="epoch 2", color="#ee854a")
            for i, v in enumerate(e1):
                if v == 0:
                    ax.text(0.02, i, "failed / not supported", va="center", fontsize=7, color="#a00",
                            transform=ax.get_yaxis_transform())
            c = get(cw, w, "epoch_ceiling_samples_per_s")
            if c:
                ax.axvline(c, color="k", ls="--", lw=1, label="ceiling (epoch)")
            ax.set_yticks(list(y))
            ax.set_yticklabels(labels, fontsize=8)
            ax.invert_yaxis()
            ax.set_xscale("log")
            ax.set_xlabel(f"{UNITS[w]}/s (log)")
            ax.set_title(w)
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        handles, labels_ = axes[0][0].get_legend_handles_labels()
        for ax in axes[0][1:]:
            for h, l_ in zip(*ax.get_legend_handles_labels()):
                if l_ not in labels_:
                    handles.append(h)
                    labels_.append(l_)
        fig.legend(handles, labels_, loc="lower center", ncol=3, fontsize=8)
        fig.suptitle(f"Throughput, scale={scale}")
        fig.tight_layout(rect=(0, 0.07, 1, 1))
        p = os.path.join(img_dir, f"{scale}-throughput.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        plots.append(("Throughput (epoch 1 and 2, log scale; dashed: ceiling)", p))

        fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4.2), squeeze=False)
        for ax, w in zip(axes[0], workloads):
            for s in doc["systems"]:
                r = by.get((s["id"], w))
                if not r or r.get("status") != "ok" or not r.get("stall"):
                    continue
                xs = [p_["step_ms"] for p_ in r["stall"]]
                ys = [p_["stall_fraction"] for p_ in r["stall"]]
                ax.plot(xs, ys, marker="o", label=s["id"], color=color[s["id"]],
                        lw=2.6 if is_pq(s["id"]) else 1.2, ls="-" if is_pq(s["id"]) else "--")
            ax.set_xscale("log")
            ax.minorticks_off()
            ticks = sorted({p_["step_ms"] for (sid, ww), r in by.items() if ww == w for p_ in (r.get("stall") or [])})
            if ticks:
                ax.set_xticks(ticks)
                ax.set_xticklabels([f"{x:g}" for x in ticks])
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel("simulated train step (ms per batch, log)")
            ax.set_ylabel("data-stall fraction")
            ax.set_title(w)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle("Fraction of the training loop spent waiting for data")
        fig.tight_layout()
        p = os.path.join(img_dir, f"{scale}-stall.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        plots.append(("Data-stall fraction vs. train step time", p))

        fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
        ids = [s["id"] for s in doc["systems"] if any((s["id"], w) in by for w in workloads)]
        width = 0.8 / max(1, len(workloads))
        for k, w in enumerate(workloads):
            xs = [i + k * width for i in range(len(ids))]
            ttfb = [get(by.get((i, w)), "epoch1", "ttfb_s") or 0 for i in ids]
            mem = [(by.get((i, w)) or {}).get("peak_pss_mb") or 0 if (by.get((i, w)) or {}).get("status") == "ok" else 0
                   for i in ids]
            axes[0].bar(xs, ttfb, width, label=w)
            axes[1].bar(xs, mem, width, label=w)
        for ax, t in zip(axes, ("time to first batch (s, log)", "peak memory, PSS of process tree (MiB)")):
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(ids))])
            ax.set_xticklabels(ids, rotation=30, ha="right", fontsize=8)
            ax.set_title(t)
            ax.legend(fontsize=7)
        axes[0].set_yscale("log")
        fig.tight_layout()
        p = os.path.join(img_dir, f"{scale}-resources.png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        plots.append(("Time to first batch and peak memory", p))

    # ------------------------------------------------------------------ summary
    P("## Summary")
    P("")
    P("| workload | pqloader samples/s | best peer | best peer samples/s | pqloader ÷ best peer | ceiling samples/s |")
    P("|---|---:|---|---:|---:|---:|")
    for w in workloads:
        pq_r = by.get((ref_id(w), w))
        pq_rate = get(pq_r, "epoch1", "samples_per_s") if pq_r and pq_r.get("status") == "ok" else None
        peers = [(get(r, "epoch1", "samples_per_s"), r["system"]) for (s, ww), r in by.items()
                 if ww == w and not is_pq(s) and r.get("status") == "ok" and get(r, "epoch1", "samples_per_s")]
        best = max(peers) if peers else (None, "–")
        pq_txt = f(pq_rate) if pq_rate else (status_text(pq_r, 90) if pq_r else "–")
        P(f"| {w} | {pq_txt} ({ref_id(w)}) | {best[1]} | {f(best[0])} | {f(ratio(pq_rate, best[0]), 2)} | "
          f"{f(get(cw, w, 'epoch_ceiling_samples_per_s'))} |")
    P("")
    for title, p in plots:
        P(f"![{title}]({os.path.relpath(p, out_dir)})")
        P("")

    # ------------------------------------------------------------------ per workload
    P("## Results per workload")
    P("")
    P("Columns: epoch-1 samples/s and MB/s (MB = Parquet bytes on disk); TTFB; peak memory = max over time of the "
      "summed PSS of the measurement's process tree (RSS sum in parentheses; sampled every 0.1 s); CPU s per "
      "1,000 samples = user+sys of the whole process tree during epoch 1 (incl. start-up) ÷ samples × 1000; "
      "bg CPU = share of the machine used by *other* processes during the measurement (noise indicator; "
      "for Ray it includes its own daemons, which the measurement process does not reap).")
    P("")
    for w in workloads:
        man = (doc.get("datasets") or {}).get(w, {})
        c = cw.get(w, {})
        P(f"### {w}")
        P("")
        P(f"{man.get('rows', '?'):,} {UNITS[w]} in {nfiles(man)} files / {man.get('row_groups', '?')} "
          f"row groups, {f((man.get('bytes') or 0) / 1e6, 1)} MB on disk, batch size {man.get('batch_size')}. "
          f"Epoch ceiling {f(c.get('epoch_ceiling_samples_per_s'))}/s ({c.get('epoch_ceiling_basis', '–')}); "
          f"cached ceiling {f(c.get('cached_ceiling_samples_per_s'))}/s.")
        P("")
        P("| system | samples/s (shuffled) | MB/s | × pqloader | % ceiling | unshuffled samples/s | cold samples/s | "
          "TTFB s | peak PSS MiB (RSS) | CPU s / 1k | epoch 2 samples/s | e2 × pqloader | e2 % cached ceiling | "
          "bg CPU |")
        P("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        pq_r = by.get((ref_id(w), w)) or {}
        pq1 = get(pq_r, "epoch1", "samples_per_s") if pq_r.get("status") == "ok" else None
        pq2 = get(pq_r, "epoch2", "samples_per_s") if pq_r.get("status") == "ok" else None
        for s in doc["systems"]:
            r = by.get((s["id"], w))
            if not r:
                continue
            name = s["label"] + (" (no transforms: PIL decode in consumer)" if s["id"] == "pqloader" and w == "images"
                                 else "")
            if s["id"] == ref_id(w):
                name = f"**{name}** (reference)"
            if r.get("status") != "ok":
                P(f"| {name} | {status_text(r, 160)} |  |  |  |  |  |  |  |  |  |  |  |  |")
                continue
            e1, e2 = r.get("epoch1") or {}, r.get("epoch2") or {}
            part = " (partial)" if e1.get("partial") else (f" (short: {e1.get('samples')})" if e1.get("short") else "")
            part2 = " (partial)" if e2.get("partial") else (f" (short: {e2.get('samples')})" if e2.get("short") else "")
            P(f"| {name} | {f(e1.get('samples_per_s'))}{part} | {f(e1.get('mb_per_s'), 1)} | "
              f"{f(ratio(e1.get('samples_per_s'), pq1), 2)} | "
              f"{f(ratio(e1.get('samples_per_s'), c.get('epoch_ceiling_samples_per_s')), pct=True)} | "
              f"{f(get(r, 'unshuffled', 'samples_per_s'))} | {f(get(r, 'cold', 'samples_per_s'))} | "
              f"{f(e1.get('ttfb_s'), 2)} | {f(r.get('peak_pss_mb'))} ({f(r.get('peak_rss_mb'))}) | "
              f"{g3(e1.get('cpu_s_per_1k'))} | {f(e2.get('samples_per_s'))}{part2} | "
              f"{f(ratio(e2.get('samples_per_s'), pq2), 2)} | "
              f"{f(ratio(e2.get('samples_per_s'), c.get('cached_ceiling_samples_per_s')), pct=True)} | "
              f"{f(r.get('foreign_cpu_frac'), pct=True)} |")
        P("")
        if w == "tokens":
            lm_section(P, doc, by, c)
        if pq1:
            P(f"Same rows as ratios to the reference row ({ref_id(w)}; >1 = more than it; for TTFB, memory and "
              "CPU lower is better):")
            P("")
            P("| system | samples/s | epoch 2 samples/s | TTFB | peak PSS | CPU s / 1k |")
            P("|---|---:|---:|---:|---:|---:|")
            for s in doc["systems"]:
                r = by.get((s["id"], w))
                if not r or r.get("status") != "ok" or s["id"] == ref_id(w):
                    continue
                e1, e2 = r.get("epoch1") or {}, r.get("epoch2") or {}
                P(f"| {s['label']} | {f(ratio(e1.get('samples_per_s'), pq1), 2)} | "
                  f"{f(ratio(e2.get('samples_per_s'), pq2), 2)} | "
                  f"{f(ratio(e1.get('ttfb_s'), get(pq_r, 'epoch1', 'ttfb_s')), 1)} | "
                  f"{f(ratio(r.get('peak_pss_mb'), pq_r.get('peak_pss_mb')), 1)} | "
                  f"{f(ratio(e1.get('cpu_s_per_1k'), get(pq_r, 'epoch1', 'cpu_s_per_1k')), 1)} |")
            P("")
        steps = []
        for r in rows:
            if r["workload"] == w and r.get("stall"):
                steps = [p_["step_ms"] for p_ in r["stall"]]
                break
        if steps:
            st = doc.get("settings", {})
            P("Simulated training loop: one continuous stream of batches (epochs chained, so epoch start-up "
              "counts), 2 warm-up batches, then for each step time in turn up to "
              f"{st.get('stall_max_steps')} steps or {st.get('stall_max_s')} s; each step sleeps the step time "
              "(a GPU step leaves the CPU free); stall = time blocked in `next(loader)` ÷ loop time. "
              "Break-even = epoch-1 seconds ÷ batches: the step time below which the loader starves the trainer.")
            P("")
            P("| system | " + " | ".join(f"stall @ {s_:g} ms" for s_ in steps) + " | break-even step ms |")
            P("|---|" + "---:|" * (len(steps) + 1))
            for s in doc["systems"]:
                r = by.get((s["id"], w))
                if not r or r.get("status") != "ok":
                    continue
                vals = {p_["step_ms"]: p_ for p_ in r.get("stall") or []}
                P(f"| {s['label']} | " + " | ".join(f(get(vals, s_, "stall_fraction"), pct=True) for s_ in steps)
                  + f" | {f(r.get('breakeven_step_ms'), 1)} |")
            P("")
        P("<details><summary>configurations used</summary>")
        P("")
        for s in doc["systems"]:
            r = by.get((s["id"], w))
            if r:
                P(f"- **{s['label']}**: {r.get('description') or s.get('notes')} — config `{json.dumps(r.get('config'))}`")
        P("")
        P("</details>")
        P("")

    # ------------------------------------------------------------------ determinism
    P("## Determinism")
    P("")
    det = doc.get("determinism") or []
    if det:
        P("Shuffled epoch (seed 42 for the loader), order-sensitive SHA-256 over every batch (first 16 hex digits); "
          "the content hash is order-insensitive (sorted `i1` ids), showing both runs saw the same rows.")
        P("")
        P("| system | run | config | samples | order hash | content hash |")
        P("|---|---|---|---:|---|---|")
        for r in det:
            d = r.get("determinism") or {}
            if r.get("status") == "ok":
                P(f"| {r['system']} | {r.get('tag', '').lstrip('-')} | `{json.dumps(r.get('config'))}` | "
                  f"{d.get('samples')} | `{d.get('order_hash')}` | `{d.get('content_hash', '–')}` |")
            else:
                P(f"| {r['system']} | {r.get('tag', '').lstrip('-')} | `{json.dumps(r.get('config'))}` | "
                  f"{status_text(r)} | | |")
        P("")
        for r in det:
            if r.get("flaky_attempts"):
                P(f"- {r['system']}{r.get('tag', '')}: {len(r['flaky_attempts'])} earlier attempt(s) failed and were "
                  f"retried: {'; '.join(r['flaky_attempts'])}")
        for sysid in sorted({r["system"] for r in det}):
            hs = [get(r, "determinism", "order_hash") for r in det if r["system"] == sysid and r.get("status") == "ok"]
            if len(hs) >= 2:
                P(f"- **{sysid}**: {'MATCH' if len(set(hs)) == 1 else 'DIFFER'} ({', '.join(hs)})")
            else:
                P(f"- **{sysid}**: not comparable (a run failed)")
        P("")
    else:
        P("Not run.")
        P("")

    # ------------------------------------------------------------------ ceilings
    P("## Ceilings (measured in the same run)")
    P("")
    if ceil.get("workloads"):
        mem = ceil.get("memory", {})
        P(f"- Decode limit: `pyarrow.parquet.read_table(dir, use_threads=True)` on all {ceil.get('ncpu')} cores "
          f"(pyarrow {ceil.get('pyarrow')}), best of 3 warm reads.")
        P(f"- JPEG: Pillow {ceil.get('pillow')} with its bundled libjpeg-turbo {ceil.get('libjpeg_turbo')}, full "
          f"decode (`Image.draft` not used), one process per core; `decode_resize` adds the Resize(256) + CenterCrop(224) "
          f"every loader does (the image epoch ceiling; "
          f"pqloader's native resize is its own fixed-point code, so it can beat this PIL-based ceiling). simplejpeg {ceil.get('simplejpeg') or '–'} "
          f"(also libjpeg-turbo) for reference.")
        P(f"- Memory bandwidth (cached epochs): `np.copyto` of a {mem.get('array_mib')} MiB float32 array: "
          f"{f(mem.get('copy_gb_per_s_1proc'), 1)} GB/s with 1 process, {f(mem.get('copy_gb_per_s_all'), 1)} GB/s "
          f"with one per core (bytes copied per second).")
        passes = ceil.get("foreign_cpu_frac_passes")
        P("- Measured twice, before and after the measurements; each number is the best of both passes "
          "(and of 3 repeats within a pass)." if passes else "- Measured once, before the measurements.")
        P(f"- Background CPU during the ceiling passes: "
          f"{', '.join(f(x, pct=True) for x in passes) if passes else f(ceil.get('foreign_cpu_frac'), pct=True)} "
          "of the machine.")
        P("")
        P("| workload | read_table samples/s | read_table MB/s | stage (all cores) | stage samples/s | "
          "epoch ceiling samples/s | decoded B/sample | cached ceiling samples/s |")
        P("|---|---:|---:|---|---:|---:|---:|---:|")
        for w in workloads:
            c = cw.get(w)
            if not c:
                continue
            st = c.get("stages") or {}
            stxt = "<br>".join(st) or "–"
            srate = "<br>".join(f(v.get("samples_per_s")) for v in st.values()) or "–"
            P(f"| {w} | {f(get(c, 'read_table', 'samples_per_s'))} | {f(get(c, 'read_table', 'mb_per_s'), 1)} | "
              f"{stxt} | {srate} | {f(c.get('epoch_ceiling_samples_per_s'))} | {f(c.get('decoded_bytes_per_sample'))} | "
              f"{f(c.get('cached_ceiling_samples_per_s'))} |")
        P("")
    else:
        P(f"Not available: {ceil.get('error', 'skipped')}")
        P("")

    # ------------------------------------------------------------------ tuning
    P("## Configuration and tuning")
    P("")
    P("Batch sizes are the same for every system: " + ", ".join(
        f"{w} {get(doc, 'datasets', w, 'batch_size')}" for w in workloads) + ". Images are decoded with the same "
      "function everywhere (Pillow full decode, Resize(256) bilinear, CenterCrop(224) → uint8 HWC; pqloader's "
      "native ops produce identical pixels); tokens are right-padded per batch to int32 [N, L] + lengths, except "
      "Petastorm `make_batch_reader` (cannot return ragged lists) and pqloader-native (`PadOrTruncate`), which "
      "pad to 1024, and the language-model layouts (see *Language-model layouts* under tokens): pqloader-ragged "
      "(values + offsets), pqloader-pad (longest row rounded up to 8), HF datasets + collator (int64, "
      "`pad_sequence`), and the packed rows pqloader-pack and grain-pack (32 blocks of 1024 tokens a batch).")
    P("")
    P("| system | documented fast path used | base config | per-workload overrides | tuning candidates |")
    P("|---|---|---|---|---|")
    for s in doc["systems"]:
        if not any(r["system"] == s["id"] for r in rows):
            continue
        P(f"| {s['label']} | {s.get('notes', '')} | `{json.dumps(s['config'])}` | "
          f"`{json.dumps(s.get('per_workload', {}))}` | "
          f"{'`' + json.dumps(s['tune']) + '`' if s.get('tune') else ('as ' + s['inherit'] if s.get('inherit') else 'fixed')} |")
    P("")
    if doc.get("tuning"):
        P("`--tune` probed each candidate on epoch 1 (capped) and kept the fastest:")
        P("")
        P("| system | workload | candidate | samples/s |")
        P("|---|---|---|---:|")
        for t in doc["tuning"]:
            P(f"| {t['system']} | {t['workload']} | `{json.dumps(t['candidate'])}` | "
              f"{f(t['samples_per_s']) if t['samples_per_s'] else (t.get('status') or '') + ': ' + str(t.get('reason'))} |")
        P("")
    else:
        P("This run used the fixed configurations above (no `--tune`), chosen from trial runs on this 2-core "
          "machine: 2 reader workers/threads, and HF datasets with `num_workers=0` on tabular and tokens, where "
          "shipping ~100 tensors per batch between processes cost more than it saved (tabular: ~17k vs ~160k "
          "rows/s). `bench/run.sh --tune` re-probes the candidates listed above and keeps the fastest.")
        P("")

    # ------------------------------------------------------------------ failures
    bad = [r for r in rows + det if r.get("status") != "ok"]
    P("## Failures and unsupported combinations")
    P("")
    if bad:
        for r in bad:
            P(f"- **{r['system']}{r.get('tag', '')} / {r['workload']}** — {status_text(r)} (log: `{r.get('log')}`)")
    else:
        P("None.")
    P("")

    # ------------------------------------------------------------------ datasets
    P("## Datasets")
    P("")
    P("Generated by `bench/gen_data.py` (seeded; every file from its own seed, so the bytes do not depend on the "
      "number of generator processes), snappy-compressed Parquet written by pyarrow.")
    P("")
    P("| workload | rows | files | row groups | rows / row group | MB on disk | schema |")
    P("|---|---:|---:|---:|---:|---:|---|")
    schema = {
        "tabular": "100 × float32 `f000..f099`, 4 × int64 `i0..i3`, int64 `label`",
        "images": "binary `image` (JPEG q90, ImageNet-like sizes, mostly 500×375, random crops / rescales / flips / "
                  "brightness of real photos from scikit-image and scikit-learn), int64 `label`",
        "ndarray": "binary `array` = `np.save` bytes of float32 64×64 (Petastorm NdarrayCodec layout), int64 `label`",
        "tokens": "`list<int32>` `tokens` (log-normal lengths 8..1024, Zipf ids), int64 `label`",
    }
    for w in workloads:
        m = (doc.get("datasets") or {}).get(w, {})
        P(f"| {w} | {f(m.get('rows'))} | {nfiles(m)} | {m.get('row_groups')} | "
          f"{get(m, 'spec', 'row_group_rows')} | {f((m.get('bytes') or 0) / 1e6, 1)} | {schema[w]} |")
    P("")
    if doc.get("datasets", {}).get("images", {}).get("photos"):
        P("Source photographs: " + ", ".join(doc["datasets"]["images"]["photos"]) + ".")
        P("")

    # ------------------------------------------------------------------ machine
    m = doc.get("machine", {})
    P("## Machine")
    P("")
    P(f"- OS: {m.get('os')}; kernel {get(m, 'uname', 'release')}; {m.get('nproc')} CPUs; disk: `{m.get('disk')}`")
    P(f"- Load average at start / end: `{m.get('loadavg_start')}` / `{m.get('loadavg_end', '?')}` "
      "(other work on the machine shows in the *bg CPU* columns).")
    P("")
    P("```")
    keep = ("Architecture", "Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket", "Socket(s)",
            "CPU max MHz", "L1d", "L2", "L3", "Hypervisor", "Flags")
    for line in (m.get("lscpu") or "").splitlines():
        if line.split(":")[0].strip().startswith(keep) and not line.startswith("Flags"):
            P(line)
    P("```")
    P("")
    P("```")
    P(m.get("free") or "")
    P("```")
    P("")
    P("| venv | python | key packages |")
    P("|---|---|---|")
    for v, pk in (m.get("packages") or {}).items():
        P(f"| {v} | {get(m, 'python', v)} | " + ", ".join(f"{k} {ver}" for k, ver in sorted(pk.items())) + " |")
    P("")
    P("Venvs: `main` = `.venv` (pqloader; Pillow comes from `bench/.venvs/pqloader-extras` on "
      "PYTHONPATH); `peers` = torch / HF datasets / Ray; `petastorm` = Petastorm with pyarrow < 15 and NumPy < 2; "
      "`tools` = generators, ceilings, plots. Exact pins: `bench/requirements-*.txt`.")
    P("")
    P("<details><summary>full lscpu</summary>")
    P("")
    P("```")
    P(m.get("lscpu") or "")
    P("```")
    P("")
    P("</details>")
    P("")

    # ------------------------------------------------------------------ commands
    P("## Exact command lines")
    P("")
    P("```")
    P(f"make bench            # = bash bench/run.sh  (this run: {doc['command']})")
    P(doc.get("driver", ""))
    for k, v in (doc.get("steps") or {}).items():
        P(v.get("command", ""))
    P("```")
    P("")
    P("<details><summary>every measurement</summary>")
    P("")
    P("```")
    for r in rows + det:
        if r.get("command"):
            P(r["command"])
    P("```")
    P("")
    P("</details>")
    P("")
    P("More measurements, each a script of its own: the C++ image pipeline against PIL and the "
      "libjpeg-turbo ceiling, the disk cache against pre-decoded Parquet, and S3 over a throttled "
      "link: `docs/benchmarks_pipeline_storage.md`. Shuffle quality: `docs/determinism.md`.")
    P("")
    # Paths relative to the repository root: the report must not name this checkout.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = "\n".join(L).replace(root + "/", "").replace(root, ".")
    with open(a.out, "w") as fh:
        fh.write(text)


if __name__ == "__main__":
    main()
