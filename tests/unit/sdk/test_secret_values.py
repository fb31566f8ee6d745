"""``ember secret set``'s KEY=VALUE spellings: a value from a file or standard input stays off the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from ember._errors import InvalidInputError
from ember._secrets import parse_values


def test_values_come_from_argv_a_file_or_stdin(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("from-file\n")
    values = parse_values(["A=plain=with=equals", f"B=@{token}", "C=-", "D="], read_stdin=lambda: "from-stdin\n")
    assert values == {"A": "plain=with=equals", "B": "from-file", "C": "from-stdin", "D": ""}


@pytest.mark.parametrize("pairs", [["NOEQUALS"], ["=v"], ["A=-", "B=-"], ["A=@/no/such/file"]])
def test_bad_pairs_are_refused(pairs: list[str]) -> None:
    with pytest.raises(InvalidInputError):
        parse_values(pairs, read_stdin=lambda: "x")
