#!/usr/bin/env python3
"""A Mooncake-style trace made TILES times larger: tile t's arrivals follow tile t-1's (each
tile spans the trace's own time), its hash ids past every id before it, so that tiles share no
prefix. The scale benches run the simulator and the planner on it; `--time-scale 1/TILES` then
packs the tiles into the trace's own span, TILES times its load.

    bench/tile_trace.py SOURCE TILES OUT
"""
import json
import sys

source, tiles, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lines = [json.loads(line) for line in open(source) if line.strip()]
span = max(line["timestamp"] for line in lines) + 1
ids = max(max(line["hash_ids"], default=0) for line in lines) + 1
with open(out, "w") as f:
    for t in range(tiles):
        for line in lines:
            tiled = dict(line, timestamp=line["timestamp"] + t * span,
                         hash_ids=[h + t * ids for h in line["hash_ids"]])
            f.write(json.dumps(tiled) + "\n")
