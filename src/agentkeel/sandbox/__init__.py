"""Per-thread workspace, path confinement and command execution."""
