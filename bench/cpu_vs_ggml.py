#!/usr/bin/env python3
"""flashattn's CPU kernels against ggml's ggml_flash_attn_ext, alternating rounds in one run.

ggml comes from the pinned sdist ggml-python==0.0.45 (it vendors ggml 0.15.3), built from
source for this CPU only (GGML_NATIVE, no GPU backends) into a venv of its own: by default
build-ggml/venv, made by this script when missing (python3 -m venv, then pip install numpy and
the pinned package with --no-binary and CMAKE_ARGS below); --venv PATH uses or makes another.
The script re-executes itself under that venv's python.

Rows (the --cpu and --decode shapes of `flashattn bench`):
  prefill  B 1, H 8, d 128 (--head-dims), seqlen 512/2048/8192 (--seqlens), f16 and f32,
           causal and not; forward only (ggml has no backward)
  decode   B 1 and 8, GQA 32/8, d 128, one query token against a full cache of 8k and 32k
           (--cache-lens), f16 and bf16 caches (contiguous)
Ours: `flashattn bench --cpu` / `--decode --backend cpu` run for one row at a time (the tool's
method: standard normal inputs, warm-up calls, the median of the wall clock around each timed
call). ggml: one graph holding ggml_flash_attn_ext over tensors viewed as BSHD memory (q, k, v
made [d, heads, seq, batch] and permuted to ggml's [d, seq, heads, batch]), computed by
ggml_graph_compute on a persistent ggml threadpool of the same thread count, timed the same
way (warm-up, median of wall-clock calls). Causal prefill passes ggml its f16 mask
(0 / -inf, [n_kv, n_q]); decode passes none (one bottom-right query row sees every key, the
same attention as our causal decode); GQA is ggml's broadcast of the kv heads. ggml's CPU
kernel takes q in f32 only, so its q is f32 in every row (K/V in the row's type); ours has q in
the row's type. Each round times ours then ggml on every row (--rounds N); per row the median
over rounds of each side's median is reported, with GFLOP/s (forward 4 B H Nq Nk d, half when
causal) and, for decode, GB/s of K/V read (2 B len Hkv d size).

Before timing, a guard compares ggml's output with ours (the Python package on numpy arrays,
through build-cpu's libflashattn) on a small odd-sized causal GQA shape, a non-causal one and a
decode shape in f32, f16 and bf16, and exits non-zero when max |diff| exceeds the tolerance: a wrong layout cannot
produce a fast wrong number.

    python3 bench/cpu_vs_ggml.py --tool build-cpu/tools/flashattn --rounds 3 \\
        --json /tmp/ggml.json --md /tmp/ggml.md
    ... --seqlens 2048 --cache-lens 8192 --batches 1      # narrower
"""
import argparse
import ctypes
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

