"""DataLoader workers that die with their trainer.

torch's workers watch their parent process, which is the trainer only when they were forked or
spawned from it. Under a forkserver their parent is the fork server, which lives as long as
any process holds its "alive" pipe, and every worker it forked holds that pipe. So a trainer
killed by a fault (SIGKILL, the OOM killer) leaves the fork server and its persistent workers
running forever: each keeps the other alive, and both keep the memory and the job's output
pipes.

A worker therefore watches the trainer itself: ``multiprocessing.parent_process()`` is the
process that created the worker's ``Process`` object (the trainer, whatever the start method),
and its sentinel becomes readable the moment the trainer is gone. A daemon thread waits on it
and also checks the trainer's pid and start time every second (a sentinel can be held open by
another child the trainer forked), then ends the worker.

Not ``prctl(PR_SET_PDEATHSIG)``: it fires when the *thread* that created the worker exits, not
the process (a persistent DataLoader iterated first from a short-lived thread would lose its
workers), and under a forkserver the parent it watches is the fork server anyway.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import sys
import threading

from torch.utils.data import get_worker_info

INTERVAL = 1.0  # seconds between checks of the trainer's pid

_watching: int | None = None  # the pid of the process whose watchdog runs (a fork needs its own)
_lock = threading.Lock()


def worker_init_fn(worker_id: int) -> None:
    """A DataLoader ``worker_init_fn`` that ends the worker within seconds of its trainer's
    death, under ``fork``, ``forkserver`` and ``spawn``, persistent or not.

    torch's workers outlive a trainer killed by a fault (SIGKILL, the OOM killer) when a
    fork server started them, as the guides recommend: the fork server and its persistent
    workers keep each other alive, with their memory and the job's output pipes. Pass this
    function to a DataLoader over a fastshard sampler (``fastshard.ShardedStream`` starts the
    same watch by itself in every worker that iterates it). It starts one daemon thread per
    worker process, which waits on the trainer and ends the worker when the trainer is gone.

    Parameters
    ----------
    worker_id : int
        The worker's id, as the DataLoader passes it (not used).

    Examples
    --------
    >>> from torch.utils.data import DataLoader
    >>> sampler = fastshard.DistributedSampler(range(8), num_replicas=1, rank=0)
    >>> loader = DataLoader(
    ...     range(8), sampler=sampler, batch_size=4, num_workers=2,
    ...     persistent_workers=True, worker_init_fn=fastshard.worker_init_fn,
    ... )
    >>> sum(len(batch) for batch in loader)
    8

    With a ``worker_init_fn`` of your own, call it from there::

        def init(worker_id):
            fastshard.worker_init_fn(worker_id)
            ...  # yours
    """
    watch_trainer()


def watch_trainer() -> None:
    """Start this process's watch of the process that started it (once per process; nothing
    in a process that ``multiprocessing`` did not start, such as the trainer itself)."""
    global _watching
    info = get_worker_info()
    if info is not None and getattr(info, "worker_method", "multiprocessing") != "multiprocessing":
        return  # a worker thread (torch's thread workers) dies with its process anyway
    me = os.getpid()
    with _lock:
        if _watching == me:
            return
        trainer = multiprocessing.parent_process()
        if trainer is None or trainer.pid is None:
            return
        try:
            sentinel = trainer.sentinel
        except ValueError:  # no sentinel to wait on: the pid alone
            sentinel = None
        started = _start_time(trainer.pid)
        thread = threading.Thread(
            target=_watch,
            args=(trainer.pid, started, sentinel),
            name="fastshard-trainer-watchdog",
            daemon=True,
        )
        thread.start()
        _watching = me


def _watch(pid: int, started: int | None, sentinel: int | None) -> None:
    while True:
        if sentinel is None:
            gone = False
            threading.Event().wait(INTERVAL)
        else:
            try:
                gone = bool(multiprocessing.connection.wait([sentinel], timeout=INTERVAL))
            except (OSError, ValueError):  # the descriptor is gone: keep to the pid
                sentinel, gone = None, False
        if gone or not _alive(pid, started):
            try:
                sys.stderr.write(
                    f"fastshard: the trainer (pid {pid}) of DataLoader worker {os.getpid()} "
                    "is gone; the worker exits\n"
                )
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os._exit(1)  # at once: the trainer that would collect anything is gone


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, from /proc), which tells it apart
    from a later process given the same pid; None without /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive(pid: int, started: int | None) -> bool:
    """Whether the trainer runs: its pid exists, is not a zombie, and started when it did."""
    if started is not None:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except FileNotFoundError:
            return False
        except OSError:
            return True  # unreadable: the sentinel still watches
        return fields[0] not in (b"Z", b"X") and int(fields[19]) == started
    if sys.platform == "win32":  # os.kill(pid, 0) would terminate the process there
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
