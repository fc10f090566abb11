"""The Loader called from several threads during iteration (issue 13): no crash, no hang.

Every call that reaches the engine while another thread waits in next() — stop (by
load_state_dict or a new iteration), stats(), the loader dropped — must leave the process
alive and the data exact. Each scenario runs in a worker thread joined with a deadline,
so a deadlock fails the test instead of hanging the suite.
"""

from __future__ import annotations

import gc
import os
import textwrap
import threading
import time
import weakref

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import run_with_timeout

DEADLINE_S = 60


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    path = tmp_path_factory.mktemp("threads") / "ids.parquet"
    pq.write_table(pa.table({"id": np.arange(4000, dtype=np.int64)}), path, row_group_size=250)
    return str(path)


def slow_identity(batch):
    time.sleep(0.002)  # holds the background thread inside the transform for a while
    return batch


def ids_of(batches):
    return [b["id"].tolist() for b in batches]


def within_deadline(fn):
    """Run fn in a thread; fail if it does not finish in time (a deadlock)."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised below
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(DEADLINE_S)
    assert not t.is_alive(), "deadlock: the scenario did not finish"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def drain_in_a_thread(iterator, taken, errors, pause: float = 0.0) -> threading.Thread:
    """Append the ids of `iterator`'s batches to `taken` in a started thread (sleeping
    `pause` s after each); a RuntimeError (the iterator became stale) goes to `errors`."""

    def drain():
        try:
            for b in iterator:
                taken.append(b["id"].tolist())
                time.sleep(pause)
        except RuntimeError as e:
            errors.append(e)

    t = threading.Thread(target=drain)
    t.start()
    return t


def reference(ds, **kw):
    return ids_of(pqloader.Loader(ds, batch_size=64, shuffle=True, seed=3, **kw))


@pytest.mark.parametrize("transform", [None, slow_identity])
def test_break_then_load_state_dict_many_times(ds, transform):
    expected = reference(ds)

    def scenario():
        loader = pqloader.Loader(ds, batch_size=64, shuffle=True, seed=3, num_workers=2,
                                 batch_transform=transform)
        state = loader.state_dict()
        for rep in range(20):
            got = []
            for b in loader:
                got.append(b["id"].tolist())
                if len(got) == 3 + rep % 5:
                    break
            assert got == expected[:len(got)], rep
            loader.load_state_dict(state)  # back to the start, the loop above left mid-epoch
        assert ids_of(loader) == expected

    within_deadline(scenario)


@pytest.mark.parametrize("transform", [None, slow_identity])
def test_load_state_dict_from_another_thread_stops_the_running_iteration(ds, transform):
    expected = reference(ds)

    def scenario():
        loader = pqloader.Loader(ds, batch_size=64, shuffle=True, seed=3, num_workers=2,
                                 batch_transform=transform, _debug_max_delay_us=2000)
        state = loader.state_dict()
        seen, errors = [], []

        def iterate():
            try:
                for b in loader:
                    seen.append(b["id"].tolist())
            except RuntimeError as e:
                errors.append(e)

        for _ in range(3):
            seen.clear()
            errors.clear()
            t = threading.Thread(target=iterate)
            t.start()
            while len(seen) < 2 and t.is_alive():
                time.sleep(0.001)
            loader.load_state_dict(state)  # while the other thread waits in next()
            t.join(DEADLINE_S)
            assert not t.is_alive()
            # The old iteration either finished first or stopped with the stale error,
            # and every batch it handed out was the right one.
            assert seen == expected[:len(seen)]
            assert len(seen) == len(expected) or (errors and "loaded a state" in str(errors[0]))
        assert ids_of(loader) == expected  # and the loader goes on from the state

    within_deadline(scenario)


def test_stats_from_another_thread_while_iterating(ds):
    def scenario():
        loader = pqloader.Loader(ds, batch_size=64, num_workers=2, num_epochs=3)
        done = threading.Event()
        rows_seen = []

        def poll():
            while not done.is_set():
                rows_seen.append(loader.stats()["rows"])

        t = threading.Thread(target=poll)
        t.start()
        n = sum(len(b["id"]) for b in loader)
        done.set()
        t.join(DEADLINE_S)
        assert n == 3 * 4000
        assert rows_seen == sorted(rows_seen)  # counters only grow
        assert loader.stats()["rows"] == n

    within_deadline(scenario)


def test_a_new_iteration_stops_the_one_running_in_another_thread(ds):
    expected = reference(ds)

    def scenario():
        loader = pqloader.Loader(ds, batch_size=64, shuffle=True, seed=3, num_workers=2,
                                 _debug_max_delay_us=2000)
        errors = []
        first = iter(loader)
        taken = [next(first)["id"].tolist()]
        # A slow consumer: on a loaded machine it used to finish the epoch before the
        # re-iteration below began (no error to see: the test failed now and then).
        t = drain_in_a_thread(first, taken, errors, pause=0.05)
        time.sleep(0.01)
        second = ids_of(loader)  # re-iteration while the first iterator runs
        t.join(DEADLINE_S)
        assert errors and "iterated again" in str(errors[0])
        # Between them, every batch exactly once, in order: the new iteration continues
        # after the last batch the old one handed out.
        assert taken + second == expected

    within_deadline(scenario)


def test_dropping_the_loader_while_another_thread_iterates(ds):
    expected = reference(ds)

    def scenario():
        loader = pqloader.Loader(ds, batch_size=64, shuffle=True, seed=3, num_workers=2,
                                 batch_transform=slow_identity)
        out = []
        it = iter(loader)
        t = threading.Thread(target=lambda: out.extend(b["id"].tolist() for b in it))
        t.start()
        del loader  # the iterator keeps what it needs alive
        t.join(DEADLINE_S)
        assert out == expected

    within_deadline(scenario)


# -- a daemon thread inside a pqloader call when the interpreter exits -----------------
# CPython ends such a thread when it takes the GIL back during finalization, by
# pthread_exit; unwinding the bindings' C++ frames so aborted the process (SIGABRT, every
# run). The thread now parks instead, and the process exits normally (python/src/gil.h).

_DAEMON_SCRIPT = r'''
import sys, threading, time
import pyarrow.compute as pc
import pqloader

path, many, mode = sys.argv[1], sys.argv[2], sys.argv[3]

def slow_keep_all(batch):
    time.sleep(0.01)  # the mask pass's threads inside Python for most of the run
    return pc.greater_equal(batch.column("id"), 0)

def run():
    if mode == "iterate":
        for _ in pqloader.Loader(path, batch_size=64, shuffle=True, seed=1, num_epochs=None,
                                 _debug_max_delay_us=2000):
            pass
    elif mode == "build":
        while True:
            pqloader.Loader(path, batch_size=64, shuffle=True)
    elif mode == "build_packed":  # footers of many files, then every document's length
        while True:
            pqloader.Loader(many, batch_size=8, columns=["tokens"], pack=pqloader.Pack("tokens", 64))
    elif mode == "mixture":
        a = pqloader.Loader(path, batch_size=64, shuffle=True, seed=1, _debug_max_delay_us=2000)
        b = pqloader.Loader(path, batch_size=64, shuffle=True, seed=2, _debug_max_delay_us=2000)
        for _ in pqloader.mix([a, b], [0.5, 0.5], num_epochs=None):
            pass
    elif mode == "inspect":  # footers, then every document's length
        while True:
            pqloader.inspect(many, lengths=True)
    elif mode == "predicate":
        while True:
            pqloader.Loader(path, batch_size=64,
                            filter=pqloader.Predicate(["id"], slow_keep_all))

threading.Thread(target=run, daemon=True).start()
time.sleep(0.6)
print("main returns", flush=True)
'''


@pytest.fixture(scope="module")
def many_files(tmp_path_factory):
    """3000 small files of token lists: building a packing Loader over them takes ~0.5 s."""
    d = tmp_path_factory.mktemp("many")
    rng = np.random.default_rng(0)
    for i in range(3000):
        docs = [rng.integers(1, 1000, size=int(k)).astype(np.int32) for k in rng.integers(1, 40, size=20)]
        pq.write_table(pa.table({"tokens": pa.array(docs, type=pa.list_(pa.int32()))}), d / f"f{i:04d}.parquet")
    return str(d)


# A daemon thread building Loaders exited the process with SIGSEGV in 2 runs of 3 (the
# build went on during the static destructors) until the exit cancelled and awaited it.
@pytest.mark.parametrize("mode", ["iterate", "build", "build_packed", "mixture", "predicate",
                                  "inspect"])
def test_a_daemon_thread_inside_a_call_at_interpreter_exit(ds, many_files, tmp_path, mode):
    import subprocess
    import sys

    script = tmp_path / "daemon.py"
    script.write_text(_DAEMON_SCRIPT)
    for _ in range(4 if mode in ("build_packed", "inspect") else 2):
        r = subprocess.run([sys.executable, str(script), ds, many_files, mode], capture_output=True,
                           text=True, timeout=DEADLINE_S)
        assert "main returns" in r.stdout, r.stderr
        assert r.returncode == 0, f"exit status {r.returncode}: {r.stderr[-2000:]}"
        assert "terminate" not in r.stderr and "leaked" not in r.stderr, r.stderr[-2000:]


# An atexit handler registered before pqloader was imported runs after pqloader's own
# exit handler, and here joins a thread inside pqloader calls: the thread must finish
# (it parked for good before: the process never exited).
_JOIN_AT_EXIT = r'''
import atexit, sys, threading, time
stop = threading.Event()
def worker():
    n = 0
    while not stop.is_set():
        for _ in loader:
            n += 1
            if stop.is_set():
                break
    print("worker done", flush=True)
t = threading.Thread(target=worker, daemon=True)
atexit.register(lambda: (stop.set(), t.join(), print("joined", flush=True)))
import pqloader
loader = pqloader.Loader(sys.argv[1], batch_size=64)
t.start()
time.sleep(0.3)
print("main returns", flush=True)
'''


def test_an_atexit_handler_may_join_a_thread_inside_a_call(ds, tmp_path):
    import subprocess
    import sys

    script = tmp_path / "join.py"
    script.write_text(_JOIN_AT_EXIT)
    r = subprocess.run([sys.executable, str(script), ds], capture_output=True, text=True,
                       timeout=DEADLINE_S)
    assert r.returncode == 0, f"exit status {r.returncode}: {r.stderr[-2000:]}"
    assert "worker done" in r.stdout and "joined" in r.stdout, r.stdout + r.stderr
    assert "terminate" not in r.stderr and "leaked" not in r.stderr, r.stderr[-2000:]


_BETWEEN_CALLS_AT_EXIT = r'''
import atexit, sys, threading
stop, released, first_done, calling = (threading.Event() for _ in range(4))
def worker():
    for _ in loader:
        pass
    first_done.set()
    released.wait()  # between two calls while the exit handlers release the engines
    while True:
        calling.set()
        for _ in loader:  # a call into a released engine
            pass
        if stop.is_set():
            break
    print("worker done", flush=True)
t = threading.Thread(target=worker, daemon=True)
atexit.register(lambda: (calling.wait(), stop.set(), t.join(), print("joined", flush=True)))
atexit.register(released.set)  # runs after pqloader's handlers (last in, first out)
import pqloader
loader = pqloader.Loader(sys.argv[1], batch_size=64)
t.start()
first_done.wait()
print("main returns", flush=True)
'''


def test_a_thread_between_two_calls_when_the_engines_are_released_at_exit_goes_on(ds, tmp_path):
    # The rare failure of the test above, made certain: a daemon thread whose next call
    # came after the exit handler had released the engines got a RuntimeError and died
    # (no "worker done"); a call into a released engine now parks, as one into the
    # engine does, and then finds the epoch empty: the thread sees its stop flag.
    import subprocess
    import sys

    script = tmp_path / "between.py"
    script.write_text(_BETWEEN_CALLS_AT_EXIT)
    r = subprocess.run([sys.executable, str(script), ds], capture_output=True, text=True,
                       timeout=DEADLINE_S)
    assert r.returncode == 0, f"exit status {r.returncode}: {r.stderr[-2000:]}"
    assert "worker done" in r.stdout and "joined" in r.stdout, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "terminate" not in r.stderr, r.stderr[-2000:]


def test_an_old_iterator_inside_the_engine_call_never_takes_the_new_iterations_batch(ds):
    # The race behind a rare failure of the test above: the old iterator passed its
    # "still current?" check and was about to call the engine when another thread's new
    # iteration started its run; the old call then took the new run's next batch and,
    # stale, dropped it (a batch lost). The engine call names its run now. Here the old
    # iterator's call is held at that point until the new iteration has its first batch.
    expected = reference(ds)

    def scenario():
        loader = pqloader.Loader(ds, batch_size=64, shuffle=True, seed=3, num_workers=2)
        engine = loader._engine
        real_next = engine.next
        held, go = threading.Event(), threading.Event()
        this_thread = threading.current_thread()  # the new iteration's; the old one drains

        def next_held_once(run=-1):
            if threading.current_thread() is not this_thread and not held.is_set():
                held.set()
                go.wait(DEADLINE_S)
            return real_next(run)

        engine.next = next_held_once
        first = iter(loader)
        taken = [next(first)["id"].tolist()]
        errors = []
        t = drain_in_a_thread(first, taken, errors)
        assert held.wait(DEADLINE_S)  # the old iterator is about to call the engine
        second_it = iter(loader)
        second = [next(second_it)["id"].tolist()]  # the new run started, and read from
        go.set()  # the old call goes on now, into the engine
        t.join(DEADLINE_S)
        second += [b["id"].tolist() for b in second_it]
        assert errors and "iterated again" in str(errors[0])
        assert taken + second == expected

    within_deadline(scenario)


# -- batch_transform's thread, left by its consumer ---------------------------------------


@pytest.mark.parametrize("leave", ["break", "drop", "close"])
def test_leaving_a_batch_transform_iteration_near_its_end_never_hangs(ds, leave):
    # The transform thread's last puts (the end marker, an error) waited without a
    # timeout on a queue full of batches nobody would take; the consumer leaving joined
    # that thread for good (a `for` loop broken off near the epoch's end, an iterator
    # dropped, or made stale by close()).
    def scenario():
        loader = pqloader.Loader(ds, batch_size=250, batch_transform=lambda b: b, prefetch_batches=2)
        for epoch in range(10):
            loader.set_epoch(epoch)
            it = iter(loader)
            for _ in range(14):  # of 16: the last two queued, the thread at its end marker
                next(it)
            time.sleep(0.1)  # the queue fills behind the consumer
            if leave == "break":
                it.close()
            elif leave == "drop":
                del it
            else:
                loader.close()
                del it
        return True

    assert run_with_timeout(scenario, timeout=DEADLINE_S)


def test_a_batch_transform_iterator_from_before_a_fork_refuses_in_the_child(ds):
    # The transform thread is not in the child: its next() waited for good for a batch.
    import subprocess
    import sys

    script = textwrap.dedent(f"""
        import os, sys, time
        import pqloader
        loader = pqloader.Loader({ds!r}, batch_size=250,
                                 batch_transform=lambda b: (time.sleep(0.5), b)[1])
        it = iter(loader)
        next(it)  # the thread is transforming the next one: nothing queued at the fork
        pid = os.fork()
        if pid == 0:
            try:
                next(it)
                os._exit(3)
            except RuntimeError as e:
                os._exit(0 if "forked" in str(e) else 4)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=DEADLINE_S)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_stale_iterators_first_call_leaves_the_current_one_alone(ds):
    # Its first next() started an engine run, replacing the current iterator's, which
    # then failed ("the run was replaced by a newer one") though it was current.
    loader = pqloader.Loader(ds, batch_size=250)
    first, second = iter(loader), iter(loader)
    assert next(second)["id"][0] == 0
    with pytest.raises(RuntimeError, match="iterated again"):
        next(first)
    assert [b["id"][0] for b in second] == list(range(250, 4000, 250))


