"""Streamlit dashboard for researchers and teams (issue 7; not built yet)."""
