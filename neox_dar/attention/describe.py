"""``python -m neox_dar.attention.describe``: the same command as ``python -m neox_dar.describe`` (kept for the
commands already written down; the report itself lives outside this package, which never imports the model)."""

if __name__ == "__main__":
    import runpy

    runpy.run_module("neox_dar.describe", run_name="__main__", alter_sys=True)