def test_an_epoch_without_a_batch_is_one_epoch_of_a_for_loop(ds):
    # It was skipped as if ended: each `for` loop moved two epochs on.
    loader = pqloader.Loader(ds, batch_size=5000, drop_last=True)
    assert len(loader) == 0
    assert list(loader) == [] and loader.epoch == 1
    loader.set_epoch(5)
    assert list(loader) == [] and loader.epoch == 6


def test_a_fork_while_another_thread_holds_the_cursor_lock_does_not_hang_the_child(tmp_path):
    # The child's after-fork step stopped the loader's iterators by taking the cursor's
    # lock, which a parent thread (an iterator mid-step) held at the fork: the child
    # waited for good inside os.fork.
    import os

    from conftest import write_dataset
    write_dataset(tmp_path, [[37, 50, 11]])
    loader = pqloader.Loader(str(tmp_path), columns=["id"], batch_size=8, seed=1)
    held, release = threading.Event(), threading.Event()

    def hold():
        with loader._cursor.lock:  # what an iterator's step holds for a moment
            held.set()
            release.wait()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    held.wait()
    pid = os.fork()
    if pid == 0:
        os._exit(0 if sum(len(b["id"]) for b in loader) == 98 else 1)  # the handlers ran; it reads
    release.set()
    deadline = time.time() + 30
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung in pqloader's after-fork handler (the cursor's lock)")