GGML_PYTHON = "ggml-python==0.0.45"
GGML_VENDORED = "0.15.3"  # the ggml that sdist vendors (its CMakeLists.txt)
# CPU build only, tuned for the machine it runs on; the GPU backends stay off
CMAKE_ARGS = ("-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF "
              "-DGGML_BLAS=OFF -DGGML_OPENCL=OFF -DGGML_RPC=OFF")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ensure_venv(path):
    """Re-run this script under the venv at path, making it (pinned ggml-python) when missing."""
    py = os.path.join(path, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(path):
        return
    if not os.path.exists(py):
        print(f"making {path} with {GGML_PYTHON} (ggml built from source, a few minutes)",
              flush=True)
        subprocess.run([sys.executable, "-m", "venv", path], check=True)
    probe = subprocess.run([py, "-c", "import ggml, numpy, ml_dtypes; print(ggml.__version__)"],
                           capture_output=True, text=True)
    if probe.returncode != 0 or probe.stdout.strip() != GGML_PYTHON.split("==")[1]:
        env = dict(os.environ, CMAKE_ARGS=CMAKE_ARGS,
                   CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"))
        # ml_dtypes: numpy's bfloat16, for the guard's bf16 cases through our package
        subprocess.run([py, "-m", "pip", "install", "--no-binary", "ggml-python", "numpy",
                        "ml_dtypes", GGML_PYTHON], check=True, env=env)
    os.execv(py, [py] + sys.argv)


def rows_for(a):
    rows = []
    if "prefill" in a.parts:
        for d in a.head_dims:
            for n in a.seqlens:
                for dt in a.prefill_dtypes:
                    for causal in (False, True):
                        rows.append(dict(op="fwd", dtype=dt, batch=1, heads_q=8, heads_kv=8,
                                         head_dim=d, seqlen_q=n, seqlen_k=n, causal=causal))
    if "decode" in a.parts:
        for b in a.batches:
            for n in a.cache_lens:
                for dt in a.decode_dtypes:
                    rows.append(dict(op="decode", dtype=dt, batch=b, heads_q=32, heads_kv=8,
                                     head_dim=128, seqlen_q=1, seqlen_k=n, causal=True))
    return rows


def flops(r):
    f = 4.0 * r["batch"] * r["heads_q"] * r["seqlen_q"] * r["seqlen_k"] * r["head_dim"]
    return f * (0.5 if r["causal"] and r["op"] == "fwd" else 1.0)


def kv_bytes(r):
    size = {"f32": 4, "f16": 2, "bf16": 2}[r["dtype"]]
    return 2.0 * r["batch"] * r["seqlen_k"] * r["heads_kv"] * r["head_dim"] * size


def run_ours(a, r, peak):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ours.json")
        # the preset (--cpu, --decode) first: the options after it override its defaults
        if r["op"] == "decode":
            cmd = [a.tool, "bench", "--decode", "--backend", "cpu", "--contiguous", "--checks", "off",
                   "--batches", str(r["batch"]), "--cache-lens", str(r["seqlen_k"])]
        else:
            cmd = [a.tool, "bench", "--cpu", "--op", "fwd", "--head-dim", str(r["head_dim"]),
                   "--seqlens", str(r["seqlen_k"]),
                   "--masks", "causal" if r["causal"] else "none"]
            if not peak:
                cmd += ["--no-peak"]
        cmd += ["--threads", str(a.threads), "--warmup", str(a.warmup), "--reps", str(a.reps),
                "--min-time", str(a.min_time), "--dtype", r["dtype"], "--json", path]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(path) as f:
            out = json.load(f)
    got = [x for x in out["rows"] if x.get("median_s", 0) > 0]
    if len(got) != 1:
        sys.exit(f"expected one timed row from {' '.join(cmd)}, got {out['rows']}")
    return got[0], cmd


class Ggml:
    """One ggml_flash_attn_ext graph per row on standard normal inputs in BSHD memory."""

    def __init__(self, threads):
        import ggml
        import numpy as np
        self.g, self.np, self.threads = ggml, np, threads
        ggml.ggml_cpu_init()
        params = ggml.ggml_threadpool_params_default(threads)
        self.pool = ggml.ggml_threadpool_new(ctypes.byref(params))
        if not self.pool:
            sys.exit("ggml_threadpool_new failed")
        self.types = {"f32": ggml.GGML_TYPE_F32, "f16": ggml.GGML_TYPE_F16,
                      "bf16": ggml.GGML_TYPE_BF16}

    def _fill(self, t, x):
        """Write the float array x into tensor t in t's type (bf16 rounded to nearest even)."""
        np, g = self.np, self.g
        n = x.size
        ptr = g.ggml_get_data(t)
        if t.contents.type == g.GGML_TYPE_F32:
            dst = np.ctypeslib.as_array((ctypes.c_float * n).from_address(ptr))
            dst[:] = x.astype(np.float32).ravel()
            return
        dst = np.ctypeslib.as_array((ctypes.c_uint16 * n).from_address(ptr))
        if t.contents.type == g.GGML_TYPE_F16:
            dst[:] = x.astype(np.float16).ravel().view(np.uint16)
        else:
            u = x.astype(np.float32).ravel().view(np.uint32)
            dst[:] = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

    def build(self, r, q, k, v):
        """q (B, Nq, H, d), k/v (B, Nk, Hkv, d) float arrays; returns the output getter."""
        g, np = self.g, self.np
        b, nq, h, d = q.shape
        nk, hkv = k.shape[1], k.shape[2]
        kvt = self.types[r["dtype"]]
        esz = 4 if r["dtype"] == "f32" else 2
        need = (q.size * 4 + (k.size + v.size) * esz + b * nq * h * d * 4
                + (nk * nq * 2 if r["causal"] and nq > 1 else 0)
                + 16 * g.ggml_tensor_overhead() + g.ggml_graph_overhead() + (1 << 20))
        self.close()
        self.ctx = g.ggml_init(g.ggml_init_params(mem_size=need, mem_buffer=None))
        ctx = self.ctx
        tq = g.ggml_new_tensor_4d(ctx, g.GGML_TYPE_F32, d, h, nq, b)
        tk = g.ggml_new_tensor_4d(ctx, kvt, d, hkv, nk, b)
        tv = g.ggml_new_tensor_4d(ctx, kvt, d, hkv, nk, b)
        for t, x in ((tq, q), (tk, k), (tv, v)):
            self._fill(t, x)
        mask = None
        if r["causal"] and nq > 1:
            # ggml's mask is f16 [n_kv, n_q]: 0 where a key is seen, -inf where not
            # (bottom-right alignment, as ours)
            mask = g.ggml_new_tensor_4d(ctx, g.GGML_TYPE_F16, nk, nq, 1, 1)
            i = np.arange(nq)[:, None] + (nk - nq)
            m = np.where(np.arange(nk)[None, :] <= i, 0.0, -np.inf)
            self._fill(mask, m)
        perm = lambda t: g.ggml_permute(ctx, t, 0, 2, 1, 3)  # [d, seq, heads, batch] views
        out = g.ggml_flash_attn_ext(ctx, perm(tq), perm(tk), perm(tv), mask,
                                    1.0 / d ** 0.5, 0.0, 0.0)
        self.gf = g.ggml_new_graph(ctx)
        g.ggml_build_forward_expand(self.gf, out)
        self.plan = g.ggml_graph_plan(self.gf, self.threads, self.pool)
        self.work = (ctypes.c_uint8 * max(1, self.plan.work_size))()
        self.plan.work_data = ctypes.cast(self.work, ctypes.POINTER(ctypes.c_uint8))
        self.out, self.out_shape = out, (b, nq, h, d)  # res [d, heads, seq, batch]: BSHD
        g.ggml_threadpool_resume(self.pool)

    def call(self):
        g = self.g
        st = g.ggml_graph_compute(self.gf, ctypes.byref(self.plan))
        if st != 0:
            sys.exit(f"ggml_graph_compute returned {st}")

    def output(self):
        np = self.np
        n = int(np.prod(self.out_shape))
        a = np.ctypeslib.as_array((ctypes.c_float * n).from_address(self.g.ggml_get_data(
            self.out)))
        return a.reshape(self.out_shape).copy()

    def time(self, warmup, reps, min_time):
        for _ in range(warmup):
            self.call()
        times = []
        start = time.perf_counter()
        while len(times) < reps or time.perf_counter() - start < min_time:
            t0 = time.perf_counter()
            self.call()
            times.append(time.perf_counter() - t0)
        # idle workers while ours runs: no ggml thread spins beside our threads (a no-op in
        # an OpenMP build, whose workers sleep after their spin count)
        self.g.ggml_threadpool_pause(self.pool)
        return statistics.median(times)

    def close(self):
        if getattr(self, "ctx", None):
            self.g.ggml_free(self.ctx)
            self.ctx = None


def normal_inputs(np, r, seed):
    rng = np.random.default_rng(seed)
    b, h, hkv, d = r["batch"], r["heads_q"], r["heads_kv"], r["head_dim"]
    q = rng.standard_normal((b, r["seqlen_q"], h, d), dtype=np.float32)
    k = rng.standard_normal((b, r["seqlen_k"], hkv, d), dtype=np.float32)
    v = rng.standard_normal((b, r["seqlen_k"], hkv, d), dtype=np.float32)
    return q, k, v


def guard(a, gg):
    """ggml against ours (and float64) on small shapes; exits non-zero on disagreement."""
    import numpy as np
    os.environ.setdefault("FLASHATTN_LIBRARY", a.library)
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import flashattn
    cases = [dict(op="fwd", batch=2, heads_q=8, heads_kv=2, head_dim=128, seqlen_q=77,
                  seqlen_k=77, causal=True),
             dict(op="fwd", batch=1, heads_q=4, heads_kv=4, head_dim=128, seqlen_q=45,
                  seqlen_k=45, causal=False),
             dict(op="decode", batch=2, heads_q=32, heads_kv=8, head_dim=128, seqlen_q=1,
                  seqlen_k=1000, causal=True)]
    import ml_dtypes
    tol = {"f32": 1e-3, "f16": 1e-2, "bf16": 3e-2}
    worst = 0.0
    for c in cases:
        for dt, npt in (("f32", np.float32), ("f16", np.float16),
                        ("bf16", ml_dtypes.bfloat16)):
            r = dict(c, dtype=dt)
            q, k, v = normal_inputs(np, r, 7)
            q, k, v = (x.astype(npt).astype(np.float32) for x in (q, k, v))
            gg.build(r, q, k, v)
            gg.call()
            got = gg.output()
            ours, _ = flashattn.attention_forward(q.astype(npt), k.astype(npt), v.astype(npt),
                                                  causal=r["causal"])
            ref = reference(np, q, k, v, r["causal"])
            diff = float(np.max(np.abs(got - ours.astype(np.float32))))
            dref = float(np.max(np.abs(got - ref)))
            worst = max(worst, diff)
            print(f"guard {r['op']:6} {dt:4} B{r['batch']} H{r['heads_q']}/{r['heads_kv']} "
                  f"Nq {r['seqlen_q']} Nk {r['seqlen_k']} {'causal' if r['causal'] else 'none'}"
                  f": max|ggml-ours| {diff:.2e}, max|ggml-fp64| {dref:.2e} (tol {tol[dt]:g})")
            if not np.isfinite(diff) or diff > tol[dt]:
                sys.exit(f"GUARD FAILED: ggml disagrees with ours on {r}: max |diff| {diff:.3e}")
    gg.close()
    return worst


def reference(np, q, k, v, causal):
    """float64 attention, BSHD, kv heads broadcast, bottom-right causal."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    rep = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[3])
    nq, nk = q.shape[1], k.shape[1]
    if causal:
        seen = np.arange(nk)[None, :] <= np.arange(nq)[:, None] + (nk - nq)
        s = np.where(seen, s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", p, v)


def label(r):
    if r["op"] == "decode":
        return (f"decode {r['dtype']:4} B{r['batch']} GQA {r['heads_q']}/{r['heads_kv']} "
                f"d {r['head_dim']} cache {r['seqlen_k']}")
    return (f"fwd {r['dtype']:4} d {r['head_dim']} N {r['seqlen_k']} "
            f"{'causal' if r['causal'] else 'none'}")


def markdown(a, rows, meta):
    out = [f"# CPU: flashattn against ggml's ggml_flash_attn_ext ({meta['date']})", "",
           f"Machine: {meta['cpu']}; {a.threads} threads; {a.rounds} alternating rounds "
           f"(ours then ggml per row); load average {meta['load_start']:.2f} at the start, "
           f"{meta['load_end']:.2f} at the end. ggml: {GGML_PYTHON} (ggml "
           f"{meta['ggml_version']}), built from source with `{CMAKE_ARGS}`; "
           f"its CPU features: {meta['ggml_features']}. Ours: {meta['ours_version']}, "
           f"{meta['ours_features']}.", "",
           f"Command: `{meta['command']}`", "",
           "Method: the tool's (standard normal inputs, warm-up, median of wall-clock calls; "
           "per row the median over rounds). ggml's q is f32 in every row (its CPU kernel "
           "reads q in f32 only), K/V in the row's type; causal prefill through its f16 mask; "
           "decode without a mask (one bottom-right query row sees every key). "
           f"Guard before timing: max |ggml - ours| {meta['guard_max_diff']:.2e} on small "
           "f32/f16/bf16 shapes (GQA, causal, decode).", "",
           "| row | ours ms | GFLOP/s | GB/s | kernel | ggml ms | GFLOP/s | GB/s | ours/ggml |",
           "|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        gb = lambda s: f"{kv_bytes(r) / s * 1e-9:.1f}" if r["op"] == "decode" else "-"
        out.append(f"| {label(r)} | {r['median_s'] * 1e3:.2f} | {r['gflops']:.1f} | "
                   f"{gb(r['median_s'])} | {r.get('kernel', '')} | {r['ggml_median_s'] * 1e3:.2f}"
                   f" | {r['ggml_gflops']:.1f} | {gb(r['ggml_median_s'])} | "
                   f"{r['speedup_vs_ggml']:.2f} |")
    for note in meta["notes"]:
        out += ["", note]
    return "\n".join(out) + "\n"


def parse():
    ints = lambda s: [int(x) for x in s.split(",")]
    strs = lambda s: s.split(",")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tool", default=os.path.join(ROOT, "build-cpu/tools/flashattn"))
    ap.add_argument("--library", default=os.path.join(ROOT, "build-cpu/libflashattn.so"),
                    help="libflashattn for the guard (FLASHATTN_LIBRARY wins when set)")
    ap.add_argument("--venv", default=os.path.join(ROOT, "build-ggml/venv"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--parts", type=strs, default=["prefill", "decode"])
    ap.add_argument("--head-dims", type=ints, default=[128])
    ap.add_argument("--seqlens", type=ints, default=[512, 2048, 8192])
    ap.add_argument("--prefill-dtypes", type=strs, default=["f16", "f32"])
    ap.add_argument("--batches", type=ints, default=[1, 8])
    ap.add_argument("--cache-lens", type=ints, default=[8192, 32768])
    ap.add_argument("--decode-dtypes", type=strs, default=["f16", "bf16"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=0.0)
    ap.add_argument("--json")
    ap.add_argument("--md")
    ap.add_argument("--note", action="append", default=[],
                    help="a paragraph for the table's foot (e.g. the machine's load)")
    return ap.parse_args()


def main():
    a = parse()
    ensure_venv(a.venv)
    import numpy as np
    import ggml
    a.tool = os.path.abspath(a.tool)
    gg = Ggml(a.threads)
    load_start = os.getloadavg()[0]
    worst = guard(a, gg)
    import flashattn
    rows = rows_for(a)
    times = [{"ours": [], "ggml": []} for _ in rows]
    ours_rows = [None] * len(rows)
    cmds = [None] * len(rows)
    for rnd in range(a.rounds):
        for i, r in enumerate(rows):
            o, cmds[i] = run_ours(a, r, peak=(rnd == 0 and i == 0))
            ours_rows[i] = ours_rows[i] or o
            times[i]["ours"].append(o["median_s"])
            q, k, v = normal_inputs(np, r, 1234 + i)
            gg.build(r, q, k, v)
            del q, k, v
            times[i]["ggml"].append(gg.time(a.warmup, a.reps, a.min_time))
            gg.close()
            print(f"round {rnd + 1}/{a.rounds} {label(r)}: ours {times[i]['ours'][-1] * 1e3:.2f}"
                  f" ms, ggml {times[i]['ggml'][-1] * 1e3:.2f} ms", flush=True)
    peak = ours_rows[0].get("peak_gflops") if ours_rows else None
    out_rows = []
    for r, o, t, cmd in zip(rows, ours_rows, times, cmds):
        mo, mg = statistics.median(t["ours"]), statistics.median(t["ggml"])
        row = dict(o, **r, median_s=mo, gflops=flops(r) / mo * 1e-9, ggml_median_s=mg,
                   ggml_gflops=flops(r) / mg * 1e-9, speedup_vs_ggml=mg / mo,
                   rounds_ours_s=t["ours"], rounds_ggml_s=t["ggml"], ours_command=" ".join(cmd))
        if r["op"] == "decode":
            row.update(kv_gbps=kv_bytes(r) / mo * 1e-9, ggml_kv_gbps=kv_bytes(r) / mg * 1e-9)
        out_rows.append(row)
    info = subprocess.run([a.tool, "info"], capture_output=True, text=True).stdout
    feats = [ln.split(":", 1)[1].strip() for ln in info.splitlines()
             if ln.lower().startswith(("cpu features", "isa"))]
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), "unknown CPU")
    gf = [n for n in ("avx", "avx2", "fma", "f16c", "avx512", "avx512_bf16", "amx_int8")
          if getattr(ggml, "ggml_cpu_has_" + n)()]
    notes = [n for n in a.note]
    if peak:
        notes.append(f"Our measured FMA peak: {peak:.1f} GFLOP/s ({a.threads} threads).")
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), cpu=cpu,
                load_start=load_start, load_end=os.getloadavg()[0],
                ggml_version=GGML_VENDORED, ggml_features=", ".join(gf),
                ours_version=flashattn.__version__ if hasattr(flashattn, "__version__") else
                "flashattn", ours_features="; ".join(feats) or "see `flashattn info`",
                command="python3 " + shlex.join(sys.argv), guard_max_diff=worst, notes=notes)
    md = markdown(a, out_rows, meta)
    print("\n" + md)
    worst_ratio = min((x["speedup_vs_ggml"] for x in out_rows), default=0)
    print(f"lowest ours / ggml: {worst_ratio:.2f}x over {len(out_rows)} rows")
    if a.md:
        with open(a.md, "w") as f:
            f.write(md)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(meta, rows=out_rows, ggml_python=GGML_PYTHON, cmake_args=CMAKE_ARGS,
                           threads=a.threads, rounds=a.rounds), f, indent=1)
        print("wrote", a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
