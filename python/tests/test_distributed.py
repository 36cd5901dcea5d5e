"""flashattn.distributed: the shard layouts and the causal schedule (single process), and
context_parallel_attn against the float64 reference on the whole sequence (the correctness
rule, forward and gradients), zigzag and contiguous, causal or not, sequence lengths that 2n
does not divide, GQA: over gloo on the CPU with 1, 2 and 4 ranks (fp32, fp16, bf16), and over
NCCL with one GPU per rank, 1, 2 and 4 ranks as far as the GPUs go (fp16, bf16: the CUDA
backend's dtypes; skipped without CUDA, NCCL, the library's CUDA backend or enough GPUs)."""

import os
import tempfile

import numpy as np
import pytest

import reference as R
from harness import BF16, F16, F32, Case, check_backward, check_forward, randn

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with the gloo backend is not available in this torch build",
                allow_module_level=True)

import flashattn  # noqa: E402
import flashattn.distributed as fd  # noqa: E402
from flashattn.distributed import CAUSAL, FULL, SKIP  # noqa: E402

LAYOUTS = fd.LAYOUTS


# ---- layouts ----

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("seqlen", [0, 1, 3, 8, 37, 64])
def test_split_unsplit_and_positions(seqlen, n, layout):
    x = torch.arange(seqlen * 2).reshape(1, seqlen, 2)
    shards = fd.split(x, n, layout)
    assert len(shards) == n
    assert torch.equal(fd.unsplit(shards, layout), x)
    lengths = fd.shard_lengths(seqlen, n, layout)
    assert [s.shape[1] for s in shards] == lengths and sum(lengths) == seqlen
    assert max(lengths) - min(lengths) <= 1, lengths  # the remainder rule spreads it
    for r in range(n):
        pos = fd.shard_positions(seqlen, n, r, layout)
        assert shards[r][0, :, 0].div(2).tolist() == pos
        assert pos == sorted(pos)  # a shard is a run of increasing positions
        assert torch.equal(fd.shard(x, n, r, layout), shards[r])
    if layout == "zigzag":
        assert torch.equal(fd.zigzag_unsplit(fd.zigzag_split(x, n)), x)


