"""Answer texts of the simulated model, one TOML file per language group (data only)."""
