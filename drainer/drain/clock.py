"""How long batches take and how far the database is: what claim sizes and claims ahead
follow (:class:`BatchClock`, the drain loop's clock)."""

from __future__ import annotations

import math
from collections.abc import Callable

#: Statements are sent ahead (the next batch claimed while this one runs) only while a batch
#: takes at most this long.
PIPELINE_MAX_BATCH_S = 0.1

#: A claim grows with the round trip once ADAPT_SAMPLES claims have been timed and the
#: database is across a link (see BatchClock.far): locally the configured batch size stays.
ADAPT_SAMPLES = 5

#: Claims whose fastest round trip (of ADAPT_SAMPLES) took this long, in seconds, are taken
#: for a link at once (a database 8 ms or more away).
ADAPT_MIN_RTT_S = 0.008

#: Faster claims, but LINK_MIN_S or more, may be a link 1-5 ms away or a local database on
#: a busy disk (there a claim's commit waits 5-15 ms for its WAL flush behind the other
#: writers): a Sync alone then tells which, as it costs no statement and no commit. It is a
#: link when LINK_PROBES Syncs in a row, timed while nothing else runs in the drain, all
#: took LINK_MIN_S or more. Locally a Sync takes 0.03-0.1 ms, on a loaded machine too:
#: measured at load 6.6 on 2 cores, one in 60 took a few ms, none of 1,000 sets of three
#: in a row all did (in a drain, the first after a batch took 0.1-1 ms, the next 0.03-0.3).
LINK_MIN_S = 0.0005
LINK_PROBES = 3


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
        self.probing = False  # a Sync alone can be timed (see Claims.probe)
        self.link: float | None = None  # the fastest Sync alone timed
        self.linked: bool | None = None  # what the Syncs said: a link, local; None: not yet
        self.probes = 0  # Syncs timed

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

    def wants_probe(self) -> bool:
        """Whether to time a Sync alone now (the connection is idle): ADAPT_SAMPLES claims
        timed, the fastest between LINK_MIN_S (faster: no link that long is there) and
        ADAPT_MIN_RTT_S (slower: a link already), and the Syncs have not decided yet."""
        return self.probing and self.linked is None and self.samples >= ADAPT_SAMPLES \
            and self.rtt is not None and LINK_MIN_S <= self.rtt < ADAPT_MIN_RTT_S

    def link_round_trip(self, seconds: float) -> None:
        """A Sync alone took ``seconds``: under LINK_MIN_S says local, LINK_PROBES in a row
        that long say a link (either for the rest of the drain)."""
        self.link = seconds if self.link is None else min(self.link, seconds)
        self.probes += 1
        if seconds < LINK_MIN_S:
            self.linked = False
        elif self.probes >= LINK_PROBES:
            self.linked = True

    def far(self) -> bool:
        """Whether claims grow with the round trip: ADAPT_SAMPLES claims timed, and the
        fastest took ADAPT_MIN_RTT_S or more, or the Syncs timed said a link (a database
        1-5 ms away; not a local one, loaded or not)."""
        if self.rtt is None or self.samples < ADAPT_SAMPLES:
            return False
        return self.rtt >= ADAPT_MIN_RTT_S or bool(self.linked)

    def adapted(self, batch_size: int, most: int) -> int:
        """A claim size for the measured link: with the database across one (:meth:`far`),
        large enough that a batch runs for two round trips (so the claim sent ahead is back
        before the batch in hand is done; a batch of slow handlers that already does stays
        at ``batch_size``), but at most ``most``, and no larger than runs within half the
        ``limit`` (so that batches stay fast enough to claim ahead, and a claimed job waits
        at most that long for its handler)."""
        if not self.per_job or not self.far():
            return batch_size
        assert self.rtt is not None
        want = int(2 * self.rtt / self.per_job) + 1
        # half the limit: a batch sized right at it would be "slow" every other time
        return max(batch_size, min(most, want, int(self.limit / 2 / self.per_job)))

    def depth(self, size: int, most: int) -> int:
        """How many claims of ``size`` to keep in flight, at most ``most`` (the pipeline
        depth): enough that they hold the jobs the handlers run in two measured round trips
        (so that the next claim is back before the batches in hand are done), but no more
        than run within the ``limit`` (a job claimed ahead waits at most that long for its
        handler, so no drainer hoards jobs). Before ADAPT_SAMPLES round trips, and while
        Syncs are still to be timed (they go out when nothing is in flight): one."""
        if most <= 1 or self.rtt is None or not self.per_job or self.samples < ADAPT_SAMPLES \
                or size <= 0 or self.wants_probe():
            return min(1, most)
        batch_s = size * self.per_job
        want = math.ceil(2 * self.rtt / batch_s)
        return max(1, min(most, want, int(self.limit / batch_s)))

    def runs_out(self, waiting: int) -> bool:
        """Whether ``waiting`` jobs (claimed, not started) run out within two measured round
        trips: a claim sent now is then back about when they are done (none waiting: yes;
        nothing measured yet: no, the batch is handed over first)."""
        if not waiting:
            return True
        return self.rtt is not None and bool(self.per_job) and \
            self.samples >= ADAPT_SAMPLES and waiting * (self.per_job or 0) <= 2 * self.rtt

    def fast(self) -> bool:
        """The last batch ran fast enough to claim the next ahead of it."""
        return self.last is not None and self.last <= self.limit

    def slow_now(self, now: float) -> bool:
        """The batch in hand has run too long to keep claims ahead in the socket."""
        return self.started is not None and now - self.started > self.limit

    def time_link(self, probe: Callable[[], float | None]) -> None:
        """Time Syncs alone, back to back, while :meth:`wants_probe` (LINK_PROBES across a
        link, locally one or two: the first after a batch can be slow). Called when nothing
        else runs: no claim in flight, no handler (a handler thread holding the GIL when
        the answer comes would be timed too). ``probe`` returns None when the connection
        cannot take one: the claims' times alone then."""
        while self.wants_probe():
            seconds = probe()
            if seconds is None:
                self.probing = False
                return
            self.link_round_trip(seconds)
