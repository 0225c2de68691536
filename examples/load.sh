#!/usr/bin/env bash
# Sends N chat completions to a running `llmtrio serve` and reports per-request timings.
#
#   N=8 MAX_TOKENS=32 ./examples/load.sh
#   N=16 MAX_TOKENS=64 ARRIVE=2000 URL=http://127.0.0.1:8080 ./examples/load.sh
#
# Requests start together unless ARRIVE=<ms> spreads their start times at random over that
# many milliseconds. Each streams (SSE) with usage; ttfb is curl's time to the first byte of
# the response body, total its time to the end. IGNORE_EOS=1 (default) makes each request
# produce exactly MAX_TOKENS tokens. While it runs, /health is polled for the engine's
# inflight count.
set -euo pipefail
N=${N:-8}
MAX_TOKENS=${MAX_TOKENS:-32}
ARRIVE=${ARRIVE:-0}
URL=${URL:-http://127.0.0.1:8080}
IGNORE_EOS=${IGNORE_EOS:-1}
PROMPT=${PROMPT:-Write a short story about a robot learning to paint.}
PY=${PYTHON:-python3}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ignore=$([ "$IGNORE_EOS" = 1 ] && echo true || echo false)
body=$("$PY" -c 'import json,sys; print(json.dumps({"messages":[{"role":"user","content":sys.argv[1]}],
  "max_tokens":int(sys.argv[2]),"stream":True,"stream_options":{"include_usage":True},
  "temperature":0,"ignore_eos":sys.argv[3]=="true"}))' "$PROMPT" "$MAX_TOKENS" "$ignore")

# Poll /health for the engine's inflight count while the requests run (shell only: a
# process started per poll would take CPU from the server being measured).
field() { sed -n "s/.*\"$1\": *\([0-9]*\).*/\1/p" <<< "$2"; }
( max=0; of=0
  while [ ! -e "$work/done" ]; do
    h=$(curl -s --max-time 2 "$URL/health" || true)
    now=$(field inflight "$h"); of_now=$(field max_inflight "$h")
    [ "${now:-0}" -gt "$max" ] && max=$now
    [ "${of_now:-0}" -gt 0 ] && of=$of_now
    echo "$max $of" > "$work/inflight"
    sleep 0.1
  done ) &
poller=$!

start=$(date +%s.%N)
for i in $(seq 1 "$N"); do
  (
    if [ "$ARRIVE" -gt 0 ]; then sleep "$("$PY" -c "import random; print(random.uniform(0, $ARRIVE) / 1000)")"; fi
    curl -s -N -o "$work/$i.sse" -w '%{time_starttransfer} %{time_total}\n' \
      -H 'content-type: application/json' -d "$body" "$URL/v1/chat/completions" > "$work/$i.time"
  ) &
done
wait $(jobs -p | grep -v "^$poller$") 2>/dev/null || true
end=$(date +%s.%N)
touch "$work/done"
wait "$poller" 2>/dev/null || true

"$PY" - "$work" "$N" "$start" "$end" <<'PY'
import json, sys, pathlib
work, n, start, end = pathlib.Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
print(f"{'#':>3} {'ttfb':>9} {'total':>9} {'tokens':>8} {'tok/s':>8}  finish")
total_tokens = 0
for i in range(1, n + 1):
    ttfb, total = (float(x) for x in (work / f"{i}.time").read_text().split())
    tokens, finish = 0, "?"
    for line in (work / f"{i}.sse").read_text().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            finish = "error"
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        for choice in chunk.get("choices", []):
            finish = choice.get("finish_reason") or finish
    total_tokens += tokens
    rate = tokens / (total - ttfb) if total > ttfb else 0.0
    print(f"{i:>3} {ttfb:>9.6f} {total:>9.6f} {tokens:>8} {rate:>8.1f}  {finish}")
wall = end - start
peak, of = (work / "inflight").read_text().split() if (work / "inflight").exists() else ("?", "?")
print(f"\nwall {wall:.1f}s · {total_tokens} tokens · {total_tokens / wall:.1f} tok/s across all requests")
print(f"engine inflight while running: max {peak} of {of}")
PY
