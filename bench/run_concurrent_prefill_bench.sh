#!/usr/bin/env bash
# Two prompts on one prefill node at once, against the same two one after the other: through
# `baton up` (small preset, one prefill and one decode node), two cold LENGTH-token prompts
# (default 4,096; random tokens, so neither hits the other's prefix) are sent together, and the
# time from sending them to both first tokens is taken; then two more are sent one after the
# other, the second once the first's stream (two tokens) has ended, and the time from sending
# the first to the second's first token is taken. A prefill node computes its prompts one at a
# time on all its cores, in the order they came (common/fifo_turns.h): together, the first
# prompt's TTFT is one prefill and the second's two, and both finish when the one-after-the-other
# pair does. Each figure is the median of ROUNDS (default 3) pairs, after one warm-up request.
#
#   [LENGTH=4096] [ROUNDS=3] bench/run_concurrent_prefill_bench.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BATON_BUILD_DIR:-$root/build}"
# shellcheck source=bench/baton_up.sh
source "$root/bench/baton_up.sh"
start_baton_up "$build"
python3 - "$build/tools/batonctl" "$addr" "${LENGTH:-4096}" "${ROUNDS:-3}" <<'PY'
import json, random, statistics, subprocess, sys, threading, time
batonctl, addr, length, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(7)

def prompt():
    return ",".join(str(rng.randrange(3, 4096)) for _ in range(length))

def generate(tokens, out, i):
    sent = time.monotonic()
    done = subprocess.run([batonctl, "generate", "--addr", addr, "--tokens", tokens,
                           "--max-tokens", "2", "--json"], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"batonctl generate failed ({done.returncode}): {done.stderr.strip()}")
    ttft = json.loads(done.stdout)["ttft_ms"]
    # The first token's time on this clock: the client's TTFT after it sent (batonctl's own
    # start is a few ms after `sent`, which this keeps in).
    out[i] = (sent, ttft)

# Warm-up, the nodes' first request: tried until the cluster serves (its nodes register after the
# router is up).
deadline = time.monotonic() + 120
while True:
    warm = subprocess.run([batonctl, "generate", "--addr", addr, "--tokens", prompt(),
                           "--max-tokens", "2", "--json"], capture_output=True, text=True)
    if warm.returncode == 0:
        break
    if time.monotonic() > deadline:
        sys.exit(f"the cluster did not serve within 120 s: {warm.stderr.strip()}")
    time.sleep(0.5)
together, apart, first_ttft, second_ttft = [], [], [], []
for _ in range(rounds):
    out = [None, None]
    start = time.monotonic()
    threads = [threading.Thread(target=generate, args=(prompt(), out, i)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ends = [s + ttft / 1e3 - start for s, ttft in out]
    together.append(max(ends) * 1e3)
    first_ttft.append(min(ttft for _, ttft in out))
    second_ttft.append(max(ttft for _, ttft in out))
    out = [None, None]
    start = time.monotonic()
    generate(prompt(), out, 0)
    generate(prompt(), out, 1)
    apart.append((out[1][0] + out[1][1] / 1e3 - start) * 1e3)
m = statistics.median
print(f"{length}-token prompts, one prefill node, median of {rounds}:")
print(f"  together: both first tokens after {m(together):.1f} ms "
      f"(first TTFT {m(first_ttft):.1f} ms, second {m(second_ttft):.1f} ms)")
print(f"  one after the other: both first tokens after {m(apart):.1f} ms")
print(f"  together / one after the other: {m(together) / m(apart):.3f}")
PY
stop_baton_up
