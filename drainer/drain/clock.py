"""How long batches take and how far the database is: what claim sizes and claims ahead
follow (:class:`BatchClock`, the drain loop's clock)."""

from __future__ import annotations

import math

#: Statements are sent ahead (the next batch claimed while this one runs) only while a batch
#: takes at most this long.
PIPELINE_MAX_BATCH_S = 0.1

#: Claims are sized from the work once ADAPT_SAMPLES round trips have been timed (before:
#: the configured batch size). One: the run's first Query counts (its round trip, the
#: server's time included, is an upper bound of a claim's, and the fastest timed since
#: is what sizes claims), so that a claim 10 ms away grows after the first batch, not
#: after five round trips of 10 jobs (half of a 20,000-job drain's extra time across the
#: link); an overestimate only makes the next claims larger, within the bounds, where the
#: local curve of --batch-size is flat.
ADAPT_SAMPLES = 1

#: A claim grows until its jobs take this many of its round trips to run (the fastest claim
#: timed, the server's time included), on any connection: a round trip is then at most
#: about a tenth of a batch, where the local curve of --batch-size is flat (100 to 1000
#: within 0.88-1.0x of each other, 50 at 0.74x; a claim's round trip 0.3-0.6 ms there, a
#: no-op job 20-30 us), and across a link the claim reaches its cap or half the limit first.
#: The same rule locally, on a busy disk (a claim's commit waiting 5-15 ms for the WAL
#: flush, when a larger claim pays for its commit over more jobs) and across a link.
BATCH_ROUND_TRIPS = 8


class BatchClock:
    """How long batches take: claims go ahead only while a batch takes at most
    PIPELINE_MAX_BATCH_S (then a round trip is a large share of a batch, and claiming
    ahead holds few jobs away from other drainers for little time)."""

    def __init__(self, limit: float = PIPELINE_MAX_BATCH_S) -> None:
        self.limit = limit
        self.started: float | None = None  # when the batch in hand was handed over
        self.last: float | None = None  # how long the last batch took to run
        self.count = 0  # jobs handed over in the batch in hand
        self.per_job: float | None = None  # the last batch's time a job
        self.rtt: float | None = None  # the fastest claim's round trip (server time included)
        self.samples = 0

    def start(self, now: float, jobs: int = 1) -> None:
        """``jobs`` handed over at ``now``."""
        if self.started is None:
            self.started = now
        self.count += jobs

    def finish(self, now: float) -> None:
        if self.started is not None:
            self.last = now - self.started
            self.per_job = self.last / max(1, self.count)
            self.started = None
            self.count = 0

    def round_trip(self, seconds: float) -> None:
        self.rtt = seconds if self.rtt is None else min(self.rtt, seconds)
        self.samples += 1

    def measured(self) -> bool:
        """Whether claims are sized from the work: ADAPT_SAMPLES claims timed, and a batch."""
        return self.rtt is not None and bool(self.per_job) and self.samples >= ADAPT_SAMPLES

    def adapted(self, batch_size: int, most: int) -> int:
        """A claim size for the measured work: large enough that a batch runs for
        BATCH_ROUND_TRIPS round trips (so the round trip, and the statement's own cost on
        both ends, is a small share of the batch; a batch of slow handlers that already
        does stays at ``batch_size``), but at most ``most``, and no larger than runs within
        half the ``limit`` (so that batches stay fast enough to claim ahead, and a claimed
        job waits at most that long for its handler)."""
        if not self.measured():
            return batch_size
        assert self.rtt is not None and self.per_job
        want = int(BATCH_ROUND_TRIPS * self.rtt / self.per_job) + 1
        # half the limit: a batch sized right at it would be "slow" every other time
        return max(batch_size, min(most, want, int(self.limit / 2 / self.per_job)))

    def depth(self, size: int, most: int) -> int:
        """How many claims of ``size`` to keep in flight, at most ``most`` (the pipeline
        depth): enough that they hold the jobs the handlers run in two measured round trips
        (so that the next claim is back before the batches in hand are done), but no more
        than run within the ``limit`` (a job claimed ahead waits at most that long for its
        handler, so no drainer hoards jobs). Before ADAPT_SAMPLES round trips: one."""
        if most <= 1 or not self.measured() or size <= 0:
            return min(1, most)
        assert self.rtt is not None and self.per_job
        batch_s = size * self.per_job
        want = math.ceil(2 * self.rtt / batch_s)
        return max(1, min(most, want, int(self.limit / batch_s)))

    def within_half_limit(self) -> int:
        """The jobs the handlers run in half the ``limit`` at the measured speed (0 before a
        batch is measured): what claims in flight may hold when a round trip takes longer
        than MAX_CLAIM jobs run (across a link), since no job claimed ahead then waits
        longer than that for its handler."""
        return int(self.limit / 2 / self.per_job) if self.measured() and self.per_job else 0

    def runs_out(self, waiting: int) -> bool:
        """Whether ``waiting`` jobs (claimed, not started) run out within two measured round
        trips: a claim sent now is then back about when they are done (none waiting: yes;
        nothing measured yet: no, the batch is handed over first)."""
        if not waiting:
            return True
        return self.measured() and waiting * (self.per_job or 0) <= 2 * (self.rtt or 0)

    def fast(self) -> bool:
        """The last batch ran fast enough to claim the next ahead of it."""
        return self.last is not None and self.last <= self.limit

    def slow_now(self, now: float) -> bool:
        """The batch in hand has run too long to keep claims ahead in the socket."""
        return self.started is not None and now - self.started > self.limit
