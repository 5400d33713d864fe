#!/usr/bin/env python3
"""Checks the engine's layer rule: engine/src's top-level modules form no import cycle, and
each imports only from its own layer or the layers below it.

The layers are read from the fenced ```layers block in ARCHITECTURE.md (one layer per line,
lowest first; a line may hold several modules of the same layer, and `name: a b` names a
layer). A module's imports are every `crate::<module>` path in its files (a file module, or
every file under a folder module), code and comments alike, outside `#[cfg(test)]`-only
modules (tests may reach up).

Usage: scripts/check-layers.py [--graph]   exits 1 on a cycle or an upward import.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "engine" / "src"
ARCH = ROOT / "ARCHITECTURE.md"

PATH_RE = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")
# A `use crate::{a, b::c}` group names several modules at once.
GROUP_RE = re.compile(r"\buse\s+crate::\{([^;]*)\};", re.S)
TEST_MOD_RE = re.compile(r"#\[cfg\((?:all\()?[^\]]*\btest\b[^\]]*\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+\w+\s*\{")


def layers():
    text = ARCH.read_text()
    m = re.search(r"```layers\n(.*?)```", text, re.S)
    if not m:
        sys.exit("ARCHITECTURE.md has no ```layers block")
    order = {}
    for rank, line in enumerate(l for l in m.group(1).splitlines() if l.strip()):
        names = line.split(":", 1)[-1].split()
        for n in names:
            order[n] = rank
    return order


def strip_tests(src):
    """Drops `#[cfg(test)] mod x { ... }` bodies (brace-matched)."""
    out = []
    pos = 0
    for m in TEST_MOD_RE.finditer(src):
        if m.start() < pos:
            continue
        out.append(src[pos : m.start()])
        depth = 1
        i = m.end()
        while i < len(src) and depth:
            c = src[i]
            depth += c == "{"
            depth -= c == "}"
            i += 1
        pos = i
    out.append(src[pos:])
    return "".join(out)


def modules():
    mods = {}
    for p in sorted(SRC.iterdir()):
        if p.name in ("lib.rs", "main.rs"):
            continue
        if p.is_dir():
            mods[p.name] = sorted(p.rglob("*.rs"))
        elif p.suffix == ".rs":
            mods.setdefault(p.stem, []).append(p)
            sub = SRC / p.stem
            if sub.is_dir():
                mods[p.stem] += sorted(sub.rglob("*.rs"))
    return mods


def imports(files, names):
    deps = {}
    for f in files:
        # Comments count too: a doc that names a higher layer's path is a dependency of the
        # reader's mental model, and tools that read `crate::` paths see it.
        src = strip_tests(f.read_text())
        found = set(PATH_RE.findall(src))
        for g in GROUP_RE.findall(src):
            for part in re.split(r",", g):
                head = part.strip().split("::")[0].strip("{} \n")
                if head:
                    found.add(head)
        for n in found:
            if n in names:
                deps.setdefault(n, set()).add(f.relative_to(ROOT).as_posix())
    return deps


def cycles(graph):
    """Tarjan's strongly connected components of size > 1 (or a self-loop)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    order = layers()
    mods = modules()
    names = set(mods)
    graph = {}
    where = {}
    for m, files in mods.items():
        deps = imports(files, names)
        deps.pop(m, None)
        graph[m] = set(deps)
        for d, fs in deps.items():
            where[(m, d)] = sorted(fs)
    bad = 0
    missing = sorted(names - set(order))
    if missing:
        print(f"modules with no layer in ARCHITECTURE.md: {', '.join(missing)}")
        bad += 1
    for comp in cycles(graph):
        print(f"import cycle: {' -> '.join(comp)}")
        bad += 1
    for m in sorted(graph):
        for d in sorted(graph[m]):
            if m in order and d in order and order[d] > order[m]:
                print(f"upward import: {m} (layer {order[m]}) uses {d} (layer {order[d]}) in {', '.join(where[(m, d)])}")
                bad += 1
    if "--graph" in sys.argv:
        for m in sorted(graph, key=lambda x: (order.get(x, 99), x)):
            print(f"{order.get(m, '?')!s:>2} {m:10} -> {' '.join(sorted(graph[m])) or '-'}")
    if bad:
        print(f"check-layers: {bad} problem(s)")
        return 1
    print(f"check-layers: {len(graph)} modules, {sum(map(len, graph.values()))} imports, no cycle, none upward")
    return 0


if __name__ == "__main__":
    sys.exit(main())
