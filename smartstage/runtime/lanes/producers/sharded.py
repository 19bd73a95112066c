"""The producer of a sharded stage: one worker per input task, batches interleaved round-robin.

    before:  one input, read on the trainer            -> batches b0 b1 b2 ...
    after:   task i reads shard i (its own iterator)   -> t0.b0 t1.b0 t2.b0 t0.b1 t1.b1 ...

Each worker runs its task's lane (read + body on the task, enqueue into the lane's queue on the
trainer) whenever its previous batch has been moved. The merger moves from the tasks in turn,
0, 1, ..., N-1, 0, ...; a task at its end of input leaves the turn, so the order is a fixed function
of the shards' contents (tf.data's `interleave(cycle_length=N, block_length=1)` over the tasks): no
batch is lost or repeated, and the buffer closes after every task's last batch. A task failing (its
error named by runtime/lanes/remote.py) arrives at its turn, after the batches before it.
"""

from __future__ import annotations

import logging
import threading
import time

from smartstage.runtime.lanes.lanes import LaneGraph, discard_leftovers
from smartstage.runtime.lanes.remote import RemotePlan, named_task_error
from smartstage.runtime.lanes.producers.host import ProducerHost

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.05


class ShardedProducer:
    """Workers and a round-robin merger for a stage whose input is sharded over input tasks."""

    def __init__(self, host: ProducerHost, lanes: LaneGraph, plan: RemotePlan):
        self.host = host
        self.sess = host.sess
        self.lanes = lanes
        self.plan = plan
        self.meter = host.meter
        self.max_threads = len(plan.tasks)  # one lane per task: a task's reads stay in its shard's order
        self.num_threads = self.max_threads
        self.soft_capacity = None
        self.lane_batches = [0] * self.max_threads
        self.threads: list[threading.Thread] = []
        self._cond = threading.Condition()
        self._pending = [0] * self.max_threads          # batches in a lane's queue, not yet moved
        self._ended: list[BaseException | None] = [None] * self.max_threads  # end of input or failure
        self._options = plan.run_options(host.run_options)

    def halted(self) -> bool:
        return self.host.halted()

    def apply(self, lanes: int, capacity: int) -> None:
        """Autotune does not change a sharded stage: one lane per task."""

    def discard_lane_leftovers(self) -> None:
        discard_leftovers(self.host.control_run, self.lanes.lanes[:self.max_threads])

    def start(self, prime: bool = False) -> None:
        self.threads = [threading.Thread(target=self._work, args=(i,), daemon=True,
                                         name=f"smartstage-prefetch-{self.host.name}-task{i}")
                        for i in range(self.max_threads)]
        self.threads.append(threading.Thread(target=self._merge, daemon=True,
                                             name=f"smartstage-prefetch-{self.host.name}-merger"))
        for thread in self.threads:
            thread.start()

    def _work(self, task: int) -> None:
        lane = self.lanes.lanes[task]
        while True:
            with self._cond:  # the lane's queue holds one batch: wait until the merger took the last
                while self._pending[task] and not self.halted():
                    self._cond.wait(POLL_SECONDS)
                if self.halted():
                    return
            started = time.monotonic()
            try:
                with self.host.in_flight(task):
                    self.sess.run(lane.enqueue, options=self._options)
            except Exception as error:  # noqa: BLE001  the merger delivers it at this task's turn
                with self._cond:
                    self._ended[task] = error
                    self._cond.notify_all()
                return
            self.meter.produced(0.0, time.monotonic() - started)
            with self._cond:
                self._pending[task] += 1
                self.lane_batches[task] += 1
                self._cond.notify_all()

    def _merge(self) -> None:
        turn = list(range(self.max_threads))
        position = 0
        end_of_input: BaseException | None = None
        while turn:
            task = turn[position % len(turn)]
            with self._cond:
                while not (self._pending[task] or self._ended[task] is not None or self.halted()):
                    self._cond.wait(POLL_SECONDS)
                if self.halted():
                    return
                ready = bool(self._pending[task])
                ended = self._ended[task]
            if ready:
                if not self._move(task):
                    return
                position = (position + 1) % len(turn)
                continue
            kind = self.host.classify(ended)
            if kind == "closed":
                logger.info("stage %s: input task %d reached the end of its shard", self.host.name, task)
                end_of_input = ended
                turn.remove(task)
                position = position % len(turn) if turn else 0
                continue
            if kind in ("shutdown", "cancelled"):
                return
            self.host.finish(named_task_error(ended, self.plan, task), deferred=True)
            return
        if end_of_input is not None:
            self.host.finish(end_of_input, deferred=True)  # closes the buffer after the last batch

    def _move(self, task: int) -> bool:
        started = time.monotonic()
        try:
            with self.host.in_flight(self.max_threads):
                occupancy = self.sess.run(self.lanes.lanes[task].occupancy, options=self.host.run_options)
        except Exception as error:  # noqa: BLE001
            if not self.halted():
                self.host.finish(error, deferred=True)
            return False
        self.meter.moved(time.monotonic() - started, int(occupancy))
        with self._cond:
            self._pending[task] -= 1
            self._cond.notify_all()
        return True


__all__ = ["ShardedProducer"]
