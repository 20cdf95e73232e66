"""Local groups driven by Python threads: the GIL is released inside the library (ranks run
in parallel and other Python threads make progress meanwhile), abort wakes a waiting rank,
timeouts and disagreeing ranks end in errors, and LocalGroup.run fails fast."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import stria
from conftest import TIMEOUT_S


def shards(n, seq, heads=4, d=64, batch=2, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((batch, seq // n, heads, d)).astype(np.float32) for _ in range(n)]


def test_other_python_threads_run_during_a_collective():
    """While both ranks are inside stria_attention_forward, a pure-Python counting thread keeps
    running: with the GIL held it could not run at all for the whole call."""
    stop = threading.Event()
    stamps = []

    def count():
        i = 0
        while not stop.is_set():
            i += 1
            if i % 256 == 0:
                stamps.append(time.perf_counter())

    def rank_fn(ctx, q):
        t0 = time.perf_counter()
        ctx.attention_forward(q, q, q, causal=False)
        return t0, time.perf_counter()

    counter = threading.Thread(target=count)
    with stria.local_group(2, timeout_s=TIMEOUT_S) as group:
        counter.start()
        try:
            windows = group.run(rank_fn, shards(2, 4096))
        finally:
            stop.set()
            counter.join()
    start = max(t0 for t0, _ in windows)  # both ranks inside the library from here ...
    end = min(t1 for _, t1 in windows)  # ... to here
    assert end - start > 0.05, f"the ranks did not run concurrently ({windows})"
    inside = [t for t in stamps if start <= t <= end]
    longest_stall = float(np.max(np.diff([start, *inside, end])))
    assert longest_stall < 0.5 * (end - start), (
        f"the counting thread stalled {longest_stall:.3f} s of a {end - start:.3f} s call: GIL held?"
    )


def test_abort_wakes_a_rank_waiting_for_its_peer():
    q = shards(2, 64, d=16)[0]
    errors = []

    def lonely_rank0(ctx):
        try:
            ctx.attention_forward(q, q, q)
        except stria.StriaError as e:
            errors.append(e)

    with stria.local_group(2, timeout_s=TIMEOUT_S) as group:
        t = threading.Thread(target=lonely_rank0, args=(group[0],))
        t.start()
        time.sleep(0.3)
        assert t.is_alive(), "rank 0 finished a collective without rank 1"
        started = time.perf_counter()
        group[0].abort()  # from this thread, while rank 0 blocks inside the library
        t.join(timeout=TIMEOUT_S)
        assert not t.is_alive()
    assert time.perf_counter() - started < 10
    assert len(errors) == 1 and isinstance(errors[0], stria.AbortedError), errors
    assert str(errors[0])


def test_a_rank_that_never_comes_times_out():
    q = shards(2, 64, d=16)[0]
    with stria.local_group(2, timeout_s=0.5) as group:
        started = time.perf_counter()
        with pytest.raises(stria.TimeoutError) as info:
            group[0].attention_forward(q, q, q)
        assert time.perf_counter() - started < 30
    assert isinstance(info.value, TimeoutError) and str(info.value)


def test_ranks_that_disagree_all_fail():
    qs = shards(2, 32, d=16)
    seen = []

    def rank_fn(ctx, q):
        try:
            ctx.attention_forward(q, q, q, causal=ctx.rank == 0)
        except stria.StriaError as e:
            seen.append(e)
            raise

    with stria.local_group(2, timeout_s=TIMEOUT_S) as group:
        with pytest.raises(stria.InvalidArgumentError, match="causal"):
            group.run(rank_fn, qs, abort_on_error=False)
    assert len(seen) == 2 and all(isinstance(e, stria.InvalidArgumentError) for e in seen), seen


def test_call_tags_tell_apart_calls_of_the_same_shapes():
    """Calls tagged alike run; calls tagged differently fail on every rank, before any block
    moves, and the group stays usable; a tag names one call only."""
    qs = shards(2, 32, d=16)
    seen = []

    def rank_fn(ctx, q):
        ctx.attention_forward(q, q, q, call_tag=7)  # alike
        try:
            ctx.attention_forward(q, q, q, call_tag=1 + ctx.rank)
        except stria.InvalidArgumentError as e:
            seen.append(str(e))
        out, lse = ctx.attention_forward(q, q, q)  # untagged on both: the 7 and the 1 or 2 are spent
        ctx.attention_backward(q, q, q, out, lse, q, call_tag=2**64 - 1)
        return out

    with stria.local_group(2, timeout_s=TIMEOUT_S) as group:
        group.run(rank_fn, qs)
        with pytest.raises(ValueError, match="call_tag must be"):
            group[0].attention_forward(qs[0], qs[0], qs[0], call_tag=-1)
    assert len(seen) == 2 and all("paired different calls" in m and "0x1" in m and "0x2" in m for m in seen), seen


def test_a_tag_whose_call_never_ran_names_no_later_call():
    """A tagged call that raises before it reaches the library (here its stream argument) leaves
    no tag behind: the rank's next, untagged call pairs with its peer's untagged one."""
    qs = shards(2, 32, d=16)

    def rank_fn(ctx, q):
        if ctx.rank == 0:
            with pytest.raises(TypeError, match="stream"):
                ctx.attention_forward(q, q, q, call_tag=0x1234, stream="not a stream")
        return ctx.attention_forward(q, q, q)[0]

    with stria.local_group(2, timeout_s=TIMEOUT_S) as group:
        outs = group.run(rank_fn, qs)
    assert all(np.isfinite(o).all() for o in outs)


def test_an_interrupt_of_run_aborts_the_group(tmp_path):
    """Ctrl-C while run() waits (a notebook's interrupt, which the session survives): the group is
    aborted, so a rank waiting in a collective for a peer that never comes returns at once
    instead of at its timeout, and KeyboardInterrupt reaches the caller."""
    script = tmp_path / "interrupted.py"
    script.write_text(
        "import stria, threading, time\n"
        "import numpy as np\n"
        "q = np.zeros((1, 16, 2, 8), np.float32)\n"
        "def rank_fn(ctx):\n"
        "    if ctx.rank == 0:\n"
        "        threading.Timer(0.3, lambda: print('waiting', flush=True)).start()\n"
        "        ctx.attention_forward(q, q, q)  # rank 1 never calls\n"
        "group = stria.local_group(2, timeout_s=60)\n"
        "try:\n"
        "    group.run(rank_fn)\n"
        "except KeyboardInterrupt:\n"
        "    start = time.monotonic()\n"
        "    while any(t.name.startswith('stria-rank') for t in threading.enumerate()):\n"
        "        time.sleep(0.01)\n"
        "    print(f'ranks done {time.monotonic() - start:.3f}', flush=True)\n"
        "group.close()\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "waiting"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=90)
    finally:
        proc.kill()
    line = proc.stdout.read().strip()
    assert proc.returncode == 0 and line.startswith("ranks done"), (proc.returncode, line)
    assert float(line.split()[-1]) < 5.0, line


def test_run_reraises_the_first_real_failure_quickly():
    """A rank that fails before the collective makes run() abort the others instead of letting
    them wait for the timeout, and the original error is the one raised."""
    qs = shards(3, 48, d=16)

    def rank_fn(ctx, q):
        if ctx.rank == 2:
            raise KeyError("rank 2 broke before the collective")
        return ctx.attention_forward(q, q, q)

    with stria.local_group(3, timeout_s=TIMEOUT_S) as group:
        started = time.perf_counter()
        with pytest.raises(KeyError, match="rank 2 broke"):
            group.run(rank_fn, qs)
        assert time.perf_counter() - started < 10
        with pytest.raises(stria.AbortedError):
            group[0].attention_forward(qs[0], qs[0], qs[0])


def test_run_checks_per_rank_arguments():
    with stria.local_group(2) as group:
        with pytest.raises(ValueError, match="2 entries"):
            group.run(lambda ctx, x: x, [1, 2, 3])
        assert group.run(lambda ctx, x: (ctx.rank, x), "ab") == [(0, "a"), (1, "b")]


def test_step_times_after_a_call():
    qs = shards(3, 96, d=16)
    with stria.local_group(3, timeout_s=TIMEOUT_S) as group:
        assert group[0].step_times() == []
        group.run(lambda ctx, q: ctx.attention_forward(q, q, q), qs)
        for ctx in group:
            steps = ctx.step_times()
            assert len(steps) == 3
            assert all(s.compute_s >= 0 and s.wait_s >= 0 for s in steps)
