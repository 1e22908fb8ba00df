"""Ready-made pipelines built from a config (what the CLI commands parameterise)."""