def test_a_child_forked_after_s3_was_initialised_exits_normally(tmp_path):
    # storage_options (or an s3:// source) initialise the AWS SDK. A child of os.fork()
    # that exited normally (sys.exit, or the end of the script) ran its teardown: the
    # atexit FinalizeS3 and the static destructors join the SDK's event-loop threads and
    # free OpenSSL's state, which the parent's threads had (they do not exist in the
    # child): SIGSEGV in aws_thread_join / the logger, most exits. No server is needed.
    import os
    import subprocess
    import sys

    from conftest import write_dataset
    write_dataset(tmp_path, [[37, 50, 11]])
    script = textwrap.dedent("""
        import os, sys
        import pqloader
        loader = pqloader.Loader(sys.argv[1], columns=["id"], batch_size=8, seed=1,
                                 storage_options={"region": "us-east-1"})
        it = iter(loader)
        next(it)
        statuses = []
        for _ in range(6):
            pid = os.fork()
            if pid == 0:
                if len(statuses) % 2:  # the child reads too, with the same options
                    assert sum(len(b["id"]) for b in pqloader.Loader(
                        sys.argv[1], columns=["id"], batch_size=8, num_epochs=1,
                        storage_options={"region": "us-east-1"})) == 98
                sys.stdout.write("child output ")
                sys.exit(7)  # a normal exit: atexit handlers and static destructors
            statuses.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        print(statuses, sum(1 for _ in it))
    """)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("child output ") == 6  # the children's buffers were flushed
    assert done.stdout.strip().endswith("[7, 7, 7, 7, 7, 7] 12"), done.stdout + done.stderr[-2000:]
    assert "FinalizeS3 was not called" not in done.stderr


