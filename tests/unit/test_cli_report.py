"""The demo's latency table: rows and column alignment, without a cluster."""

from __future__ import annotations

from cluster.report import latency_row, print_table


def test_latency_row() -> None:
    row = latency_row("http json", 6, [0.010, 0.030, 0.020], 3, 1.5)
    assert row == ["http json", "6", "3", "20.0", "30.0", "2.0"]


def test_table_aligns_the_first_column_left_and_the_others_right(capsys) -> None:
    print_table(["path", "p50 ms"], [["a", "1.0"], ["longer", "12.5"]])
    assert capsys.readouterr().out.splitlines() == [
        "path    p50 ms",
        "------  ------",
        "a          1.0",
        "longer    12.5",
    ]
