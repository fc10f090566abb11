#!/usr/bin/env python3
"""Benchmark driver (standard library only; run by the project .venv's python via bench/run.sh).

    bench/run.sh [--scale small|medium|large] [--systems a,b] [--workloads w1,w2] [--tune] [...]

1. generates the datasets once into bench/data/<scale>/ (tools venv; reused when present),
2. measures the ceilings (tools venv),
3. runs every (system, workload) in its own subprocess with that system's venv python
   (bench/measure.py, JSON on stdout), with a timeout; the driver samples the child's process
   tree for peak memory (PSS and RSS, via /proc) and the machine-wide CPU use of other processes,
4. runs the determinism check (pqloader: two runs with different num_workers; Petastorm: two runs),
5. writes bench/results/<scale>/results.json and then docs/benchmarks.md + PNG plots (tools venv).
A measurement that crashes or times out becomes a "failed: reason" row; nothing aborts the run.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
VENVS = os.path.join(BENCH, ".venvs")
WORKLOADS = ("tabular", "images", "ndarray", "tokens")


def py(venv: str) -> str:
    if venv == "main":
        return os.path.join(ROOT, ".venv", "bin", "python")
    return os.path.join(VENVS, venv, "bin", "python")


def env_for(venv: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = BENCH + (os.pathsep + os.path.join(VENVS, "pqloader-extras") if venv == "main" else "")
    env.setdefault("PYTHONWARNINGS", "ignore")
    env["TOKENIZERS_PARALLELISM"] = "false"
    return env


# --------------------------------------------------------------------------- systems
# config: measure.py --config; per_workload: overrides; tune: candidate overrides tried with --tune
SYSTEMS = [
    dict(id="pqloader", label="pqloader", venv="main", module="pqloader_sys",
         config={"num_workers": None},
         tune=[{"num_workers": None}, {"num_workers": 1}, {"num_workers": 2}, {"num_workers": 4}],
         notes="Loader(batch_size, num_workers), raw columns; images decoded by PIL in a consumer thread pool, "
               ".npy by np.load (no pqloader transforms); ragged tokens unsupported without a transform"),
    dict(id="pqloader-native", label="pqloader + C++ transforms", venv="main", module="pqloader_sys",
         workloads=("images", "ndarray", "tokens"), config={"num_workers": None, "native": True},
         tune=[{"num_workers": None}, {"num_workers": 1}, {"num_workers": 2}, {"num_workers": 4}],
         notes="Loader(transforms=...): images [DecodeImage, Resize(256), CenterCrop(224)], ndarray [DecodeNdarray], "
               "tokens [PadOrTruncate(1024)], in pqloader's workers"),
    dict(id="pqloader-native-cache", label="pqloader + C++ transforms + cache", venv="main", module="pqloader_sys",
         workloads=("images", "ndarray", "tokens"), config={"num_workers": None, "native": True, "cache": True},
         inherit="pqloader-native",
         notes="as above with cache_dir (epoch 1 fills pqloader's decoded-sample cache, epoch 2 reads it)"),
    # Language-model outputs of the tokens workload (issue 16): no transform, the list column
    # itself as values + offsets, padded to the batch's longest row, or packed into blocks.
    dict(id="pqloader-ragged", label="pqloader lists='ragged'", venv="main", module="pqloader_sys",
         workloads=("tokens",), config={"num_workers": None, "lists": "ragged"},
         tune=[{"num_workers": None}, {"num_workers": 1}, {"num_workers": 2}, {"num_workers": 4}],
         notes="Loader(lists={'tokens': 'ragged'}): values + tokens_offsets (zero-copy where a batch's rows "
               "are consecutive)"),
    dict(id="pqloader-pad", label="pqloader Pad(multiple_of=8)", venv="main", module="pqloader_sys",
         workloads=("tokens",), config={"num_workers": None, "lists": "pad8"},
         tune=[{"num_workers": None}, {"num_workers": 1}, {"num_workers": 2}, {"num_workers": 4}],
         notes="Loader(lists={'tokens': Pad(multiple_of=8)}): [B, L] + tokens_length, L = the batch's longest "
               "row rounded up to a multiple of 8"),
    dict(id="pqloader-pack", label="pqloader Pack(seq_len=1024)", venv="main", module="pqloader_sys",
         workloads=("tokens",), config={"num_workers": None, "pack": 1024, "pack_blocks": 32},
         tune=[{"num_workers": None}, {"num_workers": 1}, {"num_workers": 2}, {"num_workers": 4}],
         notes="Loader(columns=['tokens'], pack=Pack('tokens', seq_len=1024), batch_size=32 blocks): tokens, "
               "position_ids, document_ids, loss_mask, cu_seqlens; the lengths pass runs in the constructor"),
    dict(id="petastorm-batch", label="Petastorm make_batch_reader", venv="petastorm", module="petastorm_sys",
         config={"reader": "batch", "pool": "thread", "workers_count": 2},
         tune=[{"pool": "thread", "workers_count": 2}, {"pool": "thread", "workers_count": 4},
               {"pool": "process", "workers_count": 2}],
         notes="make_batch_reader + BatchedDataLoader (shuffling_queue_capacity=0)"),
    dict(id="petastorm-batch-cache", label="Petastorm make_batch_reader + local-disk cache", venv="petastorm",
         module="petastorm_sys", config={"reader": "batch", "pool": "thread", "workers_count": 2, "cache": True},
         inherit="petastorm-batch",
         notes="as above with cache_type='local-disk' (epoch 1 fills the cache, epoch 2 reads it)"),
    dict(id="petastorm-row", label="Petastorm make_reader", venv="petastorm", module="petastorm_sys",
         config={"reader": "row", "pool": "thread", "workers_count": 2},
         tune=[{"workers_count": 2}, {"workers_count": 4}],
         notes="make_reader on the Unischema view (hard links + _common_metadata) + petastorm.pytorch.DataLoader"),
    dict(id="torch-nw0", label="torch DataLoader nw=0", venv="peers", module="torch_sys",
         config={"num_workers": 0}, notes="IterableDataset over pyarrow row groups, num_workers=0"),
    dict(id="torch-nw2", label="torch DataLoader nw=2", venv="peers", module="torch_sys",
         config={"num_workers": 2}, notes="IterableDataset over pyarrow row groups, num_workers=2"),
    dict(id="hf-datasets", label="HF datasets", venv="peers", module="hf_sys",
         config={"num_workers": 2, "num_proc": 2},
         per_workload={"tabular": {"num_workers": 0}, "tokens": {"num_workers": 0}},
         tune=[{"num_workers": 0}, {"num_workers": 2}],
         notes="load_dataset('parquet') -> Arrow cache; with_format('arrow') slices via torch DataLoader"),
    dict(id="hf-datasets-collate", label="HF datasets + pad_sequence collator", venv="peers", module="hf_sys",
         workloads=("tokens",), config={"num_workers": 0, "num_proc": 2, "collate": "pad_sequence"},
         tune=[{"num_workers": 0}, {"num_workers": 2}],
         notes="load_dataset('parquet') -> with_format('torch') -> DataLoader(batch_size, shuffle, "
               "collate_fn=pad_sequence + lengths): the usual Hugging Face way (int64 tokens)"),
    dict(id="grain-pad", label="Grain + pad batch_fn", venv="peers", module="grain_sys", workloads=("tokens",),
         config={"output": "pad", "num_workers": 0}, tune=[{"num_workers": 0}, {"num_workers": 2}],
         notes="grain.experimental.ParquetIterDataset -> .batch(batch_fn=pad to the longest row)"),
    dict(id="grain-pack", label="Grain ConcatThenSplit(1024)", venv="peers", module="grain_sys",
         workloads=("tokens",), config={"output": "pack", "num_workers": 2, "pack": 1024, "pack_blocks": 32},
         tune=[{"num_workers": 0}, {"num_workers": 2}],
         notes="grain.experimental.ParquetIterDataset -> ConcatThenSplitIterDataset(length_struct={'tokens': 1024}) "
               "-> .batch(32) -> mp_prefetch"),
    dict(id="ray-data", label="Ray Data", venv="peers", module="ray_sys", config={},
         notes="ray.init(num_cpus=all); read_parquet -> map_batches(decode) -> iter_torch_batches"),
]
SYSTEM_BY_ID = {s["id"]: s for s in SYSTEMS}

SCALE_DEFAULTS = {
    "small": dict(timeout=300, epoch_cap=45, stall_max_s=4, stall_max_steps=200),
    "medium": dict(timeout=1200, epoch_cap=300, stall_max_s=10, stall_max_steps=400),
    "large": dict(timeout=3600, epoch_cap=1200, stall_max_s=20, stall_max_steps=1000),
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- /proc sampling
def _children_map():
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    s = f.read()
            except OSError:
                continue
            rest = s[s.rfind(b")") + 2:].split()
            kids.setdefault(int(rest[1]), []).append(int(d))
    return kids


def tree(root):
    kids, out, stack = _children_map(), [], [root]
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(kids.get(p, ()))
    return out


def tree_mem_kb(root):
    pss = rss = 0
    for pid in tree(root):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1])
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1])
        except OSError:
            pass
    return pss, rss


def cpu_busy_seconds():
    with open("/proc/stat") as f:
        parts = f.readline().split()[1:]
    v = [int(x) for x in parts]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def run_child(cmd, env, timeout, log_path, cwd=ROOT):
    """Run cmd, sampling its process tree; return dict(rc, stdout, wall, peak_pss_mb, peak_rss_mb,
    child_maxrss_mb, child_cpu_s, foreign_cpu_frac, timed_out)."""
    t0 = time.time()
    busy0 = cpu_busy_seconds()
    with open(log_path, "w") as errf:
        errf.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n")
        errf.flush()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, env=env, cwd=cwd, start_new_session=True)
        out_chunks = []
        import threading

        th = threading.Thread(target=lambda: out_chunks.append(p.stdout.read()), daemon=True)
        th.start()
        peak_pss = peak_rss = 0
        timed_out = False
        ru = None
        status = 0
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            pss, rss = tree_mem_kb(p.pid)
            peak_pss, peak_rss = max(peak_pss, pss), max(peak_rss, rss)
            if time.time() - t0 > timeout:
                timed_out = True
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # the child's own session: only what we started
                except ProcessLookupError:
                    pass
                _, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(0.1)
        p.returncode = os.waitstatus_to_exitcode(status)
        # leftovers of the child's session (e.g. Ray daemons) are ours: end them
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        th.join(timeout=10)
    wall = time.time() - t0
    busy = cpu_busy_seconds() - busy0
    child_cpu = (ru.ru_utime + ru.ru_stime) if ru else 0.0
    ncpu = os.cpu_count() or 1
    return dict(rc=p.returncode, stdout=(out_chunks[0] if out_chunks else b"").decode("utf-8", "replace"),
                wall_s=wall, peak_pss_mb=peak_pss / 1024, peak_rss_mb=peak_rss / 1024,
                child_maxrss_mb=(ru.ru_maxrss / 1024) if ru else None, child_cpu_s=child_cpu,
                foreign_cpu_frac=max(0.0, (busy - child_cpu) / (wall * ncpu)) if wall > 0 else None,
                timed_out=timed_out)


def last_stderr_line(path):
    try:
        with open(path, errors="replace") as f:
            lines = [l.strip() for l in f if l.strip() and not l.startswith("$ ")]
    except OSError:
        return ""
    for l in reversed(lines):
        if "Error" in l or "error" in l or "Exception" in l:
            return l[:300]
    return lines[-1][:300] if lines else ""


def parse_result(out):
    res = None
    for line in out.splitlines():
        if line.startswith("@@RESULT "):
            try:
                res = json.loads(line[9:])
            except json.JSONDecodeError:
                pass
    return res


# --------------------------------------------------------------------------- steps
def machine_info():
    def sh(cmd):
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30).stdout.strip()
        except Exception as e:  # noqa: BLE001
            return f"unavailable: {e}"

    info = {
        "lscpu": sh("lscpu"),
        "free": sh("free -h"),
        "uname": platform.uname()._asdict(),
        "os": sh(". /etc/os-release && echo \"$PRETTY_NAME\""),
        "nproc": os.cpu_count(),
        "loadavg_start": open("/proc/loadavg").read().strip(),
        "disk": sh(f"df -h {shlex.quote(BENCH)} | tail -1"),
        "python": {},
        "packages": {},
    }
    key = ("numpy", "pyarrow", "torch", "pillow", "petastorm", "datasets", "ray", "pandas", "pqloader",
           "scikit-image", "scikit-learn", "matplotlib", "simplejpeg")
    for v in ("main", "tools", "peers", "petastorm"):
        exe = py(v)
        if not os.path.exists(exe):
            info["python"][v] = "missing"
            continue
        info["python"][v] = sh(f"{shlex.quote(exe)} -c 'import sys; print(sys.version.split()[0])'")
        frz = sh(f"{shlex.quote(exe)} -m pip list --format=freeze 2>/dev/null")
        pk = {}
        for line in frz.splitlines():
            if "==" in line:
                n, ver = line.split("==", 1)
                if n.lower() in key:
                    pk[n.lower()] = ver
        info["packages"][v] = pk
    ex = os.path.join(VENVS, "pqloader-extras")
    if os.path.isdir(ex):
        info["packages"]["main"]["pillow (pqloader-extras)"] = ",".join(
            d[: -len(".dist-info")].split("-")[1] for d in os.listdir(ex)
            if d.lower().startswith("pillow-") and d.endswith(".dist-info"))
    return info


def step(cmd, env, log_path, timeout):
    r = run_child(cmd, env, timeout, log_path)
    if r["rc"] != 0 or r["timed_out"]:
        raise RuntimeError(f"{' '.join(cmd[:3])} failed (rc={r['rc']}, timed_out={r['timed_out']}): "
                           f"{last_stderr_line(log_path)} (log: {os.path.relpath(log_path, ROOT)})")
    return r


def warm_cache(data, workload):
    d = os.path.join(data, workload)
    for f in sorted(os.listdir(d)):
        with open(os.path.join(d, f), "rb") as fh:
            while fh.read(1 << 22):
                pass


def system_config(sysdef, workload, tuned):
    cfg = dict(sysdef["config"])
    cfg.update(sysdef.get("per_workload", {}).get(workload, {}))
    src = sysdef.get("inherit", sysdef["id"])
    if (src, workload) in tuned:
        cfg.update(tuned[(src, workload)])
    return cfg


def measure(args, sysdef, workload, cfg, logs, mode="perf", tag="", extra_args=()):
    exe = py(sysdef["venv"])
    rid = f"{sysdef['id']}{tag}-{workload}"
    log_path = os.path.join(logs, rid + ".log")
    row = dict(system=sysdef["id"], label=sysdef["label"], workload=workload, mode=mode, config=cfg, tag=tag)
    if not os.path.exists(exe):
        row.update(status="failed", reason=f"interpreter missing: {os.path.relpath(exe, ROOT)}")
        return row
    cmd = [exe, os.path.join(BENCH, "measure.py"), "--system", sysdef["module"], "--workload", workload,
           "--data", args.data, "--mode", mode, "--config", json.dumps(cfg),
           "--epoch-cap-s", str(args.epoch_cap), "--stall-steps", args.stall_steps,
           "--stall-max-s", str(args.stall_max_s), "--stall-max-steps", str(args.stall_max_steps),
           "--seed", str(args.loader_seed), *extra_args]
    warm_cache(args.data, workload)
    r = run_child(cmd, env_for(sysdef["venv"]), args.timeout, log_path)
    res = parse_result(r["stdout"])
    row.update({k: r[k] for k in ("wall_s", "peak_pss_mb", "peak_rss_mb", "child_maxrss_mb", "child_cpu_s",
                                  "foreign_cpu_frac", "rc")})
    row["command"] = " ".join(shlex.quote(c) for c in cmd)
    row["log"] = os.path.relpath(log_path, ROOT)
    if res is not None:
        res.pop("config", None)
        row.update(res)
        row["system"], row["workload"] = sysdef["id"], workload
        if r["timed_out"]:
            row["note"] = "result emitted, then killed at timeout"
    elif r["timed_out"]:
        row.update(status="failed", reason=f"timeout after {args.timeout:.0f} s")
    else:
        row.update(status="failed", reason=f"exit {r['rc']}: {last_stderr_line(log_path)}")
    return row


def fmt_row(row):
    if row.get("status") != "ok":
        return f"{row['status']}: {row.get('reason')}"
    if row.get("mode") == "determinism":
        return f"hash {row['determinism']['order_hash']} ({row['determinism']['samples']} samples)"
    e1, e2 = row.get("epoch1") or {}, row.get("epoch2") or {}
    return (f"{e1.get('samples_per_s') or 0:,.0f}/s ttfb {e1.get('ttfb_s') or 0:.2f}s, epoch2 "
            f"{e2.get('samples_per_s') or 0:,.0f}/s, peak PSS {row.get('peak_pss_mb', 0):.0f} MiB, "
            f"{row['wall_s']:.0f}s wall")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", default="small", choices=sorted(SCALE_DEFAULTS))
    ap.add_argument("--seed", type=int, default=1234, help="dataset seed")
    ap.add_argument("--loader-seed", type=int, default=42, help="shuffle seed of the determinism runs")
    ap.add_argument("--systems", default=",".join(s["id"] for s in SYSTEMS))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--timeout", type=float, help="per measurement, seconds")
    ap.add_argument("--epoch-cap", type=float, help="stop an epoch after this many seconds (reported as partial)")
    ap.add_argument("--stall-steps", default="5,20,50", help="simulated train step times, ms")
    ap.add_argument("--stall-max-s", type=float)
    ap.add_argument("--stall-max-steps", type=int)
    ap.add_argument("--tune", action="store_true", help="probe the candidate configs first and keep the fastest")
    ap.add_argument("--no-ceilings", action="store_true")
    ap.add_argument("--no-determinism", action="store_true")
    ap.add_argument("--determinism-workloads", default="tabular")
    ap.add_argument("--report-only", action="store_true", help="re-render the report from results.json")
    ap.add_argument("--data-dir", help="default bench/data/<scale>")
    ap.add_argument("--results-dir", help="default bench/results/<scale>")
    ap.add_argument("--report", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    args = ap.parse_args()
    for k, v in SCALE_DEFAULTS[args.scale].items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    args.data = os.path.abspath(args.data_dir or os.path.join(BENCH, "data", args.scale))
    results_dir = os.path.abspath(args.results_dir or os.path.join(BENCH, "results", args.scale))
    logs = os.path.join(results_dir, "logs")
    os.makedirs(logs, exist_ok=True)
    results_path = os.path.join(results_dir, "results.json")
    command = "bench/run.sh " + " ".join(shlex.quote(a) for a in sys.argv[1:])

    if not args.report_only:
        t_start = time.time()
        doc = {"command": command, "driver": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
               "started": _dt.datetime.now().isoformat(timespec="seconds"), "scale": args.scale,
               "seed": args.seed, "settings": {k: getattr(args, k) for k in
                                                ("timeout", "epoch_cap", "stall_steps", "stall_max_s",
                                                 "stall_max_steps", "tune")},
               "systems": SYSTEMS, "rows": [], "tuning": [], "determinism": [], "steps": {}}
        doc["machine"] = machine_info()
        workloads = [w for w in args.workloads.split(",") if w]
        systems = [SYSTEM_BY_ID[s] for s in args.systems.split(",") if s]

        # 1. data
        log(f"data -> {os.path.relpath(args.data, ROOT)}")
        cmd = [py("tools"), os.path.join(BENCH, "gen_data.py"), "--out", args.data, "--scale", args.scale,
               "--seed", str(args.seed), "--workloads", ",".join(workloads)]
        r = step(cmd, env_for("tools"), os.path.join(logs, "gen_data.log"), 4 * 3600)
        doc["datasets"] = json.loads(r["stdout"])
        doc["steps"]["gen_data"] = {"command": " ".join(map(shlex.quote, cmd)), "wall_s": r["wall_s"]}
        if any(s["venv"] == "petastorm" for s in systems):
            cmd = [py("petastorm"), os.path.join(BENCH, "petastorm_prep.py"), "--data", args.data]
            for w in workloads:
                cmd += ["--workload", w]
            try:
                step(cmd, env_for("petastorm"), os.path.join(logs, "petastorm_prep.log"), 600)
            except RuntimeError as e:
                log(f"petastorm prep failed: {e}")

        # 2. ceilings
        if not args.no_ceilings:
            log("ceilings")
            cmd = [py("tools"), os.path.join(BENCH, "ceilings.py"), "--data", args.data,
                   "--workloads", ",".join(workloads)]
            ceil_first = os.path.join(results_dir, "ceilings-start.json")
            try:
                r = step(cmd, env_for("tools"), os.path.join(logs, "ceilings.log"), 1800)
                doc["ceilings"] = json.loads(r["stdout"])
                doc["ceilings"]["foreign_cpu_frac"] = r["foreign_cpu_frac"]
                doc["steps"]["ceilings"] = {"command": " ".join(map(shlex.quote, cmd)), "wall_s": r["wall_s"]}
                with open(ceil_first, "w") as f:
                    json.dump(doc["ceilings"], f)
            except (RuntimeError, json.JSONDecodeError) as e:
                doc["ceilings"] = {"error": str(e)}
                log(f"ceilings failed: {e}")

        # 3. tuning (optional)
        tuned = {}
        if args.tune:
            quick = argparse.Namespace(**vars(args))
            quick.epoch_cap, quick.stall_steps = min(args.epoch_cap, 15), ""
            for s in systems:
                for w in workloads:
                    if not s.get("tune") or w not in s.get("workloads", WORKLOADS):
                        continue
                    best = None
                    for cand in s["tune"]:
                        cfg = dict(s["config"])
                        cfg.update(s.get("per_workload", {}).get(w, {}))
                        cfg.update(cand)
                        row = measure(quick, s, w, cfg, logs, tag="-tune" + str(s["tune"].index(cand)),
                                      extra_args=["--quick"])
                        rate = (row.get("epoch1") or {}).get("samples_per_s") if row.get("status") == "ok" else None
                        doc["tuning"].append(dict(system=s["id"], workload=w, candidate=cand, samples_per_s=rate,
                                                  status=row.get("status"), reason=row.get("reason")))
                        log(f"tune {s['id']:22s} {w:8s} {json.dumps(cand)}: {rate and round(rate)}")
                        if rate and (best is None or rate > best[0]):
                            best = (rate, cand)
                    if best:
                        tuned[(s["id"], w)] = best[1]
        doc["tuned"] = [dict(system=k[0], workload=k[1], choice=v) for k, v in tuned.items()]

        # 4. measurements
        for w in workloads:
            for s in systems:
                if w not in s.get("workloads", WORKLOADS):
                    continue
                cfg = system_config(s, w, tuned)
                log(f"run {s['id']:22s} {w:8s} {json.dumps(cfg)}")
                # A cold-page-cache epoch for the tabular workload (the others decode on the CPU
                # whatever the disk does).
                row = measure(args, s, w, cfg, logs, extra_args=["--cold"] if w == "tabular" else ())
                log(f"    -> {fmt_row(row)}")
                doc["rows"].append(row)
                with open(results_path, "w") as f:
                    json.dump(doc, f, indent=1, default=str)

        # 5. determinism
        if not args.no_determinism:
            for w in [x for x in args.determinism_workloads.split(",") if x in workloads]:
                plan = []
                if "pqloader" in args.systems.split(","):
                    s = SYSTEM_BY_ID["pqloader"]
                    plan += [(s, {"num_workers": 1}, "-det-nw1"), (s, {"num_workers": 2}, "-det-nw2")]
                if "petastorm-batch" in args.systems.split(","):
                    s = SYSTEM_BY_ID["petastorm-batch"]
                    c = system_config(s, w, tuned)
                    plan += [(s, c, "-det-run1"), (s, c, "-det-run2")]
                for s, cfg, tag in plan:
                    flakes = []
                    for attempt in range(3):  # Petastorm sometimes ends a shuffled epoch early: retry, record it
                        row = measure(args, s, w, cfg, logs, mode="determinism", tag=tag)
                        if row.get("status") == "ok" or "yielded" not in str(row.get("reason")):
                            break
                        flakes.append(row.get("reason"))
                    row["flaky_attempts"] = flakes
                    log(f"det {s['id']}{tag} {w}: {fmt_row(row)}")
                    doc["determinism"].append(row)
        # 6. ceilings again (best of both passes), so one load spike cannot lower a ceiling
        if not args.no_ceilings and "error" not in doc.get("ceilings", {"error": 1}):
            log("ceilings (second pass)")
            cmd = [py("tools"), os.path.join(BENCH, "ceilings.py"), "--data", args.data,
                   "--workloads", ",".join(workloads), "--previous", ceil_first]
            try:
                r = step(cmd, env_for("tools"), os.path.join(logs, "ceilings-2.log"), 1800)
                fg = [doc["ceilings"].get("foreign_cpu_frac"), r["foreign_cpu_frac"]]
                doc["ceilings"] = json.loads(r["stdout"])
                doc["ceilings"]["foreign_cpu_frac"] = min(x for x in fg if x is not None)
                doc["ceilings"]["foreign_cpu_frac_passes"] = fg
            except (RuntimeError, json.JSONDecodeError) as e:
                log(f"ceilings second pass failed (first pass kept): {e}")
        doc["finished"] = _dt.datetime.now().isoformat(timespec="seconds")
        doc["total_wall_s"] = time.time() - t_start
        doc["machine"]["loadavg_end"] = open("/proc/loadavg").read().strip()
        with open(results_path, "w") as f:
            json.dump(doc, f, indent=1, default=str)
        log(f"results -> {os.path.relpath(results_path, ROOT)} ({doc['total_wall_s'] / 60:.1f} min)")

    # 7. report
    cmd = [py("tools"), os.path.join(BENCH, "report.py"), "--results", results_path, "--out", args.report]
    r = run_child(cmd, env_for("tools"), 600, os.path.join(logs, "report.log"))
    if r["rc"] != 0:
        log(f"report failed: {last_stderr_line(os.path.join(logs, 'report.log'))}")
        return 1
    log(f"report -> {os.path.relpath(args.report, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
