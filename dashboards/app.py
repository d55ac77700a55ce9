"""flowtrial dashboard: the Streamlit entry point (``flowtrial dashboard --db PATH``).

Run directly with ``streamlit run dashboards/app.py -- --db study.db``; the database may also
come from ``FLOWTRIAL_DASHBOARD_DB``. Pages live in ``dashboards/pages``.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `streamlit run` puts this file's folder, not the repository, on sys.path.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import streamlit as st  # noqa: E402

from dashboards import data  # noqa: E402
from dashboards.ui import db_from_args  # noqa: E402
from study.errors import FlowtrialError  # noqa: E402

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