def test_loaders_built_in_three_threads_at_once_do_not_deadlock(tmp_path):
    # A build's worker thread was joined with the GIL held; its last step takes gil.cc's
    # mutex, which a thread returning from the engine held while waiting for the GIL:
    # the whole process hung (so this runs in a subprocess).
    import subprocess
    import sys

    from conftest import write_dataset
    write_dataset(tmp_path, [[37, 50, 11]])
    script = textwrap.dedent("""
        import sys, threading
        import pqloader
        def build():
            for _ in range(150):
                pqloader.Loader(sys.argv[1], columns=["id"], batch_size=8, seed=1)
        threads = [threading.Thread(target=build) for _ in range(3)]
        for t in threads: t.start()
        for t in threads: t.join()
        print("ok")
    """)
    try:
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                              timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("three threads building Loaders deadlocked")
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr


@pytest.mark.parametrize("op", ["close", "set_epoch", "load_state_dict"])
def test_an_iteration_started_while_another_thread_stops_the_engine_keeps_its_run(ds, op):
    """close(), set_epoch() and load_state_dict() stop the engine in the same step as the
    iterators: an iteration that another thread starts meanwhile is not stopped (it got a
    raw "the pipeline was stopped" error)."""
    loader = pqloader.Loader(ds, batch_size=100, num_workers=2)
    expected = ids_of(pqloader.Loader(ds, batch_size=100, num_workers=2))
    if op == "close":
        expected = expected[1:]  # the loader goes on from its position
    state = loader.state_dict()
    it = iter(loader)
    next(it)  # a running iteration: set_epoch stops the engine only then
    result = {}
    taken, stopped = threading.Event(), threading.Event()

    def other_thread():
        try:
            batches = []
            for b in loader:
                batches.append(b)
                taken.set()
                stopped.wait(DEADLINE_S)
            result["ids"] = ids_of(batches)
        except BaseException as e:
            result["error"] = e
        taken.set()

    method = "close" if op == "close" else "stop"  # what the op stops the engine with
    real_stop = getattr(loader._engine, method)

    def stop():
        # Between the iterators' invalidation and the engine's stop, another thread
        # starts an iteration (it waits for the stop to finish, or its run is stopped).
        thread = threading.Thread(target=other_thread)
        thread.start()
        taken.wait(1.0)
        real_stop()
        stopped.set()
        stop.thread = thread

    setattr(loader._engine, method, stop)
    if op == "close":
        loader.close()
    elif op == "set_epoch":
        loader.set_epoch(0)
    else:
        loader.load_state_dict(state)
    setattr(loader._engine, method, real_stop)
    stop.thread.join(DEADLINE_S)
    assert "error" not in result, result.get("error")
    assert result["ids"] == expected


