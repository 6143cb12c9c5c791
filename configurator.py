"""
nanoGPT-style configuration. A script defines its defaults as plain globals, then calls

    from configurator import configure
    configure(globals())

which runs every config file named on the command line over those globals (plain Python assignments,
e.g. config/base_pair.py), then applies `--key=value` overrides (`--key` alone: True, for a True/False key).
Values are parsed with ast.literal_eval and must match the default's type (an int is accepted where a float is
expected); a key whose default is a string takes the text as it is. Unknown keys, wrong types (a config file's
pathlib.Path or np.int64 too) and non-finite numbers stop with a one-line message.
`--help` (or -h) prints every key with its default and the comment written beside it in the script, then exits.
Every failure a user can cause ends in one line (SystemExit) that says what to do: `check` and `oneline` help.
"""
import ast
import io
import math
import os
import re
import sys
import tokenize
from collections import Counter

SIMPLE = (bool, int, float, str, tuple, list, type(None))


def _check(key, value, defaults, where):
    if key not in defaults:
        known = ", ".join(sorted(defaults))
        raise SystemExit(f"config: unknown key '{key}' in {where} (known keys: {known})")
    default = defaults[key]
    if isinstance(value, float) and not math.isfinite(value):  # 1e999 parses as inf: no setting takes it
        raise SystemExit(f"config: {where}: '{key}' must be a finite number, got {value!r}")
    if default is None and isinstance(value, SIMPLE) or type(value) is type(default):
        return value
    if isinstance(default, float) and type(value) is int:
        return float(value)
    raise SystemExit(f"config: {where}: '{key}' must be {type(default).__name__} "
                     f"(like the default {default!r}), got {type(value).__name__} {value!r}")


def show(value):
    return value if isinstance(value, str) else repr(value)


def print_help(g, defaults):
    """The script's docstring, then its config block as `--key=default  comment`, section comments as headings:
    generated from the source, so it cannot drift from what the script does."""
    path = g.get("__file__", "")
    try:
        with open(path) as f:
            source = f.read()
    except OSError:
        source = ""
    tree = ast.parse(source) if source else ast.Module(body=[])
    script = os.path.relpath(os.path.abspath(path), os.path.dirname(os.path.abspath(__file__))) if path else ""
    script = os.path.basename(path) if script.startswith("..") else script  # as run from the repository root
    print(f"usage: python {script} [config/file.py ...] [--key=value ...]\n")
    print((ast.get_docstring(tree) or "").strip() + "\n\nsettings (--key=default, then what it is):")
    comments = {t.start[0]: (t.start[1], t.string.lstrip("#").strip()) for t in
                tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT}
    lines, done = source.splitlines(), set()
    for node in tree.body:
        names = [n.id for t in getattr(node, "targets", []) for n in (t.elts if isinstance(t, ast.Tuple) else [t])
                 if isinstance(n, ast.Name) and n.id in defaults and n.id not in done]  # the first assignment
        if not names:
            continue
        heading = comments.get(node.lineno - 1)  # a comment line of its own just above, at column 0: a section
        if heading and heading[0] == 0 and not heading[1].startswith("-") and lines[node.lineno - 2].startswith("#"):
            print(f"\n {heading[1]}")
        text = [comments.get(node.end_lineno, (0, ""))[1]]
        line = node.end_lineno + 1
        while line in comments and lines[line - 1].lstrip().startswith("#") and comments[line][0] > 0:
            text.append(comments[line][1])  # an indented comment line below continues the comment
            line += 1
        done.update(names)  # a, b = ... # comment: one line for all of them, the comment once
        print(("  " + " ".join(f"--{name}={show(defaults[name])}" for name in names)).ljust(40) + " " +
              " ".join(t for t in text if t))
    for name in sorted(set(defaults) - done):  # defined elsewhere than a plain assignment
        print(f"  --{name}={show(defaults[name])}")


def script_defaults(path):
    """The settings a script defines in its config block (between its first two '# ----' lines) whose values are
    literals, without running the script: e.g. what train.py's defaults are for a setting an old record lacks."""
    with open(path) as f:
        source = f.read()
    lines = source.splitlines()
    start, end = [i + 1 for i, line in enumerate(lines) if line.startswith("# " + "-" * 70)][:2]
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and start < node.lineno < end:
            try:
                value = ast.literal_eval(node.value)
            except ValueError:  # computed (device = "cuda" if ... else "cpu"): not a literal
                continue
            for t in node.targets:
                names = [n.id for n in (t.elts if isinstance(t, ast.Tuple) else [t])]
                out.update(zip(names, value if isinstance(t, ast.Tuple) else [value]))
    return out


