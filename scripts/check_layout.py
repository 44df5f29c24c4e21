"""Check that csrc/, the Cython modules and the Python package have no dependency
cycles, and that csrc/ keeps its vector code under x86/.

    python scripts/check_layout.py            # exit 1 and name the cycle or the file if there is one
    python scripts/check_layout.py --graph    # also print who depends on whom

Two graphs over the files under csrc/ (or --root):

- includes: file A -> header B when A has `#include "B"` (paths relative to the
  root, as the sources write them);
- calls: source A.c -> source B.c when A.c names a function or global that B.c
  defines without `static` (a call, or its address in a table), counting the
  bodies of the header inline functions A.c calls (and those they call) and the
  rows of the tables (.def) A.c includes itself (a row names its kernel whether or not the
  includer expands that column: an over-approximation, which can only add edges;
  names made by token pasting are not seen).

A third graph covers the Cython modules of ggmlrpc/_native (or --native): module A ->
module B when A.pyx or A.pxd cimports ggmlrpc._native.B (rpc.pxd and exec.pxd only
declare C; codec, sockio and hostmem layer over them, hostmem over sockio).

A fourth covers the Python modules of ggmlrpc (or --package): module A -> module B
when A imports B (`import ggmlrpc.B`, `from .B import x`, `from . import B`), at
module level or inside a function alike: a function-local import only defers the
dependency, and hiding a cycle behind one is what this check is meant to stop.
Imports under `if TYPE_CHECKING:` (annotations only, never run) do not count, nor
does the implicit import of a module's parent packages.

Any graph with a cycle fails: a lower module (job.c, vec.c, the quant kernels)
never reaches back into the ones above it (the ops, the run loop in exec.c).

Architecture code: a file that names a vector type (__m128, __m256, __m512,
__mmask) or an intrinsic other than the pause and prefetch hints must sit in an
x86/ folder, beside the portable twin it is tested against (as ggml-cpu keeps
arch/x86/). The
parse is textual (comments and strings stripped, top-level definitions found by
brace depth), which is enough for this code base's plain C.
"""
from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "csrc"
NATIVE = Path(__file__).resolve().parent.parent / "ggmlrpc" / "_native"
PACKAGE = Path(__file__).resolve().parent.parent / "ggmlrpc"
_CIMPORT = re.compile(r"^\s*(?:from\s+ggmlrpc\._native\.(\w+)\s+cimport|cimport\s+ggmlrpc\._native\.(\w+))", re.M)

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_STRING = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'')
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
_IDENT = re.compile(r"\b[A-Za-z_]\w*\b")
_KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "do", "else", "case"}


def strip_code(text: str) -> str:
    """The text without comments, string contents and preprocessor lines."""
    text = _COMMENT.sub(" ", text)
    text = _STRING.sub('""', text)
    lines = []
    cont = False
    for line in text.split("\n"):
        directive = cont or line.lstrip().startswith("#")
        cont = directive and line.rstrip().endswith("\\")
        lines.append("" if directive else line)
    return "\n".join(lines)


def top_level_chunks(code: str):
    """(head, body) for each top-level declaration or definition: head is the text
    before a function's body (body: the text between its braces) or up to the ';'
    of anything else (body None)."""
    depth, start, head_end = 0, 0, None
    for i, ch in enumerate(code):
        if ch == "{":
            if depth == 0:
                head_end = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                head = code[start:head_end]
                # a struct/enum/initializer body ends at the ';' after it, not here
                if re.search(r"\)\s*$", head) and not re.search(r"=\s*$", head):
                    yield head, code[head_end + 1:i]
                    start = i + 1
        elif ch == ";" and depth == 0:
            yield code[start:i], None
            start = i + 1


