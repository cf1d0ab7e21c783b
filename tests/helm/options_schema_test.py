#!/usr/bin/env python3
"""The chart's values.schema.json against each binary's table of options.

Every key of `config.<section>` in helm/baton/values.schema.json becomes a key of that section
of the rendered baton.yaml, which the binary reads as its flag of the same name. So each key
must be an option of the binary (`common`: of every binary that has it, and of at least one),
and the two must agree on the type, on the allowed values (the same set), and on the range:
the schema's minimum and maximum equal the option's (`InRange`), except where the schema lists
a narrower range on purpose in NARROWER below. An option with a range or allowed values that
the schema accepts without them is a disagreement too: the chart would pass what the binary
refuses.

`baton up`'s own flags that it hands to a role's binary (FORWARDED) must agree with that
binary's option the same way (type, allowed values, range), so that baton up never accepts what
the binary refuses, nor refuses what it accepts.

Usage: options_schema_test.py SCHEMA [--up BATON] BINARY... (each binary, and `baton up`,
answers --print-options with its table as JSON: baton/common/options.h).
"""
import json
import subprocess
import sys

# Keys of config.<section> that the chart renders under another binary's name.
ALIASES = {("kvstore", "replication"): ("router", "kvstore-replication")}

# baton up's flags that become a role's flag of the same meaning: (role, that binary's name).
FORWARDED = {
    "port": [("router", "port")],
    "transport": [("router", "transport")],
    "split": [("router", "split"), ("prefill", "split")],
    "replay-rows-per-step": [("decode", "replay-rows-per-step")],
    "replay-step-budget": [("decode", "replay-step-budget")],
    "speculative": [("decode", "speculative")],
    "speculative-tokens": [("decode", "speculative-tokens")],
    "speculative-policy": [("decode", "speculative-policy")],
    "decode-pages": [("decode", "pages")],
    "http-port": [("router", "http-port")],
    "device": [("prefill", "device"), ("decode", "device")],
    "weights": [("prefill", "weights"), ("decode", "weights")],
    "cuda-prefill-attention": [("prefill", "cuda-prefill-attention"),
                               ("decode", "cuda-prefill-attention")],
    "kvstore-replication": [("router", "kvstore-replication")],
    "kvstore-budget-bytes": [("kvstore", "budget-bytes")],
    "block-cache-bytes": [("prefill", "block-cache-bytes")],
    "prefill-policy": [("router", "prefill-policy")],
    "fidelity-sample-rate": [("router", "fidelity-sample-rate")],
    "log-format": [(role, "log-format") for role in ("router", "prefill", "decode", "kvstore")],
    "host": [("router", "host")],
    "api-keys": [("router", "api-keys")],
}


def compare_forwarded(where, up, child):
    """The disagreements between a baton up option and the child option it becomes."""
    problems = []
    kinds = ("array" if up.get("list") else up["type"], "array" if child.get("list") else child["type"])
    if kinds[0] != kinds[1]:
        problems.append(f"{where}: baton up's type {kinds[0]}, the binary's {kinds[1]}")
    if set(up.get("allowed", [])) != set(child.get("allowed", [])):
        problems.append(f"{where}: allowed values differ: baton up {up.get('allowed', 'any')}, "
                        f"binary {child.get('allowed', 'any')}")
    if (up.get("min"), up.get("max")) != (child.get("min"), child.get("max")):
        problems.append(f"{where}: baton up's range [{up.get('min')}, {up.get('max')}], the "
                        f"binary's [{child.get('min')}, {child.get('max')}]")
    return problems


# Ranges the chart narrows on purpose, with the reason. A port in a pod is never 0 ("any free
# port") or -1 ("none"): the Services and probes need a fixed one.
NARROWER = {
    "port": "a pod's port is fixed: 1..65535, not 0 (any free port)",
    "internal-port": "a pod's port is fixed: 1..65535, not 0 (any free port)",
    "metrics-port": "a pod's port is fixed: 1..65535, not 0 or -1",
    "health-port": "a pod's port is fixed: the kubelet probes it",
    "http-port": "-1 (off) or a fixed port, not 0 (any free port)",
}


def resolve(schema, node):
    """The node with its $ref followed (one level of definitions)."""
    if "$ref" in node:
        name = node["$ref"].split("/")[-1]
        merged = dict(schema["definitions"][name])
        merged.update({k: v for k, v in node.items() if k != "$ref"})
        return merged
    return node


