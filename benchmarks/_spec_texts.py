"""The texts of ``spec_compare.py``'s workloads: passages a "rewrite" request asks back
(prose and code, 300-600 tokens each on gemma's tokenizer), and records a json_schema
"extraction" request pulls fields out of. Fixed here so figures stay comparable."""

from __future__ import annotations

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


def extract_prompt(record: str) -> str:
    return f"Record:\n{record}\n\nThe record's fields as JSON (values copied from the record):\n"


def chat_prompt(question: str) -> str:
    return f"Question: {question}\nAnswer:"