def definitions(code: str) -> set[str]:
    """Functions and globals this file defines with external linkage."""
    out = set()
    for head, body in top_level_chunks(code):
        has_body = body is not None
        words = _IDENT.findall(head)
        if not words or {"static", "typedef", "extern"} & set(words):
            continue
        if has_body:
            m = re.search(r"\b([A-Za-z_]\w*)\s*\([^()]*(?:\([^()]*\)[^()]*)*\)\s*$", head)
            if m and m.group(1) not in _KEYWORDS:
                out.add(m.group(1))
            continue
        decl = head.split("=", 1)[0]
        if re.search(r"\)\s*$", decl) or re.match(r"\s*(struct|enum|union)\b[^=]*\}", head):
            continue   # a prototype, or a type definition
        m = re.search(r"\b([A-Za-z_]\w*)\s*(\[[^\]]*\]\s*)*$", decl)
        if m and "(" not in decl:
            out.add(m.group(1))
    return out


def uses(code: str) -> set[str]:
    """Names a source uses: in function bodies and initializers, not in prototypes."""
    out: set[str] = set()
    for head, body in top_level_chunks(code):
        if body is not None:
            out |= set(_IDENT.findall(body))
        elif "=" in head:
            out |= set(_IDENT.findall(head.split("=", 1)[1]))
    return out


_VECTOR = re.compile(r"\b__m(?:128|256|512)\w*|\b__mmask\w*|\b_mm\d*_(?!pause\b|prefetch\b)\w+\s*\(")


def misplaced_vector_code(root: Path) -> list[str]:
    """The files outside an x86/ folder that hold vector code (see above)."""
    out = []
    for p in sorted(root.rglob("*")):
        if p.suffix in (".c", ".h") and "x86" not in p.relative_to(root).parts[:-1]:
            if _VECTOR.search(_COMMENT.sub(" ", p.read_text(errors="replace"))):
                out.append(p.relative_to(root).as_posix())
    return out


