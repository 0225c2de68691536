"""The texts of ``spec_compare.py``'s workloads: passages a "rewrite" request asks back
(prose and code, 300-600 tokens each on gemma's tokenizer), and records a json_schema
"extraction" request pulls fields out of. Fixed here so figures stay comparable."""

from __future__ import annotations

import json

REWRITE_TEXTS = (
    """The lighthouse on Carrick Point was built in 1847 by a company of masons from
Aberdeen, who carried the granite blocks across the bay on flat-bottomed barges because the
cliff road had not yet been cut. For the first forty years it burned whale oil, then
paraffin, and in 1923 it was fitted with an electric lamp that the keepers distrusted for a
whole winter. The last keeper, Morag Lennox, kept a logbook in which she recorded not only
the weather and the passing ships but the birds that struck the lantern glass on foggy
nights: gannets, a snowy owl in 1962, and once, improbably, a heron. When the light was
automated in 1988 she moved to the village below and opened a tea room in the old
coastguard hut, where she sold scones and told visitors that the new lamp was brighter but
had no sense of humour. The logbooks are now kept in the county archive, and a volunteer
group has transcribed them so that anyone can read, day by day, how the sea and the sky
changed over a century. The group meets on the first Tuesday of each month, and new members
are asked to transcribe one week of entries before they are given a key to the reading
room. Most of them stay for years.""",
    """Our team moved the billing service from a nightly batch job to a stream of events in
three stages. First we wrote every invoice change to an append-only table and kept the batch
job as it was, so that we could compare the two outputs every morning; for six weeks they
differed only where the batch job had bugs we had not known about. Second, we built the
consumer that reads the events and updates customer balances, and we ran it in shadow mode:
it wrote to a separate schema, and an alert fired whenever a balance differed from the batch
result by more than one cent. Third, after two clean weeks, we switched the customer portal
to read from the new tables and turned the batch job into a reconciliation check that runs
on Sundays. The hardest part was not the code but the edge cases in the old data: refunds
issued before the customer existed, currencies that had been renamed, and a discount code
that applied itself twice if the invoice was edited on the last day of a month. We wrote
each of these down as a test before fixing it, and the suite now has more than four hundred
cases. The lesson we would pass on is simple: keep the old system running beside the new one
for longer than feels necessary, and make the differences loud.""",
    '''def merge_intervals(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge overlapping half-open intervals and return them sorted by start.

    Intervals that only touch (one ends where the next begins) are merged as well, so
    [(1, 3), (3, 5)] becomes [(1, 5)]. Empty intervals (start == end) are dropped.
    """
    ordered = sorted((start, end) for start, end in intervals if start < end)
    merged: list[tuple[int, int]] = []
    for start, end in ordered:
        if merged and start <= merged[-1][1]:
            last_start, last_end = merged[-1]
            merged[-1] = (last_start, max(last_end, end))
        else:
            merged.append((start, end))
    return merged


def total_covered(intervals: list[tuple[int, int]]) -> int:
    """The length of the union of the intervals."""
    return sum(end - start for start, end in merge_intervals(intervals))


def gaps(intervals: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """The parts of [lo, hi) that no interval covers, in order."""
    out: list[tuple[int, int]] = []
    cursor = lo
    for start, end in merge_intervals(intervals):
        if end <= lo or start >= hi:
            continue
        if start > cursor:
            out.append((cursor, min(start, hi)))
        cursor = max(cursor, end)
    if cursor < hi:
        out.append((cursor, hi))
    return out''',
    """class RateLimiter {
  constructor(capacity, refillPerSecond, now = () => Date.now()) {
    this.capacity = capacity;
    this.refillPerSecond = refillPerSecond;
    this.now = now;
    this.buckets = new Map();
  }

  bucketFor(key) {
    let bucket = this.buckets.get(key);
    if (bucket === undefined) {
      bucket = { tokens: this.capacity, updatedAt: this.now() };
      this.buckets.set(key, bucket);
    }
    const elapsed = (this.now() - bucket.updatedAt) / 1000;
    bucket.tokens = Math.min(this.capacity, bucket.tokens + elapsed * this.refillPerSecond);
    bucket.updatedAt = this.now();
    return bucket;
  }

  tryTake(key, cost = 1) {
    const bucket = this.bucketFor(key);
    if (bucket.tokens < cost) {
      const wait = (cost - bucket.tokens) / this.refillPerSecond;
      return { allowed: false, retryAfterSeconds: Math.ceil(wait) };
    }
    bucket.tokens -= cost;
    return { allowed: true, remaining: Math.floor(bucket.tokens) };
  }

  forget(key) {
    this.buckets.delete(key);
  }
}

module.exports = { RateLimiter };""",
    """The Hollins Cut, a nine-mile branch canal linking the limestone quarries at Ashby Fold to
the River Wend at Marlow Staithe, opened to traffic in the spring of 1794. Its promoters, a
syndicate of quarry owners led by the Quaker banker Josiah Penrose, had hoped to halve the
cost of carrying stone to the lime kilns downriver, and for a generation they largely
succeeded. The cut climbed sixty-one feet through eleven locks, most of them clustered in a
tight flight below Cowlam Bridge, and each lock was tended by a keeper who lived in a small
brick cottage beside the chamber.

The best remembered of these keepers was Hannah Gilbey, who took over Lock Seven in 1838
after her husband drowned while clearing ice from the upper gates. The company minutes
record a short debate about whether a widow could be trusted with the windlass and the toll
book, but the engineer, Samuel Orde, argued that she had been doing most of the work for
years already. She kept the lock for thirty-one years. Her ledgers, now held at the county
record office in Bramford, list every boat by name, cargo and tonnage, and in the margins
she noted floods, hard frosts, and the occasional fight between boatmen waiting their turn.

Traffic peaked in the late 1840s, when nearly forty narrow boats a day worked up the
flight. The arrival of the Wend Valley Railway in 1856 changed that quickly. By 1870 the
quarries were sending their stone by rail, and the keepers' cottages began to empty one by
one. The last commercial cargo, a load of coal for the fulling mill at Tanner's Green,
passed through in October 1911, and the company was wound up two years later.

Today most of the channel is dry, its bed grazed by sheep and crossed by farm tracks, but
Lock Seven survives. Volunteers from the Hollins Cut Society rebuilt its oak gates in 1987,
and Gilbey's cottage, with its low door and iron boot scraper, opens to visitors on summer
Sundays, when a retired schoolteacher reads aloud from her ledgers.""",
    """The Valdrenne Rack Railway leaves the lower station at Saint-Orel at 7:42 each morning in
winter, and on the January day I rode it the platform thermometer read minus eleven. The train
is two carriages long, painted the colour of dried cherries, and it carries a brass plate from
the Winterthur works dated 1926. A conductor named Anselm Ruegg checked tickets with his mittens
on, punching each card with a tool that looked older than the carriage itself.

For the first twenty minutes the line climbs through larch forest, the cogwheel beneath the floor
grinding in a rhythm you stop hearing after a while. At Combe-Noire, a halt with one bench and a
post box, a woman boarded with a crate of eggs wrapped in newspaper. She told me she sold them to
the summit hotel every Tuesday and had done so since her husband retired from the signal box.
Beyond the halt the trees thin out, and the track crosses the Pont des Chamois, a stone viaduct
of nine arches over a gorge so narrow that the river below is only audible, never seen.

Snow had fallen overnight, and a rotary plough had cleared the rails before dawn, leaving walls
of packed white higher than the windows. The light inside turned blue. Somewhere past the tunnel
at Grand Becquet we halted for eight minutes while a crew dug out a frozen switch, and nobody
complained; a man across the aisle simply unwrapped a sandwich and opened a paperback.

We reached Col de Valdrenne at 9:15, twenty-one minutes late. The summit station has a cafe
warmed by a tiled stove, where barley soup costs six francs and arrives with a slab of rye bread.
From its terrace you can see three countries on a clear day, though that morning the cloud sat on
the ridge like wet wool. I lingered until the 13:05 descent, which left exactly on time.""",
    """Summary. On 14 February, between 06:52 and 09:18 UTC, the order-events pipeline stopped
delivering messages to downstream consumers in the eu-west region. Roughly 2.3 million events
were delayed, and about 41,000 were delivered twice once service resumed. No messages were
permanently lost. Customers saw stale order statuses in the dashboard and received shipping
notifications up to two and a half hours late.

What happened. Our queue cluster runs five brokers behind a partition-aware client library.
At 06:40 a routine configuration rollout lowered the segment retention check interval from
five minutes to thirty seconds, a change intended to reclaim disk faster after a recent
storage alert. The new setting was valid, but it interacted badly with a compaction job that
already held a lock on the largest topic. Brokers began spending most of their time
contending for that lock, request latency climbed past the consumer session timeout, and at
06:52 consumers started leaving their groups in waves.

Each departure triggered a rebalance, and each rebalance forced the remaining consumers to
reread their last committed offsets. Because the brokers were still slow, those reads timed
out too, so the groups never settled. The on-call engineer was paged at 07:05 by the
consumer-lag alert. She first suspected a network partition and spent about forty minutes
ruling that out. At 07:58 a second engineer spotted the retention change in the deploy log,
and the rollout was reverted at 08:11. Broker latency recovered within six minutes, but the
consumer groups needed another hour to drain the backlog, which they finished at 09:18.

What we changed. Broker configuration now goes through the same staged rollout as code,
beginning with a single canary broker that must stay healthy for thirty minutes. We raised
the consumer session timeout and added jitter to rebalance retries so that groups cannot
thrash in lockstep. The lag alert now links directly to recent deploys for the affected
cluster. Finally, the services that produced duplicates are being updated to deduplicate on
event identifier instead of assuming exactly-once delivery.""",
    """Minutes of the Annual General Meeting of the Larkfield Row Housing Co-operative, held on
Saturday 15 March 2025 in the community room at 12 Larkfield Row. Thirty-four of the fifty-two
member households were present in person and six were represented by proxy, so the chair, Grace
Adeyemi, declared the meeting quorate at 10:07.

The minutes of the previous annual meeting were approved without amendment on a motion from
Tomasz Wielgosz, seconded by Ruth Fennimore. Under matters arising, the secretary reported that
the bicycle shelter promised last year had been installed in October at a final cost of 4,860
pounds, slightly below the agreed ceiling of 5,000 pounds.

The treasurer, Daniel Okafor, presented the accounts for the year ending 31 December 2024. Rental
income came to 412,300 pounds against expenditure of 389,750, leaving a surplus of 22,550. He
explained that insurance premiums had risen by eighteen percent and that the repairs reserve now
stands at 131,400 pounds. Members asked several questions about the new boiler servicing
contract, and Mr Okafor agreed to circulate the tender comparison within a fortnight. The
accounts were adopted by 37 votes to none, with three abstentions.

The main item was the proposal to replace the single-glazed windows in blocks C and D. The
maintenance committee recommended drawing up to 96,000 pounds from the reserve, spread over two
financial years, rather than taking out a loan. After a lengthy debate, in which some members
argued that roof repairs to block A should come first, the proposal was carried by 29 votes to
8, with 3 abstentions. The committee will report on contractor selection in the autumn.

Members also agreed to raise weekly rents by 3.2 percent from 1 June, below the 4 percent
originally suggested. Two committee vacancies were filled by election: Priya Raman and Colin
Beattie join for three-year terms. Under any other business, residents raised late-night noise
from the car wash on Mill Lane, which the secretary will take up with the council. The meeting
closed at 12:24.""",
    """Beneath the glasshouses of the Carrow Hill Botanic Garden, in a converted boiler room that
still smells faintly of coal dust, sits a modest but carefully kept seed bank. It was founded
in 2006 by the garden's former curator, Dr Elspeth Marchant, who worried that several local
meadow species were disappearing faster than anyone was recording them. Today the collection
holds around 4,800 accessions, most of them wildflowers and grasses gathered within forty
miles of the garden, along with a smaller set of heritage vegetable varieties donated by
allotment holders.

Almost all of the day-to-day work is done by volunteers. A typical Tuesday session begins at
the long oak table by the drying room, where paper bags of freshly collected seed heads wait
with their field labels still pinned on. Volunteers first check each bag against the
collector's notebook, confirming the species, the site, the date and the number of parent
plants sampled. Seeds are then cleaned by hand, using sieves of graded mesh and, for the
fluffier species, a gentle stream of air from a modified hair dryer. Once cleaned, a sample
of fifty seeds is set aside for a germination test, and the remainder goes into the drying
room, where humidity is held at fifteen percent for several weeks.

Cataloguing happens only when the seeds are dry enough to store. Each accession receives a
number, written in pencil on an acid-free card and entered into a shared spreadsheet that
the garden is slowly migrating to a proper database. The seeds are sealed in foil pouches
and placed in chest freezers at minus twenty degrees. Every five years a small portion is
thawed and tested again, and when germination falls below seventy percent the volunteers
flag that accession for recollection the following summer.

Marchant retired in 2019, but she still comes in most Tuesdays, mainly, she says, to make
sure nobody has mislabelled the knapweed.""",
    """The Harvest at Oudenburg, woven in Brussels around 1655, returned to the east gallery this
spring after a conservation campaign lasting almost three years. Measuring 3.4 by 4.9 metres, the
tapestry shows reapers and gleaners in a wheat field beneath a distant walled town, framed by a
border of fruit garlands, parrots and small grotesque masks. It entered the collection in 1932 as
a gift from the estate of Lady Henrietta Vane and had never been taken down for treatment.

Once the hanging came off the wall, the team led by senior textile conservator Marieke Dellaert
found that its lower edge had carried the full weight for decades, stretching the warps and
opening long slits where the weavers had changed colour. Earlier repairs, probably from the
1930s, had been made with cotton thread that later shrank and pulled the surrounding silk out of
line. These were unpicked stitch by stitch under magnification.

The tapestry was wet-cleaned in a purpose-built tank using softened water and a mild non-ionic
detergent, then dried flat on blotting paper while small fans moved air across its surface.
Cleaning revealed colours hidden beneath grime: the sky, long described as a dull grey, is in
fact a pale blue-green, and the reapers' shirts are a warm madder red. Dye analysis by liquid
chromatography confirmed weld and woad in the greens and detected cochineal in the pink border
flowers, a costly import at the time.

Weak areas were supported by stitching them to a new linen backing dyed to match, using fine silk
couching rather than reweaving, so every surviving thread remains visible and nothing has been
invented. The most striking discovery came from the reverse: a workshop mark, a small shield
bearing the letters PC, which links the piece to the little-documented atelier of Pieter
Cleynaert. A strip of hook-and-loop fastener sewn to a webbing band now spreads the load evenly
along the top edge.""",
    '''"""A small least-recently-used cache with per-entry time-to-live expiry."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable, Generic, Hashable, Optional, Tuple, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TTLCache(Generic[K, V]):
    """Bounded mapping that evicts the oldest entries and drops stale ones."""

    def __init__(self, capacity: int, ttl: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self._capacity = capacity
        self._ttl = ttl
        self._clock = clock
        self._data: OrderedDict[K, Tuple[V, float]] = OrderedDict()

    def get(self, key: K, default: Optional[V] = None) -> Optional[V]:
        """Return the cached value, or default if it is missing or expired."""
        entry = self._data.get(key)
        if entry is None:
            return default
        value, expires_at = entry
        if expires_at <= self._clock():
            del self._data[key]
            return default
        self._data.move_to_end(key)
        return value

    def put(self, key: K, value: V, ttl: Optional[float] = None) -> None:
        """Insert or refresh a value, evicting the least recently used entry."""
        lifetime = self._ttl if ttl is None else ttl
        self._data[key] = (value, self._clock() + lifetime)
        self._data.move_to_end(key)
        while len(self._data) > self._capacity:
            self._data.popitem(last=False)

    def purge_expired(self) -> int:
        """Remove every stale entry and report how many were dropped."""
        now = self._clock()
        stale = [k for k, (_, exp) in self._data.items() if exp <= now]
        for key in stale:
            del self._data[key]
        return len(stale)


def memoize(cache: TTLCache[K, V]) -> Callable[[Callable[[K], V]], Callable[[K], V]]:
    """Wrap a single-argument function so that its results are kept in cache."""
    def decorate(fn: Callable[[K], V]) -> Callable[[K], V]:
        def inner(key: K) -> V:
            hit = cache.get(key)
            if hit is not None:
                return hit
            result = fn(key)
            cache.put(key, result)
            return result
        return inner
    return decorate''',
    r"""//! Fixed-capacity ring buffer used by the telemetry sampler.

pub struct RingBuffer<T> {
    slots: Vec<Option<T>>,
    head: usize,
    len: usize,
}

impl<T> RingBuffer<T> {
    pub fn with_capacity(capacity: usize) -> Self {
        assert!(capacity > 0, "capacity must be non-zero");
        let mut slots = Vec::with_capacity(capacity);
        slots.resize_with(capacity, || None);
        RingBuffer { slots, head: 0, len: 0 }
    }

    /// Appends a value, returning the evicted element when full.
    pub fn push(&mut self, value: T) -> Option<T> {
        let cap = self.slots.len();
        let evicted = self.slots[(self.head + self.len) % cap].replace(value);
        if self.len == cap {
            self.head = (self.head + 1) % cap;
        } else {
            self.len += 1;
        }
        evicted
    }

    pub fn pop(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let value = self.slots[self.head].take();
        self.head = (self.head + 1) % self.slots.len();
        self.len -= 1;
        value
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        let cap = self.slots.len();
        (0..self.len).filter_map(move |i| self.slots[(self.head + i) % cap].as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::RingBuffer;

    #[test]
    fn pops_in_fifo_order() {
        let mut buf = RingBuffer::with_capacity(3);
        buf.push(1);
        buf.push(2);
        assert_eq!(buf.pop(), Some(1));
        assert_eq!(buf.pop(), Some(2));
        assert_eq!(buf.pop(), None);
    }

    #[test]
    fn overwrites_oldest_when_full() {
        let mut buf = RingBuffer::with_capacity(2);
        assert_eq!(buf.push('a'), None);
        buf.push('b');
        assert_eq!(buf.push('c'), Some('a'));
        assert_eq!(buf.iter().copied().collect::<Vec<_>>(), vec!['b', 'c']);
    }
}""",
    """// Package ratelimit provides a per-client token-bucket HTTP middleware.
package ratelimit

import (
    "math"
    "net"
    "net/http"
    "strconv"
    "sync"
    "time"
)

// bucket tracks the tokens currently available to a single client.
type bucket struct {
    tokens   float64
    lastSeen time.Time
}

// Limiter hands out tokens at a fixed rate, up to a maximum burst.
type Limiter struct {
    mu      sync.Mutex
    rate    float64 // tokens added per second
    burst   float64
    buckets map[string]*bucket
}

// NewLimiter returns a Limiter that refills at rate tokens per second.
func NewLimiter(rate float64, burst int) *Limiter {
    return &Limiter{rate: rate, burst: float64(burst), buckets: make(map[string]*bucket)}
}

// Allow reports whether the client identified by key may proceed now,
// and if not, how long it should wait before trying again.
func (l *Limiter) Allow(key string, now time.Time) (bool, time.Duration) {
    l.mu.Lock()
    defer l.mu.Unlock()
    b, ok := l.buckets[key]
    if !ok {
        b = &bucket{tokens: l.burst, lastSeen: now}
        l.buckets[key] = b
    }
    elapsed := now.Sub(b.lastSeen).Seconds()
    b.tokens = math.Min(l.burst, b.tokens+elapsed*l.rate)
    b.lastSeen = now
    if b.tokens >= 1 {
        b.tokens--
        return true, 0
    }
    wait := (1 - b.tokens) / l.rate
    return false, time.Duration(wait * float64(time.Second))
}

// Middleware rejects requests with 429 once a client exhausts its bucket.
func (l *Limiter) Middleware(next http.Handler) http.Handler {
    return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
        host, _, err := net.SplitHostPort(r.RemoteAddr)
        if err != nil {
            host = r.RemoteAddr
        }
        allowed, retry := l.Allow(host, time.Now())
        if !allowed {
            secs := int(math.Ceil(retry.Seconds()))
            w.Header().Set("Retry-After", strconv.Itoa(secs))
            http.Error(w, "rate limit exceeded", http.StatusTooManyRequests)
            return
        }
        next.ServeHTTP(w, r)
    })
}""",
    r"""import type { SearchResult } from "./types";

export interface SearchControllerOptions {
  endpoint: string;
  delayMs?: number;
  minLength?: number;
  onResults: (results: SearchResult[]) => void;
  onError?: (error: unknown) => void;
}

export class DebouncedSearchController {
  private timer: ReturnType<typeof setTimeout> | null = null;
  private inFlight: AbortController | null = null;

  constructor(private readonly options: SearchControllerOptions) {}

  handleInput(query: string): void {
    this.clearTimer();
    const trimmed = query.trim();
    if (trimmed.length < (this.options.minLength ?? 2)) {
      this.cancel();
      this.options.onResults([]);
      return;
    }
    const delay = this.options.delayMs ?? 250;
    this.timer = setTimeout(() => void this.run(trimmed), delay);
  }

  cancel(): void {
    this.clearTimer();
    this.inFlight?.abort();
    this.inFlight = null;
  }

  private clearTimer(): void {
    if (this.timer !== null) {
      clearTimeout(this.timer);
      this.timer = null;
    }
  }

  private async run(query: string): Promise<void> {
    this.timer = null;
    this.inFlight?.abort();
    const controller = new AbortController();
    this.inFlight = controller;
    const url = `${this.options.endpoint}?q=${encodeURIComponent(query)}`;
    try {
      const response = await fetch(url, { signal: controller.signal });
      if (!response.ok) {
        throw new Error(`search failed with status ${response.status}`);
      }
      const body = (await response.json()) as { items: SearchResult[] };
      if (this.inFlight === controller) {
        this.options.onResults(body.items);
      }
    } catch (error) {
      if (!controller.signal.aborted) this.options.onError?.(error);
    } finally {
      if (this.inFlight === controller) {
        this.inFlight = null;
      }
    }
  }
}""",
    """-- Migration 0042: workshop bookings
-- Adds instructors, workshops and registrations, plus two reporting views.

BEGIN;

CREATE TABLE instructors (
    instructor_id   BIGSERIAL PRIMARY KEY,
    full_name       TEXT         NOT NULL,
    email           TEXT         NOT NULL UNIQUE,
    hourly_rate     NUMERIC(8,2) NOT NULL CHECK (hourly_rate >= 0)
);

CREATE TABLE workshops (
    workshop_id     BIGSERIAL PRIMARY KEY,
    instructor_id   BIGINT       NOT NULL REFERENCES instructors (instructor_id)
                                 ON DELETE RESTRICT,
    title           TEXT         NOT NULL,
    starts_at       TIMESTAMPTZ  NOT NULL,
    ends_at         TIMESTAMPTZ  NOT NULL,
    capacity        INTEGER      NOT NULL CHECK (capacity BETWEEN 1 AND 200),
    CONSTRAINT workshops_time_order CHECK (ends_at > starts_at)
);

CREATE TABLE registrations (
    registration_id BIGSERIAL PRIMARY KEY,
    workshop_id     BIGINT       NOT NULL REFERENCES workshops (workshop_id)
                                 ON DELETE CASCADE,
    attendee_email  TEXT         NOT NULL,
    status          TEXT         NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'confirmed', 'cancelled')),
    registered_at   TIMESTAMPTZ  NOT NULL DEFAULT now(),
    CONSTRAINT registrations_one_per_attendee UNIQUE (workshop_id, attendee_email)
);

CREATE INDEX workshops_instructor_idx ON workshops (instructor_id);
CREATE INDEX workshops_starts_at_idx ON workshops (starts_at);
CREATE INDEX registrations_status_idx ON registrations (workshop_id, status);

CREATE VIEW workshop_occupancy AS
SELECT w.workshop_id,
       w.title,
       w.capacity,
       count(r.registration_id) AS confirmed,
       w.capacity - count(r.registration_id) AS seats_left
FROM workshops w
LEFT JOIN registrations r
       ON r.workshop_id = w.workshop_id AND r.status = 'confirmed'
GROUP BY w.workshop_id, w.title, w.capacity;

CREATE VIEW upcoming_workshops AS
SELECT w.workshop_id, w.title, w.starts_at, i.full_name AS instructor
FROM workshops w
JOIN instructors i ON i.instructor_id = w.instructor_id
WHERE w.starts_at > now()
ORDER BY w.starts_at;

COMMENT ON TABLE instructors IS 'People who lead workshops; hourly_rate is in EUR.';
COMMENT ON TABLE workshops IS 'Scheduled sessions, each run by exactly one instructor.';
COMMENT ON TABLE registrations IS 'Attendee sign-ups; cancelled rows are kept for reporting.';
COMMENT ON VIEW workshop_occupancy IS 'Confirmed seats and remaining capacity per workshop.';

COMMIT;""",
    r"""/*
 * arena.c - bump-pointer arena allocator.
 *
 * Memory is carved sequentially from a single malloc'd block and released
 * all at once with arena_reset() or arena_free(). Individual frees are not
 * supported, and the arena is not safe to share between threads.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define ARENA_DEFAULT_ALIGN (2 * sizeof(void *))

typedef struct {
    unsigned char *base;
    size_t capacity;
    size_t offset;
} Arena;

int arena_init(Arena *arena, size_t capacity)
{
    arena->base = malloc(capacity);
    arena->offset = 0;
    if (arena->base == NULL) {
        arena->capacity = 0;
        return -1;
    }
    arena->capacity = capacity;
    return 0;
}

/* align must be a power of two. Returns NULL when the arena is exhausted. */
void *arena_alloc_aligned(Arena *arena, size_t size, size_t align)
{
    uintptr_t current = (uintptr_t)(arena->base + arena->offset);
    size_t padding = (size_t)(-current & (align - 1));
    size_t remaining = arena->capacity - arena->offset;

    if (padding > remaining || size > remaining - padding) {
        return NULL;
    }
    arena->offset += padding;
    void *ptr = arena->base + arena->offset;
    arena->offset += size;
    return ptr;
}

void *arena_alloc(Arena *arena, size_t size)
{
    return arena_alloc_aligned(arena, size, ARENA_DEFAULT_ALIGN);
}

void arena_reset(Arena *arena)
{
    arena->offset = 0;
}

void arena_free(Arena *arena)
{
    free(arena->base);
    arena->base = NULL;
    arena->capacity = 0;
    arena->offset = 0;
}""",
)

