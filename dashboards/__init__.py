"""Streamlit dashboard for researchers and teams (`flowtrial dashboard`)."""