def read_file(path):
    """The settings a config file assigns (plain Python, run with an empty namespace)."""
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as e:
        moved = os.path.join("studies", path)  # the studies' configs moved to studies/config/
        hint = f" (it moved: use {moved})" if not os.path.exists(path) and os.path.exists(moved) else ""
        raise SystemExit(f"config: cannot read config file {path}: {e.strerror}{hint}")
    values = {}
    try:
        exec(compile(source, path, "exec"), {}, values)
    except Exception as e:
        raise SystemExit(f"config: error in config file {path}: {type(e).__name__}: {e}")
    return {k: v for k, v in values.items() if not k.startswith("_")}


def configure(g, argv=None, given=None):
    """Apply config files and --key=value overrides from argv (default sys.argv[1:]) to the dict g; returns the
    effective configuration. given, a dict, receives each key that a config file or an override set, with where its
    value came from: the file's path, or the override as written ('--dropout=0.1'), the last one that set it."""
    argv = sys.argv[1:] if argv is None else argv
    defaults = {k: v for k, v in g.items()  # lower-case globals: UPPER_CASE ones are the script's constants
                if not k.startswith("_") and not k.isupper() and isinstance(v, SIMPLE)}
    given = {} if given is None else given
    if "--help" in argv or "-h" in argv:
        try:
            print_help(g, defaults)
            sys.stdout.flush()
        except BrokenPipeError:  # `--help | head`
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(0)
    for arg in argv:
        if not arg.startswith("--"):  # a config file
            for k, v in read_file(arg).items():
                if k in defaults or isinstance(v, SIMPLE):  # a setting's value that is no plain literal (pathlib.Path,
                    g[k] = _check(k, v, defaults, arg)  # np.int64) is refused, never dropped; other names (imported
                    given[k] = arg  # modules, helper functions) are the file's own
        else:
            key, eq, text = arg[2:].partition("=")
            if not eq and isinstance(defaults.get(key), bool):
                eq, text = "=", "True"  # --flag: a True/False setting switched on
            if not eq:
                raise SystemExit(f"config: expected --key=value, got '{arg}'")
            if isinstance(defaults.get(key), str):
                value = text  # a string key takes the text as it is: --tasks=cola,rte --device=cuda
            else:
                try:
                    value = ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    value = text  # not a Python literal: reported as a str where a number is expected
            g[key] = _check(key, value, defaults, f"--{key}")
            given[key] = arg
    return {k: g[k] for k in defaults}  # the effective configuration, e.g. for logging and checkpoints


def oneline(e):
    """An exception as one short line, for the messages that end a script."""
    return f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]


def comma_list(script, key, text, allowed=None, numbers=False):
    """The items of a comma-list setting (--seeds=1,2, --arms=original,pairwise): the one check every script's lists
    go through. No empty item, each of allowed (when given), or with numbers a whole number, given back in its plain
    spelling ("01" -> "1"); none named twice (numbers compared as numbers), which would plan and run its job twice.
    Anything else: one line (SystemExit)."""
    items = text.split(",")
    kind = "whole numbers" if numbers else ", ".join(allowed) if allowed is not None else "non-empty items"
    if not all(re.fullmatch(r"[0-9]+", x) if numbers else x and (allowed is None or x in allowed) for x in items):
        raise SystemExit(f"{script}: {key} must be a comma list of {kind}, got {text!r}")
    items = [str(int(x)) for x in items] if numbers else items
    if twice := [x for x, n in Counter(items).items() if n > 1]:
        raise SystemExit(f"{script}: {key} names {', '.join(twice)} twice ({text!r}): name each once")
    return items


def check(script, *rules):
    """Validate a script's configuration once, right after it is parsed: rules are (ok, message) pairs; the
    failed ones are reported together in one line."""
    failed = [msg for ok, msg in rules if not ok]
    if failed:
        raise SystemExit(f"{script}: " + "; ".join(failed))