def schema_facts(schema, node):
    """(types, allowed values or None, minimum or None, maximum or None) of a property."""
    node = resolve(schema, node)
    if "oneOf" in node or "anyOf" in node:
        parts = [schema_facts(schema, p) for p in node.get("oneOf", node.get("anyOf"))]
        types = set().union(*(p[0] for p in parts))
        mins = [p[2] for p in parts if p[2] is not None]
        maxs = [p[3] for p in parts if p[3] is not None]
        allowed = None
        if all(p[1] is not None for p in parts):
            allowed = set().union(*(p[1] for p in parts))
        return types, allowed, min(mins) if mins else None, max(maxs) if maxs else None
    if "const" in node:
        value = node["const"]
        kind = {bool: "boolean", int: "integer", float: "number", str: "string"}[type(value)]
        number = value if kind in ("integer", "number") else None
        return {kind}, None if number is not None else {value}, number, number
    types = node.get("type", [])
    types = set(types if isinstance(types, list) else [types])
    allowed = set(node["enum"]) if "enum" in node else None
    return types, allowed, node.get("minimum"), node.get("maximum")


def compare(where, key, node, option, schema):
    """The disagreements between a schema property and an option, as messages."""
    problems = []
    types, allowed, low, high = schema_facts(schema, node)
    kind = "array" if option.get("list") else option["type"]
    fits = kind in types or (kind == "integer" and "number" in types and low is not None)
    if kind == "number" and "integer" in types:
        fits = True
    if not fits:
        problems.append(f"{where}: the schema's type {sorted(types)}, the binary's {kind}")
    table_allowed = set(option["allowed"]) if "allowed" in option else None
    if allowed is not None and "string" in types and allowed != table_allowed:
        problems.append(
            f"{where}: allowed values differ: schema {sorted(allowed)}, binary "
            f"{sorted(table_allowed) if table_allowed is not None else 'any'}")
    elif allowed is None and table_allowed is not None:
        problems.append(f"{where}: the binary allows only {sorted(table_allowed)}, the schema any")
    if kind in ("integer", "number"):
        t_low, t_high = option.get("min"), option.get("max")
        if t_low is None and (low is not None or high is not None):
            problems.append(f"{where}: the schema's range [{low}, {high}] has no bound in the "
                            "binary's table (InRange)")
        elif t_low is not None and (low is None or high is None):
            problems.append(f"{where}: the binary takes [{t_low}, {t_high}], the schema any value")
        elif t_low is not None and (low, high) != (t_low, t_high):
            inside = t_low <= low and high <= t_high
            if not (inside and key in NARROWER):
                problems.append(f"{where}: the schema's range [{low}, {high}], the binary's "
                                f"[{t_low}, {t_high}]")
    return problems


def main():
    schema = json.load(open(sys.argv[1]))
    args = sys.argv[2:]
    up_binary = None
    if args[:1] == ["--up"]:
        up_binary, args = args[1], args[2:]
    tables = {}
    for binary in args:
        out = subprocess.run([binary, "--print-options"], check=True, capture_output=True,
                             text=True).stdout
        table = json.loads(out)
        tables[table["section"]] = {o["name"]: o for o in table["options"]}
    config = schema["properties"]["config"]["properties"]
    problems, checked = [], 0
    for section, body in config.items():
        for key, node in body["properties"].items():
            if section == "common":
                holders = [s for s, t in tables.items() if key in t]
                if not holders:
                    problems.append(f"config.common.{key}: no binary has --{key}")
                for holder in holders:
                    problems += compare(f"config.common.{key} ({holder})", key, node,
                                        tables[holder][key], schema)
                    checked += 1
                continue
            target, name = ALIASES.get((section, key), (section, key))
            if target not in tables:
                problems.append(f"config.{section}: no binary given for section {target}")
                continue
            if name not in tables[target]:
                problems.append(f"config.{section}.{key}: baton-{target} has no --{name}")
                continue
            problems += compare(f"config.{section}.{key}", key, node, tables[target][name], schema)
            checked += 1
    if up_binary is not None:
        out = subprocess.run([up_binary, "up", "--print-options"], check=True,
                             capture_output=True, text=True).stdout
        up = {o["name"]: o for o in json.loads(out)["options"]}
        for name, targets in FORWARDED.items():
            if name not in up:
                problems.append(f"baton up has no --{name}")
                continue
            for role, child in targets:
                if child not in tables.get(role, {}):
                    problems.append(f"baton up --{name}: baton-{role} has no --{child}")
                    continue
                problems += compare_forwarded(f"baton up --{name} (baton-{role} --{child})",
                                              up[name], tables[role][child])
                checked += 1
    for problem in problems:
        print("FAIL:", problem)
    print(f"{checked} chart keys and baton up flags checked against {len(tables)} binaries' "
          "options; "
          f"{len(problems)} disagreements")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