EXTRACT_RECORDS = (
    """From: Harbour Tools Ltd, 14 Quay Street, Leith EH6 6LX, Scotland
Invoice number: HT-2024-0871, issued 3 March 2024, due 2 April 2024
Bill to: Northwind Boatyard, attention of Ms Priya Raman (priya.raman@northwind.example)
Items: 12 stainless deck cleats at 18.40 GBP; 3 coils of 10 mm mooring line at 54.00 GBP;
1 hand winch, model HW-220, at 310.00 GBP. Delivery by courier, tracking LX449201GB.
Total due: 692.80 GBP, payable by bank transfer to account 20-45-77 / 60331298.""",
    """Customer support ticket #55120, opened 17 November 2023 at 09:42 by Tomas Eklund
(tomas.eklund@mailbox.example), phone +46 70 123 45 67, on the Premium plan since 2021.
Product: SmartThermo X2, firmware 4.1.7, serial STX2-88-01934. Problem: the device loses
its Wi-Fi connection every night around 02:00 and the schedule resets to factory defaults.
Steps tried: router restarted, device re-paired twice, firmware reinstalled. Priority: high.
Assigned to: Lena Vogt, second-line support, Berlin office.""",
    """Property listing 7733-B: a two-bedroom flat on the third floor of 41 Rue des Tanneurs,
Lyon 69001, France, built in 1911 and renovated in 2019. Floor area 68 square metres,
balcony facing south-west, no lift. Asking price 329,000 EUR, service charges 1,140 EUR a
year, energy rating C. Agent: Camille Moreau, Agence Saone Immobilier, phone +33 4 72 00 18 55,
email c.moreau@saone-immo.example. Viewings on Saturdays between 10:00 and 13:00.""",
    """Conference registration confirmation for Dr. Aiko Tanaka, Kyoto Institute of Materials,
aiko.tanaka@kim.example. Event: Nordic Polymer Symposium 2025, Trondheim, 9 to 11 June 2025.
Registration type: speaker, fee 420 EUR (waived), dinner ticket included. Talk: "Fatigue in
recycled polyamide fibres", session B3, Tuesday 10 June at 14:20, room Gloshaugen 2. Hotel:
Scandic Nidelven, three nights, booking reference SN-99812.""",
    """Rental agreement RA-7731-KX between Coastline Car Hire, 88 Harbour Road, Galway H91 T2E4,
Ireland, and hirer Mr Daniel Okafor (d.okafor@postbox.example), licence no. IE-4471902.
Vehicle: grey Skoda Octavia estate, registration 231-G-5582, full tank on collection.
Collected 9 August 2024 at 10:15, return due 16 August 2024 by 18:00 at the Shannon Airport
desk. Daily rate 46.50 EUR; excess waiver 9.00 EUR per day. Deposit of 300.00 EUR held on
card ending 4417. Signed at the counter by agent Roisin Keane.""",
    """Invoice DC-2025-04417 from Harbourside Dental Practice, 18 Quay Street, Galway H91 X2K7,
Ireland, issued 3 April 2025. Patient: Siobhan Kearney. Treatment on 27 March 2025 with
Dr. Rory Fitzgerald: examination with scale and polish 95 EUR, composite filling on the
lower left molar 140 EUR, two bitewing X-rays 45 EUR. Total due 280 EUR, payable within 30
days by bank transfer or card. Queries to accounts@harbourside-dental.example or
+353 91 555 204.""",
    """Appointment confirmation from Willowbank Veterinary Practice, 3 Mill Lane, Hebden Bridge
HX7 8AD. Patient: Biscuit, seven-year-old neutered beagle, record no. WVP-20931. Owner:
Mrs Alison Pryce (alison.pryce@homemail.example), mobile 07700 900412. Booked for Thursday
12 September 2024 at 16:20 with Dr Kofi Mensah for the annual booster and a check of a lump
on the left shoulder. Estimated cost 68.00 GBP before any tests. Please arrive ten minutes
early and bring a fresh stool sample if possible.""",
    """Offer of employment, reference HR-OF-3381, dated 12 May 2025. Dear Mateus Oliveira,
Brightwater Analytics Ltd is pleased to offer you the position of Senior Data Engineer at
our office at 7 Canal Wharf, Leeds LS11 5PS, United Kingdom, starting on 1 July 2025.
Annual salary 68,500 GBP, 25 days of paid leave, employer pension contribution 6 percent,
probation three months. Please sign and return this letter by 26 May to Helen Marsh, Head
of People, h.marsh@brightwater.example.""",
    """Freight manifest MNF-0449-RTM, vessel MV Nordic Tern, voyage 24N17, departing Rotterdam
Europoort on 21 May 2024 for Gothenburg. Carrier: Baltica Shortsea Lines B.V., Waalhaven
Zuidzijde 12, 3089 JH Rotterdam. Shipper contact: Henk de Vries (h.devries@baltica.example).
Container MSKU 7720154: 18 pallets of ceramic floor tiles, gross weight 21,400 kg. Container
TGHU 3381906: 240 cartons of bicycle parts, 9,850 kg. Declared cargo value 148,200.00 EUR.
Freight prepaid; customs entry reference SE-IMP-55210.""",
    """Penalty Charge Notice WK40281937, issued by Westbrook City Council Parking Services
on 18 February 2025 at 16:42. Vehicle KX71 RMB, a grey Skoda Octavia, was parked on a
double yellow line outside 63 Albion Road, Westbrook WB4 9TE. Civil enforcement officer:
Daniel Ferreira, badge 2214. Charge 70 GBP, reduced to 35 GBP if paid within 14 days.
Challenges may be made online or by email to appeals@westbrook-parking.example, quoting
the notice number.""",
    """Overdue notice from Brambleton Public Library, 40 Chapel Street, Brambleton, Ohio 45601,
sent 28 January 2025 to patron Marcus Delaney (m.delaney@inbox.example), card 2290 0041 7781.
Items overdue: "The Quiet Orchard" (barcode 31882004551207), due 6 January; "A Field Guide
to Ohio Mushrooms" (barcode 31882003918846), due 9 January. Accrued fines total 7.25 USD.
Borrowing is suspended once fines exceed 10.00 USD. Pay online, at any branch desk, or call
circulation supervisor Janet Ruiz on (740) 555-0182.""",
    """Licence renewal notice for Nordlicht Engineering GmbH, Hafenstrasse 12, 20457 Hamburg,
Germany. Product: CadForge Professional, 25 named-user seats, licence key
CF-PRO-7Q2M-88KD. The current term expires on 30 September 2025. Renewal for twelve months
costs 11,250 EUR excluding VAT and includes priority support and all version upgrades.
Account manager: Sofia Lindqvist, s.lindqvist@cadforge.example. Please send a purchase
order by 15 September to avoid any interruption of service.""",
    """Booking confirmation HB-58204-Q from Hotel Albergo Sant'Anna, Via dei Serpenti 61, 00184
Rome, Italy. Guest: Ms Keiko Tanaka (keiko.tanaka@travelmail.example), two adults. Arrival
Friday 4 October 2024, departure Monday 7 October 2024: three nights in a superior double
room with courtyard view, breakfast included. Rate 189.00 EUR per night; city tax of 6.00 EUR
per person per night is payable at the hotel. Free cancellation until 1 October 2024, 23:59
local time. Reservations desk: Marco Bellini.""",
    """Repair order BR-1093, Spoke and Sprocket Cycles, 220 Division Street, Portland, Oregon
97202. Customer: Marcus Lee, marcus.lee@mailbox.example, phone 503-555-0187. Bicycle: blue
Trek FX 3 hybrid, frame number WTU294C1188. Work requested: replace worn chain and rear
cassette, true the rear wheel, adjust the front brake. Estimate 164.50 USD including parts
and labour. Dropped off Monday 7 April 2025, ready for collection Thursday 10 April after
15:00. Mechanic: Jenna Ortiz.""",
    """Award letter from the Halden Foundation for Coastal Science, 2 Brygge Alle, 1767 Halden,
Norway, dated 15 April 2024. Dear Dr Ingrid Solberg (ingrid.solberg@uni-fjord.example),
we are pleased to confirm grant HFCS-2024-017 for the project "Eelgrass recovery after
winter storms in the Skagerrak", in the amount of 1,250,000 NOK over three years, starting
1 September 2024. Funds are released in annual instalments on receipt of a progress report.
Programme officer: Erik Lunde.""",
    """Claim acknowledgement from Meridian Mutual Insurance, claim number MM-HC-2025-118604.
Policyholder: Ingrid Solberg, Storgata 27, 0184 Oslo, Norway. We received your report on
22 January 2025 of water damage to the kitchen floor caused by a burst pipe on 19 January.
Declared estimated repair cost: 48,000 NOK, subject to an excess of 6,000 NOK. Assessor
Henrik Dahl will contact you within five working days to arrange a visit. Please send
photographs and receipts to claims@meridian-mutual.example.""",
)

