"""`report` split over processes: the ranks of a launched run (`torchrun`, `accelerate launch`:
torch.distributed, gloo on CPUs, NCCL on GPUs), or one `--shard I/N` with no communication.

Each rank runs its share of the corpus's batches (`pipelines.shards`), keeps its partial (for
--resume), and sends it to rank 0, which merges the partials exactly and writes the report;
the other ranks write and print nothing. The launcher's own rendezvous (its environment:
RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) joins the ranks; attnviz launches nothing.

Rank 0 receives each rank's partial from that rank alone (point to point), so a rank whose
process dies is named: its connections close, and the receive fails at once. Waits for a
slower rank are not limited in time (a share may take hours); the launcher stops a run whose
rank has died (torchrun stops the others with SIGTERM), and rank 0 then says which ranks had
not finished.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnviz.errors import AttnvizError, InputError, RankFailed

if TYPE_CHECKING:
    from attnviz.analysis.importance import ImportanceSums
    from attnviz.core.inputs import Sentences
    from attnviz.core.models import Model
    from attnviz.core.treebank import Treebank
    from attnviz.outputs.figures import Style

PARTIALS = ".partials"  # the ranks' partials in the report folder, unless --partial says
WAIT = 0.2  # seconds between looks at the other ranks' progress while waiting for them
ERROR = b"attnviz error\n"  # what a rank sends rank 0 instead of its sums when it fails
JOIN = timedelta(minutes=30)  # for every rank to join (torch's default)
TIMEOUT = timedelta(days=7)  # a transfer's limit: no limit on how long a share takes


def launched() -> tuple[int, int] | None:
    """(rank, world size) where a launcher started this process as one of several ranks
    (torchrun and accelerate set RANK and WORLD_SIZE); None otherwise."""
    rank, size = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or size is None or int(size) < 2:
        return None
    return int(rank), int(size)


def _waiting(call: Callable[[], Any], on_wait: Callable[[], None] | None) -> Any:
    """`call()` (a blocking send or receive) in a thread of its own, while this thread looks
    at progress every WAIT seconds and stays free to take a signal; its error, if any."""
    found: dict[str, Any] = {}

    def run() -> None:
        try:
            found["value"] = call()
        except Exception as error:  # noqa: BLE001 - re-raised below, in this thread
            found["error"] = error

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(WAIT)
        if on_wait is not None:
            on_wait()
    if "error" in found:
        raise found["error"]
    return found.get("value")


class World:
    """This process's place in a launched run: its rank, the run's size, a store that all
    ranks share (progress, who finished) and point-to-point transfers of bytes."""

    def __init__(self, rank: int, size: int, store: Any, device: str) -> None:
        self.rank, self.size, self.store, self.device = rank, size, store, device
        self.pending = set(range(1, size)) if rank == 0 else set()  # sums not yet on rank 0

    @classmethod
    def join(cls, device: str) -> World:
        """Join the launcher's rendezvous: gloo for a CPU `device`, NCCL for CUDA."""
        import torch.distributed as dist

        rank, size = launched() or (0, 1)
        store, _, _ = next(dist.rendezvous("env://", rank, size, timeout=JOIN))
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")  # a restart's own keys
        backend = "gloo"
        if device.startswith("cuda"):
            import torch

            torch.cuda.set_device(device)  # NCCL's transfers go through this rank's GPU
            backend = "nccl"
        dist.init_process_group(backend, store=dist.PrefixStore(f"attnviz/{restart}/pg", store),
                                rank=rank, world_size=size, timeout=TIMEOUT)  # fmt: skip
        return cls(rank, size, dist.PrefixStore(f"attnviz/{restart}", store), device)

    def count(self, key: str, add: int = 0) -> int:
        """Add to a count in the launcher's store, and read it."""
        try:
            return self.store.add(key, add)
        except RuntimeError:  # its host is gone: the launcher, or rank 0 where none holds it
            raise RankFailed("the launcher's store stopped answering (rank 0 or the launcher "
                             "stopped)", rank=0) from None  # fmt: skip

    def tell(self, done: int) -> None:
        """Add `done` texts to this rank's progress."""
        self.count(f"progress/{self.rank}", done)

    def counts(self, what: str = "progress") -> list[int]:
        """Every rank's count of `what`: texts done so far (progress), texts (total)."""
        return [self.count(f"{what}/{rank}") for rank in range(self.size)]

    def finished(self) -> None:
        self.count(f"done/{self.rank}", 1)

    def unfinished(self) -> list[int]:
        return [rank for rank, done in enumerate(self.counts("done")) if not done]

    def _send(self, payload: bytes, to: int, on_wait: Callable[[], None] | None) -> None:
        import torch
        import torch.distributed as dist

        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(self.device)
        size = torch.tensor([len(payload)], dtype=torch.int64, device=self.device)
        _waiting(lambda: (dist.send(size, to), dist.send(data, to)), on_wait)

    def _receive(self, source: int, on_wait: Callable[[], None] | None) -> bytes:
        import torch
        import torch.distributed as dist

        def receive() -> bytes:
            size = torch.zeros(1, dtype=torch.int64, device=self.device)
            dist.recv(size, source)
            data = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
            dist.recv(data, source)
            return data.cpu().numpy().tobytes()

        return _waiting(receive, on_wait)

    def gather(self, payload: bytes, what: str, on_wait: Callable[[], None] | None = None):
        """Every rank's `payload` on rank 0, in rank order (None on the others); a rank that
        stops first is named (`what`: what it was to send)."""
        if self.rank != 0:
            try:
                self._send(payload, 0, on_wait)
            except RuntimeError:
                raise RankFailed(f"rank 0 of {self.size} stopped before it took {what}",
                                 rank=0) from None  # fmt: skip
            return None
        found = [payload]
        self.pending = set(range(1, self.size))
        for rank in range(1, self.size):
            try:
                raw = self._receive(rank, on_wait)
            except RuntimeError:
                raise RankFailed(f"rank {rank} of {self.size} stopped before it sent {what} "
                                 "(its process ended or lost its connection)",
                                 rank=rank) from None  # fmt: skip
            if raw.startswith(ERROR):  # the rank said why it stopped
                message = raw[len(ERROR) :].decode("utf-8")
                raise RankFailed(f"rank {rank} of {self.size} stopped: {message}", rank=rank)
            found.append(raw)
            self.pending.discard(rank)
        return found

    def spread(self, payload: bytes | None, what: str) -> bytes:
        """Rank 0's `payload` on every rank."""
        if self.rank == 0:
            for rank in range(1, self.size):
                try:
                    self._send(payload or b"", rank, None)
                except RuntimeError:
                    raise RankFailed(f"rank {rank} of {self.size} stopped before it took {what}",
                                     rank=rank) from None  # fmt: skip
            return payload or b""
        try:
            return self._receive(0, None)
        except RuntimeError:
            raise RankFailed(f"rank 0 of {self.size} stopped before it sent {what}",
                             rank=0) from None  # fmt: skip

    def leave(self) -> None:
        import torch.distributed as dist

        dist.destroy_process_group()


