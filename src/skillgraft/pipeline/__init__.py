"""The layer every runner is built from: the store of finished stages, setups, variants, the report writer."""

from skillgraft.pipeline.report import RunDir, aggregate, md_table, mean_std, pct, summary_rows, write_csv
from skillgraft.pipeline.store import Store

__all__ = ["RunDir", "Store", "aggregate", "md_table", "mean_std", "pct", "summary_rows", "write_csv"]
