#!/usr/bin/env python3
"""The module graph of a crate, from its `crate::` paths, and the cycles in it.

    scripts/module-graph.py crates/conveyor/src            # cycles only
    scripts/module-graph.py crates/conveyor/src --edges    # every module's imports too
    scripts/module-graph.py crates/conveyor/src --leaf transport,message,...

A module is a top-level file or folder of `src`. Comments and `#[cfg(test)] mod tests`
are left out. With `--leaf`, the named modules must import nothing outside themselves:
the script exits 1 naming each import that does (scripts/test.sh checks the core's
transport contract this way).
"""
import os
import re
import sys


def graph(root):
    edges = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(folder, name)
            parts = os.path.relpath(path, root)[:-3].split(os.sep)
            module = parts[0] if parts[0] not in ("lib", "mod") else "lib"
            text = re.split(r"#\[cfg\(test\)\]\s*mod tests", open(path).read())[0]
            text = "\n".join(l for l in text.split("\n") if not l.strip().startswith("//"))
            found = edges.setdefault(module, set())
            found.update(m for m in re.findall(r"crate::(\w+)", text) if m != module)
    return {m: {t for t in ts if t in edges} for m, ts in edges.items()}


def cycles(edges):
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main(args):
    root = args[0]
    edges = graph(root)
    if "--edges" in args:
        for module in sorted(edges):
            print(module, "->", " ".join(sorted(edges[module])))
    for component in cycles(edges):
        print("cycle of", len(component), ":", " ".join(component))
    if "--leaf" in args:
        leaf = set(args[args.index("--leaf") + 1].split(","))
        outside = [(m, t) for m in sorted(leaf) for t in sorted(edges.get(m, ())) if t not in leaf]
        for module, target in outside:
            print(f"{module} imports {target}, outside {','.join(sorted(leaf))}")
        return 1 if outside else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
