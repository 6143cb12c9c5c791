"""
nanoGPT-style configuration. A script defines its defaults as plain globals, then calls

    from configurator import configure
    configure(globals())

which runs every config file named on the command line over those globals (plain Python assignments,
e.g. config/base_pair.py), then applies `--key=value` overrides. Values are parsed with
ast.literal_eval and must match the default's type (an int is accepted where a float is expected);
a key whose default is a string takes the text as it is. Unknown keys and wrong types stop with a one-line message.
"""
import ast
import sys

SIMPLE = (bool, int, float, str, tuple, list, type(None))


def _check(key, value, defaults, where):
    if key not in defaults:
        known = ", ".join(sorted(defaults))
        raise SystemExit(f"config: unknown key '{key}' in {where} (known keys: {known})")
    default = defaults[key]
    if default is None or type(value) is type(default):
        return value
    if isinstance(default, float) and type(value) is int:
        return float(value)
    raise SystemExit(f"config: {where}: '{key}' must be {type(default).__name__} "
                     f"(like the default {default!r}), got {type(value).__name__} {value!r}")


def configure(g, argv=None):
    """Apply config files and --key=value overrides from argv (default sys.argv[1:]) to the dict g."""
    argv = sys.argv[1:] if argv is None else argv
    defaults = {k: v for k, v in g.items()  # lower-case globals: UPPER_CASE ones are the script's constants
                if not k.startswith("_") and not k.isupper() and isinstance(v, SIMPLE)}
    for arg in argv:
        if not arg.startswith("--"):  # a config file
            try:
                with open(arg) as f:
                    source = f.read()
            except OSError as e:
                raise SystemExit(f"config: cannot read config file {arg}: {e.strerror}")
            values = {}
            try:
                exec(compile(source, arg, "exec"), {}, values)
            except Exception as e:
                raise SystemExit(f"config: error in config file {arg}: {type(e).__name__}: {e}")
            for k, v in values.items():
                if not k.startswith("_") and isinstance(v, SIMPLE):
                    g[k] = _check(k, v, defaults, arg)
        else:
            key, eq, text = arg[2:].partition("=")
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
    return {k: g[k] for k in defaults}  # the effective configuration, e.g. for logging and checkpoints
