"""The tuning sweep's part of the report: one line per point (rows of `specbuild.tuning`), its
status included, as a table and a plot."""

from __future__ import annotations

import os
from collections.abc import Sequence

import pandas as pd

from specbuild.infra.io import read_json
from specbuild.report.plots import plot_tuning
from specbuild.report.tables import check_written, output_folders, write_table
from specbuild.tuning import TUNING_KEYS

__all__ = ["write_tuning_report"]


def write_tuning_report(
    point_files: Sequence[str | os.PathLike], *, outputs: Sequence[str | os.PathLike]
) -> list[dict]:
    """tuning.{csv,md,html} and tuning.png, in the folders of the declared `outputs`."""
    tables_dir, plots_dir = output_folders(outputs)
    rows = [read_json(p) for p in point_files]
    write_table(pd.DataFrame(rows, columns=list(TUNING_KEYS)), tables_dir / "tuning")
    plot_tuning(rows, plots_dir / "tuning.png")
    check_written(outputs)
    return rows