def _exchange(world: World) -> Callable[[ImportanceSums], ImportanceSums]:
    """For mean ablation: every rank's sums of the heads' outputs, merged on rank 0 and sent
    back to each."""

    def exchange(mine: ImportanceSums) -> ImportanceSums:
        from attnviz.analysis.report_sums import pack_means, unpack_means
        from attnviz.outputs.partials import decode, encode

        found = world.gather(encode(*pack_means(mine)), "its heads' mean outputs")
        merged = None
        if found is not None:
            parts = [unpack_means(*decode(raw, f"rank {r}")) for r, raw in enumerate(found)]
            total = parts[0]
            for part in parts[1:]:
                total = total.merge(part)
            merged = encode(*pack_means(total))
        return unpack_means(*decode(world.spread(merged, "the heads' mean outputs"), "rank 0"))

    return exchange


def report_split(
    model: Model,
    sentences: Sentences | Treebank,
    out: Path,
    style: Style,
    shard: str | None = None,
    partial: Path | None = None,
    resume: bool = False,
    on_ranks: Callable[[list[int], list[int]], None] | None = None,
    **options: Any,
) -> tuple[Any, list[Path]]:
    """`report` in shares: shard `shard` ("I/N") alone into the folder `partial`, or this
    process's rank of a launched run. Returns the report and its files on rank 0, the shard
    and its texts (a dict) and the partial for a shard, and (None, []) on the other ranks."""
    from attnviz.pipelines.shards import Share, run_share

    if shard is None:
        return _rank(model, sentences, out, style, partial, resume, on_ranks, **options)
    share = Share.parse(shard)
    if partial is None:
        raise InputError("--shard needs --partial DIR: the folder its sums are written to")
    from attnviz.outputs.files import prepare_dir
    from attnviz.outputs.partials import partial_path

    prepare_dir(partial)
    path = partial_path(partial, share.index, share.count)
    _, document = run_share(model, model.load(), sentences, share, path, resume, **options)
    return {"shard": [share.index, share.count], "texts": document["texts"]}, [path]


