"""flowtrial: latency-controlled trials of AI coding assistants.

This folder is the composition root: the CLI (:mod:`flowtrial.cli`), the demo and the live
simulation wire the packages below it. Imports run one way (checked by import-linter, see
``pyproject.toml``): root → ``dashboards`` → ``analysis`` | ``instrumentation`` → ``study``.

=========================== ============================== ==================================
package                     folder in the repository       holds
=========================== ============================== ==================================
``flowtrial.study``         ``study/``                     config, schema, storage, simulator
``flowtrial.instrumentation`` ``instrumentation/``         proxy, shaping, recorder, capture
``flowtrial.analysis``      ``analysis/``                  estimators, checks, report
``flowtrial.dashboards``    ``dashboards/``                Streamlit dashboard
=========================== ============================== ==================================
"""

from __future__ import annotations

import pkgutil

# In the repository the subpackages sit beside this folder, not inside it; an installed
# copy (wheel, or a strict editable install's link tree) has them inside. When Python finds
# this folder first (a script run from the repository root puts it on sys.path), extending
# the path lets `flowtrial.study` resolve to the installed copy's subpackage.
__path__ = pkgutil.extend_path(__path__, __name__)

__version__ = "0.1.0"
