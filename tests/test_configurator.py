import pytest

from configurator import configure


def defaults():
    return dict(batch_size=8, learning_rate=1e-4, compile=True, out_dir="out", tasks="all", betas=(0.9, 0.999),
                wandb_project=None)


def test_config_file_then_overrides(tmp_path):
    cfg = tmp_path / "c.py"
    cfg.write_text("batch_size = 32\nlearning_rate = 5e-4\nimport math\n_hidden = 1\n")
    g = defaults()
    eff = configure(g, [str(cfg), "--batch_size=4", "--compile=False", "--tasks=cola,rte", "--out_dir=123"])
    assert (g["batch_size"], g["learning_rate"], g["compile"]) == (4, 5e-4, False)
    assert g["tasks"] == "cola,rte" and g["out_dir"] == "123"  # str keys take the raw text
    assert eff["batch_size"] == 4 and "math" not in eff


def test_int_accepted_for_float():
    g = defaults()
    configure(g, ["--learning_rate=1"])
    assert g["learning_rate"] == 1.0 and isinstance(g["learning_rate"], float)


@pytest.mark.parametrize("args,msg", [
    (["--batch_sise=4"], "unknown key 'batch_sise'"),
    (["--batch_size=4.5"], "'batch_size' must be int"),
    (["--compile=1"], "'compile' must be bool"),
    (["--learning_rate=fast"], "'learning_rate' must be float"),
    (["--batch_size"], "expected --key=value"),
    (["no_such_file.py"], "cannot read config file"),
])
def test_bad_input_is_a_one_line_error(args, msg):
    with pytest.raises(SystemExit, match=msg) as e:
        configure(defaults(), args)
    assert "\n" not in str(e.value)


def test_a_bare_flag_switches_a_bool_on():
    g = {**defaults(), "compile": False}
    configure(g, ["--compile"])
    assert g["compile"] is True
    with pytest.raises(SystemExit, match="expected --key=value"):
        configure(defaults(), ["--batch_size"])  # not a True/False key


def test_script_defaults_reads_the_config_block_without_running_it(tmp_path):
    from configurator import script_defaults
    script = tmp_path / "s.py"
    script.write_text("import sys\nraise SystemExit('never run')\n# " + "-" * 77 + "\nlr = 1e-3  # a comment\n"
                      "a, b = 1, 'x'\ndevice = 'cuda' if sys.argv else 'cpu'\n# " + "-" * 77 + "\nlater = 5\n")
    assert script_defaults(str(script)) == {"lr": 1e-3, "a": 1, "b": "x"}  # computed and later ones left out


def test_unknown_key_in_config_file(tmp_path):
    cfg = tmp_path / "c.py"
    cfg.write_text("learning_rat = 1e-3\n")
    with pytest.raises(SystemExit, match="unknown key 'learning_rat'"):
        configure(defaults(), [str(cfg)])