# Fields named as a reader of these records would; every value is copied from the text.
EXTRACT_SCHEMA: dict[str, object] = {
    "type": "object",
    "properties": {
        "summary": {"type": "string", "maxLength": 120},
        "organisation": {"type": "string", "maxLength": 60},
        "person": {"type": "string", "maxLength": 40},
        "email": {"type": "string", "maxLength": 60},
        "place": {"type": "string", "maxLength": 80},
        "date": {"type": "string", "maxLength": 40},
        "reference": {"type": "string", "maxLength": 40},
        "amount": {"type": "string", "maxLength": 30},
    },
    "required": [
        "summary",
        "organisation",
        "person",
        "email",
        "place",
        "date",
        "reference",
        "amount",
    ],
}


def rewrite_prompt(text: str) -> str:
    """A base model's cue to repeat a text (it has no instructions to follow)."""
    return f"Original:\n{text}\n\nThe same, copied exactly, with no changes:\n"


#: Two worked examples lead every extraction prompt. Without them gemma-3-270m (a base
#: model) writes "1" or digits of its own into most fields, so the requests measured no
#: extraction at all; with them it quotes most fields from the record, as the workload is
#: meant to (issue 18: "fields quoted from the prompt"). Their records are not among
#: ``EXTRACT_RECORDS``.
EXTRACT_SHOTS: tuple[tuple[str, dict[str, str]], ...] = (
    (
        """Order confirmation 30418 from Alder & Finch Books, 9 Market Row, Hexham NE46 3NB,
England. Placed on 22 May 2024 by Jonah Pike (jonah.pike@post.example) for two hardback
atlases and a set of map pins, sent by tracked post. Total paid: 47.50 GBP by card.""",
        {
            "summary": "two hardback atlases and a set of map pins, sent by tracked post",
            "organisation": "Alder & Finch Books",
            "person": "Jonah Pike",
            "email": "jonah.pike@post.example",
            "place": "9 Market Row, Hexham NE46 3NB, England",
            "date": "22 May 2024",
            "reference": "30418",
            "amount": "47.50 GBP",
        },
    ),
    (
        """Booking BK-7712 at Villa Solana Surf School, Playa de Somo, Cantabria, Spain: a week of
morning lessons for Marta Ruiz (marta.ruiz@olas.example), starting 3 August 2025, board and
wetsuit included. Deposit of 120 EUR received; balance due on arrival.""",
        {
            "summary": "a week of morning lessons, board and wetsuit included",
            "organisation": "Villa Solana Surf School",
            "person": "Marta Ruiz",
            "email": "marta.ruiz@olas.example",
            "place": "Playa de Somo, Cantabria, Spain",
            "date": "3 August 2025",
            "reference": "BK-7712",
            "amount": "120 EUR",
        },
    ),
)

_EXTRACT_CUE = "The record's fields as JSON (values copied from the record):\n"


def extract_prompt(record: str, tag: str = "") -> str:
    """The worked examples, then ``tag`` (a benchmark's request number), then the record:
    every request starts with the same examples, as a deployment's requests start with
    the same instructions, so a server reuses their cells (prompt caching) and ingests
    the record only."""
    shots = "".join(
        f"Record:\n{shot}\n\n{_EXTRACT_CUE}{json.dumps(fields)}\n\n"
        for shot, fields in EXTRACT_SHOTS
    )
    return f"{shots}{tag}Record:\n{record}\n\n{_EXTRACT_CUE}"


def chat_prompt(question: str) -> str:
    return f"Question: {question}\nAnswer:"