def reachable(graph: dict[str, set[str]], node: str) -> set[str]:
    """Every node reachable from node (not node itself unless on a cycle)."""
    seen: set[str] = set()
    todo = list(graph.get(node, ()))
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(graph.get(n, ()))
    return seen


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a list of nodes (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def graphs(root: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    files = sorted(p for p in root.rglob("*") if p.suffix in (".c", ".h", ".def"))
    rel = {p: p.relative_to(root).as_posix() for p in files}
    texts = {p: p.read_text(errors="replace") for p in files}
    includes: dict[str, set[str]] = {}
    for p in files:
        deps = set()
        for name in _INCLUDE.findall(texts[p]):
            for cand in (root / name, p.parent / name):
                if cand in rel:
                    deps.add(rel[cand])
                    break
        includes[rel[p]] = deps
    sources = [p for p in files if p.suffix == ".c"]
    code = {p: strip_code(texts[p]) for p in sources}
    owner: dict[str, str] = {}
    for p in sources:
        for name in definitions(code[p]):
            owner.setdefault(name, rel[p])
    # names a file uses: its own code, the bodies of the inline functions (and
    # macros' initializers) of headers that it calls, in turn, and the rows of the
    # tables (.def) it includes itself
    inline: dict[str, set[str]] = {}    # header inline function -> names in its body
    header_inits: dict[str, set[str]] = {}
    rows: dict[str, set[str]] = {}
    for p in files:
        if p.suffix == ".def":
            rows[rel[p]] = set(_IDENT.findall(strip_code(texts[p].replace("#include", "#"))))
        elif p.suffix == ".h":
            hcode = strip_code(texts[p])
            header_inits[rel[p]] = set()
            for head, body in top_level_chunks(hcode):
                if body is not None:
                    m = re.search(r"\b([A-Za-z_]\w*)\s*\([^()]*(?:\([^()]*\)[^()]*)*\)\s*$", head)
                    if m:
                        inline.setdefault(m.group(1), set()).update(_IDENT.findall(body))
                elif "=" in head:
                    header_inits[rel[p]] |= set(_IDENT.findall(head.split("=", 1)[1]))
    calls: dict[str, set[str]] = {}
    for p in sources:
        used = uses(code[p])
        for dep in reachable(includes, rel[p]):
            if dep.endswith(".h"):
                used |= header_inits[dep]
        for dep in includes[rel[p]]:   # a table's rows count where a source expands it
            if dep.endswith(".def"):
                used |= rows[dep]
        todo = [n for n in used if n in inline]
        while todo:   # the inline functions it calls, and theirs
            for n in inline[todo.pop()] - used:
                used.add(n)
                if n in inline:
                    todo.append(n)
        calls[rel[p]] = {owner[n] for n in used if n in owner and owner[n] != rel[p]}
    return includes, calls


def cimports(native: Path) -> dict[str, set[str]]:
    """Cython module -> the modules its .pyx and .pxd cimport."""
    graph: dict[str, set[str]] = {}
    for p in sorted(q for q in native.iterdir() if q.suffix in (".pyx", ".pxd")):
        deps = {a or b for a, b in _CIMPORT.findall(p.read_text(errors="replace"))}
        graph.setdefault(p.stem, set()).update(deps - {p.stem})
    return graph


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:` blocks."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def python_imports(package: Path) -> dict[str, set[str]]:
    """Python module (dotted, relative to the package; "" is its __init__) -> the
    package's modules it imports, anywhere in its code (see above)."""
    mods: dict[str, Path] = {}
    for p in sorted(package.rglob("*.py")):
        parts = list(p.relative_to(package).with_suffix("").parts)
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    graph: dict[str, set[str]] = {}
    for name, p in mods.items():
        here = name.split(".") if name else []
        parent = here if p.name == "__init__.py" else here[:-1]
        tree = ast.parse(p.read_text(errors="replace"), str(p))
        skip = _type_checking_only(tree)
        deps: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                deps.update(".".join(a.name.split(".")[1:]) for a in node.names
                            if a.name.split(".")[0] == package.name)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = parent[:len(parent) - node.level + 1]
                    mod = base + (node.module.split(".") if node.module else [])
                elif node.module and node.module.split(".")[0] == package.name:
                    mod = node.module.split(".")[1:]
                else:
                    continue
                subs = [".".join(mod + [a.name]) for a in node.names]
                deps.update(s for s in subs if s in mods)
                if not all(s in mods for s in subs):   # names defined in the module itself
                    deps.add(".".join(mod))
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=ROOT, help="the C tree (default: csrc/)")
    ap.add_argument("--native", type=Path, default=NATIVE,
                    help="the Cython modules (default: ggmlrpc/_native/)")
    ap.add_argument("--package", type=Path, default=PACKAGE,
                    help="the Python package (default: ggmlrpc/)")
    ap.add_argument("--graph", action="store_true", help="print the graphs")
    args = ap.parse_args(argv)
    includes, calls = graphs(args.root)
    cimps = cimports(args.native)
    imps = python_imports(args.package)
    if args.graph:
        for title, g in (("includes", includes), ("calls", calls), ("cimports", cimps),
                         ("imports", imps)):
            print(f"{title}:")
            for node in sorted(g):
                if g[node]:
                    print(f"  {node} -> {', '.join(sorted(g[node]))}")
    bad = 0
    for title, g in (("include", includes), ("call", calls), ("cimport", cimps),
                     ("import", imps)):
        cycle = find_cycle(g)
        if cycle:
            print(f"{title} cycle: {' -> '.join(cycle)}")
            bad = 1
    for name in misplaced_vector_code(args.root):
        print(f"vector code outside an x86/ folder: {name}")
        bad = 1
    if not bad:
        n_files = len(includes)
        print(f"csrc layout: {n_files} files, no include or call cycles, vector code only under x86/; "
              f"{len(cimps)} Cython modules, no cimport cycles; "
              f"{len(imps)} Python modules, no import cycles")
    return bad


if __name__ == "__main__":
    sys.exit(main())
