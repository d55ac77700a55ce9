"""The study domain: config, schema, storage, randomization, participants, simulator.

Nothing here imports the proxy, the analysis or the dashboard: they build on this package.
"""
