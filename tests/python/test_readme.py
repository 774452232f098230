"""Runs the README's Python quick start (the ```python block after <!-- quickstart -->)."""
import pathlib
import re
import subprocess
import sys


def test_readme_quickstart_runs():
    # The repository's README (or a copy next to the tests' folder, as on the device).
    here = pathlib.Path(__file__).resolve()
    readmes = [p / "README.md" for p in here.parents if (p / "README.md").exists()]
    assert readmes, "README.md not found above the tests"
    text = readmes[0].read_text()
    m = re.search(r"<!-- quickstart -->\s*```python\n(.*?)```", text, re.S)
    assert m, "README has no quick start block"
    r = subprocess.run([sys.executable, "-c", m.group(1)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "torch.Size([2, 1, 16, 512]) torch.Size([2, 16, 1])" in r.stdout
