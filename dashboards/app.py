"""flowtrial dashboard: the Streamlit entry point (``flowtrial dashboard --db PATH``).

Run directly with ``streamlit run dashboards/app.py -- --db study.db`` (flowtrial installed,
e.g. ``pip install -e '.[dashboard]'``); the database may also
come from ``FLOWTRIAL_DASHBOARD_DB``. Pages live in ``dashboards/pages``.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from flowtrial.dashboards import data
from flowtrial.dashboards.ui import db_from_args
from flowtrial.study.errors import FlowtrialError

PAGES = Path(__file__).resolve().parent / "pages"


def main() -> None:
    st.set_page_config(page_title="flowtrial", page_icon="⏱", layout="wide")
    db = db_from_args()
    if not db:
        st.error("No study database: start with `flowtrial dashboard --db PATH`.")
        st.stop()
    try:
        url = data.database(str(db)).url
    except FlowtrialError as exc:
        st.error(str(exc))
        st.stop()
    st.session_state["flowtrial_db_url"] = url
    nav = st.navigation({
        "Trial": [
            st.Page(PAGES / "overview.py", title="Study overview", icon="📋", default=True),
            st.Page(PAGES / "timeline.py", title="Flow timeline", icon="🕒"),
            st.Page(PAGES / "arms.py", title="Arms", icon="⚖️"),
            st.Page(PAGES / "threshold.py", title="Flow threshold", icon="📈"),
        ],
        "Team": [st.Page(PAGES / "team.py", title="Team view", icon="👥")],
    })
    # The analysis-layer work of large studies (compute.py) starts when a page needs it,
    # after that page's SQL parts: a background thread shares the GIL with page rendering.
    nav.run()


main()