@pytest.mark.parametrize("op", ["load_state_dict", "set_epoch"])
def test_a_stale_iterators_first_next_leaves_a_state_loaded_meanwhile_alone(ds, op):
    """An older iterator's first next() read the position, then (after another thread's
    load_state_dict or set_epoch) took the restored end and recorded its own as the
    running iteration's: the next `for` loop ran num_epochs from the position instead
    of the rest of the interrupted iteration, and state_dict() named an end before its
    epoch."""
    first = pqloader.Loader(ds, batch_size=64, num_epochs=3)
    running = iter(first)
    next(running)
    state = first.state_dict()  # epoch 0, batch 1 of an iteration of 3 epochs
    resumed = pqloader.Loader(ds, batch_size=64, num_epochs=1)
    resumed.load_state_dict(state)
    expected = ids_of(resumed)
    assert len(expected) == 3 * 63 - 1

    loader = pqloader.Loader(ds, batch_size=64, num_epochs=1)
    loader.load_state_dict(state)
    older = iter(loader)
    engine = loader._engine
    real = engine.num_batches

    def num_batches(*args):  # the older iterator's first next() is between its steps
        del engine.num_batches
        if op == "load_state_dict":
            other = threading.Thread(target=loader.load_state_dict, args=(state,))
        else:
            other = threading.Thread(target=loader.set_epoch, args=(5,))
        other.start()
        other.join(DEADLINE_S)
        return real(*args)

    engine.num_batches = num_batches
    with pytest.raises(RuntimeError, match="iterated again"):
        next(older)
    if op == "load_state_dict":
        assert loader.state_dict()["iteration_end"] == 3
        assert within_deadline(lambda: ids_of(loader)) == expected
    else:
        s = loader.state_dict()
        assert (s["epoch"], s["batch"], s["iteration_end"]) == (5, 0, None)