def _progress(world: World, on_ranks: Callable[[list[int], list[int]], None] | None):
    """This rank's progress callback (its count, in the store), and on rank 0 a look at every
    rank's counts and totals, at most every WAIT seconds (for its own texts and its waits)."""
    import time

    last = [0.0]

    def look() -> None:
        if on_ranks is None or world.rank != 0 or time.monotonic() - last[0] < WAIT:
            return
        last[0] = time.monotonic()
        on_ranks(world.counts(), world.counts("total"))

    def done(n: int) -> None:
        world.tell(n)
        look()

    return done, look


def _rank(
    model: Model,
    sentences: Sentences | Treebank,
    out: Path,
    style: Style,
    partial: Path | None,
    resume: bool,
    on_ranks: Callable[[list[int], list[int]], None] | None,
    on_progress: Callable[[int], None] | None = None,
    **options: Any,
) -> tuple[Any, list[Path]]:
    """This process's rank of a launched run: its share, its partial kept, every partial on
    rank 0, which writes the report; a rank that stops is named in one line. Every rank's
    progress goes to rank 0's `on_ranks(counts, totals)`, not to `on_progress`."""
    import signal

    from attnviz.core import models
    from attnviz.core.settings import resolve_device
    from attnviz.outputs.files import prepare_dir
    from attnviz.outputs.partials import partial_path

    rank, size = launched() or (0, 1)
    device = resolve_device(model.device)
    if device == "cuda":  # one GPU a rank, as the launcher numbers them on each machine
        device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
    ranked = models.get(replace(model.settings, device=device))  # the other settings kept
    folder = partial if partial is not None else out / PARTIALS
    if rank == 0:
        prepare_dir(out)
    prepare_dir(folder)
    world = World.join(device)

    def stopped(signum: int, frame: Any) -> None:
        missing = sorted(set(world.unfinished()) | world.pending)
        raise RankFailed(f"stopped by the launcher (signal {signum}) before rank(s) "
                         f"{', '.join(map(str, missing))} had finished")  # fmt: skip

    before = signal.signal(signal.SIGTERM, stopped)
    path = partial_path(folder, rank, size)
    try:
        return _run_rank(world, ranked, sentences, out, style, path, resume, on_ranks, **options)
    except RankFailed as error:
        raise RankFailed(f"{error}; nothing was written; the ranks that finished kept their "
                         f"sums in {folder}/: run the same command with --resume",
                         error.rank) from None  # fmt: skip
    finally:
        signal.signal(signal.SIGTERM, before)
        world.leave()


def _run_rank(
    world: World,
    model: Model,
    sentences: Sentences | Treebank,
    out: Path,
    style: Style,
    path: Path,
    resume: bool,
    on_ranks: Callable[[list[int], list[int]], None] | None,
    **options: Any,
) -> tuple[Any, list[Path]]:
    import signal

    from attnviz.outputs.partials import decode, encode
    from attnviz.outputs.report_files import write_report
    from attnviz.pipelines.shards import Share, report_of, run_share

    on_progress, on_wait = _progress(world, on_ranks)
    mean = options.get("importance") in ("ablation", "both") and options.get("ablation") == "mean"
    if world.rank != 0:  # only rank 0 says anything
        options.pop("on_warning", None)
    try:
        found = run_share(
            model, model.load(), sentences, Share(world.rank, world.size), path, resume,
            exchange=_exchange(world) if mean else None, on_progress=on_progress,
            on_start=lambda n: world.count(f"total/{world.rank}", n), **options,
        )  # fmt: skip
    except AttnvizError as error:
        if world.rank != 0 and not isinstance(error, RankFailed):  # rank 0 says it, naming us
            with contextlib.suppress(RankFailed):  # rank 0 stopped too (the same error)
                world.gather(ERROR + str(error).encode("utf-8"), "why it stopped")
        raise
    world.finished()
    gathered = world.gather(encode(*found), "its sums", on_wait)
    if gathered is None:
        world.spread(None, "the news that the report is written")
        result, written = None, []
    else:
        partials = [(f"rank {r}", decode(raw, f"rank {r}")) for r, raw in enumerate(gathered)]
        result = report_of(partials)
        # Every rank's sums are in: a launcher stopping the run now (another rank ended after
        # it sent them) would only cut the report's files short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        written = write_report(result, out, style)
        try:  # the other ranks may remove their partials now
            world.spread(b"written", "the news that the report is written")
        except RankFailed:  # the report is whole: a rank that stopped now keeps its partial
            pass
    if path.parent.name == PARTIALS and path.parent.parent == out:  # ours to remove
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # another rank's partial is still there, or it is
            path.parent.rmdir()  # gone already: the last rank out removes the folder
    return result, written