def test_remainder_rule_and_zigzag_chunks():
    # 37 = 8 * 4 + 5 over 2n = 8 chunks: the first 5 chunks get 5 tokens, the last 3 get 4
    assert fd.chunk_sizes(37, 8) == [5, 5, 5, 5, 5, 4, 4, 4]
    assert [fd.rank_chunks(4, r, "zigzag") for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert fd.shard_lengths(37, 4, "zigzag") == [9, 9, 9, 10]
    # 10 over 4 chunks is 3+3+2+2: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    assert fd.shard_positions(10, 2, 0, "zigzag") == [0, 1, 2, 8, 9]
    assert fd.shard_positions(10, 2, 1, "zigzag") == [3, 4, 5, 6, 7]
    assert fd.shard_lengths(37, 4, "contiguous") == [10, 9, 9, 9]
    x = torch.zeros(1, 5, 1)
    assert fd.unsplit([x[:, :3], x[:, :2]], "zigzag").shape[1] == 5  # 2+1+1+1: (3, 2)
    with pytest.raises(ValueError, match="shard lengths"):
        fd.unsplit([x[:, :2], x[:, :3]], "zigzag")
    with pytest.raises(ValueError, match="layout"):
        fd.split(x, 2, "ring")


# ---- the causal schedule ----

def test_pair_kinds():
    assert fd.pair_kind(3, 1, True) == FULL
    assert fd.pair_kind(3, 3, True) == CAUSAL
    assert fd.pair_kind(1, 3, True) == SKIP
    assert fd.pair_kind(1, 3, False) == FULL


def _covered(seqlen, n, rank, layout, causal):
    """(rows, seqlen) counts: how often each (query row of rank, global key) is computed."""
    qpos = fd.shard_positions(seqlen, n, rank, layout)
    seen = np.zeros((len(qpos), seqlen), dtype=int)
    for s in range(n):
        kpos = np.array(fd.shard_positions(seqlen, n, s, layout), dtype=int)
        for b in fd.blocks(seqlen, n, rank, s, causal, layout):
            vis = R.visible_mask(b.q1 - b.q0, b.k1 - b.k0, b.causal, (-1, -1))
            rows, cols = np.nonzero(vis)
            np.add.at(seen, (rows + b.q0, kpos[b.k0:b.k1][cols]), 1)
    return np.array(qpos, dtype=int), seen


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("seqlen", [1, 5, 37, 64])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_schedule_covers_the_mask_once(seqlen, n, layout, causal):
    """Over the ring, each rank computes every (query, key) pair the mask shows, exactly once,
    and none it hides: the union of the blocks is the global mask restricted to its rows."""
    for r in range(n):
        qpos, seen = _covered(seqlen, n, r, layout, causal)
        want = (np.arange(seqlen)[None, :] <= qpos[:, None]) if causal else \
            np.ones((len(qpos), seqlen), dtype=bool)
        assert np.array_equal(seen, want.astype(int)), (r, seen, want)


def test_zigzag_makes_one_balanced_call_per_step():
    seqlen, n = 64, 4
    for r in range(n):
        area = 0
        for s in range(n):
            bl = fd.blocks(seqlen, n, r, s, True, "zigzag")
            assert len(bl) == 1
            b = bl[0]
            if s == r:
                assert b == fd.Block(0, 16, 0, 16, True)
            elif s < r:
                assert (b.q0, b.q1, b.k0, b.k1, b.causal) == (0, 16, 0, 8, False)
            else:
                assert (b.q0, b.q1, b.k0, b.k1, b.causal) == (8, 16, 0, 16, False)
            area += (b.q1 - b.q0) * (b.k1 - b.k0)
        assert area == 16 * 16 + 3 * 128  # the same work on every rank


# ---- context_parallel_attn over gloo (CPU) and NCCL (one GPU per rank) ----

TORCH_DTYPE = {F32: "float32", F16: "float16"}
if BF16 is not None:
    TORCH_DTYPE[BF16] = "bfloat16"
BACKENDS = ("gloo", "nccl")


def _cases():
    """(case, layout, pass seqlen) of one run: seq 37 (2n does not divide it) and 64, GQA 4/2,
    d 16 in fp32, d 64 in fp16, d 32 in bf16; and a sequence shorter than the chunks."""
    out = []
    for dtype, d in ((F32, 16), (F16, 64), (BF16, 32)):
        if dtype is None:
            continue
        for seqlen in (37, 64):
            for causal in (False, True):
                for layout in LAYOUTS:
                    c = Case(b=2, sq=seqlen, sk=seqlen, hq=4, hkv=2, d=d, dtype=dtype,
                             causal=causal)
                    out.append((c, layout, len(out) % 2 == 0))
    # 3 tokens: with 4 ranks one zigzag shard is empty (its sends are of size 0)
    for dtype, d in ((F32, 16), (F16, 32)):
        out.append((Case(b=1, sq=3, sk=3, hq=4, hkv=2, d=d, dtype=dtype, causal=True),
                    "zigzag", False))
    return out


CASES = _cases()


def _on(backend, case):
    """The case runs on this backend: the CUDA backend takes fp16 and bf16 only."""
    return backend == "gloo" or case.dtype != F32


def _special(backend):
    """The broken-schedule and subgroup cases, in a dtype the backend takes."""
    dtype, d = (F32, 16) if backend == "gloo" else (F16, 32)
    return Case(b=1, sq=37, sk=37, hq=4, hkv=2, d=d, dtype=dtype, causal=True)


def _name(case, layout):
    return f"{case} {layout}".replace(" ", "_").replace("/", "-")


def _inputs(case, rng):
    shape_q = (case.b, case.sq, case.hq, case.d)
    shape_k = (case.b, case.sk, case.hkv, case.d)
    return [randn(rng, s, case.dtype) for s in (shape_q, shape_k, shape_k, shape_q)]


def _nccl_missing(n):
    """Why NCCL cannot run n ranks here (None: it can)."""
    if not dist.is_nccl_available():
        return "this torch build has no NCCL"
    if not torch.cuda.is_available():
        return "no CUDA device"
    if torch.cuda.device_count() < n:
        return f"{n} ranks need {n} GPUs, this machine has {torch.cuda.device_count()}"
    if not flashattn.has_cuda():
        return "libflashattn was built without the CUDA backend"
    return None


def _spawn(backend, n, jobs):
    """Runs dist_worker.run on n ranks of backend over jobs [(name, case, layout, broken, give
    seqlen, halves, arrays)]; returns {name: [out, lse, dq, dk, dv]} put back in sequence
    order (halves: a list of two such, one per group of n/2 ranks), and for a GPU run of one
    rank {name + "#single": the same from flash_attn_func there}."""
    import torch.multiprocessing as mp

    import dist_worker
    with tempfile.TemporaryDirectory() as work:
        specs = []
        for name, case, layout, broken, give, halves, arrays in jobs:
            torch.save([torch.from_numpy(a.astype(np.float32)) for a in arrays],
                       os.path.join(work, f"{name}.pt"))
            specs.append((name, case.causal, layout, TORCH_DTYPE[case.dtype], broken, give,
                          halves))
        env = {"OMP_NUM_THREADS": "1"}  # gloo: n ranks share the machine's cores
        if backend == "nccl":
            env = dict(dist_worker.NCCL_ENV)  # inherited by the ranks, set before NCCL starts
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            mp.spawn(dist_worker.run, args=(n, work, specs, backend), nprocs=n)
        finally:
            for k, v in old.items():
                if v is None:
                    del os.environ[k]
                else:
                    os.environ[k] = v
        per_rank = [torch.load(os.path.join(work, f"rank{r}.pt")) for r in range(n)]

    def whole(name, layout, ranks):
        parts = list(zip(*(per_rank[r][name] for r in ranks)))  # per output, the shards
        return [fd.unsplit(list(ts), layout, dim=2 if i == 1 else 1).numpy()
                for i, ts in enumerate(parts)]

    res = {}
    for name, case, layout, broken, give, halves, arrays in jobs:
        h = n // 2
        res[name] = [whole(name, layout, range(0, h)), whole(name, layout, range(h, n))] \
            if halves else whole(name, layout, range(n))
        if name + "#single" in per_rank[0]:
            res[name + "#single"] = [t.numpy() for t in per_rank[0][name + "#single"]]
    return res


# NCCL first: on a GPU machine under a time limit its runs are the ones that matter
RUNS = [(b, n) for b in ("nccl", "gloo") for n in (1, 2, 4)]


def _run_id(p):
    return f"{p[0]}-world{p[1]}"


@pytest.fixture(scope="module", params=RUNS, ids=_run_id)
def run(request):
    """One process group per (backend, world size) for every case of that backend (with 2
    ranks the broken schedule too, with 4 the two subgroups): (backend, world size, inputs by
    name, results by name, the seed)."""
    backend, n = request.param
    if backend == "nccl":
        why = _nccl_missing(n)
        if why:
            pytest.skip(f"NCCL with {n} ranks: {why}")
    seed = int.from_bytes(os.urandom(4), "little") if "FLASHATTN_TEST_SEED" not in os.environ \
        else int(os.environ["FLASHATTN_TEST_SEED"], 0)
    rng = np.random.default_rng([seed, n, BACKENDS.index(backend)])
    jobs = [(_name(c, lay), c, lay, False, give, False, _inputs(c, rng))
            for c, lay, give in CASES if _on(backend, c)]
    special = _special(backend)
    if n == 2:
        jobs.append(("broken", special, "zigzag", True, True, False, _inputs(special, rng)))
    if n == 4:
        jobs.append(("halves", special, "zigzag", False, False, True, _inputs(special, rng)))
    res = _spawn(backend, n, jobs)
    return backend, n, {j[0]: j[-1] for j in jobs}, res, (seed, n)


def _as(dtype, x):
    return x.astype(dtype)  # fp32 values that are exactly representable in dtype


@pytest.mark.parametrize("case,layout,give", CASES,
                         ids=[f"{c}-{lay}" for c, lay, _ in CASES])
def test_context_parallel_matches_reference(run, case, layout, give):
    backend, n, inputs, results, seed = run
    if not _on(backend, case):
        pytest.skip(f"{backend}: the CUDA backend takes fp16 and bf16")
    name = _name(case, layout)
    q, k, v, dout = inputs[name]
    out, lse, dq, dk, dv = results[name]
    check_forward(case, seed, q, k, v, None, None, None, _as(case.dtype, out), lse)
    check_backward(case, seed, q, k, v, dout, None, None, None,
                   *(_as(case.dtype, g) for g in (dq, dk, dv)))
    if n == 1 and backend == "gloo":
        # one rank is one flash_attn_func call on the whole sequence: the same bits
        t = [torch.from_numpy(x.astype(np.float32)).to(getattr(torch, TORCH_DTYPE[case.dtype]))
             for x in (q, k, v, dout)]
        tq, tk, tv = (x.requires_grad_() for x in t[:3])
        o, l, _ = flashattn.flash_attn_func(tq, tk, tv, causal=case.causal,
                                            return_attn_probs=True)
        o.backward(t[3])
        for got, want in ((out, o), (lse, l), (dq, tq.grad), (dk, tk.grad), (dv, tv.grad)):
            assert np.array_equal(got, want.detach().float().numpy())
    if n == 1 and backend == "nccl":
        # the same on the GPU for the forward; the GPU backward sums dQ with atomics (its
        # bits vary from call to call), so the gradients are held to the rule above only
        want = results[name + "#single"]
        assert np.array_equal(out, want[0]) and np.array_equal(lse, want[1])


@pytest.mark.parametrize("run", [("gloo", 2), ("nccl", 2)], ids=_run_id, indirect=True)
def test_a_broken_schedule_fails_the_rule(run):
    """The comparison can fail: the causal ring with its diagonal unmasked is caught."""
    backend, n, inputs, results, seed = run
    q, k, v, _ = inputs["broken"]
    out, lse = results["broken"][:2]
    case = _special(backend)
    with pytest.raises(AssertionError):
        check_forward(case, seed, q, k, v, None, None, None, _as(case.dtype, out), lse)


@pytest.mark.parametrize("run", [("gloo", 4), ("nccl", 4)], ids=_run_id, indirect=True)
def test_subgroups(run):
    """group=: ranks 0-1 and 2-3 run the same case as two groups of 2 at once (the second's
    group ranks are not its global ranks; seqlen=None gathers the lengths within a group)."""
    backend, n, inputs, results, seed = run
    q, k, v, dout = inputs["halves"]
    case = _special(backend)
    for out, lse, dq, dk, dv in results["halves"]:
        check_forward(case, seed, q, k, v, None, None, None, _as(case.dtype, out), lse)
        check_backward(case, seed, q, k, v, dout, None, None, None,
                       *(_as(case.dtype, g) for g in (dq, dk, dv)))
