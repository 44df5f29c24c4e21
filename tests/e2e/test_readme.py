"""The README's client example runs as written (against a server of ours)."""
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def readme_python_block() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("```python") + len("```python")
    return text[start:text.index("```", start)]


def test_readme_client_example_runs(endpoint):
    code = readme_python_block().replace("127.0.0.1:50052", endpoint)
    printed = []
    scope = {"print": lambda *args: printed.append(args)}
    exec(compile(code, "README.md", "exec"), scope)
    assert not scope["rb"].connected  # the with-block closed the connection
    count, (free, total), alignment = printed[0]
    assert (count, alignment) == (1, 32) and free == total > 0
    # c = a + b with a = ones and b = 0..1023, as a (4, 256) array
    (result,) = printed[1]
    expected = (np.arange(1024, dtype=np.float32) + 1).reshape(4, 256)
    assert np.array_equal(result, expected)


def python_blocks() -> list[str]:
    text = (REPO / "README.md").read_text()
    parts = text.split("```python")[1:]
    return [p[:p.index("```")] for p in parts]


def test_readme_runner_and_builder_examples_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = [b for b in python_blocks() if "Model.load" in b or "B.Graph()" in b]
    assert len(blocks) == 3
    printed = []
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {"print": lambda *a: printed.append(a)})
    (prompt, text, why), (out, alone, n_past), (shape,) = printed
    assert prompt == b" Once upon a time" and len(text) > 0 and why == "length"
    # two sequences decoded together: the first's tokens are its tokens alone
    assert [len(o) for o in out] == [6, 6] and alone is True and n_past > 6
    assert shape == (4, 16)
