"""Run folders: what a replay writes (run.json, requests.parquet, steps.parquet), the metrics of
its summary, the printed summary table, and `testbed compare`."""