def test_leaving_a_batch_transform_iteration_starts_no_next_epoch(ds):
    """The consumer's leave stops the engine (wake); a next() the transform thread entered
    just after that stop returned None, which ended the epoch, and the thread started the
    next epoch's run and waited for its first batch (the leave waited for it too)."""
    loader = pqloader.Loader(ds, batch_size=64, num_epochs=None, batch_transform=lambda b: b)
    engine = loader._engine
    real_next, real_start = engine.next, engine.start_epoch
    started = []

    def next_(run):
        time.sleep(0.3)  # the thread is between its checks and the engine when the stop comes
        return real_next(run)

    def start_epoch(epoch, *args):
        started.append(epoch)
        return real_start(epoch, *args)

    engine.next, engine.start_epoch = next_, start_epoch
    it = iter(loader)
    next(it)
    time.sleep(0.1)  # the thread gave its batch to the queue and now waits in next_
    it.close()
    time.sleep(0.5)
    assert started == [0]
    assert loader.state_dict()["batch"] == 1


def test_leaving_a_batch_transform_loop_does_not_wait_out_the_queue_timeout(ds):
    # The transform thread, blocked putting into a full queue, waited out its 0.1 s
    # timeout before it saw that the consumer had left: every `break` (or iter()
    # restarted mid-epoch) stalled ~90 ms. Exactness of the resumed stream is kept.
    ref = ids_of(pqloader.Loader(ds, batch_size=100, shuffle=True, seed=5))
    loader = pqloader.Loader(ds, batch_size=100, shuffle=True, seed=5,
                             batch_transform=lambda b: b, prefetch_batches=2)
    got, stalls = [], []
    while len(got) < len(ref):
        it = iter(loader)
        got.append(next(it)["id"].tolist())
        time.sleep(0.02)  # the thread fills the queue and blocks in put
        t0 = time.perf_counter()
        del it
        stalls.append(time.perf_counter() - t0)
    assert got == ref
    stalls.sort()
    assert stalls[len(stalls) // 2] < 0.05, stalls



@pytest.mark.parametrize("how", ["close", "iter", "load_state_dict"])
def test_a_suspended_batch_transform_iterator_made_stale_ends_its_thread(ds, how):
    # The transform thread stopped only when its consumer left (the generator closed or
    # collected): after close() (or a newer iterator, a load_state_dict) an old iterator
    # still referenced, not iterated again (`self.it = iter(loader)` in a trainer), kept
    # its thread polling a queue nobody read, holding the batches it had transformed.
    def threads():
        return {t for t in threading.enumerate() if t.name == "pqloader-batch-transform"}

    before = threads()
    loader = pqloader.Loader(ds, batch_size=250, batch_transform=lambda b: b, prefetch_batches=2)
    state = loader.state_dict()
    it = iter(loader)
    next(it)
    time.sleep(0.2)  # the queue fills behind the consumer, the thread waits to put
    [old] = threads() - before
    newer = None
    if how == "close":
        loader.close()
    elif how == "iter":
        newer = iter(loader)
    else:
        loader.load_state_dict(state)
    old.join(5)
    assert not old.is_alive(), f"the stale iterator's thread still runs after {how}"
    with pytest.raises(RuntimeError, match="the older iterator stopped"):
        next(it)
    rest = [b["id"][0] for b in (newer if newer is not None else loader)]
    assert rest == list(range(0 if how == "load_state_dict" else 250, 4000, 250))


_ITERATE_AT_EXIT = r'''
import atexit, sys
def at_exit():
    try:
        print("batches", sum(1 for _ in loader), flush=True)
    except RuntimeError as e:
        print("refused:", e, flush=True)
atexit.register(at_exit)  # before pqloader's handlers: runs after they released the engine
import pqloader
loader = pqloader.Loader(sys.argv[1], batch_size=64)
'''


def test_an_atexit_handler_iterating_a_released_loader_is_refused_not_handed_nothing(ds, tmp_path):
    # The exiting thread is never parked: its iteration of a released engine must raise,
    # not find an empty epoch (its rows silently dropped).
    import subprocess
    import sys

    script = tmp_path / "iterate.py"
    script.write_text(_ITERATE_AT_EXIT)
    r = subprocess.run([sys.executable, str(script), ds], capture_output=True, text=True,
                       timeout=DEADLINE_S)
    assert r.returncode == 0, f"exit status {r.returncode}: {r.stderr[-2000:]}"
    assert "refused: the Python interpreter is shutting down" in r.stdout, r.stdout + r.stderr


def _tasks() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc")
def test_a_dropped_trainer_whose_batch_transform_holds_its_iterator_is_collected(ds):
    # A trainer holds the loader, its iterator (left mid-epoch) and, through its bound
    # method, is the loader's batch_transform: one cycle. The transform's thread held
    # the method (a live thread is a root of the collector), so the cycle was never
    # collected: each trainer dropped left its loader, its engine's threads and its
    # transform thread, putting forever into a queue nobody read (10 trainers: +110 threads).
    class Trainer:
        def __init__(self):
            self.loader = pqloader.Loader(ds, batch_size=64, num_workers=2, batch_transform=self.augment)
            self.it = iter(self.loader)
            next(self.it)

        def augment(self, batch):
            return batch

    def drop_one():
        t = Trainer()
        return weakref.ref(t.loader)

    drop_one()  # (pools the first loader starts, if any, count in the baseline)
    gc.collect()
    tasks = _tasks()
    refs = [within_deadline(drop_one) for _ in range(10)]
    within_deadline(gc.collect)
    assert [r() for r in refs] == [None] * 10, "a dropped trainer's loader was never collected"
    # (A generator the collector finalised on its own transform thread is not joined:
    # that thread ends on its own, seeing `stop`; waited for, bounded. Without the fix
    # they never end.)
    for t in [t for t in threading.enumerate() if t.name == "pqloader-batch-transform"]:
        t.join(timeout=60)
    assert [t.name for t in threading.enumerate() if t.name == "pqloader-batch-transform"] == []
    assert _tasks() < tasks + 10  # (without the fix: +110; a storage thread may linger)
