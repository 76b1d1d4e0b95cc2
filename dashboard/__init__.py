"""The Streamlit dashboard: browse run folders, see sim against real, run what-ifs.

It reads what testbed/ writes (run folders) and never the other way round.
Pure modules (runs_index, latency, downsample, charts, timeline, compare_table,
whatif) take DataFrames and return DataFrames, figures or JSON, so they are
tested without a browser; app.py and views/ are the Streamlit layer.
"""
