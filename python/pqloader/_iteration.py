"""Iteration: epochs from the engine, the optional batch_transform thread, the hand-out.

An ``iter(loader)`` is a chain of generators over items ``(epoch, index, batch)``:

1. :func:`read_batches` takes batches from the engine, epoch after epoch, possibly
   ahead of the consumer;
2. :func:`threaded_map` (with a ``batch_transform``) applies it in one background
   thread, in order;
3. the output adapter (:func:`make_output`: torch conversion, device staging) may hold
   a few batches;
4. :func:`hand_out` yields them to the consumer and is the only place the
   :class:`Cursor` moves, so ``state_dict()`` always names the batch after the last
   one the training loop received.

Every iterator carries the cursor's generation when it was made; a newer iterator, a
``load_state_dict`` or a fork bumps it, and the older iterator then stops before it
could take a batch that belongs to the newer one.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

from pqloader._errors import InvalidDataError, user_stacklevel
from pqloader._options import MAX_EPOCH, iteration_epochs

if TYPE_CHECKING:
    from pqloader._options import LoaderOptions

# (epoch, index of the batch in its epoch, batch)
Item = tuple[int, int, Any]

STALE = ("this loader was iterated again, moved by set_epoch, loaded a state, closed, or this process was "
         "forked; the older iterator stopped")

# The consumer-side clock (the engine has its own); a module attribute so tests can
# replace it with a clock they control.
clock: Callable[[], float] = time.perf_counter


class Cursor:
    """The consumer's position and the generation of the current iterator.

    ``epoch`` and ``batch`` name the next batch to hand out (``batch`` may equal the
    number of batches per epoch: then the next one is batch 0 of the next epoch).
    ``active_end`` is the epoch before which the running iteration stops (None when no
    iteration is active); ``resume_end`` is one restored by ``load_state_dict`` for the
    next iteration. ``elastic`` (with ``elastic_epoch``) is what an earlier world had
    consumed of that epoch when this one resumed it with another world size or batch
    size (see ``_state``): that epoch is then the rest, and ``batch`` counts its batches.
    ``loaded``: the position was restored by ``load_state_dict`` and no iteration has
    started from it since (``set_epoch`` of its epoch then keeps it).
    """

    def __init__(self) -> None:
        self.epoch = 0
        self.batch = 0
        self.generation = 0
        self.active_end: int | None = None
        self.resume_end: int | None = None
        self.elastic: dict[str, Any] | None = None
        self.elastic_epoch = -1
        self.loaded = False
        self.running = 0  # iterations between their first and last engine call
        # The generation of the iterator handing out batches (between its first next()
        # and its end): a loop in progress when it is the current generation's.
        self.live = -1
        self.before = (0, 0)  # the position before the last advance (see take_back)
        # [batches, rows] handed out by iterations that read ahead of the consumer (a
        # batch_transform's thread, the output's staging), counted as the position moves:
        # stats() gives these, as the engine counts those read ahead too (mid-iteration,
        # and those a stale check dropped before the hand-out knew of them). A new list
        # in a forked child, whose engine counts from 0 (an iterator of the parent adds
        # to the old one).
        self.handed = [0, 0]
        # Makes "still current? then move" one step for an iterator in another thread,
        # so a new iteration never starts from a position the old one then moves past.
        # Reentrant: an abandoned iterator's finally takes it, also when the collector
        # finalises that iterator on a thread that holds it.
        self.lock = threading.RLock()

    def invalidate(self, stop: Callable[[], None] | None = None) -> int:
        """Stop every iterator made so far; return the new generation.

        `stop` (the engine's) runs in the same step: no newer iteration starts its run
        before it, so it stops only runs of iterators that are stale by then.
        """
        with self.lock:
            self.generation += 1
            # The stopped iteration's end is no longer the running one's: a state taken
            # now resumes as the next iteration runs (num_epochs from the position).
            self.active_end = None
            if stop is not None:
                stop()
            return self.generation

    def invalidate_after_fork(self) -> None:
        """invalidate() in a forked child: the lock is made anew, not taken (a thread of
        the parent may have held it at the fork, and would never release it here)."""
        self.lock = threading.RLock()
        self.generation += 1
        self.handed = [0, 0]  # (the child's engine is a new one: its counts start at 0)

    def advance(self, generation: int, epoch: int, batch: int, rows: int | None = None) -> None:
        """Move to (epoch, batch) for the iterator of `generation`, if it is current;
        `rows`: the batch's rows, counted in :attr:`handed` (an iteration reading ahead).

        Raises:
            RuntimeError: The iterator became stale.
        """
        with self.lock:
            if generation != self.generation:
                raise RuntimeError(STALE)
            self.before = self.epoch, self.batch
            self.epoch, self.batch = epoch, batch
            if rows is not None:
                self.handed[0] += 1
                self.handed[1] += rows

    def take_back(self, generation: int, epoch: int, batch: int, rows: int | None = None) -> None:
        """Undo the :meth:`advance` to (epoch, batch) of the iterator of `generation`, if it
        is still current and nothing moved the cursor since (its batch was not handed out)."""
        with self.lock:
            if generation == self.generation and (self.epoch, self.batch) == (epoch, batch):
                self.epoch, self.batch = self.before
                if rows is not None:
                    self.handed[0] -= 1
                    self.handed[1] -= rows

    def seek(self, epoch: int, batch: int, iteration_end: int | None = None,
             elastic: dict[str, Any] | None = None, stop: Callable[[], None] | None = None,
             loaded: bool = False) -> None:
        """Make batch `batch` of `epoch` the next one, stopping running iterators.

        Args:
            epoch: Epoch of the next batch.
            batch: Its index in that epoch.
            iteration_end: The epoch the next iteration stops before; None: run
                ``num_epochs`` from `epoch`.
            elastic: `epoch` is the rest after what this earlier world consumed.
            stop: Run in the same step, as in :meth:`invalidate`.
            loaded: The position is a state's (see ``loaded`` above).
        """
        with self.lock:
            self.generation += 1
            self.loaded = loaded
            self.epoch, self.batch = epoch, batch
            self.resume_end = iteration_end
            self.active_end = None
            self.elastic, self.elastic_epoch = elastic, epoch
            if stop is not None:
                stop()

    def elastic_for(self, epoch: int) -> dict[str, Any] | None:
        """The elastic base of `epoch` (None: an ordinary epoch)."""
        return self.elastic if epoch == self.elastic_epoch else None


class ConsumerClock:
    """Time the consumer spends inside ``next()``, and since the first iteration."""

    def __init__(self) -> None:
        self.first_iteration: float | None = None
        self.next_seconds = 0.0
        # Of next_seconds, the time spent waiting for a batch_transform's thread (which
        # waits for the engine in the background): see stats().
        self.thread_wait_seconds = 0.0

    def start(self) -> None:
        """Note the start of the first iteration (later calls do nothing)."""
        if self.first_iteration is None:
            self.first_iteration = clock()

    def wall_seconds(self) -> float:
        """Seconds since the first iteration started (0 before it)."""
        return 0.0 if self.first_iteration is None else clock() - self.first_iteration

    def stats(self, engine_stats: Mapping[str, Any], threaded: bool = False) -> dict[str, Any]:
        """The engine's counters plus the consumer's wait, wall time and stall fraction.

        `threaded`: the engine is read on a batch_transform's thread, whose waits for it
        overlap the consumer's work: they are the consumer's only where it waited for
        that thread meanwhile (at most the lesser of the two; a slow batch_transform keeps
        the consumer waiting for the thread, not for the engine). Counting the thread's
        waits as the consumer's gave a stall of 87 % where the consumer waited 11 %."""
        s = dict(engine_stats)
        wall = self.wall_seconds()
        if threaded:
            s["engine_wait_seconds"] = min(s["wait_seconds"], self.thread_wait_seconds)
        else:
            s["engine_wait_seconds"] = s["wait_seconds"]
        s["wait_seconds"] = max(self.next_seconds, s["engine_wait_seconds"])
        s["wall_seconds"] = wall
        s["wait_fraction"] = s["wait_seconds"] / wall if wall > 0 else 0.0
        return s


def elastic_consumed(elastic: Mapping[str, Any] | None) -> bool:
    """Whether an elastic rest's old worlds (nested too) had handed out any batch of it."""
    while elastic is not None:
        if any(elastic.get("batches") or ()):
            return True
        elastic = elastic.get("base")
    return False


def position_ended(engine: Any, epoch: int, index: int, elastic: Mapping[str, Any] | None) -> bool:
    """Whether the position (epoch, index) is after its epoch's end, so that the next
    iteration starts the next epoch. An elastic rest of no batch ends its epoch only when
    the old ranks had consumed some of it: one whose old ranks had handed out nothing (an
    epoch of no batch on the old world, taken before its loop) is that epoch still to run,
    as the old world's next iteration would run it (moving on skipped an epoch of the loop)."""
    if index == 0 and not elastic_consumed(elastic):
        return False
    return index >= engine.num_batches(epoch, elastic)


def position_within(engine: Any, epoch: int, index: int, elastic: Mapping[str, Any] | None) -> bool:
    """Whether the position (epoch, index) is inside its epoch: some of it handed out
    (by this world or an earlier one, see :func:`position_ended`), some still to come."""
    return (index > 0 or elastic_consumed(elastic)) and not position_ended(engine, epoch, index, elastic)


def loaded_position_dropped(epoch: int, loaded_epoch: int) -> str:
    """The warning of a ``set_epoch(epoch)`` that drops a loaded position inside
    `loaded_epoch`."""
    return (f"set_epoch({epoch}) drops the position load_state_dict restored in the middle of epoch "
            f"{loaded_epoch}: the rest of epoch {loaded_epoch} is not run (set_epoch({loaded_epoch}) "
            "runs it)")


def read_batches(engine: Any, cursor: Cursor, generation: int, *, num_epochs: int | None,
                 warn_cache: bool, end: list[int],
                 left: threading.Event | None = None,
                 taken: "collections.deque[int] | None" = None) -> Iterator[Item]:
    """Yield (epoch, index, batch) from the cursor on; may run ahead of the consumer.

    Args:
        engine: The loader's ``_process.Engine``.
        cursor: The loader's cursor; read here, moved only by :func:`hand_out`.
        generation: The cursor generation of this iterator.
        num_epochs: Epochs per iteration (None: forever) unless the cursor holds a
            restored end.
        warn_cache: Turn the engine's cache warnings into ``RuntimeWarning``.
        end: Receives ``[epoch, batch]`` of the position after the last batch when the
            iteration completes.
        left: Set (under the cursor's lock) once the consumer left while this runs on
            another thread (a batch_transform's): no epoch starts after it.
        taken: Receives the rows (as the engine counts them) of each batch taken from
            the engine, in order; :func:`hand_out` removes those it hands out.

    Raises:
        RuntimeError: A newer iterator, a ``load_state_dict`` or a fork made this one stale.
    """
    with cursor.lock:
        # A stale iterator's first next() (iter(loader) twice, the older one used later)
        # touches nothing: its run would replace the current iterator's.
        if generation != cursor.generation:
            raise RuntimeError(STALE)
        epoch, index = cursor.epoch, cursor.batch
        elastic = cursor.elastic_for(epoch)
    # After an epoch's end, or an elastic rest with nothing left. (An epoch of no batch at
    # index 0 is still to run: skipping it moved a `for` loop two epochs on.)
    if position_ended(engine, epoch, index, elastic):
        epoch, index = epoch + 1, 0
    with cursor.lock:
        # Still current (a set_epoch or load_state_dict from another thread meanwhile
        # made this iterator stale: it must neither take the restored end nor record its
        # own as the running iteration's).
        if generation != cursor.generation:
            raise RuntimeError(STALE)
        # The epoch this iteration stops before: restored from a state, or num_epochs on.
        if cursor.resume_end is not None:
            stop = cursor.resume_end
        else:
            stop = None if num_epochs is None else epoch + num_epochs
        # Past the last epoch (2**32 - 1): refused before the first batch (a restored end
        # stays for the next try), an endless iteration ends after it.
        endless = stop is None
        stop = iteration_epochs(epoch, stop)
        cursor.resume_end = None
        cursor.loaded = False  # (an iteration started from it)
        cursor.active_end = None if endless else stop
        cursor.running += 1
    completed = False
    try:
        while epoch < stop:
            # The next epoch starts reading while this one ends. With one epoch per
            # iteration (num_epochs=1: one `for` loop per epoch), also after this
            # iteration's last: the loop usually iterates again; if it does not, that
            # read-ahead (at most half of max_inflight_bytes) is dropped unused.
            then_next = epoch + 1 < stop or num_epochs == 1
            if endless and index == 0 and engine.num_batches(epoch, cursor.elastic_for(epoch)) == 0:
                # Endless epochs of no batch would spin here forever.
                raise InvalidDataError(
                    f"epoch {epoch} has no batch (a filter that keeps no row, or fewer rows than "
                    "batch_size with drop_last): with num_epochs=None the iteration would never "
                    "yield; give num_epochs or another filter")
            with cursor.lock:  # still current, and no newer iteration starts meanwhile
                if generation != cursor.generation:
                    raise RuntimeError(STALE)
                if left is not None and left.is_set():
                    # The consumer left and stopped the engine: a next() that ran into the
                    # stop ended the epoch early; no new run (its first batch was waited for).
                    return
                run = engine.start_epoch(epoch, index, then_next, cursor.elastic_for(epoch))
            while True:
                if generation != cursor.generation:  # never take a newer iterator's batch
                    raise RuntimeError(STALE)
                try:
                    rows_before = engine.stats()["rows"] if taken is not None else 0
                    # The run checked in the engine too: a newer iteration that starts
                    # its run between the check above and this call is not read from.
                    batch = engine.next(run)
                except Exception:
                    # A newer iterator or load_state_dict stopped the engine under us.
                    if generation != cursor.generation:
                        raise RuntimeError(STALE) from None
                    raise
                if generation != cursor.generation:
                    raise RuntimeError(STALE)
                if warn_cache:
                    warning = engine.take_warning()
                    if warning:
                        warnings.warn(f"pqloader cache: {warning}", RuntimeWarning, stacklevel=user_stacklevel())
                if batch is None:
                    break
                if taken is not None:
                    # (its rows as the engine counts them: hand_out counts the batch once
                    # it is handed out, see Cursor.handed)
                    taken.append(engine.stats()["rows"] - rows_before)
                yield epoch, index, batch
                index += 1
            epoch, index = epoch + 1, 0
        if epoch > MAX_EPOCH:
            # The last epoch a loader runs ended: stay at its end (batch == its count, a
            # position a state holds and load_state_dict takes), not at epoch 2**32,
            # which the loader's own load_state_dict refused.
            epoch -= 1
            index = engine.num_batches(epoch, cursor.elastic_for(epoch))
        end[:] = [epoch, index]
        completed = True
    finally:
        # An abandoned iteration stops the workers; a completed one keeps the next
        # epoch's read-ahead for the next iteration (start_epoch drops it if unused).
        # One step with the check: a newer iteration another thread starts meanwhile
        # keeps its run.
        with cursor.lock:
            cursor.running -= 1
            if generation == cursor.generation and not completed:
                engine.stop()


def hand_out(cursor: Cursor, generation: int, items: Iterator[Item], end: list[int],
             timer: ConsumerClock, taken: "collections.deque[int] | None" = None) -> Iterator[Any]:
    """Yield the batches of `items`; the cursor moves only here.

    Args:
        cursor: The loader's cursor.
        generation: The cursor generation of this iterator.
        items: The (possibly transformed and converted) output of :func:`read_batches`.
        end: As filled by :func:`read_batches` when the iteration completes.
        timer: Counts the time the consumer spends waiting inside ``next()``.
        taken: As filled by :func:`read_batches`: the batches taken from the engine and
            not handed out yet; each one handed out is counted in ``cursor.handed``.

    Raises:
        RuntimeError: This iterator became stale.
    """
    timer.start()
    with cursor.lock:
        if generation == cursor.generation:
            cursor.live = generation
    try:
        t0 = clock()
        for epoch, index, batch in items:
            timer.next_seconds += clock() - t0
            rows = None
            try:
                if taken:  # (before the move: a call after it, a Ctrl-C there lost the batch)
                    rows = taken.popleft()
                cursor.advance(generation, epoch, index + 1, rows)
            except BaseException:
                # A signal handler's exception (Ctrl-C) raised as the move ended (the lock
                # released): the batch is not handed out, so it stays the next one.
                cursor.take_back(generation, epoch, index + 1, rows)
                if rows is not None:
                    taken.appendleft(rows)  # type: ignore[union-attr]
                raise
            # Nothing between the move and the yield may raise: a Ctrl-C there lost the
            # batch (the position counted it as handed out).
            yield batch
            t0 = clock()
        timer.next_seconds += clock() - t0
        if end:
            with cursor.lock:
                if generation == cursor.generation:
                    cursor.epoch, cursor.batch = end
    finally:
        items.close()  # type: ignore[attr-defined]
        with cursor.lock:
            if generation == cursor.generation:
                # Complete, or left (break, closed, collected): the next iteration runs
                # num_epochs from the position, so a state taken now records no end.
                cursor.active_end = None
                cursor.live = -1


_END = object()


class _Held:
    """The callable of a :func:`threaded_map`, for its thread to reach weakly."""

    __slots__ = ("fn", "__weakref__")

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn


def threaded_map(fn: Callable[[Any], Any], items: Iterable[Item], depth: int,
                 wake: Callable[[], None] | None = None,
                 timer: ConsumerClock | None = None,
                 stale: Callable[[], bool] | None = None) -> Iterator[Item]:
    """Apply `fn` to the batch of each item in one background thread, keeping order.

    Errors raised by `fn` or by `items` re-raise in the consumer. The engine releases
    the GIL while it works, so this thread overlaps with the consumer whenever `fn`
    spends time in code that releases the GIL too (NumPy, torch); pure-Python work in
    `fn` competes with the training loop for the GIL.

    Args:
        fn: The batch transform (dict -> dict).
        items: (epoch, index, batch) items.
        depth: Transformed items held ahead of the consumer (at least 1).
        wake: Called when the consumer leaves while the thread still runs: it must end
            the thread's wait for its next item (the engine's stop), or leaving (Ctrl-C,
            break) would wait for that item, up to a storage retry budget.
        timer: Its ``thread_wait_seconds`` counts the consumer's waits for the thread.
        stale: Whether the iterator became stale (``close()``, a newer iterator, a
            ``load_state_dict``): the thread then puts nothing more and ends, though the
            consumer's generator is still referenced (its next ``next()`` raises).
    """
    # C queues (each get and put one C call), not queue.Queue: its Condition is Python
    # code, and a Ctrl-C handled just after its __enter__ took the queue's mutex (before
    # the `with` block began) left that mutex held for good: leaving then blocked on it in
    # the finally below (the process hung in next()), and so did the thread's next put.
    # `out` holds the thread's items; `room` one token per free slot (`depth` of them),
    # which bounds how far the thread runs ahead.
    out: queue.SimpleQueue = queue.SimpleQueue()
    room: queue.SimpleQueue = queue.SimpleQueue()
    for _ in range(max(1, depth)):
        room.put(None)
    stop = threading.Event()
    # The thread reaches `fn` only through a weak reference to `held`, which this
    # generator holds: a running thread is a root of the garbage collector, and holding
    # `fn` there kept alive whatever `fn` reaches. A bound method of an object that also
    # holds this iterator (``self.it = iter(self.loader)`` in a trainer whose
    # ``batch_transform=self.augment``), dropped mid-epoch, was never collected: its
    # thread put forever into a queue nobody read, with the engine's threads and memory.
    held = _Held(fn)
    fn_ref = weakref.ref(held)

    def put(item: tuple[bool, Any]) -> bool:
        # Every put gives up once the consumer left (stop): the queue may be full of
        # batches nobody takes (a loop broken off near the epoch's end, an iterator
        # dropped or made stale), and the consumer's join would wait for good.
        while not stop.is_set():
            if stale is not None and stale():
                # Whatever it puts would be refused (hand_out's advance): a suspended
                # iterator of a closed loader kept this thread polling, with its batches,
                # until it was dropped.
                return False
            try:
                room.get(timeout=0.1)
            except queue.Empty:
                continue
            if stop.is_set():
                break
            out.put(item)
            return True
        return False

    def run() -> None:
        try:
            for epoch, index, batch in items:
                now = fn_ref()
                if now is None:  # the consumer's generator was collected
                    return
                value = now.fn(batch)
                now = None  # (not held while waiting to put: see `held`)
                if not put((True, (epoch, index, value))):
                    return
            put((True, _END))
        except BaseException as e:  # surfaces at the consumer
            put((False, e))

    thread = threading.Thread(target=run, name="pqloader-batch-transform", daemon=True)
    try:
        # Started inside the try: a Ctrl-C raised in start() (its wait for the thread to
        # run) left the thread running without the finally below, taking batches from
        # the engine that the next iteration then lacked, and putting forever.
        thread.start()
        t0 = clock()
        while True:
            try:
                ok, value = out.get(timeout=0.1)
            except queue.Empty:
                # The thread is gone without a last item: this process was forked after
                # the iterator started (a thread does not survive a fork).
                if not thread.is_alive() and out.empty():
                    raise RuntimeError(STALE) from None
                continue
            finally:
                if timer is not None:
                    now = clock()
                    timer.thread_wait_seconds += now - t0
                    t0 = now
            room.put(None)  # (its slot is free again)
            if not ok:
                raise value
            if value is _END:
                return
            yield value
            t0 = clock()  # (the consumer asks for the next one)
    finally:
        stop.set()
        # (not on the thread itself: the collector may finalise this generator there,
        # once `held` is garbage; it sees `stop` and ends on its own)
        if thread.is_alive() and thread is not threading.current_thread():
            if wake is not None:
                wake()
            # A put waiting for room waits out its timeout (0.1 s) before it sees `stop`:
            # give it room so it returns now (every later put sees `stop` first), or each
            # loop left early (break, a restarted iter()) stalled ~0.1 s.
            room.put(None)
            thread.join()


def make_output(options: LoaderOptions) -> Any:
    """Return None for NumPy output, else a ``_torch.TorchOutput`` (importing torch)."""
    if options.output == "numpy":
        return None
    try:
        from pqloader import _torch
    except ImportError as e:
        if e.name is not None and e.name.split(".")[0] == "torch":
            raise ImportError("output='torch' needs PyTorch, which is not installed: "
                              "pip install torch (or pip install 'pqloader[torch]')", name="torch") from e
        raise
    return _torch.TorchOutput(options.pin_memory, options.device, options.device_prefetch)
